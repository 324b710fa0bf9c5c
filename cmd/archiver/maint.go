package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/urfave/cli/v2"

	"github.com/silt-dev/silt/cmd/internal/clix"
	"github.com/silt-dev/silt/internal/telemetry"
	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/graft"
	"github.com/silt-dev/silt/pkg/stream"
)

func withArchive(extra ...cli.Flag) []cli.Flag {
	return append(append(clix.CommonFlags(), archiveFlags()...), extra...)
}

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "watermark, last LSN, archived and live counts, completeness, sizes",
		Flags: withArchive(&cli.BoolFlag{Name: "json", Usage: "print JSON (--format json)"},
			&cli.StringFlag{Name: "format", Value: "text", Usage: "text, json, openmetrics, or prometheus (text 0.0.4, for node_exporter's textfile collector)"}),
		Before: func(c *cli.Context) error { return clix.CheckStatusFormat(c) },
		Action: onArchive(false, func(c *cli.Context, e *env, a *archive.Archive) error {
			st, err := a.Status(c.Context, e.dataDir)
			if err != nil {
				return err
			}
			if f := clix.StatusFormat(c); f == telemetry.FormatOpenMetrics || f == telemetry.FormatPrometheus {
				return archiveExposition(e.target.Keyspace.Queue, e.target.Stream, st).Write(c.App.Writer, f)
			}
			if clix.StatusFormat(c) == "json" {
				b, _ := json.MarshalIndent(st, "", "  ")
				_, err = fmt.Fprintf(c.App.Writer, "%s\n", b)
				return err
			}
			tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "stream\t%s\nvolume\t%s\nwatermark W\t%s\nlast LSN\t%d\n", st.Stream, st.Volume, st.W, st.LSN)
			switch r := st.PolicyLastRun; {
			case st.Policy == nil:
				fmt.Fprintf(tw, "retention policy\tnone declared (archiver policy set)\n")
			case r == nil:
				fmt.Fprintf(tw, "retention policy\t%s, never ran\n", clix.PolicyFlags(st.Policy))
			case r.Error != "":
				fmt.Fprintf(tw, "retention policy\t%s, last ran %s and failed: %s\n", clix.PolicyFlags(st.Policy), r.At.Format(time.RFC3339), r.Error)
			default:
				fmt.Fprintf(tw, "retention policy\t%s, last ran %s: archived %d, trimmed %d\n", clix.PolicyFlags(st.Policy), r.At.Format(time.RFC3339), r.Archived, r.Trimmed)
			}
			fmt.Fprintf(tw, "archived\t%d entries, %d bytes (%d malformed, archived as they are)\n", st.Archived, st.ArchivedBytes, st.Malformed)
			fmt.Fprintf(tw, "live\t%d entries (XLEN), %d above W\n", st.Live, st.LiveUnarchived)
			fmt.Fprintf(tw, "entries added\t%d\n", st.EntriesAdded)
			if st.RecordBehind {
				fmt.Fprintf(tw, "record\tRedis records commit %d, the remote's head is %d: an archiver is between a commit and its record (running), a run died there, or this Redis "+
					"is a promoted replica or was restored from a backup that never saw commits %d-%d (a failover); the next archiver run proves them, "+
					"counts what this Redis never held and records the head\n", st.RecordLSN, st.LSN, st.RecordLSN+1, st.LSN)
			}
			if st.Recovered > 0 {
				fmt.Fprintf(tw, "recovered\t%d archived entries this Redis never held (another node's commits: a failover or a split brain); read from the archive\n", st.Recovered)
			}
			if st.LiveBelowUnarchived > 0 {
				fmt.Fprintf(tw, "kept below W\t%d live entries at or below W that the archive lacks (the lowest %s): another node wrote them (a failover, "+
					"a split brain) or the record was restored; kept live, never trimmed, read from there (docs/operations.md, \"After a failover\")\n",
					st.LiveBelowUnarchived, st.FirstBelowUnarchived)
			}
			switch {
			case !st.Settled:
				fmt.Fprintf(tw, "completeness\tnot judged: an archiver committed and trimmed between the remote's read and the stream's count in each of the reads; read again\n")
			case st.AwaitingRecord:
				fmt.Fprintf(tw, "completeness\tnot judged until a run records the remote's head: the commits above the record hold entries this Redis never had (see record)\n")
			case st.Complete && st.Recovered > 0:
				fmt.Fprintf(tw, "completeness\tcomplete: entries added = archived - recovered + live above W\n")
			case st.Complete:
				fmt.Fprintf(tw, "completeness\tcomplete: entries added = archived + live above W\n")
			case st.LiveBelowUnarchived > 0 && st.LostOutside == 0 && st.TrimmedUnarchived == 0 && !st.Recreated:
				fmt.Fprintf(tw, "completeness\tnothing lost: entries added = archived - recovered + live above W + kept below W, and the archive lacks the kept ones\n")
			case st.Recreated:
				fmt.Fprintf(tw, "completeness\tunknown: entries added (%d) < archived + live above W (%d): the stream was recreated "+
					"(Redis restarted without persistence, FLUSHALL or DEL); what was not archived before is gone\n",
					st.EntriesAdded, st.Archived+st.LiveUnarchived)
			case st.LostOutside == 0:
				fmt.Fprintf(tw, "completeness\t%d entries removed unarchived by archiver trim (recorded; gone for good): entries added = archived + live above W + those\n", st.TrimmedUnarchived)
			case st.TrimmedUnarchived > 0:
				fmt.Fprintf(tw, "completeness\t%d entries removed unarchived by archiver trim (recorded), and %d more outside silt (MAXLEN, XDEL)\n", st.TrimmedUnarchived, st.LostOutside)
			default:
				fmt.Fprintf(tw, "completeness\t%d entries removed outside silt (MAXLEN, XDEL)\n", st.LostOutside)
			}
			if st.OldestUnarchived != "" {
				fmt.Fprintf(tw, "oldest unarchived\t%s (%s old)\n", st.OldestUnarchived, time.Duration(st.OldestAgeSec*float64(time.Second)).Round(time.Second))
			}
			fmt.Fprintf(tw, "remote size\t%d bytes in %d live segments (checkpoint at LSN %d)\nlocal size\t%d bytes\n", st.RemoteBytes, st.Segments, st.CheckpointLSN, st.LocalBytes)
			return tw.Flush()
		}),
	}
}

// archiveExposition is archiver status as metrics.
func archiveExposition(queue, name string, st archive.Status) *telemetry.Exposition {
	x := telemetry.NewExposition()
	l := prometheus.Labels{"queue": queue, "stream": name}
	if w, err := brand.ParseStreamID(st.W); err == nil && st.W != "" {
		x.Gauge("silt_archive_watermark_timestamp_seconds", "Mint time of the watermark W, the last archived entry.", l, float64(w.MS)/1000)
		x.Gauge("silt_archive_lag_seconds", "Now minus the mint time of W.", l, time.Since(w.Time()).Seconds())
	}
	x.Gauge("silt_archive_lsn", "The archive's last commit (LSN).", l, float64(st.LSN))
	x.Counter("silt_archive_archived_entries", "Entries in the archive.", l, float64(st.Archived))
	x.Counter("silt_archive_archived_bytes", "Record bytes in the archive.", l, float64(st.ArchivedBytes))
	x.Gauge("silt_archive_live_entries", "Entries in the live stream (XLEN).", l, float64(st.Live))
	x.Gauge("silt_archive_live_unarchived_entries", "Live entries above W, not archived yet.", l, float64(st.LiveUnarchived))
	x.Gauge("silt_archive_oldest_unarchived_age_seconds", "Age of the oldest live entry above W (0: none).", l, st.OldestAgeSec)
	x.Gauge("silt_archive_live_below_w_unarchived_entries", "Live entries at or below W that the archive lacks (another node wrote them: a failover); kept live.", l, float64(st.LiveBelowUnarchived))
	x.Counter("silt_archive_recovered_entries", "Archived entries this Redis never held (another node's commits: a failover).", l, float64(st.Recovered))
	x.Gauge("silt_archive_trimmed_unarchived_entries", "Entries archiver trim (or a trim-only policy) removed above W, recorded.", l, float64(st.TrimmedUnarchived))
	x.Gauge("silt_archive_status_settled", "1 when the counts and the remote's commit were read as one view; 0 when an archiver moved it during every read (completeness not judged).", l, b2f(st.Settled))
	if st.Settled { // else a trim between the reads would read as a loss: no sample rather than a false one
		x.Gauge("silt_archive_lost_outside_entries", "Entries removed outside silt (MAXLEN, XDEL): entries added - archived - live above W - trimmed unarchived.", l, float64(st.LostOutside))
		x.Gauge("silt_archive_complete", "1 when entries added = archived + live above W.", l, b2f(st.Complete))
	}
	x.Gauge("silt_archive_remote_bytes", "Bytes of the live segments on the remote.", l, float64(st.RemoteBytes))
	x.Gauge("silt_archive_segments", "Live segments on the remote.", l, float64(st.Segments))
	x.Gauge("silt_archive_local_bytes", "Bytes under the volume's local directory.", l, float64(st.LocalBytes))
	return x
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func verifyCommand() *cli.Command {
	return &cli.Command{
		Name:  "verify",
		Usage: "check the hash chain, every checksum and every watermark, remote and local, and the remote against Redis's record; names the first bad object",
		Flags: withArchive(),
		Action: onArchive(false, func(c *cli.Context, e *env, a *archive.Archive) error {
			remote, err := a.Volume().VerifyRemote(c.Context)
			if err != nil {
				return fmt.Errorf("remote: %w%s", err, remoteRepair(err))
			}
			// The local copies before the watermarks: the watermarks are read
			// through the local segments, and a corrupt one is the local
			// copy's fault, named so, not the remote's.
			local, err := a.Volume().VerifyLocal(c.Context)
			if err != nil {
				return fmt.Errorf("local: %w (repair with: archiver pull)", err)
			}
			marks, err := a.VerifyWatermarks(c.Context)
			if err != nil {
				return fmt.Errorf("watermarks: %w%s", err, remoteRepair(err))
			}
			out := map[string]any{"remote": remote, "watermarks": marks, "local": local, "ok": true}
			// The remote was proven against Redis's record when it was opened.
			if rec, ok, err := a.Log().ArchiveRecord(c.Context); err == nil && ok {
				out["anchor"] = map[string]any{"lsn": rec.LSN, "w": rec.W, "hash": rec.Hash}
			}
			return clix.PrintJSON(c.App.Writer, out)
		}),
	}
}

// remoteRepair is the repair verify names for a corrupt remote object (the
// library names the object; the command names what to run). Missing
// commits get theirs from clix.Run, whichever command met them.
func remoteRepair(err error) string {
	switch {
	case errors.Is(err, graft.ErrMissingCommits):
		return ""
	case errors.Is(err, graft.ErrCorrupt) && errors.Is(err, graft.ErrBadIndex):
		return " (repair: archiver reindex rebuilds the checkpoint and its index from the commit chain)"
	case errors.Is(err, graft.ErrCorrupt):
		return " (repair: restore the named object from the bucket's versioning or from a data directory that verifies, byte for byte; docs/operations.md, \"A corrupt object or page file\"; archiver gc removes segments no commit references)"
	}
	return ""
}

func pullCommand() *cli.Command {
	return &cli.Command{
		Name:  "pull",
		Usage: "rebuild the local page files from the remote (repairs a corrupt local copy)",
		Flags: withArchive(),
		Action: onArchive(false, func(c *cli.Context, e *env, a *archive.Archive) error {
			rep, err := a.Volume().Pull(c.Context)
			if err != nil {
				return err
			}
			return clix.PrintJSON(c.App.Writer, rep)
		}),
	}
}

func reindexCommand() *cli.Command {
	return &cli.Command{
		Name:  "reindex",
		Usage: "rebuild the checkpoint index from the commit chain (when verify names a corrupt index node)",
		Flags: withArchive(),
		Action: onArchive(true, func(c *cli.Context, e *env, a *archive.Archive) error {
			lsn, err := a.Volume().RebuildIndex(c.Context)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(c.App.Writer, "{\"checkpoint_lsn\":%d}\n", lsn)
			return err
		}),
	}
}

func compactCommand() *cli.Command {
	return &cli.Command{
		Name:  "compact",
		Usage: "merge runs of small segments into large ones (archiver run does a bounded amount of this after its slices)",
		Flags: withArchive(
			&cli.Int64Flag{Name: "target", Value: graft.DefaultCompactTarget, Usage: "bytes of a merged segment"},
			&cli.IntFlag{Name: "min-entries", Value: graft.DefaultCompactMinEntries, Usage: "merge a run of this many small segments even below --target"},
			&cli.Int64Flag{Name: "max-bytes", Value: 1 << 40, Usage: "bytes merged at most by this command"},
		),
		Action: onArchive(true, func(c *cli.Context, e *env, a *archive.Archive) error {
			if c.Int64("target") < 1 || c.Int("min-entries") < 2 || c.Int64("max-bytes") < 1 {
				return clix.Usagef("--target", "--target and --max-bytes must be at least 1 byte, --min-entries at least 2")
			}
			var err error
			if a.Failpoint, err = clix.FailpointFromEnv(); err != nil {
				return err
			}
			res, err := a.Compact(c.Context, graft.CompactOptions{Target: c.Int64("target"), MinEntries: c.Int("min-entries"), MaxBytes: c.Int64("max-bytes")})
			if err != nil {
				return err
			}
			return clix.PrintJSON(c.App.Writer, res)
		}),
	}
}

func gcCommand() *cli.Command {
	return &cli.Command{
		Name:  "gc",
		Usage: "remove segments no commit references (crashed or losing uploads) and superseded checkpoints older than --grace",
		Flags: withArchive(
			&cli.DurationFlag{Name: "grace", Value: time.Hour, Usage: "keep objects younger than this (at least 1m: a commit or a reader in flight needs them)"},
			&cli.BoolFlag{Name: "force", Usage: "accept a --grace under 1m (only with no archiver or reader running)"},
			&cli.BoolFlag{Name: "drop-old-commits", Usage: "also delete the commit objects before the oldest checkpoint kept, 16 at once: readers open from checkpoints; verify and pull then start the chain there (after an interrupted drop, at the checkpoint above what is left)"},
		),
		Action: onArchive(true, func(c *cli.Context, e *env, a *archive.Archive) error {
			n, err := a.Volume().GC(c.Context, c.Duration("grace"), c.Bool("force"))
			if errors.Is(err, graft.ErrGraceTooShort) {
				return clix.Usagef("--grace", "%v", err)
			}
			if err != nil {
				return err
			}
			dropped := 0
			if c.Bool("drop-old-commits") {
				// The commit Redis's record names must stay: move the record
				// up to the head first.
				if err := a.ProveHead(c.Context); err != nil {
					return err
				}
				if dropped, err = a.Volume().DropOldCommits(c.Context, c.Duration("grace"), c.Bool("force"), 0); err != nil {
					return err
				}
			}
			_, err = fmt.Fprintf(c.App.Writer, "{\"deleted\":%d,\"dropped_commits\":%d}\n", n, dropped)
			return err
		}),
	}
}

func trimCommand() *cli.Command {
	return &cli.Command{
		Name:  "trim",
		Usage: "apply the retention policy WITHOUT archiving: what it removes is gone for good (an archived stream's unarchived entries only with --force)",
		Flags: append(append(append(clix.CommonFlags(), policyFlags()...), archiveFlags()...),
			&cli.BoolFlag{Name: "force", Usage: "remove entries of an archived stream (or one whose declared policy archives) that its archive does not hold"}),
		Action: func(c *cli.Context) error {
			t, err := clix.ParseTarget(c)
			if err != nil {
				return err
			}
			p, err := parsePolicy(c)
			if err != nil {
				return err
			}
			if c.String("dead-letters") != "" {
				return clix.Usagef("--dead-letters", "archiver trim trims the stream itself; a dead-letter stream is trimmed by its archive's history retention")
			}
			sess, err := clix.OpenSession(c, t)
			if err != nil {
				return err
			}
			defer sess.Close()
			if !c.Bool("force") {
				if err := checkTrim(c, sess.Log, p); errors.Is(err, archive.ErrWouldLoseUnarchived) {
					return fmt.Errorf("%w; nothing trimmed. Run archiver run (archive, then trim), or give --force to remove them for good", err)
				} else if err != nil {
					return err
				}
			}
			removed, err := archive.TrimOnly(c.Context, sess.Log, p, c.Bool("exact"))
			if err != nil {
				return err
			}
			if removed == 0 && !c.Bool("exact") && p.KeepLast > 0 {
				if n, err := sess.Redis.XLen(c.Context, sess.Log.Key()).Result(); err == nil && n > p.KeepLast {
					sess.Logger.Info("removed nothing: the approximate trim (XTRIM ~) removes only whole radix-tree nodes (stream-node-max-entries, 100 by default); --exact trims to the entry",
						"stream", sess.Log.Key(), "length", n, "keep_last", p.KeepLast)
				}
			}
			_, err = fmt.Fprintf(c.App.Writer, "{\"stream\":%q,\"removed_for_good\":%d}\n", sess.Log.Key(), removed)
			return err
		},
	}
}

// onArchive wraps an action that needs the --stream's archive: flags,
// Redis, the remote (probed when write is set) and the archive, opened and
// closed around fn.
// checkTrim refuses a trim without archiving that would remove entries of
// an archived stream its archive lacks: the remote (--remote, or the one
// Redis recorded) holding the stream's volume is compared entry by entry
// with what the trim would remove, whatever Redis's record says (it may be
// gone, restored or rolled back by a failover); a stream neither archived
// there nor recorded is judged by its record and declared policy
// (archive.CheckTrimOnly).
func checkTrim(c *cli.Context, l *stream.Log, p archive.Policy) error {
	if err := archive.CheckTrimOnly(c.Context, l, p); err != nil {
		return err
	}
	e, err := openEnv(c, true, false)
	if err != nil {
		return err
	}
	defer e.close()
	a, err := e.openArchiveIn(c.Context, e.target.Keyspace, e.target.Stream, e.deadGroup)
	if err != nil {
		return err
	}
	if a.Volume().Head() == 0 {
		return nil
	}
	n, first, err := a.TrimLacks(c.Context, p)
	if err != nil || n == 0 {
		return err
	}
	return fmt.Errorf("%s: the remote %s holds its archive (volume %s, LSN %d); this trim would remove %d entries it does not hold (the lowest %s), which exist nowhere else: %w",
		l.Key(), e.remote, a.Volume().Name(), a.Volume().Head(), n, first, archive.ErrWouldLoseUnarchived)
}

func onArchive(write bool, fn func(c *cli.Context, e *env, a *archive.Archive) error) cli.ActionFunc {
	return func(c *cli.Context) error {
		e, err := openEnv(c, true, write)
		if err != nil {
			return err
		}
		defer e.close()
		a, err := e.openArchive(c.Context, e.target.Stream, e.deadGroup)
		if err != nil {
			return err
		}
		return fn(c, e, a)
	}
}
