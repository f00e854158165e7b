package sender

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// These tests walk one row, or a few, through each way Users may answer.

func TestDeliversAndLinks(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	users, url := newFakeUsers(t, nil)
	ids := addStudents(t, pool, 25)
	run(t, pool, testConfig(url))

	eventually(t, "every row delivered", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == len(ids)
	})
	rows, err := pool.Query(context.Background(),
		"SELECT o.idempotency_key, o.payload::text, s.user_id, o.attempts, o.lease_token IS NULL FROM outbox o JOIN students s ON s.id = o.student_id")
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var (
			key      uuid.UUID
			payload  string
			userID   uuid.UUID
			attempts int
			released bool
		)
		require.NoError(t, rows.Scan(&key, &payload, &userID, &attempts, &released))
		require.Equal(t, users.idFor(key.String()), userID, "the student holds the user id Users returned for its key")
		require.JSONEq(t, payload, users.bodyFor(key.String()), "the payload is sent as stored")
		require.Equal(t, 1, attempts)
		require.True(t, released)
	}
	require.NoError(t, rows.Err())
}

// TestRetriesTransientFailures walks one row through every transient
// failure before Users finally answers: each is retried, none dead-letters.
// Each failure is counted, so only the first may meet the request timeout:
// it never answers, and the others answer at once, however long the
// timeout. Three seconds is far beyond an answer's time on a loaded
// machine, and short for a test to wait.
func TestRetriesTransientFailures(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	failures := []func(w http.ResponseWriter, r *http.Request){
		func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() }, // no answer before the request timeout
		func(w http.ResponseWriter, _ *http.Request) { // Users read the request, then the connection dropped
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				conn.Close()
			}
		},
		func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) },
		func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
		},
		func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusRequestTimeout) },
		func(w http.ResponseWriter, _ *http.Request) {
			writeProblem(w, &httpapi.Problem{Type: httpapi.TypeIdempotencyBusy, Title: "Idempotency key in use", Status: http.StatusConflict})
		},
		func(w http.ResponseWriter, _ *http.Request) { http.NotFound(w, nil) },                // a misrouted URL, not Users' verdict
		func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadRequest) }, // a 400 that is not Users' problem
	}
	users, url := newFakeUsers(t, func(w http.ResponseWriter, r *http.Request, _ string, n int) bool {
		if n > len(failures) {
			return false
		}
		failures[n-1](w, r)
		return true
	})
	addStudents(t, pool, 1)
	cfg := testConfig(url)
	cfg.RequestTimeout = 3 * time.Second
	r := run(t, pool, cfg)

	eventually(t, "row delivered after every failure", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == 1
	})
	r.wait(t)
	require.Equal(t, len(failures), r.results(t, "retry"), "each failure was judged transient")
	require.Equal(t, 1, r.results(t, "delivered"))
	require.Zero(t, r.results(t, "dead"))
	require.Equal(t, len(failures)+1, count(t, pool, "SELECT attempts FROM outbox"))
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM students WHERE user_id IS NOT NULL"))
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE last_error IS NULL"), "a delivered row has no error")
	require.Equal(t, 1, users.keys())
}

func TestPermanentFailuresDeadLetterWithoutBlockingOthers(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	ids := addStudents(t, pool, 12)
	ctx := context.Background()
	keyOf := func(student uuid.UUID) string {
		var k uuid.UUID
		require.NoError(t, pool.QueryRow(ctx, "SELECT idempotency_key FROM outbox WHERE student_id = $1", student).Scan(&k))
		return k.String()
	}
	taken, mismatch, noID, teapot := keyOf(ids[0]), keyOf(ids[1]), keyOf(ids[2]), keyOf(ids[3])
	users, url := newFakeUsers(t, func(w http.ResponseWriter, r *http.Request, key string, n int) bool {
		switch key {
		case taken:
			writeProblem(w, &httpapi.Problem{Type: httpapi.TypeDocumentTaken, Title: "Document number already in use", Status: http.StatusConflict})
		case mismatch:
			writeProblem(w, &httpapi.Problem{Type: httpapi.TypeIdempotencyMismatch, Title: "Idempotency key reused with a different request", Status: http.StatusUnprocessableEntity})
		case noID:
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"status":"created"}`))
		case teapot:
			writeProblem(w, &httpapi.Problem{Type: httpapi.TypeValidation, Title: "Invalid request\x00 \xff", Status: http.StatusBadRequest})
		default:
			return false
		}
		return true
	})
	run(t, pool, testConfig(url))

	eventually(t, "all rows settled", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'pending'") == 0
	})
	require.Equal(t, 8, count(t, pool, "SELECT count(*) FROM students WHERE user_id IS NOT NULL"), "good rows flow past bad ones")
	want := map[uuid.UUID]string{
		ids[0]: "Users answered 409 Document number already in use",
		ids[1]: "Users answered 422 Idempotency key reused with a different request",
		ids[2]: "Users answered 201 without a userId",
		ids[3]: "Users answered 400 Invalid request \uFFFD", // NUL and invalid UTF-8 would make the batch unrecordable
	}
	for student, msg := range want {
		var (
			state, lastError string
			linked           bool
		)
		require.NoError(t, pool.QueryRow(ctx,
			"SELECT o.state, o.last_error, s.user_id IS NOT NULL FROM outbox o JOIN students s ON s.id = o.student_id WHERE s.id = $1", student).
			Scan(&state, &lastError, &linked))
		require.Equal(t, "dead", state)
		require.Equal(t, msg, lastError)
		require.False(t, linked)
	}
	for _, key := range []string{taken, mismatch, noID, teapot} {
		require.Equal(t, 1, users.deliveries(key), "a permanent failure is not retried")
	}
}

func TestGivesUpAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	_, url := newFakeUsers(t, func(w http.ResponseWriter, _ *http.Request, _ string, _ int) bool {
		w.WriteHeader(http.StatusBadGateway)
		return true
	})
	addStudents(t, pool, 1)
	cfg := testConfig(url)
	cfg.MaxAttempts = 3
	run(t, pool, cfg)
	eventually(t, "row dead", func() bool { return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead'") == 1 })
	var lastError string
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT last_error FROM outbox").Scan(&lastError))
	require.Equal(t, "gave up after 3 attempts; last error (users-unavailable): Users answered 502 Bad Gateway", lastError)
	require.Equal(t, 3, count(t, pool, "SELECT attempts FROM outbox"))
}

func TestGivesUpOnRowsOlderThanMaxAge(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	users, url := newFakeUsers(t, nil)
	addStudents(t, pool, 2)
	_, err := pool.Exec(context.Background(), "UPDATE outbox SET created_at = now() - interval '2 hours', age_from = now() - interval '2 hours' WHERE id = (SELECT min(id) FROM outbox)")
	require.NoError(t, err)
	run(t, pool, testConfig(url))
	eventually(t, "both settled", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state <> 'pending'") == 2
	})
	var lastError string
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT last_error FROM outbox WHERE state = 'dead'").Scan(&lastError))
	require.Equal(t, "gave up: the operation is older than SENDER_MAX_AGE=1h0m0s", lastError)
	require.Equal(t, 1, users.keys(), "the expired row is never sent")
}

// TestRetryNeverSleepsPastMaxAge: a row about to expire is not parked for a
// whole backoff: its retry is due at its expiry, and then it dead-letters.
func TestRetryNeverSleepsPastMaxAge(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	_, url := newFakeUsers(t, func(w http.ResponseWriter, _ *http.Request, _ string, _ int) bool {
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	})
	addStudents(t, pool, 1)
	_, err := pool.Exec(context.Background(), "UPDATE outbox SET age_from = now() - interval '1 hour' + interval '500 milliseconds'")
	require.NoError(t, err)
	cfg := testConfig(url)
	cfg.BackoffMin, cfg.BackoffMax = time.Hour, time.Hour
	run(t, pool, cfg)
	eventually(t, "row dead at its max age, not an hour later", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead'") == 1
	})
	var lastError string
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT last_error FROM outbox").Scan(&lastError))
	require.Contains(t, lastError, "older than SENDER_MAX_AGE")
}

func TestNeverOverwritesAStudentLinkedToAnotherUser(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	_, url := newFakeUsers(t, nil)
	ids := addStudents(t, pool, 3)
	other := uuid.New()
	_, err := pool.Exec(context.Background(), "UPDATE students SET user_id = $1 WHERE id = $2", other, ids[0])
	require.NoError(t, err)
	run(t, pool, testConfig(url))
	eventually(t, "all settled", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'pending'") == 0
	})
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM students WHERE id = $1 AND user_id = $2", ids[0], other), "the existing link stands")
	var lastError string
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT last_error FROM outbox WHERE student_id = $1 AND state = 'dead'", ids[0]).Scan(&lastError))
	require.Contains(t, lastError, "already linked to a different user")
	require.Equal(t, 2, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'"))
}

// TestAuthRefusedIsRetriedNeverDead: Users refusing the sender's
// credentials (401, or a proxy's 403) is a misconfiguration, not a verdict
// on the row: the row is retried, even past SENDER_MAX_ATTEMPTS, never
// dead-lettered for it; the sender says so at error level, paced, and
// counts each refusal. Once the configuration is right, the row is
// delivered. The token appears in no log line and no recorded error.
func TestAuthRefusedIsRetriedNeverDead(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	const refusals = 5
	users, url := newFakeUsers(t, func(w http.ResponseWriter, r *http.Request, _ string, n int) bool {
		switch {
		case n == refusals: // a proxy in front of Users
			http.Error(w, "forbidden", http.StatusForbidden)
		case n < refusals:
			w.Header().Set("WWW-Authenticate", `Bearer realm="users", error="invalid_token"`)
			writeProblem(w, httpapi.Unauthorized("the bearer token is not valid"))
		default:
			return false
		}
		return true
	})
	addStudents(t, pool, 1)
	cfg := testConfig(url)
	cfg.MaxAttempts = 2 // fewer than the refusals: the cap must not apply
	r, logs := runLogged(t, pool, cfg)

	eventually(t, "row delivered once the refusals stop", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == 1
	})
	r.wait(t)
	require.Equal(t, refusals+1, count(t, pool, "SELECT attempts FROM outbox"))
	require.Zero(t, r.results(t, "dead"))
	require.InDelta(t, refusals, r.metric(t, "outbox_sender_results_total", "verdict", "retry", "reason_class", outbox.ReasonUsersAuthRefused), 0)
	require.InDelta(t, refusals-1, r.metric(t, "outbox_sender_auth_failures_total", "status", "401"), 0)
	require.InDelta(t, 1, r.metric(t, "outbox_sender_auth_failures_total", "status", "403"), 0)
	require.Equal(t, refusals, count(t, pool, "SELECT count(*) FROM outbox_events WHERE reason_class = $1", outbox.ReasonUsersAuthRefused))
	var lastErrors []string
	rows, err := pool.Query(context.Background(), "SELECT error FROM outbox_events WHERE reason_class = $1 ORDER BY id", outbox.ReasonUsersAuthRefused)
	require.NoError(t, err)
	for rows.Next() {
		var e string
		require.NoError(t, rows.Scan(&e))
		lastErrors = append(lastErrors, e)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, "Users answered 401 Unauthorized: Users refused the sender's credentials (check SENDER_USERS_TOKEN)", lastErrors[0])
	require.Equal(t, "Users answered 403 Forbidden: Users refused the sender's credentials (check SENDER_USERS_TOKEN)", lastErrors[refusals-1])
	require.Equal(t, refusals+1, users.deliveries(users.firstKey()))

	// Loud, but paced: the refusals came within one interval, so one line.
	line := `"level":"ERROR","msg":"Users refused the sender's credentials: misconfiguration`
	require.Equal(t, 1, strings.Count(logs.String(), line), "%s", logs)
	require.Contains(t, logs.String(), `"status":401`)
	require.NotContains(t, logs.String(), testToken)
}

// TestOutageIsLoggedAtTheDefaultLevel: Users unavailable for seven
// attempts shows in the sender's log at the default level, once when it
// starts and once when deliveries succeed again, not per attempt.
func TestOutageIsLoggedAtTheDefaultLevel(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	const failures = 7
	_, url := newFakeUsers(t, func(w http.ResponseWriter, _ *http.Request, _ string, n int) bool {
		if n > failures {
			return false
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	})
	addStudents(t, pool, 1)
	logs := &apitest.Logs{}
	r := runWith(t, slog.New(slog.NewJSONHandler(logs, nil)), pool, testConfig(url))
	eventually(t, "delivered once Users answers", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == 1
	})
	r.wait(t)
	failing := logLines(t, logs.String(), "deliveries failing; rows are retried with backoff, and this is said again every 30s while it lasts")
	require.Len(t, failing, 1, "%s", logs)
	require.Equal(t, "WARN", failing[0]["level"])
	require.Equal(t, outbox.ReasonUsersUnavailable, failing[0]["reason_class"])
	require.Equal(t, "Users answered 503 Service Unavailable", failing[0]["error"])
	back := logLines(t, logs.String(), "deliveries succeed again")
	require.Len(t, back, 1, "%s", logs)
	require.InDelta(t, failures, back[0]["failed_attempts"], 0)
	require.Empty(t, logLines(t, logs.String(), "delivery"), "no line per attempt at the default level")
}
