package clix

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/urfave/cli/v2"

	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// Exit codes of every silt binary.
const (
	ExitOK          = 0
	ExitFailure     = 1
	ExitUsage       = 2
	ExitInterrupted = 3 // stopped by SIGTERM or SIGINT before the work was done
	// ExitUnproven: the archive on the remote could not be proven against
	// Redis's record (archive.ErrNotThisArchive, archive.ErrRemoteBehind);
	// nothing was committed, trimmed or read.
	ExitUnproven = 4
	// ExitHandlersFailed: worker run --fail-on-error saw handler attempts
	// fail or entries dead-lettered (ErrHandlersFailed).
	ExitHandlersFailed = 5
	// ExitKeptUnarchived: archiver run found live entries at or below the
	// watermark that the archive lacks (archive.ErrKeptUnarchived) and kept
	// them live; nothing was lost, and an operator looks (a failover).
	ExitKeptUnarchived = 6
	// ExitNotReplicated: worker append --wait-replicas wrote entries that
	// fewer replicas than asked acknowledged (*stream.NotReplicatedError);
	// they may or may not survive a failover.
	ExitNotReplicated = 7
)

// ErrHandlersFailed is wrapped by worker run's error under --fail-on-error
// when handlers failed; the binary exits with ExitHandlersFailed.
var ErrHandlersFailed = errors.New("handlers failed")

// ErrInterrupted is wrapped by a command's error when a signal stopped it
// before its work was done; the binary exits with ExitInterrupted.
var ErrInterrupted = errors.New("interrupted")

// UsageError is a bad flag or argument; it makes the binary exit with ExitUsage.
type UsageError struct {
	Flag string // the flag or argument at fault, such as "--redis"
	Msg  string
}

func (e *UsageError) Error() string { return e.Flag + ": " + e.Msg }

// Usagef returns a *UsageError about flag.
func Usagef(flag, format string, args ...any) error {
	return &UsageError{Flag: flag, Msg: fmt.Sprintf(format, args...)}
}

// Names of the common flags.
const (
	FlagRedis        = "redis"
	FlagRedisWait    = "redis-wait"
	FlagRedisCluster = "redis-cluster"
	FlagRedisCA      = "redis-ca"
	FlagAllowEvict   = "allow-eviction"
	FlagPrefix       = "prefix"
	FlagQueue        = "queue"
	FlagStream       = "stream"
	FlagKey          = "key"
	FlagKind         = "kind"
	FlagLogFormat    = "log-format"
	FlagLogLevel     = "log-level"
)

// CommonFlags returns the flags both binaries take, each with its environment variable.
func CommonFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: FlagRedis, EnvVars: EnvVars("REDIS_URL"), Value: "redis://127.0.0.1:6379/0",
			Usage: "Redis URL: redis://[user:password@]host:port/db, rediss:// for TLS; several, comma-separated, for a cluster"},
		&cli.StringFlag{Name: FlagRedisCA, EnvVars: EnvVars("REDIS_CA"), Usage: "PEM file of the CA that signed the rediss:// server certificate (default: the system roots)"},
		&cli.BoolFlag{Name: FlagRedisCluster, EnvVars: EnvVars("REDIS_CLUSTER"), Usage: "talk to a Redis Cluster (also implied by several --redis URLs, or by one URL of a node that reports cluster_enabled)"},
		&cli.DurationFlag{Name: FlagRedisWait, EnvVars: EnvVars("REDIS_WAIT"), Value: 10 * time.Second,
			Usage: "how long to retry (with backoff) when Redis does not answer at startup"},
		&cli.BoolFlag{Name: FlagAllowEvict, EnvVars: EnvVars("ALLOW_EVICTION"),
			Usage: "run against a Redis whose maxmemory-policy may evict keys (streams, dead letters, records can vanish); warned on every run"},
		&cli.StringFlag{Name: FlagPrefix, EnvVars: EnvVars("PREFIX"), Value: stream.DefaultPrefix, Usage: "key prefix"},
		&cli.StringFlag{Name: FlagQueue, EnvVars: EnvVars("QUEUE"), Usage: "queue name (the hash tag of every key)"},
		&cli.StringFlag{Name: FlagStream, EnvVars: EnvVars("STREAM"), Usage: "stream name"},
		&cli.StringFlag{Name: FlagKey, EnvVars: EnvVars("KEY"),
			Usage: "a stream under its own key (orders, app:{tenant}:events), instead of --queue and --stream: silt's keys for it share its hash tag, so its Cluster slot"},
		&cli.StringFlag{Name: FlagKind, EnvVars: EnvVars("KIND"),
			Usage: "kind of branded id the stream holds: recorded by its first append (EVT when not given), a check afterwards"},
		&cli.StringFlag{Name: FlagLogFormat, EnvVars: EnvVars("LOG_FORMAT"), Value: "text", Usage: "log format: text or json"},
		&cli.StringFlag{Name: FlagLogLevel, EnvVars: EnvVars("LOG_LEVEL"), Value: "info", Usage: "log level: debug, info, warn, error"},
	}
}

// Target is the validated stream a command works on.
type Target struct {
	Keyspace stream.Keyspace
	Stream   string
	Kind     brand.Kind
}

// ParseTarget validates --prefix, --queue, --stream and --kind, or --key
// (a stream under its own key) in place of --queue and --stream.
func ParseTarget(c *cli.Context) (Target, error) {
	if key := c.String(FlagKey); key != "" {
		return parseKey(c, key)
	}
	t, err := ParseQueue(c)
	if err != nil {
		return t, err
	}
	if c.String(FlagStream) == "" {
		return Target{}, Usagef("--stream", "required (or SILT_STREAM)")
	}
	if err := stream.ValidateName("stream", c.String(FlagStream)); err != nil {
		return Target{}, Usagef("--stream", "%v", err)
	}
	t.Stream = c.String(FlagStream)
	return t, nil
}

// parseKey is ParseTarget for --key, which replaces --queue and --stream:
// the stream's own key, its keyspace and the name silt's keys use for it.
func parseKey(c *cli.Context, key string) (Target, error) {
	if err := stream.ValidateName("prefix", c.String(FlagPrefix)); err != nil {
		return Target{}, Usagef("--prefix", "%v", err)
	}
	kind, err := parseKind(c)
	if err != nil {
		return Target{}, err
	}
	ks, name, err := stream.KeyspaceFor(c.String(FlagPrefix), key)
	if err != nil {
		return Target{}, Usagef("--key", "%v", err)
	}
	return Target{Keyspace: ks, Stream: name, Kind: kind}, nil
}

// ParseQueue validates --prefix, --queue and --kind (Stream stays empty).
func ParseQueue(c *cli.Context) (Target, error) {
	if c.String(FlagQueue) == "" {
		return Target{}, Usagef("--queue", "required (or SILT_QUEUE)")
	}
	return ParsePrefix(c)
}

// ParsePrefix validates --prefix, --kind and, when given, --queue.
func ParsePrefix(c *cli.Context) (Target, error) {
	if err := stream.ValidateName("prefix", c.String(FlagPrefix)); err != nil {
		return Target{}, Usagef("--prefix", "%v", err)
	}
	ks := stream.Keyspace{Prefix: c.String(FlagPrefix)}
	if q := c.String(FlagQueue); q != "" {
		var err error
		if ks, err = stream.NewKeyspace(c.String(FlagPrefix), q); err != nil {
			return Target{}, Usagef("--queue", "%v", err)
		}
	}
	kind, err := parseKind(c)
	if err != nil {
		return Target{}, err
	}
	return Target{Keyspace: ks, Kind: kind}, nil
}

// parseKind validates --kind ("" when not given).
func parseKind(c *cli.Context) (brand.Kind, error) {
	s := c.String(FlagKind)
	if s == "" {
		return "", nil
	}
	if _, err := brand.ParseKind(s); err != nil {
		return "", Usagef("--kind", "%v", err)
	}
	return brand.Kind(s), nil // a kind not built in is judged against the stream (ResolveKind)
}

// ResolveKind returns the kind of stream name in t's keyspace: the one
// recorded for the stream, which --kind (t.Kind), when given, must match.
// A stream with no kind yet takes --kind, or EVT; a kind that is neither
// built in nor the stream's is refused unless newKind (worker append
// --new-kind) says it is meant.
func ResolveKind(ctx context.Context, rdb stream.Client, t Target, name string, newKind bool) (brand.Kind, error) {
	recorded, ok, err := stream.StreamKind(ctx, rdb, t.Keyspace, name)
	if err != nil {
		return "", err
	}
	given := t.Kind
	switch {
	case ok && given != "" && given != recorded:
		return "", Usagef("--kind", "stream %s holds %s ids (recorded at its first append), not %s; leave --kind out to use the stream's",
			name, recorded, given)
	case ok:
		return recorded, nil
	case given == "":
		return brand.EVT, nil
	case given.BuiltIn(), newKind:
		return given, nil
	}
	return "", Usagef("--kind", "%s is not a built-in kind and stream %s does not hold it; to start a stream of a new kind, append with --kind %s --new-kind",
		given, name, given)
}

// tlsHint explains an error that looks like TLS spoken to a plain port.
func tlsHint(opts []*redis.Options, err error) string {
	msg := err.Error()
	if len(opts) == 0 || opts[0].TLSConfig == nil {
		return ""
	}
	switch {
	case strings.Contains(msg, "first record does not look like a TLS handshake"), strings.Contains(msg, "EOF"):
		return " (this looks like a TLS mismatch: the URL is rediss://, but the server on that port speaks plain Redis; use redis://, or the server's TLS port)"
	case errors.Is(err, context.DeadlineExceeded), strings.Contains(msg, "timeout"):
		// A plain Redis server reads a TLS handshake as the start of a
		// command and waits for the rest: the handshake times out.
		return " (the TLS handshake got no answer: if the server on that port speaks plain Redis, use redis://, or the server's TLS port)"
	}
	return ""
}

// Redact returns a Redis or S3 URL with its password replaced, safe to print.
// A URL with an '@' the parser did not take as the end of its userinfo (no
// scheme, or a '#', '?' or '/' in the password) is not shown at all: nothing
// says which part of it is the password.
// ErrUnparsableURL stands for a URL parse error: its text is not shown,
// since it may quote a secret.
var ErrUnparsableURL = errors.New("the URL does not parse (in a password, '/', '?', '#', '%', '@' and spaces must be percent-encoded); its text is not shown, as it may hold a secret")

func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	if u.User == nil && strings.Contains(raw, "@") {
		return "(URL not shown: it has an '@' outside its userinfo)"
	}
	if q := u.Query(); q.Has("password") { // a Sentinel URL's master password
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// OpenRedis connects to --redis and checks the server answers, retrying with
// backoff for up to --redis-wait. Several comma-separated URLs, or
// --redis-cluster, give a Redis Cluster client. Errors name the URL without
// its password.
func OpenRedis(ctx context.Context, c *cli.Context) (redis.UniversalClient, error) {
	wait := c.Duration(FlagRedisWait)
	raw := c.String(FlagRedis)
	if sentinelURL(raw) {
		if strings.Contains(raw, ",") || c.Bool(FlagRedisCluster) {
			return nil, Usagef("--redis", "a Sentinel URL (master_name=...) names its other Sentinels with &addr=host:port, not with commas or --%s", FlagRedisCluster)
		}
		return openSentinel(ctx, c, strings.TrimSpace(raw))
	}
	urls := strings.Split(raw, ",")
	var opts []*redis.Options
	for _, u := range urls {
		o, err := redis.ParseURL(strings.TrimSpace(u))
		if err != nil {
			return nil, Usagef("--redis", "%s: %v", Redact(u), scrub(err, u))
		}
		if err := redisTLS(c, o.TLSConfig, u); err != nil {
			return nil, err
		}
		opts = append(opts, o)
	}
	rdb := newClient(opts, c.Bool(FlagRedisCluster) || len(opts) > 1)
	if err := ping(ctx, rdb, wait); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("redis at %s: %w%s", redactAll(urls), scrubAll(err, urls), tlsHint(opts, err))
	}
	var memory *redis.StringCmd // a single node's INFO memory, read with INFO cluster
	if single, ok := rdb.(*redis.Client); ok {
		var cluster bool
		cluster, memory = clusterEnabled(ctx, single)
		if cluster {
			// One URL of a cluster's node: a plain client would answer
			// MOVED for every key of another node's slots.
			rdb.Close()
			rdb, memory = newClient(opts, true), nil
			if err := ping(ctx, rdb, wait); err != nil {
				rdb.Close()
				return nil, fmt.Errorf("redis cluster at %s: %w", redactAll(urls), scrubAll(err, urls))
			}
		}
	}
	if err := checkEviction(ctx, c, rdb, memory); err != nil {
		rdb.Close()
		return nil, err
	}
	return rdb, nil
}

// checkEviction refuses a Redis (every master of a cluster) that may evict
// keys: with a maxmemory and a policy other than noeviction, Redis deletes
// streams, dead letters and records to make room, silently. --allow-eviction
// lets a run go on, with a warning every time. memory, when set, is a
// single node's INFO memory, already read.
func checkEviction(ctx context.Context, c *cli.Context, rdb redis.UniversalClient, memory *redis.StringCmd) error {
	check := func(ctx context.Context, n redis.UniversalClient) error {
		read := memory
		if read == nil {
			read = n.Info(ctx, "memory")
		}
		info, err := read.Result()
		if err != nil {
			return fmt.Errorf("redis: read maxmemory-policy (INFO memory): %w", err)
		}
		policy, limit := infoField(info, "maxmemory_policy"), infoField(info, "maxmemory")
		if policy == "noeviction" || policy == "" || limit == "0" {
			return nil
		}
		msg := fmt.Sprintf("redis maxmemory-policy is %s (maxmemory %s bytes): Redis may evict streams, dead letters and silt's records when it is full", policy, limit)
		if !c.Bool(FlagAllowEvict) {
			return fmt.Errorf("%s; set maxmemory-policy noeviction for silt's keys, or run with --%s to accept it", msg, FlagAllowEvict)
		}
		fmt.Fprintf(c.App.ErrWriter, "warning: %s (--%s)\n", msg, FlagAllowEvict)
		return nil
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return check(ctx, n) })
	}
	return check(ctx, rdb)
}

// clusterEnabled reports whether the node rdb talks to is a Redis Cluster
// node (INFO cluster says cluster_enabled:1). A server that refuses INFO
// is taken as a single node, as it was before this check. The node's INFO
// memory, which checkEviction reads, goes in the same round trip.
func clusterEnabled(ctx context.Context, rdb *redis.Client) (bool, *redis.StringCmd) {
	var cluster, memory *redis.StringCmd
	rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		cluster, memory = p.Info(ctx, "cluster"), p.Info(ctx, "memory")
		return nil
	})
	info, err := cluster.Result()
	return err == nil && infoField(info, "cluster_enabled") == "1", memory
}

// infoField returns the value of name in an INFO reply ("" when absent).
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// newClient builds a single-node or a cluster client with silt's timeouts.
func newClient(opts []*redis.Options, cluster bool) redis.UniversalClient {
	o := opts[0]
	if !cluster {
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.MaxRetries = 3*time.Second, 5*time.Second, 5*time.Second, 3
		return redis.NewClient(o)
	}
	addrs := make([]string, len(opts))
	for i, x := range opts {
		addrs[i] = x.Addr
	}
	return redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: addrs, Username: o.Username, Password: o.Password, TLSConfig: o.TLSConfig,
		DialTimeout: 3 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, MaxRedirects: 8,
	})
}

// redisTLS sets up the TLS settings of a rediss:// URL raw (cfg; nil for
// redis://): TLS 1.2 at least, --redis-ca's roots when given, which a plain
// URL refuses.
func redisTLS(c *cli.Context, cfg *tls.Config, raw string) error {
	if cfg == nil {
		if c.String(FlagRedisCA) != "" {
			return Usagef("--redis-ca", "given for %s, which is not a rediss:// URL", Redact(raw))
		}
		return nil
	}
	cfg.MinVersion = tls.VersionTLS12
	if ca := c.String(FlagRedisCA); ca != "" {
		pool, err := loadCA(ca)
		if err != nil {
			return Usagef("--redis-ca", "%v", err)
		}
		cfg.RootCAs = pool
	}
	return nil
}

// loadCA reads a PEM bundle of CA certificates.
func loadCA(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

func redactAll(urls []string) string {
	out := make([]string, len(urls))
	for i, u := range urls {
		out[i] = Redact(strings.TrimSpace(u))
	}
	return strings.Join(out, ",")
}

func scrubAll(err error, urls []string) error {
	for _, u := range urls {
		err = scrub(err, strings.TrimSpace(u))
	}
	return err
}

func ping(ctx context.Context, rdb redis.UniversalClient, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	backoff := 100 * time.Millisecond
	for {
		err := rdb.Ping(ctx).Err()
		if err == nil || time.Now().Add(backoff).After(deadline) || isAuth(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func isAuth(err error) bool {
	s := err.Error()
	return strings.Contains(s, "WRONGPASS") || strings.Contains(s, "NOAUTH") || strings.Contains(s, "NOPERM")
}

// scrub removes the password of raw from err's text, in case a library echoed it.
func scrub(err error, raw string) error {
	u, perr := url.Parse(raw)
	if perr != nil {
		// The parser's own words quote the URL, or the piece it choked on,
		// which is often a piece of the password ("invalid port \":p4ss\"").
		return ErrUnparsableURL
	}
	if u.User == nil {
		return err
	}
	pw, ok := u.User.Password()
	if !ok || pw == "" || !strings.Contains(err.Error(), pw) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), pw, "xxxxx"))
}

// redisLogger sends go-redis's internal messages (such as failed dials, which
// it prints on every retry) to our logger at debug level.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.DebugContext(ctx, "redis: "+fmt.Sprintf(format, v...))
}

// NewLogger builds the stderr logger from --log-format and --log-level.
func NewLogger(c *cli.Context, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String(FlagLogLevel))); err != nil {
		return nil, Usagef("--log-level", "%q is not one of debug, info, warn, error", c.String(FlagLogLevel))
	}
	opts := &slog.HandlerOptions{Level: level}
	var logger *slog.Logger
	switch c.String(FlagLogFormat) {
	case "text":
		logger = slog.New(slog.NewTextHandler(w, opts))
	case "json":
		logger = slog.New(slog.NewJSONHandler(w, opts))
	default:
		return nil, Usagef("--log-format", "%q is not text or json", c.String(FlagLogFormat))
	}
	redis.SetLogger(redisLogger{logger})
	// Libraries that print through the standard log package (the
	// OpenTelemetry SDK's error handler among them) go through the run's
	// logger too: --log-format json stays all JSON.
	log.SetFlags(0)
	log.SetOutput(stdLog{logger})
	warnDeprecatedEnv(logger)
	return logger, nil
}

// stdLog turns each line of the standard log package into a WARN record.
type stdLog struct{ l *slog.Logger }

func (s stdLog) Write(b []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		s.l.Warn("library", "message", line)
	}
	return len(b), nil
}

// Session is what most commands open: the logger, the Redis client and the
// target stream's log. Close releases the client.
type Session struct {
	Logger *slog.Logger
	Redis  redis.UniversalClient
	Log    *stream.Log
}

// Close closes the Redis client.
func (s *Session) Close() { s.Redis.Close() }

// OpenSession builds the logger, connects to Redis and opens t's log.
func OpenSession(c *cli.Context, t Target) (*Session, error) {
	logger, err := NewLogger(c, c.App.ErrWriter)
	if err != nil {
		return nil, err
	}
	rdb, err := OpenRedis(c.Context, c)
	if err != nil {
		return nil, err
	}
	kind, err := ResolveKind(c.Context, rdb, t, t.Stream, c.Bool("new-kind"))
	if err != nil {
		rdb.Close()
		return nil, err
	}
	l, err := stream.NewLog(rdb, t.Keyspace, t.Stream, kind)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	return &Session{Logger: logger, Redis: rdb, Log: l}, nil
}

// StatusFormat is the output format of a status command: --format, or json
// when the older --json is given.
func StatusFormat(c *cli.Context) string {
	if c.Bool("json") && !c.IsSet("format") {
		return "json"
	}
	return c.String("format")
}

// CheckStatusFormat refuses an unknown --format and --json beside another format.
func CheckStatusFormat(c *cli.Context) error {
	switch f := c.String("format"); {
	case c.Bool("json") && c.IsSet("format") && f != "json":
		return Usagef("--json", "--json contradicts --format %s", f)
	case f == "text" || f == "json" || f == "openmetrics" || f == "prometheus":
		return nil
	default:
		return Usagef("--format", "%q: want text, json, openmetrics or prometheus", f)
	}
}
