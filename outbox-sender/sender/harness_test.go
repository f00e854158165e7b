package sender

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/outbox-sender/cdc"
	"github.com/outboxref/outboxref/outbox-sender/deadletter"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// The tests of this package run the whole relay (engine, source,
// transport, store) against a real PostgreSQL, with a stand-in Users.

var quiet = slog.New(slog.DiscardHandler)

// testToken is the sender's token in these tests; the fake Users accepts
// no other.
const testToken = "sender-token-0123456789abcdef"

// adminToken is the operator "test-admin"'s token for the admin port's
// outbox routes.
const adminToken = "operator-token-0123456789abcdef"

// testConfig is a sender that polls and retries quickly. Its request
// timeout is far beyond what even a loaded machine takes to answer: a
// request that timed out is rightly sent again (delivery is at least
// once), and the tests that count attempts or deliveries would read that
// retry as a failure. A test about timeouts sets a short one of its own.
// The lease covers the requests of a claim, as config.go requires.
func testConfig(usersURL string) Config {
	return Config{
		UsersURL: usersURL, UsersToken: testToken, ID: "test-sender",
		BatchSize: 10, Concurrency: 4, PollInterval: 10 * time.Millisecond,
		Lease: time.Minute, RequestTimeout: 10 * time.Second,
		MaxAttempts: 10, BackoffMin: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond,
		MaxAge: time.Hour, DatabaseTimeout: 3 * time.Second,
		Operators:   []auth.Credential{{Caller: "test-admin", Token: adminToken}},
		MaxRedrives: deadletter.DefaultMaxRedrives,
	}
}

// addStudents writes n students and their outbox rows the way Student does,
// and returns the students' ids.
func addStudents(t *testing.T, pool *pgxpool.Pool, n int) []uuid.UUID {
	t.Helper()
	return pgtest.AddStudents(t, pool, n)
}

// running is a relay started by run.
type running struct {
	*Relay
	cancel context.CancelFunc // begins the shutdown without waiting for it
	stop   func() error       // begins the shutdown and waits for Run
}

// wait stops the relay (if not yet) and waits for Run to return.
func (r *running) wait(t *testing.T) {
	t.Helper()
	require.NoError(t, r.stop())
}

// cdc is the relay's change-data-capture source; the test fails if it
// polls.
func (r *running) cdc(t *testing.T) *cdc.Source {
	t.Helper()
	c, ok := r.source.(*cdc.Source)
	require.True(t, ok, "the relay runs with SENDER_SOURCE=cdc")
	return c
}

// asSender opens a pool as outbox_sender on pool's database: the code
// under test runs with the sender's grants, while the test sets up and
// inspects with the administrator's pool.
func asSender(t *testing.T, pool *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	return pgtest.As(t, pool, migrations.OutboxSender)
}

// run starts a relay; it is stopped at cleanup if the test does not.
func run(t *testing.T, pool *pgxpool.Pool, cfg Config) *running {
	t.Helper()
	return runWith(t, quiet, pool, cfg)
}

// runLogged is run with the relay's log lines kept.
func runLogged(t *testing.T, pool *pgxpool.Pool, cfg Config) (*running, *apitest.Logs) {
	t.Helper()
	logs := &apitest.Logs{}
	return runWith(t, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), pool, cfg), logs
}

// runWith is run with the relay logging to log.
func runWith(t *testing.T, log *slog.Logger, pool *pgxpool.Pool, cfg Config) *running {
	t.Helper()
	r := New(log, asSender(t, pool), cfg)
	ctx, cancel := context.WithCancel(context.Background())
	stop := apitest.Start(t, func(stopped context.Context) error {
		context.AfterFunc(stopped, cancel)
		return r.Run(ctx)
	})
	return &running{Relay: r, cancel: cancel, stop: stop}
}

// gather reads every metric of the relay.
func (r *Relay) gather(t *testing.T) []*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(r.Collectors()...)
	families, err := reg.Gather()
	require.NoError(t, err)
	return families
}

// metric sums the series of the metric name whose labels include labels
// (name, value pairs): a counter's value, or a histogram's sample count.
func (r *Relay) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	total := 0.0
	for _, f := range r.gather(t) {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				total += m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				total += float64(m.GetHistogram().GetSampleCount())
			case m.GetGauge() != nil:
				total += m.GetGauge().GetValue()
			}
		}
	}
	return total
}

// results sums outbox_sender_results_total over reason classes for one
// verdict.
func (r *Relay) results(t *testing.T, verdict string) int {
	t.Helper()
	return int(r.metric(t, "outbox_sender_results_total", "verdict", verdict))
}

// histogram returns how many observations the histogram name holds, and
// their sum.
func (r *Relay) histogram(t *testing.T, name string) (count uint64, sum float64) {
	t.Helper()
	for _, f := range r.gather(t) {
		if f.GetName() == name {
			h := f.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatalf("no histogram %s", name)
	return 0, 0
}

// scrape gets /metrics from an admin router, as Prometheus would.
func scrape(t *testing.T, admin http.Handler) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Host = "localhost" // the admin port answers loopback names only
	admin.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// logLines decodes a JSON log, keeping the lines with message msg.
func logLines(t *testing.T, logs string, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line), "%s", sc.Text())
		if line["msg"] == msg {
			out = append(out, line)
		}
	}
	require.NoError(t, sc.Err())
	return out
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	return apitest.Count(t, pool, sql, args...)
}

// patience is how long a test waits for something that should happen
// within moments: long enough for a loaded machine, short of hanging.
const patience = 30 * time.Second

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, patience, 10*time.Millisecond, what)
}

// deliveredWithin fails the test unless want rows are delivered within d.
func deliveredWithin(t *testing.T, pool *pgxpool.Pool, want int, d time.Duration, what string) {
	t.Helper()
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == want
	}, d, 5*time.Millisecond, what)
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
