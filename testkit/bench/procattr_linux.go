package main

import "syscall"

// childAttr puts a child in its own process group, so that stopping it
// reaches anything it starts, and has the kernel kill it should the bench
// die without stopping it (SIGKILL from outside, a crash).
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
