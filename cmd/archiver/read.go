package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/silt-dev/silt/cmd/internal/clix"
	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

func readCommand() *cli.Command {
	return &cli.Command{
		Name:  "read",
		Usage: "print the stream's whole history (archive and live merged) by id range or time window",
		Flags: append(append(clix.CommonFlags(), archiveFlags()...), archiveOnlyFlag(),
			&cli.StringFlag{Name: "from", Value: "-", Usage: "first id, inclusive: -, a branded id or <ms>-<seq>"},
			&cli.StringFlag{Name: "to", Value: "+", Usage: "last id, inclusive: +, a branded id or <ms>-<seq>"},
			&cli.StringFlag{Name: "since", Usage: "entries minted at or after TIME (RFC 3339, Unix ms, or a duration ago: 36h)"},
			&cli.StringFlag{Name: "window", Usage: "entries minted from T0 to T1, both included: T0,T1"},
			&cli.StringFlag{Name: "format", Value: "jsonl", Usage: "jsonl or text"},
		),
		Action: readAction,
	}
}

// record is one line of `archiver read --format jsonl`.
type record struct {
	ID       string            `json:"id"`
	StreamID string            `json:"stream_id"`
	Fields   map[string]string `json:"fields"`
	// FieldsBase64 holds the fields whose name or value is not UTF-8, both
	// base64 encoded.
	FieldsBase64 map[string]string `json:"fields_base64,omitempty"`
	Source       string            `json:"source"`
	Error        string            `json:"error,omitempty"`
}

func readAction(c *cli.Context) error {
	target, err := clix.ParseTarget(c)
	if err != nil {
		return err
	}
	if _, _, err := readBounds(c, "", "to"); err != nil {
		return err
	}
	write, err := formatter(c.String("format"))
	if err != nil {
		return err
	}
	e, err := openEnv(c, true, false)
	if err != nil {
		return err
	}
	defer e.close()
	a, err := e.openArchive(c.Context, target.Stream, e.deadGroup)
	if err != nil {
		return err
	}
	from, to, err := readBounds(c, a.Log().Kind(), "to") // branded bounds are checked against the stream's kind
	if err != nil {
		return err
	}
	return printEntries(c, a, from, to, write, e.log)
}

func printEntries(c *cli.Context, a *archive.Archive, from, to brand.StreamID, write writeFunc, logger *slog.Logger) error {
	out := bufio.NewWriterSize(c.App.Writer, 64<<10)
	defer out.Flush()
	n, malformed, archived := 0, 0, 0
	for it, err := range a.Read(c.Context, from, to) {
		rec := record{ID: it.ID.String(), StreamID: it.StreamID.String(), Fields: it.Fields, Source: it.Source}
		var me *stream.MalformedError
		switch {
		case errors.As(err, &me):
			malformed++
			rec.ID, rec.Error = me.RawID, me.Reason
			logger.Warn("malformed entry", "key", me.Key, "stream_id", me.StreamID.String(), "reason", me.Reason, "source", it.Source)
		case err != nil:
			return fmt.Errorf("read after %d entries: %w", n, err)
		}
		if err := write(out, rec); err != nil {
			return err
		}
		n++
		if it.Source == archive.SourceArchive {
			archived++
		}
	}
	logger.Info("read done", "entries", n, "from_archive", archived, "live", n-archived, "malformed", malformed)
	return out.Flush()
}

// readBounds turns --from/--<toFlag>, --since or --window into inclusive
// bounds (export names its last id --until: its --to is the target).
func readBounds(c *cli.Context, kind brand.Kind, toFlag string) (from, to brand.StreamID, err error) {
	ranged := c.IsSet("from") || c.IsSet(toFlag)
	switch {
	case c.IsSet("window") && (c.IsSet("since") || ranged):
		return from, to, clix.Usagef("--window", "cannot be combined with --since, --from or --%s", toFlag)
	case c.IsSet("since") && ranged:
		return from, to, clix.Usagef("--since", "cannot be combined with --from or --%s", toFlag)
	case c.IsSet("window"):
		return clix.ParseWindow("--window", c.String("window"))
	case c.IsSet("since"):
		t0, err := clix.ParseTime("--since", c.String("since"))
		return brand.WindowStart(t0), stream.Last, err
	}
	if from, err = clix.ParseBound("--from", c.String("from"), kind); err != nil {
		return from, to, err
	}
	if to, err = clix.ParseBound("--"+toFlag, c.String(toFlag), kind); err != nil {
		return from, to, err
	}
	return from, to, nil
}

type writeFunc func(w *bufio.Writer, r record) error

func formatter(name string) (writeFunc, error) {
	switch name {
	case "jsonl":
		return writeJSON, nil
	case "text":
		return writeText, nil
	}
	return nil, clix.Usagef("--format", "%q is not jsonl or text", name)
}

func writeJSON(w *bufio.Writer, r record) error {
	r.Fields, r.FieldsBase64 = stream.SplitBinary(r.Fields)
	if r.Fields == nil {
		r.Fields = map[string]string{}
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	w.Write(b)
	return w.WriteByte('\n')
}

// writeText prints "<id> <stream id> <source> k=v ...", quoting values that
// are not plain words so that each entry stays on one line.
func writeText(w *bufio.Writer, r record) error {
	id := r.ID
	if r.Error != "" {
		id = "MALFORMED(" + strconv.Quote(r.ID) + ": " + r.Error + ")"
	}
	fmt.Fprintf(w, "%s %s %s", id, r.StreamID, r.Source)
	for _, k := range slices.Sorted(maps.Keys(r.Fields)) {
		fmt.Fprintf(w, " %s=%s", quoteIfNeeded(k), quoteIfNeeded(r.Fields[k]))
	}
	_, err := io.WriteString(w, "\n")
	return err
}

func quoteIfNeeded(s string) string {
	if s == "" || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == '"' || r == '=' || r > '~' }) {
		return strconv.Quote(s)
	}
	return s
}
