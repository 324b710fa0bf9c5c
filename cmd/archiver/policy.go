package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/urfave/cli/v2"

	"github.com/silt-dev/silt/internal/clix"
	"github.com/silt-dev/silt/pkg/archive"
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
				Action: func(c *cli.Context) error {
					t, err := clix.ParseTarget(c)
					if err != nil {
						return err
					}
					p, err := parsePolicy(c)
					if err != nil {
						return err
					}
					if c.IsSet("archive") && c.Bool("no-archive") {
						return clix.Usagef("--no-archive", "give --archive or --no-archive, not both")
					}
					rdb, err := clix.OpenRedis(c.Context, c)
					if err != nil {
						return err
					}
					defer rdb.Close()
					d := archive.Declared{Policy: p, Exact: c.Bool("exact"), Archive: !c.Bool("no-archive")}
					if err := archive.Declare(c.Context, rdb, t.Keyspace, t.Stream, d); err != nil {
						return err
					}
					return printPolicy(c, t.Keyspace.Stream(t.Stream), t.Stream, &d, nil)
				},
			},
			{
				Name:  "ls",
				Usage: "list the queue's declared policies and when each last ran",
				Flags: clix.CommonFlags(),
				Action: func(c *cli.Context) error {
					t, err := clix.ParseQueue(c)
					if err != nil {
						return err
					}
					rdb, err := clix.OpenRedis(c.Context, c)
					if err != nil {
						return err
					}
					defer rdb.Close()
					all, err := archive.DeclaredPolicies(c.Context, rdb, t.Keyspace)
					if err != nil {
						return err
					}
					for _, name := range slices.Sorted(maps.Keys(all)) {
						d := all[name]
						run, ok, err := archive.LastPolicyRun(c.Context, rdb, t.Keyspace, name)
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
				},
			},
			{
				Name:  "rm",
				Usage: "remove --stream's declared policy (archiver run --all then leaves the stream alone)",
				Flags: clix.CommonFlags(),
				Action: func(c *cli.Context) error {
					t, err := clix.ParseTarget(c)
					if err != nil {
						return err
					}
					rdb, err := clix.OpenRedis(c.Context, c)
					if err != nil {
						return err
					}
					defer rdb.Close()
					ok, err := archive.Undeclare(c.Context, rdb, t.Keyspace, t.Stream)
					if err != nil {
						return err
					}
					if !ok {
						return fmt.Errorf("%s declares no policy", t.Keyspace.Stream(t.Stream))
					}
					return printPolicy(c, t.Keyspace.Stream(t.Stream), t.Stream, nil, nil)
				},
			},
		},
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
	}{name, key, d, flagsOf(d), last})
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.App.Writer, "%s\n", b)
	return err
}

func flagsOf(d *archive.Declared) string {
	if d == nil {
		return ""
	}
	return d.String()
}
