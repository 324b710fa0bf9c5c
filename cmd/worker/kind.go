package main

import (
	"github.com/urfave/cli/v2"

	"github.com/silt-dev/silt/cmd/internal/clix"
	"github.com/silt-dev/silt/pkg/brand"
	"github.com/silt-dev/silt/pkg/stream"
)

// kindCommand shows or declares the kind of ids a stream holds: a stream
// other producers write with plain XADD takes EVT ids until one is
// declared (or its first silt append records one).
func kindCommand() *cli.Command {
	return &cli.Command{
		Name:  "kind",
		Usage: "show or declare the kind of branded ids a stream holds",
		Subcommands: []*cli.Command{
			{
				Name:   "show",
				Usage:  "the stream's recorded kind (or that none is)",
				Flags:  clix.CommonFlags(),
				Action: kindShow,
			},
			{
				Name:  "set",
				Usage: "declare --kind for a stream that has none yet (entries without an id field then take ids of that kind); a stream's kind never changes",
				Flags: append(clix.CommonFlags(),
					&cli.BoolFlag{Name: "new-kind", Usage: "let --kind name a kind that is not built in"}),
				Action: kindSet,
			},
		},
	}
}

func kindShow(c *cli.Context) error {
	t, err := clix.ParseTarget(c)
	if err != nil {
		return err
	}
	rdb, err := clix.OpenRedis(c.Context, c)
	if err != nil {
		return err
	}
	defer rdb.Close()
	k, ok, err := stream.StreamKind(c.Context, rdb, t.Keyspace, t.Stream)
	if err != nil {
		return err
	}
	out := map[string]any{"stream": t.Keyspace.Stream(t.Stream), "recorded": ok}
	if ok {
		out["kind"] = string(k)
	} else {
		out["kind"] = string(brand.EVT) // what entries without an id field map to until one is declared
	}
	return clix.PrintJSON(c.App.Writer, out)
}

func kindSet(c *cli.Context) error {
	t, err := clix.ParseTarget(c)
	if err != nil {
		return err
	}
	if t.Kind == "" {
		return clix.Usagef("--kind", "required: the kind to declare")
	}
	if !t.Kind.BuiltIn() && !c.Bool("new-kind") {
		return clix.Usagef("--kind", "%s is not a built-in kind; give --new-kind to declare it", t.Kind)
	}
	rdb, err := clix.OpenRedis(c.Context, c)
	if err != nil {
		return err
	}
	defer rdb.Close()
	if err := stream.RecordAdopted(c.Context, rdb, t.Keyspace); err != nil {
		return err
	}
	k, err := stream.DeclareKind(c.Context, rdb, t.Keyspace, t.Stream, t.Kind)
	if err != nil {
		return err
	}
	return clix.PrintJSON(c.App.Writer, map[string]any{"stream": t.Keyspace.Stream(t.Stream), "kind": string(k), "recorded": true})
}
