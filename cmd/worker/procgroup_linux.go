package main

import (
	"os/exec"
	"syscall"
)

// ownGroup makes an exec handler the leader of its own process group, with
// SIGKILL as its parent-death signal, and makes cancelling the command
// (handler timeout, the end of --grace) kill the whole group: a handler
// never runs on beside the redelivery of its own entry. The death signal
// reaches the child the worker started (kept across its execve, so `sh -c`
// running a single command, which the shell replaces itself with, is
// covered); grandchildren that a compound command starts are reached by
// the group kill, not by a SIGKILL of the worker itself.
func ownGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error {
		if cmd.Process == nil {
			return nil
		}
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}
