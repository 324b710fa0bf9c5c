package main

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestReaper_KillsTheGroupsStillListed drives each reaper as the worker
// does: three handler groups start, one ends, lines that are not a group
// are sent among them, and the worker's end of the pipe closes. The two
// groups still listed are killed, the one that ended is left alone. The
// script runs under sh; with no sh on PATH the reaper is this binary
// (reaperMain, through TestMain).
func TestReaper_KillsTheGroupsStillListed(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, path string }{
		{"sh", os.Getenv("PATH")},
		{"no sh: the worker's binary", t.TempDir()},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("PATH", c.path)
			reaperKills(t, sleep)
		})
	}
}

func reaperKills(t *testing.T, sleep string) {
	var r reaper
	if err := r.start(); err != nil {
		t.Fatal(err)
	}
	groups := make([]*exec.Cmd, 3)
	exited := make([]chan error, 3)
	for i := range groups {
		cmd := exec.Command(sleep, "30")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
		groups[i], exited[i] = cmd, make(chan error, 1)
		go func() { exited[i] <- cmd.Wait() }()
		r.send('+', cmd.Process.Pid)
	}
	r.send('-', groups[1].Process.Pid)
	for _, junk := range []string{"+\n", "+abc\n", "x12\n", "-\n", "+12x\n", "-999999999\n"} {
		r.w.Write([]byte(junk))
	}
	r.w.Close()

	for _, i := range []int{0, 2} {
		select {
		case err := <-exited[i]:
			if ws, ok := groups[i].ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
				t.Errorf("group %d ended with %v, want SIGKILL", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("group %d still runs 10 s after the worker's end of the pipe closed", i)
		}
	}
	select {
	case err := <-exited[1]:
		t.Errorf("the group that ended before the close was killed: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
}
