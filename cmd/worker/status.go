package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/silt-dev/silt/cmd/internal/clix"
	"github.com/silt-dev/silt/internal/telemetry"
	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/stream"
)

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "the capacity view: stream length, and per group its pending list, lag and dead letters",
		Flags: append(clix.CommonFlags(),
			&cli.StringFlag{Name: "group", EnvVars: clix.EnvVars("GROUP"), Usage: "only this group"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON (--format json)"},
			&cli.StringFlag{Name: "format", Value: "text", Usage: "text, json, openmetrics, or prometheus (text 0.0.4, for node_exporter's textfile collector)"}),
		Before: func(c *cli.Context) error { return clix.CheckStatusFormat(c) },
		Action: statusAction,
	}
}

func statusAction(c *cli.Context) error {
	target, err := clix.ParseTarget(c)
	if err != nil {
		return err
	}
	if g := c.String("group"); g != "" {
		if err := stream.ValidateName("group", g); err != nil {
			return clix.Usagef("--group", "%v", err)
		}
	}
	sess, err := clix.OpenSession(c, target)
	if err != nil {
		return err
	}
	defer sess.Close()
	if n, err := sess.Redis.Exists(c.Context, sess.Log.Key()).Result(); err != nil {
		return fmt.Errorf("status of %s: %w", sess.Log.Key(), err)
	} else if n == 0 {
		return fmt.Errorf("stream %s does not exist: nothing was ever appended to it, or --prefix, --queue or --stream is wrong", sess.Log.Key())
	}
	st, err := stream.Inspect(c.Context, sess.Log, c.String("group"))
	if err != nil {
		return err
	}
	full := statusWithPolicy{StreamStatus: st}
	if d, ok, err := archive.DeclaredPolicy(c.Context, stream.NewPolicyStore(sess.Redis, target.Keyspace), target.Stream); err != nil {
		return err
	} else if ok {
		full.Policy = &d
	}
	if r, ok, err := archive.LastPolicyRun(c.Context, stream.NewPolicyStore(sess.Redis, target.Keyspace), target.Stream); err != nil {
		return err
	} else if ok {
		full.PolicyLastRun = &r
	}
	if f := clix.StatusFormat(c); f == telemetry.FormatOpenMetrics || f == telemetry.FormatPrometheus {
		return streamExposition(target.Keyspace.Queue, target.Stream, st).Write(c.App.Writer, f)
	}
	if clix.StatusFormat(c) == "json" {
		b, err := json.MarshalIndent(full, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(c.App.Writer, "%s\n", b)
		return err
	}
	return printStatus(c.App.Writer, full)
}

// streamExposition is worker status as metrics: the capacity view.
func streamExposition(queue, name string, st stream.StreamStatus) *telemetry.Exposition {
	x := telemetry.NewExposition()
	l := prometheus.Labels{"queue": queue, "stream": name}
	x.Gauge("silt_stream_length", "Entries in the stream (XLEN).", l, float64(st.Length))
	x.Counter("silt_stream_entries_added", "Entries ever added to the stream (XINFO STREAM entries-added).", l, float64(st.EntriesAdded))
	for _, g := range st.Groups {
		gl := prometheus.Labels{"queue": queue, "stream": name, "group": g.Name}
		x.Gauge("silt_group_pending", "Entries delivered and not acked (the PEL).", gl, float64(g.Pending))
		x.Gauge("silt_group_pending_payload_gone", "Pending entries below the first live entry: their payload was trimmed.", gl, float64(g.PendingTrimmed))
		x.Gauge("silt_group_oldest_pending_age_seconds", "Idle time of the oldest pending entry (0: none pending).", gl, g.OldestPendingAge)
		if g.Lag != nil {
			x.Gauge("silt_group_lag", "Entries not yet delivered to the group (absent when Redis cannot tell).", gl, float64(*g.Lag))
		}
		x.Gauge("silt_group_dead_letters", "Entries in the group's dead-letter stream.", gl, float64(g.DeadLetters))
		x.Gauge("silt_group_catch_up_gaps", "Gaps of entries trimmed before the group read them, to catch up from the archive.", gl, float64(g.CatchUpGaps))
		x.Gauge("silt_group_trimmed_unread", "Entries those gaps held when found.", gl, float64(g.TrimmedUnread))
	}
	return x
}

// statusWithPolicy is the stream's status with its declared retention
// policy and that policy's last run (archiver policy set, archiver run).
type statusWithPolicy struct {
	stream.StreamStatus
	Policy        *archive.Declared  `json:"policy,omitempty"`
	PolicyLastRun *archive.PolicyRun `json:"policy_last_run,omitempty"`
}

// policyLines says a declared policy and its last run, for status tables.
func policyLines(d *archive.Declared, r *archive.PolicyRun) string {
	if d == nil {
		return "policy\tnone declared (archiver policy set)\n"
	}
	s := fmt.Sprintf("policy\t%s (declared %s)\n", clix.PolicyFlags(d), d.At.Format(time.RFC3339))
	switch {
	case r == nil:
		s += "policy last ran\tnever\n"
	case r.Error != "":
		s += fmt.Sprintf("policy last ran\t%s, failed: %s\n", r.At.Format(time.RFC3339), r.Error)
	default:
		s += fmt.Sprintf("policy last ran\t%s: archived %d, trimmed %d\n", r.At.Format(time.RFC3339), r.Archived, r.Trimmed)
	}
	return s
}

func printStatus(w io.Writer, full statusWithPolicy) error {
	st := full.StreamStatus
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "stream\t%s\n", st.Key)
	fmt.Fprint(tw, policyLines(full.Policy, full.PolicyLastRun))
	fmt.Fprintf(tw, "length (XLEN)\t%d\n", st.Length)
	fmt.Fprintf(tw, "entries added\t%d\n", st.EntriesAdded)
	fmt.Fprintf(tw, "first / last id\t%s / %s\n", orNone(st.FirstID), orNone(st.LastID))
	for _, g := range st.Groups {
		fmt.Fprintf(tw, "\ngroup %s\t\n", g.Name)
		fmt.Fprintf(tw, "  pending\t%d\n", g.Pending)
		if g.OldestPendingID != "" {
			fmt.Fprintf(tw, "  oldest pending\t%s (%s old)\n", g.OldestPendingID, time.Duration(g.OldestPendingAge*float64(time.Second)).Round(time.Second).String())
		}
		fmt.Fprintf(tw, "  pending, payload gone\t%d\n", g.PendingTrimmed)
		fmt.Fprintf(tw, "  lag\t%s\n", lag(g.Lag))
		fmt.Fprintf(tw, "  dead letters\t%d\n", g.DeadLetters)
		if g.CatchUpGaps > 0 {
			fmt.Fprintf(tw, "  trimmed unread\t%d entries in %d gaps, for a run with --archive-remote to catch up\n", g.TrimmedUnread, g.CatchUpGaps)
		}
		if g.StartsRecorded > 0 {
			fmt.Fprintf(tw, "  starts recorded\t%d entries (running, failed, or their worker died)\n", g.StartsRecorded)
		}
		fmt.Fprintf(tw, "  last delivered\t%s\n", g.LastDeliveredID)
		for _, k := range g.Consumers {
			fmt.Fprintf(tw, "  consumer %s\tpending %d, idle %s\n", k.Name, k.Pending, (time.Duration(k.IdleSeconds * float64(time.Second))).Round(time.Millisecond))
		}
	}
	return tw.Flush()
}

func lag(l *int64) string {
	if l == nil {
		return "unknown (Redis cannot tell after trims or deletions)"
	}
	return strconv.FormatInt(*l, 10)
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
