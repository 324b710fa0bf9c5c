//go:build !linux

package main

import (
	"io"
	"os/exec"
)

// ownGroup leaves the command as it is where process groups and
// parent-death signals are not available (the worker is built for Linux).
func ownGroup(*exec.Cmd) {}

// startOwned starts cmd; there is no reaper off Linux.
func startOwned(cmd *exec.Cmd) (release func(), err error) {
	return func() {}, cmd.Start()
}

const reaperArg = "__silt-reaper"

func reaperMain(io.Reader) int { return 0 }
