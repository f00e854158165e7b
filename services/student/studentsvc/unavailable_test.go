package studentsvc

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

// serveOn serves Student on a pool opened as the binary opens it, on dbURL,
// logging to the returned Logs.
func serveOn(t *testing.T, dbURL string, cfg Config) (string, *apitest.Logs) {
	t.Helper()
	pool, err := database.Open(context.Background(), dbURL, database.Limits{StatementTimeout: cfg.DatabaseTimeout})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	logs := &apitest.Logs{}
	ts := httptest.NewServer(apitest.WithToken(newTestServer(slog.New(slog.NewJSONHandler(logs, nil)), pool, cfg).Routes(), clientToken))
	t.Cleanup(ts.Close)
	return ts.URL, logs
}

// TestDatabaseDown: with Student's database down, every route that needs it
// answers 503 with Retry-After instead of a 500, with or without a client
// key; the cause goes to the request's log line only.
func TestDatabaseDown(t *testing.T) {
	t.Parallel()
	url, logs := serveOn(t, pgtest.DownURL(t), Config{KeyWait: 5 * time.Second, DatabaseTimeout: 8 * time.Second})

	apitest.RequireUnavailable(t, apitest.Do(t, http.MethodPost, url+"/students", ada))
	apitest.RequireUnavailable(t, apitest.Do(t, http.MethodPost, url+"/students", ada, "Idempotency-Key", "down-1"))
	apitest.RequireUnavailable(t, apitest.Do(t, http.MethodGet, url+"/students/"+uuid.NewString(), ""))
	apitest.RequireUnavailable(t, apitest.Do(t, http.MethodGet, url+"/students", ""))

	p := apitest.RequireUnavailable(t, apitest.Do(t, http.MethodGet, url+"/readyz", ""))
	require.Equal(t, "database: not reachable", p.Detail)
	require.Equal(t, map[string]string{"database": "down"}, p.Dependencies)

	require.Contains(t, logs.String(), `"status":503`)
	require.Contains(t, logs.String(), "database unavailable: ", "the log line keeps the cause")
	require.Contains(t, logs.String(), "connect: connection refused")
}

// TestDatabaseSilent: a database that accepts connections and never
// answers costs a request at most STUDENT_DATABASE_TIMEOUT, then 503.
func TestDatabaseSilent(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	url, _ := serveOn(t, pgtest.SilentURL(t), Config{KeyWait: 100 * time.Millisecond, DatabaseTimeout: timeout})

	// Left to the connection's own limit, a request would take that long.
	for _, do := range []func() apitest.Response{
		func() apitest.Response {
			return apitest.Do(t, http.MethodPost, url+"/students", ada, "Idempotency-Key", "silent-1")
		},
		func() apitest.Response { return apitest.Do(t, http.MethodGet, url+"/students/"+uuid.NewString(), "") },
		func() apitest.Response { return apitest.Do(t, http.MethodGet, url+"/students", "") },
	} {
		apitest.RequireUnavailableWithin(t, database.ConnectTimeout, do)
	}
}
