package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/urfave/cli/v2"

	"github.com/silt-dev/silt/cmd/internal/clix"
	"github.com/silt-dev/silt/internal/telemetry"
	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/export"
	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/graft"
	"github.com/silt-dev/silt/pkg/stream"
)

// policyFlags declare the retention policy.
func policyFlags() []cli.Flag {
	return []cli.Flag{
		&cli.Int64Flag{Name: "keep-last", EnvVars: clix.EnvVars("KEEP_LAST"), Usage: "keep the newest N entries live"},
		&cli.DurationFlag{Name: "keep-for", EnvVars: clix.EnvVars("KEEP_FOR"), Usage: "keep entries younger than D live (e.g. 24h)"},
		&cli.BoolFlag{Name: "exact", Usage: "trim exactly (XTRIM =) instead of approximately (~, may keep a few more)"},
	}
}

func parsePolicy(c *cli.Context) (archive.Policy, error) {
	p, given, err := flagPolicy(c)
	if err == nil && !given {
		return p, clix.Usagef("--keep-last", "give a retention policy: --keep-last N and/or --keep-for D")
	}
	return p, err
}

// flagPolicy reads --keep-last and --keep-for; given is false when neither
// is set (a run then applies the streams' declared policies).
func flagPolicy(c *cli.Context) (p archive.Policy, given bool, err error) {
	p = archive.Policy{KeepLast: c.Int64("keep-last"), KeepFor: c.Duration("keep-for")}
	switch {
	case p.KeepLast < 0:
		return p, false, clix.Usagef("--keep-last", "must not be negative, got %d", p.KeepLast)
	case p.KeepFor < 0:
		return p, false, clix.Usagef("--keep-for", "must not be negative, got %s", p.KeepFor)
	}
	return p, p.KeepLast > 0 || p.KeepFor > 0, nil
}

func runCommand() *cli.Command {
	flags := slices.DeleteFunc(clix.CommonFlags(), func(f cli.Flag) bool { return f.Names()[0] == clix.FlagStream })
	flags = append(flags, archiveFlags()...)
	flags = append(flags, policyFlags()...)
	flags = append(flags,
		&cli.StringSliceFlag{Name: "stream", EnvVars: clix.EnvVars("STREAM"), Usage: "stream to archive (repeat for several)"},
		&cli.BoolFlag{Name: "all", Usage: "archive every stream of the queue (SCAN), dead-letter streams included"},
		&cli.BoolFlag{Name: "adopt-remote", Usage: "take a remote archive this Redis has no record of as the stream's own (a Redis restored from a backup, an archive from before records were kept); without it such a run refuses to trim"},
		&cli.IntFlag{Name: "concurrency", Value: 4, Usage: "streams archived at once"},
		&cli.Int64Flag{Name: "slice-entries", Value: archive.DefaultSliceEntries, Usage: "entries per commit (each commit holds at most --slice-bytes too)"},
		&cli.Int64Flag{Name: "slice-bytes", Value: archive.DefaultSliceBytes, Usage: "payload bytes per commit (about)"},
		&cli.IntFlag{Name: "max-entry-bytes", EnvVars: clix.EnvVars("MAX_ENTRY_BYTES_ARCHIVE"), Value: 16 << 20,
			Usage: "largest entry archived; a larger one stops the run, named, before its slice is committed (0: no limit)"},
		&cli.Int64Flag{Name: "compact-target", Value: graft.DefaultCompactTarget, Usage: "after its slices a run merges small segments into segments of this many bytes"},
		&cli.Int64Flag{Name: "compact-max", Value: 4 * graft.DefaultCompactTarget, Usage: "bytes a run merges at most (compaction's work per run)"},
		&cli.BoolFlag{Name: "no-compact", Usage: "merge no segments in this run (archiver compact does it on demand)"},
		&cli.DurationFlag{Name: "archive-keep-for", Usage: "the archive's own retention: drop archived history older than this through the fence (gc deletes the objects after its grace; 0: keep forever). Keep it above the longest consumer lag"},
		&cli.StringFlag{Name: "export-to", Usage: "after each stream's commits, export its archived history (up to W) to this target as archiver export does: file:///abs/dir or s3://bucket/prefix?..."},
		&cli.StringFlag{Name: "export-format", Value: string(export.Parquet), Usage: "format of --export-to: parquet or jsonl"},
		&cli.BoolFlag{Name: "loop", Usage: "re-apply the policy every --every until SIGTERM (the retention driver)"},
		&cli.DurationFlag{Name: "every", Value: 30 * time.Second, Usage: "beat of --loop"},
	)
	return &cli.Command{
		Name:   "run",
		Usage:  "archive what the retention policy lets go, commit it behind the fence, then trim",
		Flags:  flags,
		Action: runAction,
	}
}

// streamsOf returns the --stream values, without the one SILT_STREAM gave
// when --all is given: `export SILT_STREAM=events` for the other commands
// must not make `archiver run --all` a usage error.
func streamsOf(c *cli.Context) []string {
	streams := c.StringSlice("stream")
	if !c.Bool("all") || len(streams) == 0 {
		return streams
	}
	for _, name := range clix.EnvVars("STREAM") {
		if v, ok := os.LookupEnv(name); ok && v == strings.Join(streams, ",") {
			return nil
		}
	}
	return streams
}

// target is one stream (or a group's dead letters) to archive.
type target struct {
	Queue  string
	Stream string
	Dead   string // group, for a dead-letter stream
	// own is the keyspace of a stream under its own key (--key); nil for
	// silt's own streams.
	own *stream.Keyspace
}

func (t target) String() string {
	s := "{" + t.Queue + "}:" + t.Stream
	if t.own != nil && t.Dead == "" {
		s, _, _ = t.own.Own()
	}
	if t.Dead != "" {
		s += " (dead letters of " + t.Dead + ")"
	}
	return s
}

// streamResult is one stream's line in the run summary.
type streamResult struct {
	Queue  string `json:"queue"`
	Stream string `json:"stream"`
	Group  string `json:"dead_letters_of,omitempty"`
	// Policy says what the run applied: "declared" (the stream's declared
	// policy), "declared, trim only", "flags" (the command line's), or
	// "none: undeclared" for a stream left alone.
	Policy string `json:"policy"`
	archive.Result
	// Export is what --export-to wrote after the stream's commits.
	Export *export.Result `json:"export,omitempty"`
	Error  string         `json:"error,omitempty"`
	// Unproven: the remote's archive could not be proven against Redis's
	// record; nothing was committed or trimmed (exit 4).
	Unproven bool `json:"unproven,omitempty"`
	// Kept: the run kept live entries at or below W that the archive
	// lacks (kept_unarchived of them; exit 6 when nothing else failed).
	Kept bool `json:"kept,omitempty"`
}

// fail records err as the stream's error.
func (r *streamResult) fail(err error) {
	r.Error = err.Error()
	r.Unproven = r.Unproven || unproven(err)
	r.Kept = r.Kept || errors.Is(err, archive.ErrKeptUnarchived)
}

// unproven reports whether err refused the remote's archive as unproven.
func unproven(err error) bool {
	return errors.Is(err, archive.ErrNotThisArchive) || errors.Is(err, archive.ErrRemoteBehind) || errors.Is(err, graft.ErrForeignRemote)
}

func runAction(c *cli.Context) error {
	p, _, err := flagPolicy(c)
	if err != nil {
		return err
	}
	keyed := c.String(clix.FlagKey) != ""
	if keyed && c.Bool("all") {
		return clix.Usagef("--key", "give --key, or --all, not both")
	}
	if c.String("dead-letters") != "" && c.Bool("all") {
		return clix.Usagef("--dead-letters", "--all takes every dead-letter stream already; give --dead-letters with --stream or --key")
	}
	if !keyed && (len(streamsOf(c)) == 0) == !c.Bool("all") {
		return clix.Usagef("--stream", "give --stream NAME (repeatable), --key KEY or --all, not both")
	}
	for _, name := range streamsOf(c) {
		if err := stream.ValidateName("stream", name); err != nil {
			return clix.Usagef("--stream", "%v", err)
		}
	}
	if !keyed && !c.Bool("all") && c.String(clix.FlagQueue) == "" {
		return clix.Usagef("--queue", "required with --stream (or SILT_QUEUE); --all without --queue covers every queue")
	}
	if c.Int("concurrency") < 1 || c.Int64("slice-entries") < 1 || c.Int64("slice-bytes") < 1 {
		return clix.Usagef("--concurrency", "--concurrency, --slice-entries and --slice-bytes must be at least 1")
	}
	if c.Duration("archive-keep-for") < 0 {
		return clix.Usagef("--archive-keep-for", "--archive-keep-for must not be negative")
	}
	if c.Int64("compact-target") < 1 || c.Int64("compact-max") < 1 {
		return clix.Usagef("--compact-target", "--compact-target and --compact-max must be at least 1 byte")
	}
	var exportFormat export.Format
	if c.IsSet("export-format") && !c.IsSet("export-to") {
		return clix.Usagef("--export-format", "only with --export-to")
	}
	if c.String("export-to") != "" {
		if err := clix.CheckStoreURL(c.String("export-to")); err != nil {
			return clix.Usagef("--export-to", "%v", err)
		}
		if exportFormat, err = export.ParseFormat(c.String("export-format")); err != nil {
			return clix.Usagef("--export-format", "%v", err)
		}
	}
	e, err := openEnv(c, false, true)
	if err != nil {
		return err
	}
	defer e.close()
	if c.String("export-to") != "" {
		if e.exportTo, err = clix.OpenStore(c.Context, c.String("export-to"), fence.ReadWrite); err != nil {
			return fmt.Errorf("export target %s: %w", clix.Redact(c.String("export-to")), err)
		}
		e.exportFormat = exportFormat
	}
	tel, err := telemetry.Setup(c.Context, "silt-archiver")
	if err != nil {
		return err
	}
	defer func() {
		if err := tel.Shutdown(c.Context); err != nil {
			e.log.Warn("metrics not delivered", "error", err.Error())
		}
	}()
	e.metrics = newArchiverMetrics(tel)
	e.store = countingStore{Store: e.store, requests: e.metrics.requests}
	paceCollector()
	if c.String("remote") == "" {
		e.log.Warn("archiving into the embedded local default remote " + e.remote + ": what is trimmed then lives on this disk only; give --remote s3://... for durable storage")
	}
	for {
		failed, unproven, kept, err := runOnce(c, e, p)
		if err != nil {
			return err
		}
		if c.Context.Err() != nil { // a signal stopped the pass; what was committed is trimmed
			return fmt.Errorf("%w by a signal during a pass (see the summary: interrupted)", clix.ErrInterrupted)
		}
		if !c.Bool("loop") {
			if unproven > 0 {
				return fmt.Errorf("%d stream(s) failed, %d of them refused: %w (see the summary)", failed, unproven, archive.ErrNotThisArchive)
			}
			if failed > 0 && kept == failed {
				return fmt.Errorf("%d stream(s) kept live entries at or below W that the archive lacks: %w (see the summary: kept_unarchived, first_kept)", kept, archive.ErrKeptUnarchived)
			}
			if failed > 0 {
				return fmt.Errorf("%d stream(s) failed; see the summary", failed)
			}
			return nil
		}
		select {
		case <-c.Context.Done():
			return nil
		case <-time.After(c.Duration("every")):
		}
	}
}

// runOnce archives every target once, with bounded concurrency, and prints
// one JSON summary line. It returns how many streams failed, how many of
// them because their archive could not be proven, and how many because
// they kept live entries below W that the archive lacks.
func runOnce(c *cli.Context, e *env, p archive.Policy) (failed, unproven, kept int, err error) {
	targets, err := findTargets(c, e)
	if err != nil {
		return 0, 0, 0, err
	}
	results := make([]streamResult, len(targets))
	sem := make(chan struct{}, c.Int("concurrency"))
	var wg sync.WaitGroup
	bar := newProgress(c.App.ErrWriter)
	for i, t := range targets {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			results[i] = archiveOne(c, e, t, p, bar)
		}()
	}
	wg.Wait()
	bar.done()
	for _, r := range results {
		if r.Unproven {
			unproven++
		}
		if r.Kept {
			kept++
		}
		if r.Error != "" {
			failed++
			e.log.Error("archive failed", "stream", r.Stream, "error", r.Error)
		}
	}
	line, _ := json.Marshal(struct {
		Streams     []streamResult `json:"streams"`
		Failed      int            `json:"failed"`
		Interrupted bool           `json:"interrupted,omitempty"` // a signal stopped the pass
		Time        time.Time      `json:"time"`
	}{results, failed, c.Context.Err() != nil, time.Now().UTC()})
	fmt.Fprintf(c.App.Writer, "%s\n", line)
	return failed, unproven, kept, nil
}

// runGCPercent is the collector's pace for archiver run, unless GOGC says
// otherwise: a collection when the heap has grown by half of what the last
// one left live, where Go's default waits for it to double. A run's live
// heap is a slice or two in the works and the archive's index. At Go's
// default a run of 3,000,000 entries peaked about 11% above one of
// 300,000; handing the freed memory back to the OS after every slice held
// that flat but took 40% of a run's time (a full collection a slice, and
// the next slice faulting its memory in again). At 50 both hold: P6 1.008
// (scripts/bench-rss.sh).
const runGCPercent = 50

// paceCollector sets runGCPercent unless the environment sets GOGC.
func paceCollector() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(runGCPercent)
	}
}

func archiveOne(c *cli.Context, e *env, t target, p archive.Policy, bar *progress) streamResult {
	r := streamResult{Queue: t.Queue, Stream: t.Stream, Group: t.Dead, Policy: "flags"}
	var ks stream.Keyspace
	var err error
	if t.own != nil {
		ks = *t.own
	} else if ks, err = stream.NewKeyspace(e.target.Keyspace.Prefix, t.Queue); err != nil {
		r.fail(err)
		return r
	}
	d, declared, done := e.planStream(c, t, ks, p, &r)
	if done {
		return r
	}
	a, err := e.openArchiveIn(c.Context, ks, t.Stream, t.Dead)
	if err != nil {
		r.fail(err)
		return r
	}
	a.SliceEntries, a.SliceBytes, a.Exact = c.Int64("slice-entries"), c.Int64("slice-bytes"), c.Bool("exact")
	a.MaxEntryBytes = c.Int("max-entry-bytes")
	a.Compaction = graft.CompactOptions{Target: c.Int64("compact-target"), MaxBytes: c.Int64("compact-max")}
	a.NoCompact = c.Bool("no-compact")
	a.HistoryKeepFor = c.Duration("archive-keep-for")
	if a.Failpoint, err = clix.FailpointFromEnv(); err != nil {
		r.fail(err)
		return r
	}
	a.RemoteName, a.Adopt = e.remote, c.Bool("adopt-remote")
	attrs := streamAttrs(t.Queue, t.Stream, t.Dead)
	record, final := e.metrics.progress(attrs)
	progress := func(res archive.Result) {
		record(res)
		bar.update(t.String(), res)
	}
	applied := p
	if declared {
		applied = d.Policy
		r.Result, err = a.Apply(c.Context, d, progress)
	} else {
		r.Result, err = a.Run(c.Context, p, progress)
	}
	if err == nil && !a.Exact && r.Archived > 0 && r.Trimmed == 0 {
		e.log.Info("archived entries but trimmed none yet: the default approximate trim (XTRIM MINID ~) removes only whole radix-tree nodes "+
			"(stream-node-max-entries, 100 by default), so archived entries stay live until their node is wholly archived; --exact trims to the entry",
			"stream", t.String(), "archived", r.Archived, "w", r.W)
	}
	final(r.Result)
	if !unproven(err) { // an unproven remote's watermark says nothing
		e.metrics.after(c.Context, a, applied, attrs)
	}
	if errors.Is(err, stream.ErrOversized) { // the library's limit is this command's flag
		err = fmt.Errorf("%w (raise --max-entry-bytes, or remove the entry)", err)
	}
	if err != nil && c.Context.Err() == nil {
		r.fail(err)
	}
	if err == nil && e.exportTo != nil && r.W != "" {
		r.Export, r.Error = e.exportArchived(c.Context, a, r.W)
	}
	return r
}

// planStream decides what archiveOne applies to t: the stream's declared
// policy (dead letters declare none) when the command line gives none, the
// command line's to a stream that declares none; a conflict between them
// is an error. A trim-only policy is applied here. done reports that r is
// final: nothing is left to archive.
func (e *env) planStream(c *cli.Context, t target, ks stream.Keyspace, p archive.Policy, r *streamResult) (d archive.Declared, declared, done bool) {
	var err error
	given := p.KeepLast > 0 || p.KeepFor > 0
	if t.Dead == "" {
		if d, declared, err = archive.DeclaredPolicy(c.Context, stream.NewPolicyStore(e.rdb, ks), t.Stream); err != nil {
			r.fail(err)
			return d, declared, true
		}
	}
	flags := archive.Declared{Policy: p, Exact: c.Bool("exact"), Archive: true}
	switch {
	case declared && given && !d.Same(flags):
		r.Error = fmt.Sprintf("%s declares %s; the command line says %s: remove the flags to apply the declared policy, "+
			"or change it with archiver policy set", ks.Stream(t.Stream), clix.PolicyFlags(&d), clix.PolicyFlags(&flags))
		return d, declared, true
	case !declared && !given && c.Bool("all"):
		r.Policy = "none: undeclared"
		return d, declared, true
	case !declared && !given:
		r.Error = fmt.Sprintf("%s declares no retention policy: give --keep-last N and/or --keep-for D, or declare one with archiver policy set", ks.Stream(t.Stream))
		return d, declared, true
	case declared && !d.Archive:
		r.Policy = "declared, trim only"
		if r.Trimmed, err = e.trimOnly(c.Context, ks, t.Stream, d); err != nil {
			r.fail(err)
		}
		_, final := e.metrics.progress(streamAttrs(t.Queue, t.Stream, t.Dead))
		final(r.Result)
		return d, declared, true
	case declared:
		r.Policy = "declared"
	}
	return d, declared, false
}

// exportArchived exports a's history up to w (what its commits hold) to
// the --export-to target.
func (e *env) exportArchived(ctx context.Context, a *archive.Archive, w string) (*export.Result, string) {
	upTo, err := brand.ParseStreamID(w)
	if err != nil {
		return nil, fmt.Sprintf("export: watermark %q: %v", w, err)
	}
	res, err := exportTo(ctx, a, e.exportTo, export.Options{Format: e.exportFormat}, stream.First, upTo)
	if err != nil {
		return &res, err.Error()
	}
	return &res, ""
}

// trimOnly applies a declared trim-only policy and records the run.
func (e *env) trimOnly(ctx context.Context, ks stream.Keyspace, name string, d archive.Declared) (int64, error) {
	kind, err := clix.ResolveKind(ctx, e.rdb, clix.Target{Keyspace: ks, Kind: e.target.Kind}, name, false)
	if err != nil {
		return 0, err
	}
	l, err := stream.NewLog(e.rdb, ks, name, kind)
	if err != nil {
		return 0, err
	}
	return archive.ApplyTrimOnly(ctx, l, d)
}

// findTargets returns the --stream list, or with --all every stream and
// dead-letter stream found by SCAN (of --queue, or of every queue), on every
// master of a cluster.
func findTargets(c *cli.Context, e *env) ([]target, error) {
	if key := c.String(clix.FlagKey); key != "" {
		ks, name, err := stream.KeyspaceFor(e.target.Keyspace.Prefix, key)
		if err != nil {
			return nil, clix.Usagef("--key", "%v", err)
		}
		// Recorded, so that archiver run --all finds it from now on.
		if err := stream.RecordAdopted(c.Context, e.rdb, ks); err != nil {
			return nil, err
		}
		return []target{{Queue: ks.Queue, Stream: name, Dead: e.deadGroup, own: &ks}}, nil
	}
	ks := e.target.Keyspace
	if !c.Bool("all") {
		var out []target
		for _, s := range streamsOf(c) {
			out = append(out, target{Queue: ks.Queue, Stream: s, Dead: e.deadGroup})
		}
		return out, nil
	}
	match := escapeGlob(ks.Prefix+":{"+ks.Queue+"}:") + "*"
	if ks.Queue == "" {
		match = escapeGlob(ks.Prefix) + ":{*}:*"
	}
	var mu sync.Mutex
	var out []target
	var adopted []stream.Keyspace // queues with streams adopted under their own key
	scan := func(ctx context.Context, client redis.UniversalClient) error {
		iter := client.Scan(ctx, 0, match, 1000).Iterator()
		for iter.Next(ctx) {
			k, ok := stream.ParseKey(iter.Val())
			if !ok || k.Prefix != ks.Prefix || (ks.Queue != "" && k.Queue != ks.Queue) {
				continue
			}
			mu.Lock()
			switch k.Type {
			case "stream":
				out = append(out, target{Queue: k.Queue, Stream: k.Stream})
			case "dead":
				out = append(out, target{Queue: k.Queue, Stream: k.Stream, Dead: k.Group})
			case "adopted":
				adopted = append(adopted, k.Keyspace)
			}
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	if cc, ok := e.rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(c.Context, func(ctx context.Context, n *redis.Client) error { return scan(ctx, n) })
	} else {
		err = scan(c.Context, e.rdb)
	}
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", match, err)
	}
	owned := map[[2]string]*stream.Keyspace{} // queue (the key's hash tag) and name of each adopted stream
	for _, q := range adopted {
		owns, err := stream.AdoptedIn(c.Context, e.rdb, q)
		if err != nil {
			return nil, err
		}
		for _, ks := range owns {
			key, name, _ := ks.Own()
			ks := ks
			owned[[2]string{ks.Queue, name}] = &ks
			if n, err := e.rdb.Exists(c.Context, key).Result(); err != nil {
				return nil, fmt.Errorf("adopted stream %s: %w", key, err)
			} else if n == 0 {
				e.log.Warn("an adopted stream is gone: skipped", "key", key, "record", q.Adopted())
				continue
			}
			out = append(out, target{Queue: ks.Queue, Stream: name, own: &ks})
		}
	}
	// A dead-letter stream of an adopted stream is in the queue its key's
	// hash tag names, which need not be a queue name: it takes the adopted
	// stream's keyspace, or, its adoption record gone, is left alone.
	kept := out[:0]
	for _, t := range out {
		if ks, ok := owned[[2]string{t.Queue, t.Stream}]; ok && t.Dead != "" {
			t.own = ks
		}
		if t.own == nil && stream.ValidateName("queue", t.Queue) != nil {
			e.log.Warn("dead letters of a stream adopted under its own key, whose adoption record is gone: skipped (archiver run --key KEY --dead-letters GROUP reaches them)",
				"queue", t.Queue, "stream", t.Stream, "group", t.Dead)
			continue
		}
		kept = append(kept, t)
	}
	out = kept
	slices.SortFunc(out, func(a, b target) int { return strings.Compare(a.String(), b.String()) })
	return slices.Compact(out), nil
}

// escapeGlob escapes the SCAN MATCH metacharacters of s ({ and } are not
// special to Redis globs, but [ ] * ? \ are).
func escapeGlob(s string) string {
	return strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`).Replace(s)
}

// progress draws one status line on a terminal; it is silent otherwise.
type progress struct {
	mu  sync.Mutex
	w   io.Writer
	on  bool
	any bool
}

func newProgress(w io.Writer) *progress {
	f, ok := w.(*os.File)
	on := false
	if ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			on = true
		}
	}
	return &progress{w: w, on: on}
}

func (p *progress) update(name string, r archive.Result) {
	if !p.on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.any = true
	fmt.Fprintf(p.w, "\r\033[K%s: %d archived in %d commits, %d trimmed, W %s", name, r.Archived, r.Commits, r.Trimmed, r.W)
}

func (p *progress) done() {
	if p.on && p.any {
		fmt.Fprintln(p.w)
	}
}
