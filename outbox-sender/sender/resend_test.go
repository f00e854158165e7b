package sender

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

type connRequestsKey struct{}

// TestEverySendIsCounted: Go's HTTP client silently sends a request again
// on a fresh connection when a reused keep-alive connection breaks before
// the answer, if it deems the request replayable, which a POST carrying an
// Idempotency-Key is. Those sends were invisible to the sender: Users saw
// more deliveries than the outbox's attempts and the sender's metrics
// recorded. Here the server breaks every reused connection right after
// reading a request, and every send must be one attempt.
func TestEverySendIsCounted(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	addStudents(t, pool, 20)

	var received atomic.Int64
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		received.Add(1)
		// The first request on a connection is answered, so the client
		// keeps the connection for reuse; any later one is read, then the
		// connection is closed without an answer.
		if r.Context().Value(connRequestsKey{}).(*atomic.Int64).Add(1) > 1 {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]any{"userId": uuid.New(), "status": "created"})
	}))
	ts.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connRequestsKey{}, new(atomic.Int64))
	}
	ts.Start()
	t.Cleanup(ts.Close)

	cfg := testConfig(ts.URL)
	cfg.MaxAttempts = 1000
	s := run(t, pool, cfg)
	eventually(t, "every student linked", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == 20
	})
	s.wait(t)

	attempts := count(t, pool, "SELECT sum(attempts) FROM outbox")
	require.Greater(t, received.Load(), int64(20), "some sends must have met a broken connection, or the test proves nothing")
	require.EqualValues(t, received.Load(), attempts, "every request Users received is an attempt in the outbox")
	require.Equal(t, attempts, s.results(t, "delivered")+s.results(t, "retry")+s.results(t, "dead"),
		"every request Users received is a result in the sender's metrics")
}
