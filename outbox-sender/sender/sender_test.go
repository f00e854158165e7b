package sender

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/outbox-sender/internal/outboxdb"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

var quiet = slog.New(slog.DiscardHandler)

// testToken is the sender's token in these tests; the fake Users accepts
// no other.
const testToken = "sender-token-0123456789abcdef"

func testConfig(usersURL string) Config {
	return Config{
		UsersURL: usersURL, UsersToken: testToken, ID: "test-sender",
		BatchSize: 10, Concurrency: 4, PollInterval: 10 * time.Millisecond,
		Lease: 10 * time.Second, RequestTimeout: 300 * time.Millisecond,
		MaxAttempts: 10, BackoffMin: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond,
		MaxAge: time.Hour,
	}
}

// addStudents writes n students and their outbox rows the way Student does,
// and returns the students' ids.
func addStudents(t *testing.T, pool *pgxpool.Pool, n int) []uuid.UUID {
	t.Helper()
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.New()
		payload := fmt.Sprintf(`{"name":"S %d","email":"s%d@example.com","document_number":"doc-%s"}`, i, i, ids[i])
		_, err := pool.Exec(context.Background(), `
			WITH s AS (INSERT INTO students (id, name, email, document_number) VALUES ($1, 'S', 's@example.com', $2) RETURNING id)
			INSERT INTO outbox (idempotency_key, operation, student_id, payload) SELECT gen_random_uuid(), 'create-user', id, $3 FROM s`,
			ids[i], "doc-"+ids[i].String(), payload)
		require.NoError(t, err)
	}
	return ids
}

// running is a sender started by run.
type running struct {
	*Sender
	cancel context.CancelFunc // begins the shutdown without waiting for it
	stop   func() error       // begins the shutdown and waits for Run
}

// wait stops the sender (if not yet) and waits for Run to return.
func (r *running) wait(t *testing.T) {
	t.Helper()
	require.NoError(t, r.stop())
}

// asSender opens a pool as outbox_sender on pool's database: the code
// under test runs with the sender's grants, while the test sets up and
// inspects with the administrator's pool.
func asSender(t *testing.T, pool *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	return pgtest.As(t, pool, migrations.OutboxSender)
}

// run starts a sender; it is stopped at cleanup if the test does not.
func run(t *testing.T, pool *pgxpool.Pool, cfg Config) *running {
	t.Helper()
	return runWith(t, quiet, pool, cfg)
}

// runWith is run with the sender logging to log.
func runWith(t *testing.T, log *slog.Logger, pool *pgxpool.Pool, cfg Config) *running {
	t.Helper()
	s := New(log, asSender(t, pool), cfg)
	ctx, cancel := context.WithCancel(context.Background())
	stop := apitest.Start(t, func(stopped context.Context) error {
		context.AfterFunc(stopped, cancel)
		return s.Run(ctx)
	})
	return &running{Sender: s, cancel: cancel, stop: stop}
}

func (r *running) results(verdict string) int {
	return results(r.metrics, verdict)
}

// results sums outbox_sender_results_total over reason classes for one
// verdict.
func results(m *metrics, verdict string) int {
	ch := make(chan prometheus.Metric)
	go func() {
		m.results.Collect(ch)
		close(ch)
	}()
	total := 0.0
	for metric := range ch {
		var d dto.Metric
		_ = metric.Write(&d) // a counter's Write cannot fail
		for _, l := range d.GetLabel() {
			if l.GetName() == "verdict" && l.GetValue() == verdict {
				total += d.GetCounter().GetValue()
			}
		}
	}
	return int(total)
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	return apitest.Count(t, pool, sql, args...)
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 15*time.Second, 10*time.Millisecond, what)
}

// fakeUsers is a Users stand-in: answer decides what each delivery gets,
// given the key and how many times that key was seen (from 1). Like Users,
// it answers 401 to a request without the sender's token, unless answer
// decides first.
type fakeUsers struct {
	mu     sync.Mutex
	seen   map[string]int
	ids    map[string]uuid.UUID
	bodies map[string]string
	// requestIDs holds the X-Request-Id of each delivery of a key, in order.
	requestIDs map[string][]string
	answer     func(w http.ResponseWriter, r *http.Request, key string, n int) bool
}

func newFakeUsers(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, key string, n int) bool) (*fakeUsers, string) {
	f := &fakeUsers{seen: map[string]int{}, ids: map[string]uuid.UUID{}, bodies: map[string]string{}, requestIDs: map[string][]string{}, answer: answer}
	ts := httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(ts.Close)
	return f, ts.URL
}

func (f *fakeUsers) serve(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.seen[key]++
	n := f.seen[key]
	f.bodies[key] = string(body)
	f.requestIDs[key] = append(f.requestIDs[key], r.Header.Get("X-Request-Id"))
	if _, ok := f.ids[key]; !ok {
		f.ids[key] = uuid.New()
	}
	id := f.ids[key]
	f.mu.Unlock()
	if r.Method != http.MethodPost || r.URL.Path != "/users" || r.Header.Get("Content-Type") != "application/json" {
		http.Error(w, "unexpected request", http.StatusTeapot)
		return
	}
	if f.answer != nil && f.answer(w, r, key, n) {
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+testToken {
		writeProblem(w, httpapi.Unauthorized("the bearer token is not valid"))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]any{"userId": id, "status": "created"})
}

func (f *fakeUsers) idFor(key string) uuid.UUID {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ids[key]
}

func (f *fakeUsers) requestIDsFor(key string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requestIDs[key]...)
}

func (f *fakeUsers) bodyFor(key string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bodies[key]
}

// firstKey returns a key the fake has seen (any, when it saw several).
func (f *fakeUsers) firstKey() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k := range f.seen {
		return k
	}
	return ""
}

func (f *fakeUsers) keys() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.seen)
}

func (f *fakeUsers) deliveries(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seen[key]
}

func writeProblem(w http.ResponseWriter, p *httpapi.Problem) {
	w.Header().Set("Content-Type", httpapi.ProblemContentType)
	w.WriteHeader(p.Status)
	_, _ = w.Write(p.Body())
}

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
func TestRetriesTransientFailures(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	failures := []func(w http.ResponseWriter){
		func(http.ResponseWriter) { time.Sleep(500 * time.Millisecond) }, // slower than the request timeout
		func(w http.ResponseWriter) { // Users read the request, then the connection dropped
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				conn.Close()
			}
		},
		func(w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) },
		func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
		},
		func(w http.ResponseWriter) { w.WriteHeader(http.StatusRequestTimeout) },
		func(w http.ResponseWriter) {
			writeProblem(w, &httpapi.Problem{Type: httpapi.TypeIdempotencyBusy, Title: "Idempotency key in use", Status: http.StatusConflict})
		},
		func(w http.ResponseWriter) { http.NotFound(w, nil) },                // a misrouted URL, not Users' verdict
		func(w http.ResponseWriter) { w.WriteHeader(http.StatusBadRequest) }, // a 400 that is not Users' problem
	}
	users, url := newFakeUsers(t, func(w http.ResponseWriter, _ *http.Request, _ string, n int) bool {
		if n > len(failures) {
			return false
		}
		failures[n-1](w)
		return true
	})
	addStudents(t, pool, 1)
	r := run(t, pool, testConfig(url))

	eventually(t, "row delivered after every failure", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == 1
	})
	r.wait(t)
	require.Equal(t, len(failures), r.results("retry"), "each failure was judged transient")
	require.Equal(t, 1, r.results("delivered"))
	require.Zero(t, r.results("dead"))
	require.Equal(t, len(failures)+1, count(t, pool, "SELECT attempts FROM outbox"))
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM students WHERE user_id IS NOT NULL"))
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE last_error IS NULL"), "a delivered row has no error")
	require.Equal(t, 1, users.keys())
}

func TestRetryAfterIsCapped(t *testing.T) {
	t.Parallel()
	s := &Sender{cfg: Config{BackoffMax: time.Minute}}
	for header, want := range map[string]time.Duration{
		"":          0,
		"7":         7 * time.Second,
		"-5":        0,
		"nonsense":  0,
		"315360000": time.Minute, // ten years: capped
		time.Now().Add(30 * time.Second).UTC().Format(http.TimeFormat): 30 * time.Second,
	} {
		resp := &http.Response{Header: http.Header{}}
		if header != "" {
			resp.Header.Set("Retry-After", header)
		}
		got := s.retryAfter(resp)
		require.InDelta(t, want, got, float64(time.Second), "Retry-After: %q", header)
	}
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

// TestLateSuccessWinsOverDeadLetter: a sender whose lease ran out records a
// 201 after another sender dead-lettered the row. The user exists in Users,
// so the student is linked and the row is delivered, not left contradicting.
func TestLateSuccessWinsOverDeadLetter(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	ids := addStudents(t, pool, 1)
	sp := asSender(t, pool)
	s := New(quiet, sp, testConfig("http://127.0.0.1:1"))
	ctx := context.Background()
	rows, err := s.q.ClaimDue(ctx, sp, outboxdb.ClaimDueParams{Lease: time.Minute, BatchSize: 1, MaxAge: time.Hour})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	_, err = pool.Exec(ctx, "UPDATE outbox SET state = 'dead', dead_at = now(), last_error = 'gave up'")
	require.NoError(t, err)

	user := uuid.New()
	require.NoError(t, s.write(ctx, []result{{row: rows[0], verdict: delivered, userID: user}}))
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM students WHERE id = $1 AND user_id = $2", ids[0], user))
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered' AND dead_at IS NULL AND last_error IS NULL"))

	// A stale retry verdict, by contrast, is fenced out by the lease token.
	_, err = pool.Exec(ctx, "UPDATE outbox SET state = 'pending', lease_token = gen_random_uuid()")
	require.NoError(t, err)
	require.NoError(t, s.write(ctx, []result{{row: rows[0], verdict: retry, err: "stale", delay: time.Second}}))
	require.Zero(t, count(t, pool, "SELECT count(*) FROM outbox WHERE last_error = 'stale'"))
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

// TestExpiredLeaseIsRedelivered: a sender that claimed rows and died leaves
// them leased; once the lease runs out another sender delivers them.
func TestExpiredLeaseIsRedelivered(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	_, url := newFakeUsers(t, nil)
	addStudents(t, pool, 5)
	_, err := pool.Exec(context.Background(),
		"UPDATE outbox SET available_at = now() + interval '1 second', lease_token = gen_random_uuid(), claimed_by = 'dead-sender', attempts = 1")
	require.NoError(t, err)
	started := time.Now()
	run(t, pool, testConfig(url))
	eventually(t, "leased rows delivered", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == 5
	})
	require.GreaterOrEqual(t, time.Since(started), 900*time.Millisecond, "not before the lease ran out")
	require.Equal(t, 5, count(t, pool, "SELECT count(*) FROM outbox WHERE attempts = 2 AND claimed_by = 'test-sender'"))
}

// TestSendersSideBySide: three senders on one outbox never deliver the same
// row at the same time: with no failures, each key reaches Users once.
func TestSendersSideBySide(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	users, url := newFakeUsers(t, func(http.ResponseWriter, *http.Request, string, int) bool {
		time.Sleep(2 * time.Millisecond)
		return false
	})
	const n = 300
	addStudents(t, pool, n)
	for i := range 3 {
		cfg := testConfig(url)
		cfg.ID = fmt.Sprintf("sender-%d", i)
		run(t, pool, cfg)
	}
	eventually(t, "all delivered", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == n
	})
	users.mu.Lock()
	defer users.mu.Unlock()
	require.Len(t, users.seen, n)
	for key, times := range users.seen {
		require.Equal(t, 1, times, "key %s delivered more than once", key)
	}
	require.Greater(t, count(t, pool, "SELECT count(DISTINCT claimed_by) FROM outbox"), 1, "the work was shared")
}

// TestShutdownFinishesInFlightAndReleasesTheRest: on shutdown the request in
// flight completes and is recorded; rows claimed but not sent are handed
// back at once, without counting an attempt.
func TestShutdownFinishesInFlightAndReleasesTheRest(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	entered := make(chan struct{}, 10)
	proceed := make(chan struct{})
	_, url := newFakeUsers(t, func(_ http.ResponseWriter, _ *http.Request, _ string, _ int) bool {
		entered <- struct{}{}
		<-proceed
		return false
	})
	addStudents(t, pool, 5)
	cfg := testConfig(url)
	cfg.Concurrency, cfg.BatchSize, cfg.RequestTimeout = 1, 5, 5*time.Second
	r := run(t, pool, cfg)
	<-entered
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE lease_token IS NOT NULL") == 5
	}, 5*time.Second, 10*time.Millisecond, "all five claimed")

	r.cancel()     // shutdown begins while the request is in flight...
	close(proceed) // ...which then completes
	r.wait(t)

	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered' AND attempts = 1"))
	require.Equal(t, 4, count(t, pool,
		"SELECT count(*) FROM outbox WHERE state = 'pending' AND attempts = 0 AND lease_token IS NULL AND available_at <= now()"))
}

func TestBackoffGrowsWithJitterWithinBounds(t *testing.T) {
	t.Parallel()
	// Every attempt the defaults can reach, where a plain shift overflows.
	d := &Sender{cfg: Config{BackoffMin: 500 * time.Millisecond, BackoffMax: 5 * time.Minute}}
	for attempt := 1; attempt <= 10_000; attempt++ {
		b := d.backoff(attempt)
		require.Positive(t, b, "attempt %d", attempt)
		require.LessOrEqual(t, b, 5*time.Minute, "attempt %d", attempt)
	}
	s := &Sender{cfg: Config{BackoffMin: 100 * time.Millisecond, BackoffMax: 2 * time.Second}}
	for attempt, ceiling := range map[int]time.Duration{
		1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond,
		5: 1600 * time.Millisecond, 6: 2 * time.Second, 60: 2 * time.Second,
	} {
		for range 200 {
			d := s.backoff(attempt)
			require.GreaterOrEqual(t, d, ceiling/2, "attempt %d", attempt)
			require.LessOrEqual(t, d, ceiling, "attempt %d", attempt)
		}
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	env := apitest.Env
	cfg, r, err := LoadConfig(env())
	require.NoError(t, err, "the defaults are consistent")
	require.Equal(t, 100, cfg.BatchSize)
	require.Equal(t, SourcePoll, cfg.Source, "polling stays the default")
	require.Contains(t, r.Names(), "SENDER_MAX_AGE")
	// With the defaults SENDER_MAX_AGE, not the attempt cap, ends retries:
	// even if every delay were the shortest a capped backoff can draw (half
	// of SENDER_BACKOFF_MAX), the attempts would outlast the age.
	require.Greater(t, time.Duration(cfg.MaxAttempts)*(cfg.BackoffMax/2), cfg.MaxAge)

	for _, bad := range [][]string{
		{"SENDER_BATCH_SIZE", "0"},
		{"SENDER_CONCURRENCY", "many"},
		{"SENDER_USERS_URL", "users:8081"},
		{"SENDER_LEASE", "2s"},
		{"SENDER_BACKOFF_MIN", "10m"},
		{"SENDER_SOURCE", "stream"},
		{"SENDER_CDC_SLOT", "Outbox-Slot"},
		{"SENDER_CDC_SLOT", strings.Repeat("s", 64)},
		{"SENDER_CDC_GRACE", "0s"},
		{"SENDER_CDC_DATABASE_URL", "mysql://x"},
	} {
		_, _, err := LoadConfig(env(bad...))
		require.ErrorContains(t, err, bad[0], "%v", bad)
	}
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
	logs := &apitest.Logs{}
	s := New(slog.New(slog.NewJSONHandler(logs, nil)), asSender(t, pool), cfg)
	stop := apitest.Start(t, s.Run)

	eventually(t, "row delivered once the refusals stop", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == 1
	})
	require.NoError(t, stop())
	require.Equal(t, refusals+1, count(t, pool, "SELECT attempts FROM outbox"))
	require.Zero(t, results(s.metrics, "dead"))
	require.InDelta(t, refusals, testutil.ToFloat64(s.metrics.results.WithLabelValues("retry", ReasonUsersAuthRefused)), 0)
	require.InDelta(t, refusals-1, testutil.ToFloat64(s.metrics.authFailures.WithLabelValues("401")), 0)
	require.InDelta(t, 1, testutil.ToFloat64(s.metrics.authFailures.WithLabelValues("403")), 0)
	require.Equal(t, refusals, count(t, pool, "SELECT count(*) FROM outbox_events WHERE reason_class = $1", ReasonUsersAuthRefused))
	var lastErrors []string
	rows, err := pool.Query(context.Background(), "SELECT error FROM outbox_events WHERE reason_class = $1 ORDER BY id", ReasonUsersAuthRefused)
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

// TestAlarmPacesItsLines: the first event rings, then one per interval,
// with the number of events since the last ring.
func TestAlarmPacesItsLines(t *testing.T) {
	t.Parallel()
	var a alarm
	t0 := time.Now()
	n, ok := a.ring(t0, time.Minute)
	require.True(t, ok)
	require.Equal(t, 1, n)
	for i := range 3 {
		_, ok = a.ring(t0.Add(time.Duration(i+1)*time.Second), time.Minute)
		require.False(t, ok)
	}
	n, ok = a.ring(t0.Add(time.Minute), time.Minute)
	require.True(t, ok)
	require.Equal(t, 4, n, "three held back, and this one")
}

// The claim, and only the claim, commits without waiting for a WAL flush
// (see ClaimDue): run inside an explicit transaction, the setting it makes
// for its own transaction can be read back before the commit. The test
// cluster runs with synchronous_commit off for speed, so each transaction
// first turns it on, as a production server has it.
func TestClaimAloneSkipsTheFlushWait(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	sender := asSender(t, pool)
	addStudents(t, pool, 1)
	ctx := context.Background()
	q := outboxdb.New()

	setting := func(tx pgx.Tx) string {
		var v string
		require.NoError(t, tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&v))
		return v
	}
	begin := func() pgx.Tx {
		tx, err := sender.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		_, err = tx.Exec(ctx, "SET LOCAL synchronous_commit = on")
		require.NoError(t, err)
		return tx
	}
	tx := begin()
	rows, err := q.ClaimDue(ctx, tx, outboxdb.ClaimDueParams{Lease: time.Minute, BatchSize: 10, MaxAge: time.Hour})
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, "off", setting(tx), "the claim's transaction commits without waiting for the flush")
	require.NoError(t, tx.Commit(ctx))

	tx2 := begin()
	_, err = q.LinkStudents(ctx, tx2, outboxdb.LinkStudentsParams{
		OutboxIds: []int64{rows[0].ID}, StudentIds: []uuid.UUID{rows[0].StudentID}, UserIds: []uuid.UUID{uuid.New()},
	})
	require.NoError(t, err)
	require.Equal(t, "on", setting(tx2), "recording an answer waits for the flush")
}
