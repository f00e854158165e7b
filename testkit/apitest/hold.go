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
