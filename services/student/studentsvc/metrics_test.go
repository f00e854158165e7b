package studentsvc

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

// TestMetricsCountCommittedEffects: after students flow through with and
// without client keys, Student's metrics read exactly what the database
// holds, and what the requests were; a request whose transaction rolls
// back counts nothing.
func TestMetricsCountCommittedEffects(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	s := newTestServer(slog.New(slog.DiscardHandler), pgtest.As(t, pool, migrations.StudentApp),
		Config{KeyWait: 200 * time.Millisecond, DatabaseTimeout: 10 * time.Second})
	api := httptest.NewServer(apitest.WithToken(s.Routes(), clientToken))
	t.Cleanup(api.Close)
	admin := httptest.NewServer(s.AdminRoutes())
	t.Cleanup(admin.Close)
	post := func(body string, headers ...string) int {
		return apitest.Do(t, http.MethodPost, api.URL+"/students", body, headers...).Status
	}

	// Before anything, every series is there at zero.
	m := apitest.Scrape(t, admin.URL)
	apitest.RequireSample(t, m, "student_students_created_total 0")
	apitest.RequireSample(t, m, `student_outbox_rows_written_total{operation="create-user"} 0`)
	for _, outcome := range []string{"new", "replayed", "mismatch", "in_progress"} {
		apitest.RequireSample(t, m, `student_idempotency_requests_total{outcome="`+outcome+`"} 0`)
	}

	require.Equal(t, http.StatusCreated, post(ada))
	bob := body("Bob", "bob@example.com", "222-2")
	require.Equal(t, http.StatusCreated, post(bob, "Idempotency-Key", "k-1"))
	require.Equal(t, http.StatusCreated, post(bob, "Idempotency-Key", "k-1"), "a replay")
	require.Equal(t, http.StatusUnprocessableEntity, post(body("Bob", "bob@example.org", "222-2"), "Idempotency-Key", "k-1"))
	require.Equal(t, http.StatusCreated, post(body("Carol", "carol@example.com", "333-3"), "Idempotency-Key", "k-2"))
	// Refusals write no student, with or without a key; the key's is stored.
	require.Equal(t, http.StatusConflict, post(body("Ada Again", "ada2@example.com", "111-1"), "Idempotency-Key", "k-3"))
	require.Equal(t, http.StatusConflict, post(body("Ada Again", "ada2@example.com", "111-1")))
	require.Equal(t, http.StatusCreated, post(body("Dave", "dave@example.com", "444-4")))

	// A key another transaction holds past the wait is in progress.
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `INSERT INTO inbox (caller, idempotency_key, request_hash, request) VALUES ('client', 'busy', '\x00', '{}')`)
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, post(body("Eve", "eve@example.com", "555-5"), "Idempotency-Key", "busy"))
	require.NoError(t, tx.Rollback(ctx))

	// A transaction that fails after its inserts counts nothing.
	_, err = pool.Exec(ctx, "ALTER TABLE outbox ADD CONSTRAINT refuse_all CHECK (false) NOT VALID")
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, post(body("Fay", "fay@example.com", "666-6")))
	require.Equal(t, http.StatusInternalServerError, post(body("Fay", "fay@example.com", "666-6"), "Idempotency-Key", "k-4"))

	require.Equal(t, http.StatusNotFound, apitest.Do(t, http.MethodGet, api.URL+"/nope", "").Status)

	const created = 4
	require.Equal(t, created, apitest.Count(t, pool, "SELECT count(*) FROM students"))
	require.Equal(t, created, apitest.Count(t, pool, "SELECT count(*) FROM outbox WHERE operation = 'create-user'"))
	m = apitest.Scrape(t, admin.URL)
	apitest.RequireSample(t, m, "student_students_created_total 4")
	apitest.RequireSample(t, m, `student_outbox_rows_written_total{operation="create-user"} 4`)
	apitest.RequireSample(t, m, `student_idempotency_requests_total{outcome="new"} 3`)
	apitest.RequireSample(t, m, `student_idempotency_requests_total{outcome="replayed"} 1`)
	apitest.RequireSample(t, m, `student_idempotency_requests_total{outcome="mismatch"} 1`)
	apitest.RequireSample(t, m, `student_idempotency_requests_total{outcome="in_progress"} 1`)

	// Request durations by route pattern, never by path.
	apitest.RequireSample(t, m, `http_request_duration_seconds_count{method="POST",route="/students",status="201"} 5`)
	apitest.RequireSample(t, m, `http_request_duration_seconds_count{method="POST",route="/students",status="409"} 3`)
	apitest.RequireSample(t, m, `http_request_duration_seconds_count{method="POST",route="/students",status="500"} 2`)
	apitest.RequireSample(t, m, `http_request_duration_seconds_count{method="GET",route="unmatched",status="404"} 1`)
	// The Go runtime's and the process's collectors are served too.
	require.Contains(t, m, "\ngo_goroutines ")
	require.Contains(t, m, "\nprocess_start_time_seconds ")
}

// TestMetricsRouteByPattern: a route with an id is one series whatever the
// id; the admin listener's own requests are not in the API's figures.
func TestMetricsRouteByPattern(t *testing.T) {
	t.Parallel()
	e := newMetricsEnv(t, pgtest.RoleURL(t, pgtest.URL(t, migrations.Student), migrations.StudentApp))
	for _, id := range []string{"0190b0a0-0000-7000-8000-000000000001", "0190b0a0-0000-7000-8000-000000000002"} {
		require.Equal(t, http.StatusNotFound, apitest.Do(t, http.MethodGet, e.api+"/students/"+id, "").Status)
	}
	require.Equal(t, http.StatusOK, apitest.Do(t, http.MethodGet, e.api+"/students?limit=1", "").Status)
	require.Equal(t, http.StatusOK, apitest.Do(t, http.MethodHead, e.api+"/students", "").Status)
	require.Equal(t, http.StatusOK, apitest.Do(t, http.MethodGet, e.admin+"/readyz", "").Status)
	m := apitest.Scrape(t, e.admin)
	apitest.RequireSample(t, m, `http_request_duration_seconds_count{method="GET",route="/students/{id}",status="404"} 2`)
	apitest.RequireSample(t, m, `http_request_duration_seconds_count{method="GET",route="/students",status="200"} 1`)
	apitest.RequireSample(t, m, `http_request_duration_seconds_count{method="HEAD",route="/students",status="200"} 1`)
	require.NotContains(t, m, `route="/readyz"`, "the admin listener's requests are not the API's")
	require.NotContains(t, m, `route="/metrics"`)
}

// metricsEnv is Student's API and admin listener, served as Run serves
// them, on a pool opened as the binary opens it on dbURL.
type metricsEnv struct{ api, admin string }

func newMetricsEnv(t *testing.T, dbURL string) metricsEnv {
	t.Helper()
	// No test here waits for the timeout (a server that is down refuses at
	// once); a second was too short for a first connection and query on
	// a machine busy running four race-enabled test binaries at once.
	cfg := Config{KeyWait: 200 * time.Millisecond, DatabaseTimeout: 5 * time.Second}
	pool, err := database.Open(context.Background(), dbURL, database.Limits{StatementTimeout: cfg.DatabaseTimeout})
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := newTestServer(slog.New(slog.DiscardHandler), pool, cfg)
	api := httptest.NewServer(apitest.WithToken(s.Routes(), clientToken))
	t.Cleanup(api.Close)
	admin := httptest.NewServer(s.AdminRoutes())
	t.Cleanup(admin.Close)
	return metricsEnv{api: api.URL, admin: admin.URL}
}

// TestMetricsWithDatabaseDown: with the database stopped, the API answers
// 503 and /readyz says so, but a scrape still answers 200 with every
// counter: the metrics are the process's own, and read no database.
func TestMetricsWithDatabaseDown(t *testing.T) {
	t.Parallel()
	e := newMetricsEnv(t, pgtest.DownURL(t))
	apitest.RequireUnavailable(t, apitest.Do(t, http.MethodPost, e.api+"/students", ada, "Idempotency-Key", "down-1"))
	apitest.RequireUnavailable(t, apitest.Do(t, http.MethodGet, e.admin+"/readyz", ""))
	m := apitest.Scrape(t, e.admin)
	apitest.RequireSample(t, m, "student_students_created_total 0")
	apitest.RequireSample(t, m, `student_idempotency_requests_total{outcome="new"} 0`)
	apitest.RequireSample(t, m, `http_request_duration_seconds_count{method="POST",route="/students",status="503"} 1`)
}

// TestMetricsOnlyOnAdmin: /metrics is served on the admin listener only,
// never to the API's clients; both have the health routes.
func TestMetricsOnlyOnAdmin(t *testing.T) {
	t.Parallel()
	e := newMetricsEnv(t, pgtest.RoleURL(t, pgtest.URL(t, migrations.Student), migrations.StudentApp))
	require.Equal(t, http.StatusNotFound, apitest.Do(t, http.MethodGet, e.api+"/metrics", "").Status)
	require.Equal(t, http.StatusOK, apitest.Do(t, http.MethodGet, e.admin+"/metrics", "").Status)
	for _, base := range []string{e.api, e.admin} {
		require.Equal(t, http.StatusOK, apitest.Do(t, http.MethodGet, base+"/healthz", "").Status)
		require.Equal(t, http.StatusOK, apitest.Do(t, http.MethodGet, base+"/readyz", "").Status)
	}
	require.Equal(t, http.StatusNotFound, apitest.Do(t, http.MethodGet, e.admin+"/students", "").Status, "the admin listener serves no API")
	post := apitest.Do(t, http.MethodPost, e.admin+"/metrics", "{}")
	require.Equal(t, http.StatusMethodNotAllowed, post.Status)
	require.Equal(t, "GET, HEAD", post.Header.Get("Allow"))
	apitest.RequireHostsChecked(t, e.admin, "STUDENT_ADMIN_ALLOWED_HOSTS")
}
