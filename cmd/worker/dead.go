package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/silt-dev/silt/cmd/internal/clix"
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
					&cli.BoolFlag{Name: "all", Usage: "retry every dead letter"}}),
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
		defer pipe.close(10 * time.Second)
	}
	res, err := s.consumer.RetryDead(c.Context, h, match)
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
