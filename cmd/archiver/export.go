package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/silt-dev/silt/cmd/internal/clix"
	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/export"
	"github.com/silt-dev/silt/pkg/fence"
)

func exportCommand() *cli.Command {
	return &cli.Command{
		Name:  "export",
		Usage: "write the stream's merged history as Parquet or JSON lines files under Hive partitions (stream=/date=/hour=), incrementally",
		Description: "Each run exports what the target does not hold yet (a manifest chain under _silt/export/ records what it covers)\n" +
			"and resumes a killed run. DuckDB: SELECT * FROM read_parquet('<dir>/stream=*/*/*/*.parquet', hive_partitioning=true).",
		Flags: append(append(clix.CommonFlags(), archiveFlags()...), archiveOnlyFlag(),
			&cli.StringFlag{Name: "to", Usage: "export target: file:///abs/dir or s3://bucket/prefix?... (the --remote forms; written in plain text)"},
			&cli.StringFlag{Name: "format", Value: string(export.Parquet), Usage: "parquet (zstd) or jsonl; one format per target"},
			&cli.StringFlag{Name: "from", Value: "-", Usage: "first id, inclusive: -, a branded id or <ms>-<seq>"},
			&cli.StringFlag{Name: "until", Value: "+", Usage: "last id, inclusive: +, a branded id or <ms>-<seq>"},
			&cli.StringFlag{Name: "since", Usage: "entries minted at or after TIME (RFC 3339, Unix ms, or a duration ago: 36h)"},
			&cli.StringFlag{Name: "window", Usage: "entries minted from T0 to T1, both included: T0,T1"},
			&cli.IntFlag{Name: "max-file-rows", Value: export.DefaultMaxRows, Usage: "rows per file at most (a file also ends with its hour)"},
			&cli.Int64Flag{Name: "max-file-bytes", Value: export.DefaultMaxBytes, Usage: "payload bytes per file, about"},
			&cli.BoolFlag{Name: "verify", Usage: "check the target's export instead (manifest chain, every file's size and SHA-256)"},
		),
		Action: exportAction,
	}
}

// exportSummary is the JSON line an export prints.
type exportSummary struct {
	Queue  string `json:"queue"`
	Stream string `json:"stream"`
	Target string `json:"target"`
	Format string `json:"format"`
	export.Result
	Verified bool `json:"verified,omitempty"`
}

func exportAction(c *cli.Context) error {
	target, err := clix.ParseTarget(c)
	if err != nil {
		return err
	}
	if c.String("to") == "" {
		return clix.Usagef("--to", "required: the export target (file:///abs/dir or s3://bucket/prefix)")
	}
	if err := clix.CheckStoreURL(c.String("to")); err != nil {
		return clix.Usagef("--to", "%v", err)
	}
	format, err := export.ParseFormat(c.String("format"))
	if err != nil {
		return clix.Usagef("--format", "%v", err)
	}
	if c.Int("max-file-rows") < 1 || c.Int64("max-file-bytes") < 1 {
		return clix.Usagef("--max-file-rows", "--max-file-rows and --max-file-bytes must be at least 1")
	}
	if _, _, err := readBounds(c, "", "until"); err != nil {
		return err
	}
	mode := fence.ReadWrite
	if c.Bool("verify") {
		mode = fence.ReadOnly
	}
	dst, err := clix.OpenStore(c.Context, c.String("to"), mode)
	if err != nil {
		return fmt.Errorf("export target %s: %w", clix.Redact(c.String("to")), err)
	}
	sum := exportSummary{Queue: target.Keyspace.Queue, Stream: target.Stream, Target: clix.Redact(c.String("to")), Format: string(format)}
	if c.Bool("verify") {
		if sum.Result, err = export.VerifyReport(c.Context, dst, target.Stream); err != nil {
			return err
		}
		sum.Verified = true
		return printJSON(c, sum)
	}
	e, err := openEnv(c, true, false)
	if err != nil {
		return err
	}
	defer e.close()
	if _, encrypted := e.store.(*fence.Encrypted); encrypted {
		e.log.Warn("the archive is encrypted; the export is written in plain text: protect the target (SSE parameters of an s3 URL, bucket policy)")
	}
	a, err := e.openArchive(c.Context, target.Stream, e.deadGroup)
	if err != nil {
		return err
	}
	from, to, err := readBounds(c, a.Log().Kind(), "until")
	if err != nil {
		return err
	}
	opt := export.Options{Format: format, MaxRows: c.Int("max-file-rows"), MaxBytes: c.Int64("max-file-bytes"),
		Progress: func(m export.Manifest) { e.log.Debug("exported", "file", m.File, "rows", m.Rows, "bytes", m.Bytes) }}
	started := time.Now()
	sum.Result, err = exportTo(c.Context, a, dst, opt, from, to)
	e.log.Info("export done", "files", sum.Files, "rows", sum.Rows, "bytes", sum.Bytes, "up_to", sum.UpTo, "took", time.Since(started).Round(time.Millisecond))
	if perr := printJSON(c, sum); err == nil {
		err = perr
	}
	return err
}

// exportTo runs one export of a's history from..to into dst.
func exportTo(ctx context.Context, a *archive.Archive, dst fence.Store, opt export.Options, from, to brand.StreamID) (export.Result, error) {
	x, err := export.New(a, dst, opt)
	if err != nil {
		return export.Result{}, err
	}
	return x.Run(ctx, from, to)
}

func printJSON(c *cli.Context, v any) error {
	line, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.App.Writer, "%s\n", line)
	return err
}
