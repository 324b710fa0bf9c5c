package fence

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ParseURL reads a store URL into a local directory or an S3Config:
//
//	file:///abs/dir
//	s3://bucket[/prefix]?endpoint=URL&region=R&path-style=true|false
//
// Errors wrap ErrBadURL and say which part is wrong.
func ParseURL(raw string) (dir string, s3cfg *S3Config, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", nil, fmt.Errorf("%w: %v", ErrBadURL, redactErr(err))
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return "", nil, fmt.Errorf("%w: file URL with host %q: want file:///absolute/dir", ErrBadURL, u.Host)
		}
		if u.Path == "" || !filepath.IsAbs(u.Path) {
			return "", nil, fmt.Errorf("%w: file URL path %q is not absolute: want file:///absolute/dir", ErrBadURL, u.Path)
		}
		return filepath.Clean(u.Path), nil, nil
	case "s3":
		cfg, err := parseS3(u)
		return "", cfg, err
	case "":
		// Not echoed: without a scheme, nothing says which part would be a
		// password (a mistyped "user:pw@host" parses as a path).
		return "", nil, fmt.Errorf("%w: the store URL has no scheme: want file:///dir or s3://bucket/prefix", ErrBadURL)
	}
	return "", nil, fmt.Errorf("%w: unknown scheme %q: want file or s3", ErrBadURL, u.Scheme)
}

func parseS3(u *url.URL) (*S3Config, error) {
	if u.Host == "" {
		return nil, fmt.Errorf("%w: s3 URL without a bucket: want s3://bucket/prefix", ErrBadURL)
	}
	if u.User != nil {
		return nil, fmt.Errorf("%w: s3 URL with credentials: use the AWS environment variables or a profile", ErrBadURL)
	}
	cfg := &S3Config{Bucket: u.Host, Prefix: strings.Trim(u.Path, "/")}
	if cfg.Prefix != "" {
		if err := CheckKey(cfg.Prefix); err != nil {
			if strings.ContainsAny(cfg.Prefix, "@:") { // userinfo in the wrong place: not echoed
				return nil, fmt.Errorf("%w: the s3 prefix holds ':' or '@' (credentials in the wrong place?); it is not shown", ErrBadURL)
			}
			return nil, fmt.Errorf("%w: s3 prefix: %v", ErrBadURL, err)
		}
	}
	q := u.Query()
	for k := range q {
		switch k {
		case "endpoint", "region", "path-style", "consistent", "timeout", "sse", "sse-kms-key-id", "sse-c-key-file":
		default:
			return nil, fmt.Errorf("%w: unknown s3 URL parameter %q (want endpoint, region, path-style, consistent, timeout, sse, sse-kms-key-id, sse-c-key-file)", ErrBadURL, k)
		}
	}
	cfg.Endpoint, cfg.Region = q.Get("endpoint"), q.Get("region")
	if cfg.Endpoint != "" {
		ep, err := url.Parse(cfg.Endpoint)
		switch {
		case strings.Contains(cfg.Endpoint, "@"):
			// Credentials come from the AWS variables; an endpoint holding
			// some is refused and never echoed.
			return nil, fmt.Errorf("%w: the endpoint holds an '@' (credentials?); it is not shown: give keys in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", ErrBadURL)
		case err != nil || (ep.Scheme != "http" && ep.Scheme != "https") || ep.Host == "":
			return nil, fmt.Errorf("%w: endpoint %q is not an http:// or https:// URL", ErrBadURL, cfg.Endpoint)
		}
	}
	if err := parseSSE(q, cfg); err != nil {
		return nil, err
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	// Tigris evaluates conditional writes on the leader only when asked to.
	cfg.Consistent = strings.HasSuffix(hostOf(cfg.Endpoint), ".tigris.dev")
	if c := q.Get("consistent"); c != "" {
		b, err := strconv.ParseBool(c)
		if err != nil {
			return nil, fmt.Errorf("%w: consistent=%q is not true or false", ErrBadURL, c)
		}
		cfg.Consistent = b
	}
	if t := q.Get("timeout"); t != "" {
		d, err := time.ParseDuration(t)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("%w: timeout=%q is not a positive duration such as 10s", ErrBadURL, t)
		}
		cfg.Timeout = d
	}
	if ps := q.Get("path-style"); ps != "" {
		b, err := strconv.ParseBool(ps)
		if err != nil {
			return nil, fmt.Errorf("%w: path-style=%q is not true or false", ErrBadURL, ps)
		}
		cfg.PathStyle = b
	}
	return cfg, nil
}

func hostOf(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

func redactErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		if u, perr := url.Parse(ue.URL); perr == nil {
			ue.URL = u.Redacted()
		} else {
			ue.URL = "(unparsable URL)"
		}
	}
	return err
}

// Open opens the store a URL names. With write set it also probes that the
// store refuses a second create of one key, and refuses to return a store
// that does not. Without it a local directory is opened read-only
// (OpenLocalReadOnly): nothing is created.
func Open(ctx context.Context, raw string, write bool) (Store, error) {
	dir, cfg, err := ParseURL(raw)
	if err != nil {
		return nil, err
	}
	var st Store
	switch {
	case cfg != nil:
		st, err = OpenS3(ctx, *cfg)
	case write:
		st, err = OpenLocal(dir)
	default:
		st, err = OpenLocalReadOnly(dir)
	}
	if err != nil || !write {
		return st, err
	}
	if err := Probe(ctx, st); err != nil {
		return nil, err
	}
	return st, nil
}

// Probe creates a random key twice and fails with ErrNoConditionalWrites
// unless the second create is refused. It removes the probe object after.
func Probe(ctx context.Context, st Store) error {
	var b [8]byte
	rand.Read(b[:])
	key := "probe/" + hex.EncodeToString(b[:])
	if err := st.Create(ctx, key, []byte("first")); err != nil {
		return fmt.Errorf("probe %s: %w", st, err)
	}
	defer st.Delete(context.WithoutCancel(ctx), key)
	err := st.Create(ctx, key, []byte("second"))
	switch {
	case err == nil:
		return fmt.Errorf("probe %s: a second create of %s succeeded: %w; refusing to use it as a commit fence", st, key, ErrNoConditionalWrites)
	case errors.Is(err, ErrExists):
		return nil
	}
	return fmt.Errorf("probe %s: %w", st, err)
}

// String names the local store.
func (l *Local) String() string { return "file://" + l.root }

// parseSSE reads the server-side encryption parameters of an s3 URL:
// sse=aws:kms (with sse-kms-key-id, or the bucket's default key) or
// sse=AES256, or sse-c-key-file=PATH (a 32-byte key, raw or base64, kept
// out of the URL), which is sent with every request.
func parseSSE(q url.Values, cfg *S3Config) error {
	cfg.SSE, cfg.SSEKMSKeyID = q.Get("sse"), q.Get("sse-kms-key-id")
	switch {
	case cfg.SSE != "" && cfg.SSE != "aws:kms" && cfg.SSE != "AES256":
		return fmt.Errorf("%w: sse=%q: want aws:kms or AES256", ErrBadURL, cfg.SSE)
	case cfg.SSEKMSKeyID != "" && cfg.SSE != "aws:kms":
		return fmt.Errorf("%w: sse-kms-key-id needs sse=aws:kms", ErrBadURL)
	}
	path := q.Get("sse-c-key-file")
	if path == "" {
		return nil
	}
	if cfg.SSE != "" {
		return fmt.Errorf("%w: sse-c-key-file and sse= exclude each other", ErrBadURL)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%w: sse-c-key-file: %v", ErrBadURL, err)
	}
	if k, derr := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b))); derr == nil && len(k) == 32 {
		b = k
	}
	if len(b) != 32 {
		return fmt.Errorf("%w: sse-c-key-file %s: want 32 bytes (raw or base64)", ErrBadURL, path)
	}
	cfg.SSECustomerKey = b
	return nil
}
