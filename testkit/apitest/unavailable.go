package apitest

import (
	"bytes"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// RequireUnavailable checks the answer to a request that needed a database
// that is down or silent: a 503 /problems/unavailable with Retry-After, and
// a body that names nothing internal (no address, no driver message).
func RequireUnavailable(t testing.TB, r Response, internals ...string) Problem {
	t.Helper()
	require.Equal(t, http.StatusServiceUnavailable, r.Status, "%s", r.Body)
	p := r.Problem(t)
	require.Equal(t, "/problems/unavailable", p.Type)
	require.NotEmpty(t, r.Header.Get("Retry-After"), "a 503 says when to retry")
	for _, s := range append(internals, "127.0.0.1", "dial", "connect", "pgconn", "SQLSTATE") {
		require.NotContains(t, strings.ToLower(string(r.Body)), strings.ToLower(s), "5xx details are never sent")
	}
	return p
}

// RequireUnavailableWithin is RequireUnavailable on the answer to do, which
// must come within d: a request on a silent database ends by its own
// deadline, not by a longer limit behind it. d is that longer limit, far
// beyond the deadline, so that a loaded machine does not cross it.
func RequireUnavailableWithin(t testing.TB, d time.Duration, do func() Response, internals ...string) Problem {
	t.Helper()
	started := time.Now()
	r := do()
	require.Less(t, time.Since(started), d, "the request ends by its deadline")
	return RequireUnavailable(t, r, internals...)
}

// Logs is an io.Writer for a test's logger that may be read while the
// server under test still writes.
type Logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *Logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *Logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Reset forgets what was logged.
func (l *Logs) Reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Reset()
}
