package apitest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// HoldIdle does what a client hoarding connection slots does: it opens n
// keep-alive connections to addr, from source addresses spread over
// 127.0.0.2 to 127.0.0.9 (so that no one client's share stops it), sends
// one GET /healthz on each, reads the answer and leaves them open, idle,
// until the test ends.
func HoldIdle(t testing.TB, addr string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	conns := make([]net.Conn, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%8))}, Timeout: 5 * time.Second}
			c, err := d.Dial("tcp", addr)
			if err != nil {
				errs[i] = err
				return
			}
			conns[i] = c
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"); err != nil {
				errs[i] = err
				return
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				errs[i] = err
				return
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				errs[i] = fmt.Errorf("status %d", resp.StatusCode)
			}
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close()
			}
		}
	})
	held := 0
	for _, err := range errs {
		if err == nil {
			held++
		}
	}
	// Some may have been closed to make room for later ones; what matters
	// is that the listener was made to hold its cap.
	require.GreaterOrEqual(t, held, n/2, "the hoarder got its connections: %v", errs)
}

// Trickle does what a client holding connection slots with slow bodies
// does: it opens n connections to addr, from sources addresses 127.0.0.1,
// 127.0.0.2 and so on (with one, from the address every client on one
// host has), and on each sends request, whose headers declare a body of
// 4000 bytes, then the body a byte every two seconds, until the server
// closes the connection or the test ends. Each must be answered with
// status want within five seconds, long before the servers' ReadTimeout
// (15s) would cut the body off; it returns the slowest answer's time. The
// connections stay open until the server closes them.
func Trickle(t testing.TB, addr string, sources, n int, request string, want int) time.Duration {
	t.Helper()
	const answerWithin = 5 * time.Second
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		slowest time.Duration
	)
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	errs := make([]error, n)
	for i := range n {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+i%sources))}, Timeout: answerWithin}
		c, err := d.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		wg.Go(func() {
			start := time.Now()
			_ = c.SetReadDeadline(start.Add(answerWithin))
			if _, err := io.WriteString(c, request+"{"); err != nil {
				errs[i] = err
				return
			}
			go func() { // the rest of the body, a byte at a time
				for {
					select {
					case <-done:
						return
					case <-time.After(2 * time.Second):
					}
					if _, err := c.Write([]byte(" ")); err != nil {
						return
					}
				}
			}()
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				errs[i] = fmt.Errorf("no answer after %s: %w", time.Since(start), err)
				return
			}
			_ = resp.Body.Close()
			took := time.Since(start)
			if resp.StatusCode != want {
				errs[i] = fmt.Errorf("status %d, want %d", resp.StatusCode, want)
			}
			mu.Lock()
			slowest = max(slowest, took)
			mu.Unlock()
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err, "a trickled request")
	}
	return slowest
}
