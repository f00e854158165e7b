package pgtest

import (
	"net"
	"testing"
)

// DownURL returns the URL of a database nothing listens for: connecting
// is refused at once, as when the server is stopped.
func DownURL(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatalf("close listener: %v", err)
	}
	return "postgres://postgres@" + addr + "/down?sslmode=disable"
}

// SilentURL returns the URL of a server that accepts connections and never
// answers, like a peer behind a firewall that forgot the connection: only a
// deadline ends a wait on it. The listener and its connections are closed at
// cleanup.
func SilentURL(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return "postgres://postgres@" + ln.Addr().String() + "/silent?sslmode=disable"
}
