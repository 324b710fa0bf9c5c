package testserver

import "syscall"

// childAttr makes a server this process starts die with it: a test binary
// killed (a timeout, a signal, a crash) skips the cleanups that stop its
// servers, which would otherwise outlive it.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
