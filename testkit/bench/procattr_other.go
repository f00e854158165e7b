//go:build !linux

package main

import "syscall"

// childAttr puts a child in its own process group. (The bench reads /proc,
// so it measures on Linux only; this keeps the package building elsewhere.)
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
