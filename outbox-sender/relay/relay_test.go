package relay

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/outbox-sender/internal/store"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestMain fails the package's tests if any goroutine a test started is
// still running after they all finished.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The engine's whole runs, with each source and the HTTP transport, are
// tested where they are put together: package sender.

// noSource is a Source with nothing to offer, for tests of the engine's
// parts.
type noSource struct{ settled []int64 }

func (s *noSource) Feeds() []Feed       { return nil }
func (s *noSource) Run(context.Context) {}
func (s *noSource) Settled(ids []int64) { s.settled = append(s.settled, ids...) }

func TestBackoffGrowsWithJitterWithinBounds(t *testing.T) {
	t.Parallel()
	// Every attempt the defaults can reach, where a plain shift overflows.
	d := &Engine{cfg: Config{BackoffMin: 500 * time.Millisecond, BackoffMax: 5 * time.Minute}}
	for attempt := 1; attempt <= 10_000; attempt++ {
		b := d.backoff(attempt)
		require.Positive(t, b, "attempt %d", attempt)
		require.LessOrEqual(t, b, 5*time.Minute, "attempt %d", attempt)
	}
	e := &Engine{cfg: Config{BackoffMin: 100 * time.Millisecond, BackoffMax: 2 * time.Second}}
	for attempt, ceiling := range map[int]time.Duration{
		1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond,
		5: 1600 * time.Millisecond, 6: 2 * time.Second, 60: 2 * time.Second,
	} {
		for range 200 {
			d := e.backoff(attempt)
			require.GreaterOrEqual(t, d, ceiling/2, "attempt %d", attempt)
			require.LessOrEqual(t, d, ceiling, "attempt %d", attempt)
		}
	}
}

// fixedTransport answers every delivery with the same Answer.
type fixedTransport Answer

func (f fixedTransport) Deliver(context.Context, store.Row) Answer { return Answer(f) }

// TestRetryAfterIsCapped: the other side may ask for a longer wait than the
// backoff, never for one past SENDER_BACKOFF_MAX.
func TestRetryAfterIsCapped(t *testing.T) {
	t.Parallel()
	for asked, want := range map[time.Duration]time.Duration{
		0: 0, 7 * time.Second: 7 * time.Second, -5 * time.Second: 0, 10 * 365 * 24 * time.Hour: time.Minute,
	} {
		e := &Engine{cfg: Config{BackoffMin: time.Millisecond, BackoffMax: time.Minute, MaxAttempts: 10}, log: slog.New(slog.DiscardHandler),
			transport: fixedTransport{Verdict: Transient, Class: outbox.ReasonUsersUnavailable, RetryAfter: asked}}
		r, _ := e.deliver(context.Background(), store.Row{Attempts: 1})
		require.Equal(t, outbox.OutcomeRetry, r.Outcome)
		require.GreaterOrEqual(t, r.Delay, want, "Retry-After %s", asked)
		require.LessOrEqual(t, r.Delay, max(want, time.Millisecond), "Retry-After %s", asked)
	}
}

// TestAuthRefusalNeverUsesUpAttempts: the attempts cap dead-letters a row
// that keeps failing, but not one whose every attempt Users refused for the
// sender's credentials: under a wrong token every row fails alike.
func TestAuthRefusalNeverUsesUpAttempts(t *testing.T) {
	t.Parallel()
	e := &Engine{cfg: Config{BackoffMin: time.Millisecond, BackoffMax: time.Second, MaxAttempts: 3}}
	r := e.retryOrDie(store.Row{Attempts: 3}, outbox.ReasonUsersUnavailable, "503", 0)
	require.Equal(t, outbox.OutcomeDead, r.Outcome)
	require.Equal(t, outbox.ReasonAttemptsExhausted, r.Class)
	r = e.retryOrDie(store.Row{Attempts: 300}, outbox.ReasonUsersAuthRefused, "401", 0)
	require.Equal(t, outbox.OutcomeRetry, r.Outcome)
}

// TestSettlementsCountedOnce: a result counts only when this sender's
// write took effect. A second delivery of a row already delivered (by a
// sender whose lease this one outlived) and a retry fenced out by a lost
// lease count nothing; an answer that conflicts with the student's link
// counts as dead (conflict), not delivered; a released row counts released.
func TestSettlementsCountedOnce(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	ids := pgtest.AddStudents(t, pool, 4)
	st := store.New(pgtest.As(t, pool, migrations.OutboxSender), 3*time.Second)
	lease := store.Lease{Holder: "test-sender", For: time.Minute, MaxAge: time.Hour}
	src := &noSource{}
	e := New(slog.New(slog.DiscardHandler), st, src, nil, Config{Lease: lease})
	ctx := context.Background()
	claimed, err := st.ClaimDue(ctx, lease, 4)
	require.NoError(t, err)
	require.Len(t, claimed, 4)
	rows := map[uuid.UUID]store.Row{}
	for _, r := range claimed {
		rows[r.StudentID] = r
	}
	delivered0, stale, conflicting, handedBack := rows[ids[0]], rows[ids[1]], rows[ids[2]], rows[ids[3]]
	m := e.metrics
	results := func(verdict string) int {
		total := 0.0
		for _, class := range append([]string{"none"}, outbox.ReasonClasses...) {
			total += testutil.ToFloat64(m.results.WithLabelValues(verdict, class))
		}
		return int(total)
	}

	user := uuid.New()
	e.record(ctx, []store.Result{{Row: delivered0, Outcome: delivered, UserID: user}})
	e.record(ctx, []store.Result{{Row: delivered0, Outcome: delivered, UserID: user}})
	require.Equal(t, 1, results(delivered), "the second answer for a delivered row settles nothing")

	_, err = pool.Exec(ctx, "UPDATE outbox SET lease_token = gen_random_uuid() WHERE id = $1", stale.ID)
	require.NoError(t, err)
	e.record(ctx, []store.Result{{Row: stale, Outcome: retry, Class: outbox.ReasonUsersUnavailable, Error: "stale", Delay: time.Second}})
	require.Zero(t, results(retry), "a retry fenced out by the lease is the new holder's to count")

	_, err = pool.Exec(ctx, "UPDATE students SET user_id = $1 WHERE id = $2", uuid.New(), ids[2])
	require.NoError(t, err)
	batch := []store.Result{{Row: conflicting, Outcome: delivered, UserID: uuid.New()}, {Row: handedBack, Outcome: released}}
	e.record(ctx, batch)
	e.settled(batch)
	require.Equal(t, 1, results(delivered))
	require.InDelta(t, 1, testutil.ToFloat64(m.results.WithLabelValues(dead, outbox.ReasonConflict)), 0)
	require.InDelta(t, 1, testutil.ToFloat64(m.dead.WithLabelValues(outbox.ReasonConflict)), 0)
	require.InDelta(t, 1, testutil.ToFloat64(m.results.WithLabelValues(released, "none")), 0)
	require.Equal(t, []int64{conflicting.ID}, src.settled, "a row handed back is not settled")

	require.EqualValues(t, 2, sampleCount(t, m.lag), "one delivered, one dead")
	require.EqualValues(t, 2, sampleCount(t, m.attempts))
}

func sampleCount(t *testing.T, h prometheus.Histogram) uint64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, h.Write(&m))
	return m.GetHistogram().GetSampleCount()
}

// A fresh sender already exports the series alerts sum and take increase()
// of, at 0: a series born at its first increment would be missing from
// "inserted minus settled" until then, and increase() would miss that first
// step.
func TestSettledSeriesStartAtZero(t *testing.T) {
	t.Parallel()
	m := newMetrics()
	// Counted first, before any lookup below could create a series: the
	// series that can move, and only those.
	require.Equal(t, 4+len(outbox.RetryClasses)+len(outbox.DeadClasses), testutil.CollectAndCount(m.results))
	require.Equal(t, len(store.ReplyOutcomes), testutil.CollectAndCount(m.replies))
	require.Equal(t, len(outbox.DeadClasses), testutil.CollectAndCount(m.dead))
	require.Zero(t, testutil.ToFloat64(m.results.WithLabelValues(delivered, "none")))
	require.Zero(t, testutil.ToFloat64(m.results.WithLabelValues(released, "none")))
	require.Zero(t, testutil.ToFloat64(m.results.WithLabelValues(published, "none")))
	require.Zero(t, testutil.ToFloat64(m.results.WithLabelValues(unread, "none")))
	for _, class := range outbox.RetryClasses {
		require.Zero(t, testutil.ToFloat64(m.results.WithLabelValues(retry, class)), class)
	}
	for _, class := range outbox.DeadClasses {
		require.Zero(t, testutil.ToFloat64(m.results.WithLabelValues(dead, class)), class)
		require.Zero(t, testutil.ToFloat64(m.dead.WithLabelValues(class)), class)
	}
}

// TestOutageIsSaidPaced: a spell of failures is logged at its first
// failure, then summed up at most every outageSummaryEvery, and its end
// is logged once; nothing is logged per attempt, and a delivery while all
// is well logs nothing.
func TestOutageIsSaidPaced(t *testing.T) {
	t.Parallel()
	logs := &strings.Builder{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	var o outage
	ctx, t0 := context.Background(), time.Now()
	fail := func(at time.Duration, class string) {
		o.failed(ctx, log, t0.Add(at), store.Result{Outcome: retry, Class: class, Error: "POST /users: connection refused"})
	}
	o.delivered(ctx, log, t0)
	require.Empty(t, logs.String(), "all is well: nothing to say")
	fail(0, outbox.ReasonUsersUnreachable)
	for i := range 6 {
		fail(time.Duration(i+1)*3*time.Second, outbox.ReasonUsersUnreachable) // 7 attempts in 18s
	}
	require.Equal(t, 1, strings.Count(logs.String(), "\n"), "one line for the spell's start: %s", logs)
	require.Contains(t, logs.String(), `"level":"WARN","msg":"deliveries failing`)
	require.Contains(t, logs.String(), `"reason_class":"users-unreachable"`)
	fail(31*time.Second, outbox.ReasonUsersUnavailable)
	require.Contains(t, logs.String(), `"msg":"deliveries still failing","failed_attempts_since_last_line":7,"reason_classes":"users-unavailable=1 users-unreachable=6","failing_for":"31s"`)
	fail(32*time.Second, outbox.ReasonUsersUnavailable)
	o.delivered(ctx, log, t0.Add(40*time.Second))
	o.delivered(ctx, log, t0.Add(41*time.Second))
	require.Equal(t, 3, strings.Count(logs.String(), "\n"), "%s", logs)
	require.Contains(t, logs.String(), `"level":"INFO","msg":"deliveries succeed again","failed_attempts":9,"failing_for":"40s"`)
}

// recordingTransport counts the deliveries it is asked for.
type recordingTransport struct{ sent int }

func (r *recordingTransport) Deliver(context.Context, store.Row) Answer {
	r.sent++
	return Answer{Verdict: Delivered, UserID: uuid.New()}
}

// TestNothingSentAfterTheLease: a row whose lease ran out before its turn
// (a sender paused, or slower than its lease) is handed back unsent, and
// counts as settled for the source (the table carries it again); one
// within its lease is sent. The protocol's model (docs/model.md) found
// the run where a send after the lease makes a second user.
func TestNothingSentAfterTheLease(t *testing.T) {
	t.Parallel()
	tr := &recordingTransport{}
	e := &Engine{cfg: Config{MaxAttempts: 3}, log: slog.New(slog.DiscardHandler), transport: tr, metrics: newMetrics()}
	r, status := e.deliver(context.Background(), store.Row{Attempts: 1, LeaseEnds: time.Now().Add(-time.Millisecond)})
	require.Equal(t, outbox.OutcomeReleased, r.Outcome)
	require.True(t, r.Lapsed)
	require.Zero(t, status)
	require.Zero(t, tr.sent, "a row past its lease must not be sent")

	r, _ = e.deliver(context.Background(), store.Row{Attempts: 1, LeaseEnds: time.Now().Add(time.Minute)})
	require.Equal(t, outbox.OutcomeDelivered, r.Outcome)
	require.Equal(t, 1, tr.sent)

	src := &noSource{}
	e.source = src
	e.settled([]store.Result{{Row: store.Row{ID: 1}, Outcome: released, Lapsed: true}, {Row: store.Row{ID: 2}, Outcome: released}})
	require.Equal(t, []int64{1}, src.settled, "a lapsed row is settled, one handed back at shutdown is not")
}

// TestLapsed: no lease known never lapses; a lease lapses at its end.
// (The wall-clock half, for a machine that was suspended, cannot be
// driven from a test: Go builds no time whose monotonic reading lags its
// wall clock.)
func TestLapsed(t *testing.T) {
	t.Parallel()
	now := time.Now()
	require.False(t, lapsed(time.Time{}, now), "no lease known")
	require.False(t, lapsed(now.Add(time.Second), now))
	require.True(t, lapsed(now, now))
	require.True(t, lapsed(now.Add(-time.Second), now))
}
