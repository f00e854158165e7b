package sender

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// These tests are about who holds a row: leases that run out, senders side
// by side, a sender that stops, and claims that gather batches.

// TestExpiredLeaseIsRedelivered: a sender that claimed rows and died leaves
// them leased; once the lease runs out another sender delivers them.
func TestExpiredLeaseIsRedelivered(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	_, url := newFakeUsers(t, nil)
	addStudents(t, pool, 5)
	// The lease's end by the database's clock, which also stamps each
	// delivery: a test's own clock, read after the update, could start
	// late on a loaded machine and find the wait too short.
	var leaseEnds time.Time
	require.NoError(t, pool.QueryRow(context.Background(), `
		WITH leased AS (
			UPDATE outbox SET available_at = now() + interval '1 second', lease_token = gen_random_uuid(), claimed_by = 'dead-sender', attempts = 1
			RETURNING available_at)
		SELECT max(available_at) FROM leased`).Scan(&leaseEnds))
	run(t, pool, testConfig(url))
	eventually(t, "leased rows delivered", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == 5
	})
	require.Equal(t, 5, count(t, pool, "SELECT count(*) FROM outbox WHERE delivered_at >= $1", leaseEnds), "not before the lease ran out")
	require.Equal(t, 5, count(t, pool, "SELECT count(*) FROM outbox WHERE attempts = 2 AND claimed_by = 'test-sender'"))
}

// TestSendersSideBySide: three senders on one outbox never deliver the same
// row at the same time: with no failures, each key reaches Users once.
// That count is the point, so nothing may fail: a request that timed out
// would rightly be sent again. testConfig's request timeout is far longer
// than any answer here takes, however loaded the machine, and its lease
// longer than the test.
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
	require.Zero(t, count(t, pool, "SELECT count(*) FROM outbox WHERE attempts <> 1"), "no row was claimed twice")
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
	eventually(t, "all five claimed", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE lease_token IS NOT NULL") == 5
	})

	r.cancel()     // shutdown begins while the request is in flight...
	close(proceed) // ...which then completes
	r.wait(t)

	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered' AND attempts = 1"))
	require.Equal(t, 4, count(t, pool,
		"SELECT count(*) FROM outbox WHERE state = 'pending' AND attempts = 0 AND lease_token IS NULL AND available_at <= now()"))
}

// TestBatchSizesCountEveryRow: with a backlog of deliveries that finish
// one by one, every row is claimed once and recorded once, and the two
// histograms of batch sizes count each exactly once. How large the
// batches are is a matter of timing: alone this test saw 20 to 27 rows per
// claim and 4.4 to 7.5 answers per recording, beside the other packages'
// tests as few as 8.5 and 2.2, which is what claiming at every free slot
// gives. So the sizes are measured by make bench ("rows per claim", "rows
// per recording"), side by side with a baseline; here only a claimer that
// stopped batching altogether fails.
// Not parallel, so that its log says something when read.
func TestBatchSizesCountEveryRow(t *testing.T) {
	pool := pgtest.Pool(t, migrations.Student)
	_, url := newFakeUsers(t, func(http.ResponseWriter, *http.Request, string, int) bool {
		// Deliveries of varying length finish one by one, as real ones do.
		time.Sleep(time.Duration(rand.N(4000)) * time.Microsecond)
		return false
	})
	const n = 1000
	addStudents(t, pool, n)
	cfg := testConfig(url)
	cfg.BatchSize, cfg.Concurrency = 50, 8
	r := run(t, pool, cfg)
	eventually(t, "all delivered", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == n
	})
	claims, claimed := r.histogram(t, "outbox_sender_claim_size_rows")
	records, recorded := r.histogram(t, "outbox_sender_record_size_rows")
	require.Equal(t, n, int(claimed))
	require.Equal(t, n, int(recorded))
	t.Logf("%d claims of %.1f rows on average, %d recording transactions of %.1f", claims, claimed/float64(claims), records, recorded/float64(records))
	// A claim per row would be a claimer that no longer batches at all.
	require.GreaterOrEqual(t, claimed/float64(claims), 2.0, "rows per claim")
}
