package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/urfave/cli/v2"

	"github.com/silt-dev/silt/cmd/internal/clix"
	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/stream"
)

// policyCommand declares, lists and removes the streams' retention
// policies: recorded in the queue's keyspace, applied by `archiver run`
// (with --all, every declared stream; undeclared ones are left alone).
func policyCommand() *cli.Command {
	return &cli.Command{
		Name:  "policy",
		Usage: "declare a stream's retention policy in Redis (applied by archiver run --all), list or remove them",
		Subcommands: []*cli.Command{
			{
				Name:  "set",
				Usage: "declare --stream's policy: --keep-last N and/or --keep-for D [--exact] [--archive | --no-archive]",
				Flags: append(clix.CommonFlags(), append(policyFlags(),
					&cli.BoolFlag{Name: "archive", Value: true, Usage: "archive before trimming (the default)"},
					&cli.BoolFlag{Name: "no-archive", Usage: "trim only: what the policy removes is gone for good"},
				)...),
				Action: onPolicy(true, func(c *cli.Context, t clix.Target, rdb redis.UniversalClient) error {
					p, err := parsePolicy(c)
					if err != nil {
						return err
					}
					if c.IsSet("archive") && c.Bool("no-archive") {
						return clix.Usagef("--no-archive", "give --archive or --no-archive, not both")
					}
					d := archive.Declared{Policy: p, Exact: c.Bool("exact"), Archive: !c.Bool("no-archive"), At: time.Now().UTC()}
					if err := archive.Declare(c.Context, stream.NewPolicyStore(rdb, t.Keyspace), t.Stream, d); err != nil {
						return err
					}
					return printPolicy(c, t.Keyspace.Stream(t.Stream), t.Stream, &d, nil)
				}),
			},
			{
				Name:  "ls",
				Usage: "list the queue's declared policies and when each last ran",
				Flags: clix.CommonFlags(),
				Action: onPolicy(false, func(c *cli.Context, t clix.Target, rdb redis.UniversalClient) error {
					all, err := archive.DeclaredPolicies(c.Context, stream.NewPolicyStore(rdb, t.Keyspace))
					if err != nil {
						return err
					}
					for _, name := range slices.Sorted(maps.Keys(all)) {
						d := all[name]
						run, ok, err := archive.LastPolicyRun(c.Context, stream.NewPolicyStore(rdb, t.Keyspace), name)
						if err != nil {
							return err
						}
						var last *archive.PolicyRun
						if ok {
							last = &run
						}
						if err := printPolicy(c, t.Keyspace.Stream(name), name, &d, last); err != nil {
							return err
						}
					}
					return nil
				}),
			},
			{
				Name:  "rm",
				Usage: "remove --stream's declared policy (archiver run --all then leaves the stream alone)",
				Flags: clix.CommonFlags(),
				Action: onPolicy(true, func(c *cli.Context, t clix.Target, rdb redis.UniversalClient) error {
					ok, err := archive.Undeclare(c.Context, stream.NewPolicyStore(rdb, t.Keyspace), t.Stream)
					if err != nil {
						return err
					}
					if !ok {
						return fmt.Errorf("%s declares no policy", t.Keyspace.Stream(t.Stream))
					}
					return printPolicy(c, t.Keyspace.Stream(t.Stream), t.Stream, nil, nil)
				}),
			},
		},
	}
}

// onPolicy parses the queue (and --stream, with stream) and opens Redis
// around fn.
func onPolicy(stream bool, fn func(c *cli.Context, t clix.Target, rdb redis.UniversalClient) error) cli.ActionFunc {
	return func(c *cli.Context) error {
		parse := clix.ParseQueue
		if stream {
			parse = clix.ParseTarget
		}
		t, err := parse(c)
		if err != nil {
			return err
		}
		rdb, err := clix.OpenRedis(c.Context, c)
		if err != nil {
			return err
		}
		defer rdb.Close()
		return fn(c, t, rdb)
	}
}

// printPolicy prints one JSON line: the stream, its policy (null when
// removed) and its last run.
func printPolicy(c *cli.Context, key, name string, d *archive.Declared, last *archive.PolicyRun) error {
	b, err := json.Marshal(struct {
		Stream  string             `json:"stream"`
		Key     string             `json:"key"`
		Policy  *archive.Declared  `json:"policy"`
		Flags   string             `json:"flags,omitempty"`
		LastRun *archive.PolicyRun `json:"last_run,omitempty"`
	}{name, key, d, clix.PolicyFlags(d), last})
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.App.Writer, "%s\n", b)
	return err
}
