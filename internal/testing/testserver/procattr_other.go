//go:build !linux

package testserver

import "syscall"

// childAttr: only Linux kills a child with its parent.
func childAttr() *syscall.SysProcAttr { return nil }
