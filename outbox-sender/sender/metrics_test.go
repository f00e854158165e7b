package sender

import (
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

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
	sp := asSender(t, pool)
	r, logs := runLogged(t, pool, testConfig(url))
	eventually(t, "every row settled", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state <> 'pending'") == n
	})
	r.wait(t)

	results := func(verdict, class string) float64 {
		return r.metric(t, "outbox_sender_results_total", "verdict", verdict, "reason_class", class)
	}
	require.InDelta(t, n-1, results("delivered", "none"), 0)
	require.InDelta(t, 1, results("dead", outbox.ReasonRefused), 0)
	require.InDelta(t, 2, results("retry", outbox.ReasonUsersUnavailable), 0)
	require.Equal(t, n+2, r.results(t, "delivered")+r.results(t, "dead")+r.results(t, "retry"), "nothing else was counted")
	require.InDelta(t, 1, r.metric(t, "outbox_sender_dead_letters_total", "reason_class", outbox.ReasonRefused), 0)

	lags, lagSum := r.histogram(t, "outbox_sender_delivery_lag_seconds")
	require.EqualValues(t, n, lags, "one lag per settled row, delivered or dead")
	require.Positive(t, lagSum)
	attempts, attemptSum := r.histogram(t, "outbox_sender_settled_row_attempts")
	require.EqualValues(t, n, attempts)
	require.InDelta(t, (n-1)*1+3, attemptSum, 0, "the flaky row took three attempts, the others one each")

	// The scrape says the same, in the names the docs and dashboard use,
	// and the outbox's own figures agree: inserted = settled.
	code, body := scrape(t, adminRouter(quiet, sp, r.Relay))
	require.Equal(t, http.StatusOK, code)
	for _, want := range []string{
		`outbox_sender_results_total{reason_class="none",verdict="delivered"} 11`,
		`outbox_sender_results_total{reason_class="refused",verdict="dead"} 1`,
		`outbox_sender_results_total{reason_class="users-unavailable",verdict="retry"} 2`,
		"outbox_sender_delivery_lag_seconds_count 12",
		`outbox_sender_delivery_lag_seconds_bucket{le="30"} 12`,
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

// TestScrapeSurvivesTheDatabaseDown: with Student's database refusing
// connections, or accepting them and never answering, /metrics still
// answers 200 within its bound, with the sender's counters (at 0 here) and
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
			admin := adminRouter(log, pool, New(log, pool, testConfig("http://127.0.0.1:1")))

			for range 2 {
				start := time.Now()
				code, body := scrape(t, admin)
				// The database's read is cut off after 2s; a silent
				// database would otherwise hold the scrape past
				// Prometheus' own timeout (10s by default), for good.
				require.Less(t, time.Since(start), 10*time.Second, "the scrape is bounded")
				require.Equal(t, http.StatusOK, code, "%s", body)
				for _, want := range []string{
					"outbox_stats_read_ok 0",
					"outbox_sender_claimed_total 0",
					`outbox_sender_results_total{reason_class="none",verdict="delivered"} 0`,
					"outbox_sender_delivery_lag_seconds_count 0",
					"go_goroutines ",
				} {
					require.Contains(t, body, want)
				}
				require.NotContains(t, body, "outbox_rows{")
				require.NotContains(t, body, "\noutbox_oldest_pending_age_seconds ")
				require.NotContains(t, body, "\noutbox_oldest_published_age_seconds ")
			}
			require.Len(t, logLines(t, logs.String(),
				"read outbox stats for metrics; outbox_rows and the oldest ages are left out until it succeeds"), 1,
				"a failing read is logged at most once a minute")
		})
	}
}
