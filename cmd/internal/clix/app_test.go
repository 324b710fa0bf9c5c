package clix

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/silt-dev/silt/pkg/archive"
	"github.com/silt-dev/silt/pkg/graft"
)

// The library names an archive's fault and its objects; the last line of a
// failed command adds what to run.
func TestRun_NamesTheRepairOfAnArchiveFault(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
		code int
	}{
		{fmt.Errorf("volume v: %w: the remote lacks v/commits/5", graft.ErrMissingCommits), "archiver pull", ExitFailure},
		{fmt.Errorf("volume v: %w: %w: v/commits/1", graft.ErrMissingCommits, graft.ErrDropped), "archiver gc --drop-old-commits", ExitFailure},
		{fmt.Errorf("volume v: commit 3 is missing: %w", graft.ErrUnreachable), "archiver gc --drop-old-commits", ExitFailure},
		{fmt.Errorf("s: volume v holds %w: %w", archive.ErrNeverRecorded, archive.ErrNotThisArchive), "--archive-only; adopt it with archiver run --adopt-remote", ExitUnproven},
		{fmt.Errorf("s: Redis recorded commit 9: %w", archive.ErrRemoteBehind), "--remote", ExitUnproven},
	} {
		app := &cli.App{Name: "archiver", Commands: []*cli.Command{{Name: "x", Action: func(*cli.Context) error { return tc.err }}}}
		var stderr bytes.Buffer
		code := Run(context.Background(), app, []string{"archiver", "x"}, nil, &bytes.Buffer{}, &stderr)
		if code != tc.code || !strings.Contains(stderr.String(), tc.err.Error()) || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d with the error and %q", tc.err, code, stderr.String(), tc.code, tc.want)
		}
	}
}
