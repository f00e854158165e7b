//go:build !linux

package database

import (
	"syscall"
	"time"
)

// setUserTimeout does nothing where TCP_USER_TIMEOUT does not exist; there
// keepalives and the callers' deadlines are the client's bounds.
func setUserTimeout(time.Duration) func(network, address string, c syscall.RawConn) error {
	return nil
}
