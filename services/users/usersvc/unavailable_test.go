package usersvc

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// serveOn serves Users on a pool opened as the binary opens it, on dbURL,
// logging (at level, if given) to the returned Logs. The callers are
// testCallers unless cfg names its own.
func serveOn(t *testing.T, dbURL string, cfg Config, level ...slog.Level) (string, *apitest.Logs) {
	t.Helper()
	if cfg.Callers == nil {
		cfg.Callers = testCallers
	}
	opts := &slog.HandlerOptions{}
	if len(level) > 0 {
		opts.Level = level[0]
	}
	pool, err := database.Open(context.Background(), dbURL, database.Limits{StatementTimeout: cfg.DatabaseTimeout})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	logs := &apitest.Logs{}
	ts := httptest.NewServer(NewServer(slog.New(slog.NewJSONHandler(logs, opts)), pool, cfg).Routes())
	t.Cleanup(ts.Close)
	return ts.URL, logs
}

// TestDatabaseDown: with Users' database down, every route that needs it
// answers 503 with Retry-After, which the sender retries, instead of a 500;
// the cause goes to the request's log line only.
func TestDatabaseDown(t *testing.T) {
	t.Parallel()
	url, logs := serveOn(t, pgtest.DownURL(t), Config{KeyWait: 2 * time.Second, DatabaseTimeout: 4 * time.Second})

	apitest.RequireUnavailable(t, apitest.Do(t, http.MethodPost, url+"/users", ada, append([]string{"Idempotency-Key", "down-1"}, asSender...)...))
	apitest.RequireUnavailable(t, apitest.Do(t, http.MethodGet, url+"/users/"+uuid.NewString(), "", asSender...))

	ready := apitest.Do(t, http.MethodGet, url+"/readyz", "")
	p := apitest.RequireUnavailable(t, ready)
	require.Equal(t, "database: not reachable", p.Detail)
	require.Equal(t, map[string]string{"database": "down"}, p.Dependencies)

	require.Contains(t, logs.String(), `"status":503`)
	require.Contains(t, logs.String(), "database unavailable: ", "the log line keeps the cause")
	require.Contains(t, logs.String(), "connect: connection refused")
}

// TestDatabaseSilent: a database that accepts connections and never
// answers (a frozen peer) costs a request at most USERS_DATABASE_TIMEOUT,
// then 503, never a wait the sender gives up on first.
func TestDatabaseSilent(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	url, _ := serveOn(t, pgtest.SilentURL(t), Config{KeyWait: 100 * time.Millisecond, DatabaseTimeout: timeout})

	// Left to the connection's own limit, a request would last as long
	// as the sender waits for an answer (SENDER_REQUEST_TIMEOUT, 5s by
	// default).
	apitest.RequireUnavailableWithin(t, database.ConnectTimeout, func() apitest.Response {
		return apitest.Do(t, http.MethodPost, url+"/users", ada, append([]string{"Idempotency-Key", "silent-1"}, asSender...)...)
	})
	apitest.RequireUnavailableWithin(t, database.ConnectTimeout, func() apitest.Response {
		return apitest.Do(t, http.MethodGet, url+"/users/"+uuid.NewString(), "", asSender...)
	})
}
