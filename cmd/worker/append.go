package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/urfave/cli/v2"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/silt-dev/silt/cmd/internal/clix"
	"github.com/silt-dev/silt/internal/telemetry"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

func appendCommand() *cli.Command {
	return &cli.Command{
		Name:      "append",
		Usage:     "append one entry (field=value ...) or JSON lines from stdin; prints the branded ids",
		ArgsUsage: "[field=value ...]",
		Flags: append(clix.CommonFlags(),
			&cli.IntFlag{Name: "batch", Value: stream.DefaultBatchSize, Usage: "entries per pipelined batch when reading stdin"},
			&cli.BoolFlag{Name: "new-kind", Usage: "let --kind name a kind that is not built in: a new stream's first append records it"},
			&cli.IntFlag{Name: "max-line-bytes", Value: 1 << 20, Usage: "longest JSON line accepted from stdin"},
			&cli.BoolFlag{Name: "trace", Usage: "stamp each entry with a W3C traceparent field (a child of $TRACEPARENT when set; kept when a line has one): workers continue the trace"},
			&cli.StringFlag{Name: "id", Usage: "append one entry (field=value arguments) under this branded id, once: a retry finds the entry its first try wrote and succeeds; other fields under the id are refused"},
			&cli.IntFlag{Name: "wait-replicas", Usage: "print an id only once N replicas hold its entry (WAIT); short of that exit 7 naming the entries that may or may not exist", EnvVars: []string{"SILT_WAIT_REPLICAS"}},
			&cli.DurationFlag{Name: "wait-timeout", Value: 5 * time.Second, Usage: "how long --wait-replicas waits for the replicas (0: for ever)"},
			maxEntryBytesFlag(),
		),
		Action: appendAction,
	}
}

func appendAction(c *cli.Context) error {
	target, err := clix.ParseTarget(c)
	if err != nil {
		return err
	}
	if c.Int("batch") < 1 {
		return clix.Usagef("--batch", "must be at least 1, got %d", c.Int("batch"))
	}
	if c.Int("wait-replicas") < 0 || c.Duration("wait-timeout") < 0 {
		return clix.Usagef("--wait-replicas", "--wait-replicas and --wait-timeout must not be negative")
	}
	if c.Int("max-entry-bytes") < 0 {
		return clix.Usagef("--max-entry-bytes", "must be 0 (no limit) or more, got %d", c.Int("max-entry-bytes"))
	}
	var fields stream.Fields
	if c.NArg() > 0 {
		if fields, err = parseFieldArgs(c.Args().Slice()); err != nil {
			return err
		}
	}
	sess, err := clix.OpenSession(c, target)
	if err != nil {
		return err
	}
	defer sess.Close()
	log := sess.Log
	log.MaxEntryBytes = c.Int("max-entry-bytes")
	log.BatchSize = c.Int("batch")
	log.WaitReplicas, log.WaitTimeout = c.Int("wait-replicas"), c.Duration("wait-timeout")
	stamp := func(stream.Fields) {}
	if c.Bool("trace") {
		tel, err := telemetry.Setup(c.Context, "silt-worker")
		if err != nil {
			return err
		}
		defer flushTelemetry(c.Context, tel, sess.Logger)
		stamp = traceStamper(tel, target.Stream)
	}
	if raw := c.String("id"); raw != "" {
		return appendOnce(c, log, raw, fields, stamp)
	}
	if fields != nil {
		stamp(fields)
		id, err := log.Append(c.Context, fields)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(c.App.Writer, id)
		return err
	}
	n, err := appendLines(c, log, stamp)
	if err == nil && n == 0 {
		// A producer upstream that wrote nothing, or a forgotten pipe: say
		// so rather than exit in silence.
		sess.Logger.Warn("stdin held no entries (no field=value arguments, no JSON lines): nothing appended", "stream", log.Key())
	}
	return err
}

// appendOnce appends one entry under the branded id --id names, once
// (stream.Log.AppendIdempotent), and prints the id.
func appendOnce(c *cli.Context, log *stream.Log, raw string, fields stream.Fields, stamp func(stream.Fields)) error {
	id, err := brand.Parse(raw)
	if err != nil {
		return clix.Usagef("--id", "%v", err)
	}
	if fields == nil {
		return clix.Usagef("--id", "give the entry as field=value arguments (one entry under one id)")
	}
	if c.Bool("trace") {
		return clix.Usagef("--trace", "not with --id: a retry would stamp another traceparent, and its fields would not match the first try's")
	}
	stamp(fields)
	if _, err := log.AppendIdempotent(c.Context, id, fields); err != nil {
		return err
	}
	_, err = fmt.Fprintln(c.App.Writer, id)
	return err
}

// traceStamper returns a function that gives an entry a traceparent field:
// a producer span's, the child of $TRACEPARENT when the caller runs in a
// trace. An entry that has one keeps it.
func traceStamper(tel *telemetry.Telemetry, streamName string) func(stream.Fields) {
	parent := telemetry.Propagator.Extract(context.Background(), propagation.MapCarrier{traceparentField: os.Getenv("TRACEPARENT")})
	return func(f stream.Fields) {
		if f[traceparentField] != "" {
			return
		}
		ctx, span := tel.Tracer.Start(parent, "send "+streamName, trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(telemetry.KeySystem.String("redis"), telemetry.KeyDestination.String(streamName),
				telemetry.KeyOperation.String("send")))
		f[traceparentField] = traceparentOf(ctx)
		span.End()
	}
}

// parseFieldArgs reads field=value arguments.
func parseFieldArgs(args []string) (stream.Fields, error) {
	fields := make(stream.Fields, len(args))
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return nil, clix.Usagef(fmt.Sprintf("argument %q", a), "want field=value")
		}
		if k == stream.IDField {
			return nil, clix.Usagef(fmt.Sprintf("argument %q", a), "field %q holds the branded id and is set by silt", k)
		}
		fields[k] = v
	}
	return fields, nil
}

// appendLines appends JSON lines from stdin in batches. On a bad line, the
// lines before it are appended and their ids printed; the error names the line.
func appendLines(c *cli.Context, log *stream.Log, stamp func(stream.Fields)) (appended int, err error) {
	out := bufio.NewWriter(c.App.Writer)
	defer out.Flush()
	in := bufio.NewScanner(c.App.Reader)
	in.Buffer(make([]byte, 64<<10), c.Int("max-line-bytes"))
	batch := make([]stream.Fields, 0, c.Int("batch"))
	lineNo := 0
	flush := func() error {
		ids, err := log.AppendBatch(c.Context, batch)
		for _, id := range ids {
			fmt.Fprintln(out, id)
		}
		appended += len(ids)
		batch = batch[:0]
		if err != nil {
			return err
		}
		return out.Flush()
	}
	for in.Scan() {
		lineNo++
		fields, err := parseLine(in.Bytes())
		if err == nil && fields != nil {
			err = log.Check(fields)
		}
		if err != nil {
			if ferr := flush(); ferr != nil {
				return appended, ferr
			}
			return appended, fmt.Errorf("stdin line %d: %v (appended %d entries before it)", lineNo, err, appended)
		}
		if fields == nil {
			continue
		}
		stamp(fields)
		if batch = append(batch, fields); len(batch) == cap(batch) {
			if err := flush(); err != nil {
				return appended, fmt.Errorf("after stdin line %d: %w (appended %d entries)", lineNo, err, appended)
			}
		}
	}
	if err := flush(); err != nil {
		return appended, fmt.Errorf("at end of stdin: %w (appended %d entries)", err, appended)
	}
	if err := in.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return appended, fmt.Errorf("stdin line %d: longer than --max-line-bytes %d (appended %d entries before it)",
				lineNo+1, c.Int("max-line-bytes"), appended)
		}
		return appended, fmt.Errorf("read stdin: %w (appended %d entries)", err, appended)
	}
	return appended, nil
}

// parseLine decodes one JSON object of string fields; a blank line gives nil.
func parseLine(line []byte) (stream.Fields, error) {
	if len(bytes.TrimSpace(line)) == 0 {
		return nil, nil
	}
	// Never change input: encoding/json would turn invalid UTF-8 into
	// U+FFFD, null into "", and keep the last of two equal keys.
	if !utf8.Valid(line) {
		return nil, fmt.Errorf("invalid UTF-8 at byte %d; give binary fields base64-encoded under %q", invalidAt(line), base64Key)
	}
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("not a JSON object: %v", err)
	}
	if raw == nil {
		return nil, errors.New("not a JSON object: null")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("text after the JSON object")
	}
	if err := noRepeatedKeys(line, len(raw)); err != nil {
		return nil, err
	}
	fields := make(stream.Fields, len(raw))
	for k, v := range raw {
		switch {
		case k == stream.IDField:
			return nil, fmt.Errorf("field %q holds the branded id and is set by silt", k)
		case k == base64Key:
			if err := addBase64(fields, v); err != nil {
				return nil, err
			}
			continue
		case string(bytes.TrimSpace(v)) == "null":
			return nil, fmt.Errorf("field %q is null; a field's value is a string (give \"\" for empty)", k)
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return nil, fmt.Errorf("field %q: value %s is not a string", k, v)
		}
		if _, dup := fields[k]; dup {
			return nil, fmt.Errorf("field %q is given twice", k)
		}
		fields[k] = s
	}
	return fields, nil
}

// base64Key holds, in a JSON line, fields whose name or value is not UTF-8:
// an object of base64 name to base64 value, as archiver read and the
// worker's deliveries write them ("fields_base64" / "payload_base64").
const base64Key = "fields_base64"

// addBase64 decodes the base64 fields of a line into fields.
func addBase64(fields stream.Fields, v json.RawMessage) error {
	var enc map[string]string
	if err := json.Unmarshal(v, &enc); err != nil || enc == nil {
		return fmt.Errorf("%q must be an object of base64 name to base64 value", base64Key)
	}
	for k64, v64 := range enc {
		k, kerr := base64.StdEncoding.DecodeString(k64)
		val, verr := base64.StdEncoding.DecodeString(v64)
		if kerr != nil || verr != nil {
			return fmt.Errorf("%q: %q: %q is not base64", base64Key, k64, v64)
		}
		if _, dup := fields[string(k)]; dup || string(k) == stream.IDField {
			return fmt.Errorf("%q: field %q is given twice or is reserved", base64Key, k)
		}
		fields[string(k)] = string(val)
	}
	return nil
}

// noRepeatedKeys refuses an object that names a key twice (the decoded map
// holds n keys: fewer than the object's).
func noRepeatedKeys(line []byte, n int) error {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.Token() // {
	keys := 0
	for dec.More() {
		if _, err := dec.Token(); err != nil {
			return nil // the decode above has judged the syntax
		}
		keys++
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	if keys != n {
		return errors.New("a field is given twice")
	}
	return nil
}

// invalidAt returns the offset of the first invalid UTF-8 byte.
func invalidAt(b []byte) int {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size <= 1 {
			return i
		}
		i += size
	}
	return len(b)
}
