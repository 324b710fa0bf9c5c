package graft_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"

	"github.com/silt-dev/silt/pkg/failpoint"
	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/graft"
)

// The crash child: with GRAFT_CRASH_STEP set, the test binary opens the
// volume and commits one page, killing itself with SIGKILL at that step.
func TestMain(m *testing.M) {
	if step := os.Getenv("GRAFT_CRASH_STEP"); step != "" {
		os.Exit(crashChild(step, os.Getenv("GRAFT_CRASH_DATA"), os.Getenv("GRAFT_CRASH_REMOTE")))
	}
	os.Exit(m.Run())
}

func crashChild(step, data, remote string) int {
	st, err := fence.OpenLocal(remote)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	every, _ := strconv.Atoi(os.Getenv("GRAFT_CRASH_EVERY"))
	v, err := graft.OpenWith(context.Background(), data, "vol", st, graft.Options{CheckpointEvery: every, Unpacked: os.Getenv("GRAFT_CRASH_UNPACKED") != ""})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	v.Failpoint = func(at failpoint.Name) {
		if at == failpoint.Name(step) {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	if os.Getenv("GRAFT_CRASH_COMPACT") != "" {
		if _, err := v.Compact(context.Background(), graft.CompactOptions{Target: 1 << 30, MinEntries: 8}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
		return 0
	}
	no := v.Head() + 1
	if _, err := v.Commit(context.Background(), []graft.Page{{No: no, Data: []byte(fmt.Sprint("page ", no))}}, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	return 0
}

// TestVolume_CrashAtEachStep kills a committing process at each step of a
// commit and of the checkpoint after it (every commit checkpoints in the
// child), packed and unpacked; the volume then opens to the state before or
// after the commit, never a corrupt one, a cold open from the remote alone
// reads every page, and the next commit works. A packed commit's local
// segment is written while its one object is created, so a crash there
// may find it committed or not.
func TestVolume_CrashAtEachStep(t *testing.T) {
	for _, format := range []string{"packed", "unpacked"} {
		for _, step := range []string{"segment-written", "segment-uploaded", "commit-put", "head-updated", "checkpoint-leaves", "checkpoint-put"} {
			t.Run(format+"/"+step, func(t *testing.T) { crashAt(t, step, format == "unpacked") })
		}
	}
}

func crashAt(t *testing.T, step string, unpacked bool) {
	data, remote := t.TempDir(), t.TempDir()
	head := uint64(0)
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "GRAFT_CRASH_STEP="+step, "GRAFT_CRASH_DATA="+data, "GRAFT_CRASH_REMOTE="+remote, "GRAFT_CRASH_EVERY=1")
		if unpacked {
			cmd.Env = append(cmd.Env, "GRAFT_CRASH_UNPACKED=1")
		}
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("round %d: child not killed at %s: %v\n%s", round, step, err, out)
		}
		st, _ := fence.OpenLocal(remote)
		v, err := graft.Open(context.Background(), data, "vol", st)
		if err != nil {
			t.Fatalf("round %d: reopen after a crash at %s: %v", round, step, err)
		}
		committed := step != "segment-written" && (step != "segment-uploaded" || !unpacked)
		switch {
		case step == "segment-written" && !unpacked:
			if v.Head() != head && v.Head() != head+1 {
				t.Fatalf("round %d: head %d after a crash while committing, want %d or %d", round, v.Head(), head, head+1)
			}
			committed = v.Head() == head+1
		case committed && v.Head() != head+1:
			t.Fatalf("round %d: head %d after a crash past the commit, want %d", round, v.Head(), head+1)
		case !committed && v.Head() != head:
			t.Fatalf("round %d: head %d after a crash before the commit, want %d", round, v.Head(), head)
		}
		if _, err := v.VerifyRemote(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, err := v.VerifyLocal(context.Background()); err != nil {
			t.Fatal(err)
		}
		cold, err := graft.Open(context.Background(), t.TempDir(), "vol", st)
		if err != nil {
			t.Fatalf("round %d: cold open after a crash at %s: %v", round, step, err)
		}
		if cold.Head() != v.Head() {
			t.Fatalf("round %d: cold open after a crash at %s: head %d, want %d", round, step, cold.Head(), v.Head())
		}
		for no := uint64(1); no <= v.Head(); no++ {
			if _, err := cold.Read(context.Background(), no); err != nil {
				t.Fatalf("round %d: cold read of page %d: %v", round, no, err)
			}
		}
		if !committed { // the next commit succeeds where the crashed one did not
			if _, err := v.Commit(context.Background(), []graft.Page{{No: v.Head() + 1, Data: []byte("after")}}, nil); err != nil {
				t.Fatal(err)
			}
		}
		head = v.Head()
	}
}
