package sender

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
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

// histogramData reads a histogram's count, sum and buckets.
func histogramData(t *testing.T, h prometheus.Histogram) *dto.Histogram {
	t.Helper()
	var m dto.Metric
	require.NoError(t, h.Write(&m))
	return m.GetHistogram()
}

// scrape gets /metrics from an admin router, as Prometheus would.
func scrape(t *testing.T, admin http.Handler) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	admin.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
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

// TestMetricsReadEverySettledRow: after n rows flow through, one of them
// retried twice before Users answered and one dead-lettered, the metrics
// read n settled rows, each counted once, whose lag and attempts are
// observed; the outbox's own figures agree; every attempt reached Users
// with its X-Request-Id and was logged with the row's identity.
func TestMetricsReadEverySettledRow(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	const n = 12
	ids := addStudents(t, pool, n)
	keyOf := func(student uuid.UUID) string {
		var k uuid.UUID
		require.NoError(t, pool.QueryRow(context.Background(), "SELECT idempotency_key FROM outbox WHERE student_id = $1", student).Scan(&k))
		return k.String()
	}
	flaky, refused := keyOf(ids[0]), keyOf(ids[1])
	users, url := newFakeUsers(t, func(w http.ResponseWriter, _ *http.Request, key string, seen int) bool {
		switch {
		case key == flaky && seen <= 2:
			w.WriteHeader(http.StatusServiceUnavailable)
		case key == refused:
			writeProblem(w, &httpapi.Problem{Type: httpapi.TypeDocumentTaken, Title: "Document number already in use", Status: http.StatusConflict})
		default:
			return false
		}
		return true
	})
	logs := &apitest.Logs{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	sp := asSender(t, pool)
	cfg := testConfig(url)
	s := New(log, sp, cfg)
	stop := apitest.Start(t, s.Run)
	eventually(t, "every row settled", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state <> 'pending'") == n
	})
	require.NoError(t, stop())

	m := s.metrics
	require.InDelta(t, n-1, testutil.ToFloat64(m.results.WithLabelValues("delivered", "none")), 0)
	require.InDelta(t, 1, testutil.ToFloat64(m.results.WithLabelValues("dead", ReasonRefused)), 0)
	require.InDelta(t, 2, testutil.ToFloat64(m.results.WithLabelValues("retry", ReasonUsersUnavailable)), 0)
	require.Equal(t, n+2, results(m, "delivered")+results(m, "dead")+results(m, "retry"), "nothing else was counted")
	require.InDelta(t, 1, testutil.ToFloat64(m.dead.WithLabelValues(ReasonRefused)), 0)

	lag := histogramData(t, m.lag)
	require.EqualValues(t, n, lag.GetSampleCount(), "one lag per settled row, delivered or dead")
	require.Positive(t, lag.GetSampleSum())
	for _, b := range lag.GetBucket() {
		if b.GetUpperBound() == 30 {
			require.EqualValues(t, n, b.GetCumulativeCount(), "every row settled within the test's seconds")
		}
	}
	attempts := histogramData(t, m.attempts)
	require.EqualValues(t, n, attempts.GetSampleCount())
	require.InDelta(t, (n-1)*1+3, attempts.GetSampleSum(), 0, "the flaky row took three attempts, the others one each")

	// The scrape says the same, in the names the README and dashboard use,
	// and the outbox's own figures agree: inserted = settled.
	code, body := scrape(t, adminRouter(quiet, sp, s, cfg))
	require.Equal(t, http.StatusOK, code)
	for _, want := range []string{
		`outbox_sender_results_total{reason_class="none",verdict="delivered"} 11`,
		`outbox_sender_results_total{reason_class="refused",verdict="dead"} 1`,
		`outbox_sender_results_total{reason_class="users-unavailable",verdict="retry"} 2`,
		"outbox_sender_delivery_lag_seconds_count 12",
		"outbox_sender_settled_row_attempts_count 12",
		`outbox_sender_settled_row_attempts_bucket{le="1"} 11`,
		`outbox_rows{state="delivered"} 11`,
		`outbox_rows{state="dead"} 1`,
		`outbox_rows{state="pending"} 0`,
		"outbox_stats_read_ok 1",
	} {
		require.Contains(t, body, want)
	}

	// Each attempt reached Users with its own request id.
	require.Equal(t, []string{flaky + "/1", flaky + "/2", flaky + "/3"}, users.requestIDsFor(flaky))
	require.Equal(t, []string{refused + "/1"}, users.requestIDsFor(refused))

	// One debug line per attempt, and every line about a delivery names
	// the row, its key and the attempt.
	deliveries := logLines(t, logs.String(), "delivery")
	require.Len(t, deliveries, n+2)
	identity := func(line map[string]any) {
		t.Helper()
		for _, k := range []string{"idempotency_key", "outbox_id", "student_id", "attempt"} {
			require.Contains(t, line, k, "%v", line)
		}
	}
	var flakyVerdicts []string
	for _, line := range deliveries {
		identity(line)
		require.Contains(t, line, "duration_ms")
		require.Contains(t, line, "status")
		if line["idempotency_key"] == flaky {
			flakyVerdicts = append(flakyVerdicts, line["verdict"].(string))
			require.Equal(t, ids[0].String(), line["student_id"])
		}
	}
	require.ElementsMatch(t, []string{"retry", "retry", "delivered"}, flakyVerdicts)
	deadLines := logLines(t, logs.String(), "outbox row dead-lettered")
	require.Len(t, deadLines, 1)
	identity(deadLines[0])
	require.Equal(t, refused, deadLines[0]["idempotency_key"])
	require.InDelta(t, 1, deadLines[0]["attempt"], 0)
}

// TestSettlementsCountedOnce: a result counts only when this sender's
// write took effect. A second delivery of a row already delivered (by a
// sender whose lease this one outlived) and a retry fenced out by a lost
// lease count nothing; an answer that conflicts with the student's link
// counts as dead (conflict), not delivered; a released row counts released.
func TestSettlementsCountedOnce(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	ids := addStudents(t, pool, 4)
	sp := asSender(t, pool)
	s := New(quiet, sp, testConfig("http://127.0.0.1:1"))
	ctx := context.Background()
	claimed, err := s.q.ClaimDue(ctx, sp, outboxdb.ClaimDueParams{Lease: time.Minute, BatchSize: 4, MaxAge: time.Hour})
	require.NoError(t, err)
	require.Len(t, claimed, 4)
	rows := map[uuid.UUID]outboxdb.ClaimDueRow{}
	for _, r := range claimed {
		rows[r.StudentID] = r
	}
	delivered0, stale, conflicting, released := rows[ids[0]], rows[ids[1]], rows[ids[2]], rows[ids[3]]
	m := s.metrics

	user := uuid.New()
	require.NoError(t, s.write(ctx, []result{{row: delivered0, verdict: delivered, userID: user}}))
	require.NoError(t, s.write(ctx, []result{{row: delivered0, verdict: delivered, userID: user}}))
	require.Equal(t, 1, results(m, "delivered"), "the second answer for a delivered row settles nothing")

	_, err = pool.Exec(ctx, "UPDATE outbox SET lease_token = gen_random_uuid() WHERE id = $1", stale.ID)
	require.NoError(t, err)
	require.NoError(t, s.write(ctx, []result{{row: stale, verdict: retry, class: ReasonUsersUnavailable, err: "stale", delay: time.Second}}))
	require.Zero(t, results(m, "retry"), "a retry fenced out by the lease is the new holder's to count")

	_, err = pool.Exec(ctx, "UPDATE students SET user_id = $1 WHERE id = $2", uuid.New(), ids[2])
	require.NoError(t, err)
	require.NoError(t, s.write(ctx, []result{{row: conflicting, verdict: delivered, userID: uuid.New()},
		{row: released, verdict: release}}))
	require.Equal(t, 1, results(m, "delivered"))
	require.InDelta(t, 1, testutil.ToFloat64(m.results.WithLabelValues("dead", ReasonConflict)), 0)
	require.InDelta(t, 1, testutil.ToFloat64(m.dead.WithLabelValues(ReasonConflict)), 0)
	require.InDelta(t, 1, testutil.ToFloat64(m.results.WithLabelValues("released", "none")), 0)

	require.EqualValues(t, 2, histogramData(t, m.lag).GetSampleCount(), "one delivered, one dead")
	require.EqualValues(t, 2, histogramData(t, m.attempts).GetSampleCount())
}

// TestScrapeSurvivesTheDatabaseDown: with Student's database refusing
// connections, or accepting them and never answering, /metrics still
// answers 200 within its bound, with the sender's counters and
// outbox_stats_read_ok 0 in place of the database's figures; the failure
// is logged once, not at every scrape.
func TestScrapeSurvivesTheDatabaseDown(t *testing.T) {
	t.Parallel()
	for name, dbURL := range map[string]string{"refused": pgtest.DownURL(t), "silent": pgtest.SilentURL(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool, err := pgxpool.New(context.Background(), dbURL)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			logs := &apitest.Logs{}
			log := slog.New(slog.NewJSONHandler(logs, nil))
			cfg := testConfig("http://127.0.0.1:1")
			s := New(log, pool, cfg)
			s.metrics.claimed.Add(3)
			s.metrics.settled(delivered, "", outboxdb.ClaimDueRow{CreatedAt: time.Now().Add(-time.Second), Attempts: 1}, time.Now())
			admin := adminRouter(log, pool, s, cfg)

			for range 2 {
				start := time.Now()
				code, body := scrape(t, admin)
				require.Less(t, time.Since(start), statsTimeout+time.Second, "the scrape is bounded")
				require.Equal(t, http.StatusOK, code, "%s", body)
				for _, want := range []string{
					"outbox_stats_read_ok 0",
					"outbox_sender_claimed_total 3",
					`outbox_sender_results_total{reason_class="none",verdict="delivered"} 1`,
					"outbox_sender_delivery_lag_seconds_count 1",
					"go_goroutines ",
				} {
					require.Contains(t, body, want)
				}
				require.NotContains(t, body, "outbox_rows{")
				require.NotContains(t, body, "\noutbox_oldest_pending_age_seconds ")
			}
			require.Len(t, logLines(t, logs.String(),
				"read outbox stats for metrics; outbox_rows and outbox_oldest_pending_age_seconds are left out until it succeeds"), 1,
				"a failing read is logged at most once a minute")
		})
	}
}

// A fresh sender already exports the series alerts sum and take increase()
// of, at 0: a series born at its first increment would be missing from
// "inserted minus settled" until then, and increase() would miss that first
// step.
func TestSettledSeriesStartAtZero(t *testing.T) {
	t.Parallel()
	m := newMetrics()
	// Counted first, before any lookup below could create a series.
	require.Equal(t, 2+2*len(ReasonClasses), testutil.CollectAndCount(m.results))
	require.Equal(t, len(ReasonClasses), testutil.CollectAndCount(m.dead))
	require.Zero(t, testutil.ToFloat64(m.results.WithLabelValues("delivered", "none")))
	require.Zero(t, testutil.ToFloat64(m.results.WithLabelValues("released", "none")))
	for _, class := range ReasonClasses {
		require.Zero(t, testutil.ToFloat64(m.results.WithLabelValues("dead", class)), class)
		require.Zero(t, testutil.ToFloat64(m.dead.WithLabelValues(class)), class)
	}
}
