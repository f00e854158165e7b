package usersvc

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestMetricsCountInboxOutcomes: after creations, replays, a mismatch, a
// business refusal and a key in progress, users_inbox_requests_total reads
// exactly those numbers, and created plus refused is what the inbox holds.
func TestMetricsCountInboxOutcomes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{KeyWait: 200 * time.Millisecond})
	admin := httptest.NewServer(e.srv.AdminRoutes())
	t.Cleanup(admin.Close)

	m := apitest.Scrape(t, admin.URL)
	for _, outcome := range []string{"created", "refused", "replayed", "mismatch", "in_progress"} {
		apitest.RequireSample(t, m, `users_inbox_requests_total{outcome="`+outcome+`"} 0`)
	}

	const n = 3
	people := []string{ada, body("Bob", "bob@example.com", "222-2"), body("Carol", "carol@example.com", "333-3")}
	for i, p := range people {
		require.Equal(t, http.StatusCreated, e.create(t, "key-"+string(rune('a'+i)), p).Status)
	}
	require.Equal(t, http.StatusCreated, e.create(t, "key-a", ada).Status, "a replay")
	require.Equal(t, http.StatusCreated, e.create(t, "key-b", people[1]).Status, "a replay")
	require.Equal(t, http.StatusUnprocessableEntity, e.create(t, "key-a", body("Ada King", "ada@example.com", "111-1")).Status)
	// The business rule refuses a second enabled user for a document
	// number; the refusal is stored, and its repeat is a replay.
	require.Equal(t, http.StatusConflict, e.create(t, "key-d", body("Ada Again", "ada2@example.com", "111-1")).Status)
	require.Equal(t, http.StatusConflict, e.create(t, "key-d", body("Ada Again", "ada2@example.com", "111-1")).Status)

	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `INSERT INTO inbox (caller, idempotency_key, request_hash, request) VALUES ('outbox-sender', 'busy', '\x00', '{}')`)
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, e.create(t, "busy", body("Eve", "eve@example.com", "555-5")).Status)
	require.NoError(t, tx.Rollback(ctx))

	// Neither a stranger nor a transaction that fails counts.
	require.Equal(t, http.StatusUnauthorized, e.createAs(t, "not-a-token-0123456789", "key-e", people[0]).Status)
	_, err = e.pool.Exec(ctx, "ALTER TABLE users ADD CONSTRAINT refuse_all CHECK (false) NOT VALID")
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, e.create(t, "key-f", body("Fay", "fay@example.com", "666-6")).Status)

	require.Equal(t, n, e.count(t, "users"))
	require.Equal(t, n+1, e.count(t, "inbox"), "the creations and the refusal")
	m = apitest.Scrape(t, admin.URL)
	apitest.RequireSample(t, m, `users_inbox_requests_total{outcome="created"} 3`)
	apitest.RequireSample(t, m, `users_inbox_requests_total{outcome="refused"} 1`)
	apitest.RequireSample(t, m, `users_inbox_requests_total{outcome="replayed"} 3`)
	apitest.RequireSample(t, m, `users_inbox_requests_total{outcome="mismatch"} 1`)
	apitest.RequireSample(t, m, `users_inbox_requests_total{outcome="in_progress"} 1`)

	apitest.RequireSample(t, m, `http_request_duration_seconds_count{method="POST",route="/users",status="201"} 5`)
	apitest.RequireSample(t, m, `http_request_duration_seconds_count{method="POST",route="/users",status="409"} 3`)
	apitest.RequireSample(t, m, `http_request_duration_seconds_count{method="POST",route="/users",status="422"} 1`)
	apitest.RequireSample(t, m, `http_request_duration_seconds_count{method="POST",route="/users",status="401"} 1`)
	apitest.RequireSample(t, m, `http_request_duration_seconds_count{method="POST",route="/users",status="500"} 1`)
	require.Contains(t, m, "\ngo_goroutines ")
	require.Contains(t, m, "\nprocess_start_time_seconds ")
}

// serveWithAdmin serves Users' API and admin listener, as Run serves them,
// on a pool opened as the binary opens it on dbURL.
func serveWithAdmin(t *testing.T, dbURL string) (api, admin string) {
	t.Helper()
	// No test here waits for the timeout (a server that is down refuses at
	// once); a second is short for a first connection and query on a
	// machine busy running four race-enabled test binaries at once.
	cfg := Config{KeyWait: 200 * time.Millisecond, DatabaseTimeout: 5 * time.Second, Callers: testCallers}
	pool, err := database.Open(context.Background(), dbURL, database.Limits{StatementTimeout: cfg.DatabaseTimeout})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := NewServer(slog.New(slog.DiscardHandler), pool, cfg)
	apiServer := httptest.NewServer(s.Routes())
	t.Cleanup(apiServer.Close)
	adminServer := httptest.NewServer(s.AdminRoutes())
	t.Cleanup(adminServer.Close)
	return apiServer.URL, adminServer.URL
}

// TestMetricsWithDatabaseDown: with the database stopped, deliveries get
// 503 and /readyz says so, but a scrape still answers 200 with every
// counter: the metrics are the process's own, and read no database.
func TestMetricsWithDatabaseDown(t *testing.T) {
	t.Parallel()
	api, admin := serveWithAdmin(t, pgtest.DownURL(t))
	apitest.RequireUnavailable(t, apitest.Do(t, http.MethodPost, api+"/users", ada, append([]string{"Idempotency-Key", "down-1"}, asSender...)...))
	apitest.RequireUnavailable(t, apitest.Do(t, http.MethodGet, admin+"/readyz", ""))
	m := apitest.Scrape(t, admin)
	apitest.RequireSample(t, m, `users_inbox_requests_total{outcome="created"} 0`)
	apitest.RequireSample(t, m, `http_request_duration_seconds_count{method="POST",route="/users",status="503"} 1`)
}

// TestMetricsOnlyOnAdmin: /metrics is served on the admin listener only,
// without a token, and never on the API; the route of a request with an id
// is its pattern.
func TestMetricsOnlyOnAdmin(t *testing.T) {
	t.Parallel()
	api, admin := serveWithAdmin(t, pgtest.RoleURL(t, pgtest.URL(t, migrations.Users), migrations.UsersApp))
	require.Equal(t, http.StatusNotFound, apitest.Do(t, http.MethodGet, api+"/metrics", "", asSender...).Status)
	require.Equal(t, http.StatusNotFound, apitest.Do(t, http.MethodGet, admin+"/users/0190b0a0-0000-7000-8000-000000000001", "", asSender...).Status,
		"the admin listener serves no API")
	for _, base := range []string{api, admin} {
		require.Equal(t, http.StatusOK, apitest.Do(t, http.MethodGet, base+"/healthz", "").Status)
		require.Equal(t, http.StatusOK, apitest.Do(t, http.MethodGet, base+"/readyz", "").Status)
	}
	for _, id := range []string{"0190b0a0-0000-7000-8000-000000000001", "0190b0a0-0000-7000-8000-000000000002"} {
		require.Equal(t, http.StatusNotFound, apitest.Do(t, http.MethodGet, api+"/users/"+id, "", asSender...).Status)
	}
	m := apitest.Scrape(t, admin)
	apitest.RequireSample(t, m, `http_request_duration_seconds_count{method="GET",route="/users/{id}",status="404"} 2`)
	apitest.RequireSample(t, m, `http_request_duration_seconds_count{method="GET",route="unmatched",status="404"} 1`)
	require.NotContains(t, m, `route="/metrics"`, "the admin listener's requests are not the API's")
	apitest.RequireHostsChecked(t, admin, "USERS_ADMIN_ALLOWED_HOSTS")
}
