package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/silt-dev/silt/cmd/internal/clix"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

func deadCommand() *cli.Command {
	common := append(clix.CommonFlags(), groupFlags()...)
	return &cli.Command{
		Name:  "dead",
		Usage: "list, retry or drop a group's dead letters",
		Subcommands: []*cli.Command{
			{
				Name:   "ls",
				Usage:  "list dead letters: entry id, reason, attempts, time",
				Flags:  slices.Concat(common, []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "one JSON object per line"}}),
				Action: deadList,
			},
			{
				Name:      "retry",
				Usage:     "hand dead letters to the handler again; each is removed only after it succeeds",
				ArgsUsage: "ID | --all [-- CMD ARGS...]",
				Flags: slices.Concat(common, handlerFlags(), []cli.Flag{
					&cli.StringFlag{Name: "id", Usage: "the entry id (branded or stream id) or the dead letter's id"},
					&cli.BoolFlag{Name: "all", Usage: "retry every dead letter"},
					&cli.StringFlag{Name: "archive-remote", EnvVars: clix.EnvVars("ARCHIVE_REMOTE"),
						Usage: "with --id: look for a dead letter the archiver has trimmed in the archive of the group's dead letters (archiver run --dead-letters GROUP, or --all)"},
					&cli.StringFlag{Name: "archive-cache", EnvVars: clix.EnvVars("ARCHIVE_CACHE"), Value: "./silt-cache", Usage: "local cache of archive pages"},
					clix.EncryptionKeyFlag()}),
				Action: deadRetry,
			},
			{
				Name:   "drop",
				Usage:  "remove one dead letter unhandled (one that cannot be retried: its payload was trimmed or was oversized)",
				Flags:  slices.Concat(common, []cli.Flag{&cli.StringFlag{Name: "id", Usage: "the entry id (branded or stream id) or the dead letter's id"}}),
				Action: deadDrop,
			},
		},
	}
}

type deadDoc struct {
	ID            string            `json:"id"`
	EntryID       string            `json:"entry_id"`
	EntryStreamID string            `json:"entry_stream_id"`
	Consumer      string            `json:"consumer"`
	Attempts      int64             `json:"attempts"`
	Reason        string            `json:"reason"`
	Time          time.Time         `json:"time"`
	Payload       map[string]string `json:"payload"`
	NoPayload     bool              `json:"no_payload,omitempty"`
}

func deadList(c *cli.Context) error {
	s, err := openConsumer(c)
	if err != nil {
		return err
	}
	defer s.close()
	tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
	if !c.Bool("json") {
		fmt.Fprintln(tw, "ENTRY\tSTREAM ID\tATTEMPTS\tTIME\tREASON")
	}
	n := 0
	for dl, err := range s.consumer.DeadLetters(c.Context) {
		if err != nil {
			return err
		}
		n++
		if c.Bool("json") {
			clix.PrintJSON(c.App.Writer, deadDoc{dl.ID.String(), dl.EntryID, dl.EntryStreamID.String(), dl.Consumer, dl.Attempts, dl.Reason, dl.Time, dl.Payload, dl.NoPayload})
			continue
		}
		entry := dl.EntryID
		if entry == "" {
			entry = "(unknown: no payload)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", entry, dl.EntryStreamID, dl.Attempts, dl.Time.Format(time.RFC3339), dl.Reason)
	}
	if !c.Bool("json") {
		fmt.Fprintf(tw, "(%d dead letters in %s)\n", n, s.consumer.DeadLetterLog().Key())
	}
	return tw.Flush()
}

func deadRetry(c *cli.Context) error {
	match, all := c.String("id"), c.Bool("all")
	if (match == "") == !all {
		return clix.Usagef("--id", "give exactly one of --id ID or --all")
	}
	s, err := openConsumer(c)
	if err != nil {
		return err
	}
	defer s.close()
	h, pipe, err := chooseHandler(c, s.log)
	if err != nil {
		return err
	}
	if pipe != nil {
		defer pipeProcs(os.Getenv)() // put back after the co-process is closed
		defer pipe.close(10 * time.Second)
	}
	res, err := s.consumer.RetryDead(c.Context, h, match)
	if errors.Is(err, stream.ErrNoDeadLetter) && c.String("archive-remote") != "" {
		res, err = retryArchivedDead(c, s, h, match)
	}
	b, _ := json.Marshal(res)
	out := summaryWriter(c)
	fmt.Fprintf(out, "%s\n", b)
	if err == nil && res.Failed > 0 {
		err = fmt.Errorf("%d of %d retries failed; they stay in the dead-letter stream", res.Failed, res.Retried)
	}
	if err == nil && res.Refused > 0 {
		err = fmt.Errorf("%d dead letters hold no payload and were not retried; they stay until 'worker dead drop --id'", res.Refused)
	}
	return err
}

func deadDrop(c *cli.Context) error {
	match := c.String("id")
	if match == "" {
		return clix.Usagef("--id", "required: the dead letter to remove")
	}
	s, err := openConsumer(c)
	if err != nil {
		return err
	}
	defer s.close()
	dl, err := s.consumer.DropDead(c.Context, match)
	if err != nil {
		return err
	}
	clix.PrintJSON(c.App.Writer, map[string]any{"dropped": dl.ID.String(), "entry_stream_id": dl.EntryStreamID.String(), "reason": dl.Reason})
	return nil
}

// retryArchivedDead finds the dead letter match names in the archive of
// the group's dead letters (the archiver trimmed it from the stream) and
// hands it to h once: a dead letter retried with success before is
// refused (stream.ErrRetriedBefore).
func retryArchivedDead(c *cli.Context, s *setup, h stream.Handler, match string) (stream.RetryResult, error) {
	var res stream.RetryResult
	a, err := openArchiveRemote(c, s.consumer.DeadLetterLog())
	if err != nil {
		return res, err
	}
	// A dead letter is recorded after its entry was minted: its record
	// and its entry are at or after the time the id given says.
	from := stream.First
	if id, err := brand.Parse(match); err == nil {
		from = brand.StreamID{MS: id.StreamID.MS}
	} else if sid, err := brand.ParseStreamID(match); err == nil {
		from = brand.StreamID{MS: sid.MS}
	}
	for item, err := range a.Read(c.Context, from, stream.Last) {
		if err != nil {
			return res, err
		}
		dl, err := stream.DecodeDeadLetter(item.Entry)
		if err != nil || !dl.Matches(match) {
			continue
		}
		s.log.Info("dead letter found in the archive of the dead letters", "dead_letter", dl.ID.String(), "entry", dl.EntryID, "source", item.Source)
		res.Retried++
		if err := s.consumer.RetryDeadLetter(c.Context, h, dl); err != nil {
			if errors.Is(err, stream.ErrRetriedBefore) || errors.Is(err, stream.ErrNoPayload) {
				res.Refused++
				return res, err
			}
			if errors.Is(err, stream.ErrRetryHeld) {
				res.Elsewhere++
				return res, err
			}
			res.Failed++
			s.log.Warn("retry failed", "entry", dl.EntryID, "error", err.Error())
			return res, nil
		}
		res.Succeeded++
		return res, nil
	}
	return res, fmt.Errorf("%q: neither in the dead-letter stream nor in its archive on %s: %w",
		match, clix.Redact(c.String("archive-remote")), stream.ErrNoDeadLetter)
}
