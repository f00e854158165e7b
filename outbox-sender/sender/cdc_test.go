package sender

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/testkit/pgcluster"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

var slotCounter atomic.Int64

// cdcDatabase is a fresh Student database for a cdc sender, with a slot
// name of its own (slots belong to the whole cluster), and the config to
// stream from it. The slot is dropped at cleanup, after the senders the
// test starts have stopped: a database with a slot cannot be dropped.
func cdcDatabase(t *testing.T, usersURL string) (*pgxpool.Pool, Config) {
	t.Helper()
	dbURL := pgtest.URL(t, migrations.Student)
	pool := pgtest.Connect(t, dbURL)
	var level string
	require.NoError(t, pool.QueryRow(context.Background(), "SHOW wal_level").Scan(&level))
	require.Equal(t, "logical", level,
		"the cdc tests need a server with wal_level=logical: run them with make test, whose throwaway cluster has it, or restart the server of TEST_DATABASE_URL with it")
	cfg := testConfig(usersURL)
	cfg.Source = SourceCDC
	cfg.CDCSlot = fmt.Sprintf("test_cdc_%d_%d", time.Now().UnixNano()%1e9, slotCounter.Add(1))
	cfg.CDCDatabaseURL = pgtest.RoleURL(t, dbURL, migrations.OutboxCDC)
	cfg.CDCGrace = time.Hour
	cfg.DatabaseTimeout = 3 * time.Second
	t.Cleanup(func() { dropSlot(t, pool, cfg.CDCSlot) })
	return pool, cfg
}

// dropSlot drops the slot, ending whatever streams from it first.
func dropSlot(t *testing.T, pool *pgxpool.Pool, slot string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		_, _ = pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot)
		_, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
		if err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("could not drop replication slot %s", slot)
}

// slotConfirmed is the slot's confirmed position, 0 while it does not
// exist.
func slotConfirmed(t *testing.T, pool *pgxpool.Pool, slot string) pglogrepl.LSN {
	t.Helper()
	var lsn string
	err := pool.QueryRow(context.Background(),
		`SELECT COALESCE(max(confirmed_flush_lsn)::text, '0/0') FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&lsn)
	require.NoError(t, err)
	pos, err := pglogrepl.ParseLSN(lsn)
	require.NoError(t, err)
	return pos
}

// TestStreamDeliversWithoutPolling: with the poll an hour away and new
// rows left to the stream for an hour, only the slot can explain a
// delivery within seconds. The slot is then confirmed past them.
func TestStreamDeliversWithoutPolling(t *testing.T) {
	t.Parallel()
	users, url := newFakeUsers(t, nil)
	pool, cfg := cdcDatabase(t, url)
	cfg.PollInterval = time.Hour
	r := run(t, pool, cfg)
	eventually(t, "the sender streams from its slot", r.cdc(t).Reading)
	require.False(t, r.cdc(t).Fallback())
	before := slotConfirmed(t, pool, cfg.CDCSlot)

	addStudents(t, pool, 20)
	deliveredWithin(t, pool, 20, patience, "every new row is delivered from the stream")
	require.Equal(t, 20, users.keys())
	require.Equal(t, 0, count(t, pool, "SELECT count(*) FROM students WHERE user_id IS NULL"))
	eventually(t, "the slot is confirmed past the delivered rows", func() bool {
		return slotConfirmed(t, pool, cfg.CDCSlot) > before
	})
	// The counter moves after the recording commits: read it once the
	// sender has stopped, when every recording is done.
	r.wait(t)
	require.Equal(t, 20, r.results(t, "delivered"))
}

// TestStreamedRetriesGoThroughTheTable: a streamed row that fails is
// scheduled for a retry in the table, and the poll, which leaves only new
// rows to the stream, delivers it.
func TestStreamedRetriesGoThroughTheTable(t *testing.T) {
	t.Parallel()
	users, url := newFakeUsers(t, func(w http.ResponseWriter, _ *http.Request, _ string, n int) bool {
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return true
		}
		return false
	})
	pool, cfg := cdcDatabase(t, url)
	r := run(t, pool, cfg)
	eventually(t, "the sender streams from its slot", r.cdc(t).Reading)

	addStudents(t, pool, 5)
	deliveredWithin(t, pool, 5, patience, "each row is delivered on its second attempt")
	require.Equal(t, 5, count(t, pool, "SELECT count(*) FROM outbox WHERE attempts = 2"))
	require.Equal(t, 5, users.keys())
	r.wait(t)
}

// TestStandbyTakesOverTheSlot: one sender streams, a second stands by;
// when the first stops, the second takes the slot over and delivers.
func TestStandbyTakesOverTheSlot(t *testing.T) {
	t.Parallel()
	_, url := newFakeUsers(t, nil)
	pool, cfg := cdcDatabase(t, url)
	cfg.PollInterval = time.Hour
	first := run(t, pool, cfg)
	eventually(t, "the first sender streams", first.cdc(t).Reading)
	second := cfg
	second.ID = "test-sender-2"
	standby := run(t, pool, second)
	sb := standby.cdc(t)
	eventually(t, "the second stands by, leaving new rows to the stream", func() bool {
		return !sb.Fallback() && !sb.Reading()
	})
	time.Sleep(1500 * time.Millisecond) // more than one try to take the slot
	require.False(t, standby.cdc(t).Reading(), "one reader per slot")

	addStudents(t, pool, 5)
	deliveredWithin(t, pool, 5, patience, "the first delivers")
	first.wait(t)
	eventually(t, "the second takes the slot over", standby.cdc(t).Reading)
	addStudents(t, pool, 5)
	deliveredWithin(t, pool, 10, patience, "the second delivers what comes next")
	standby.wait(t)
}

// TestDroppedSlotFallsBackToPolling: a slot dropped by hand is logged as
// an error, the rows committed meanwhile are delivered by the poll, and
// the slot is created again.
func TestDroppedSlotFallsBackToPolling(t *testing.T) {
	t.Parallel()
	_, url := newFakeUsers(t, nil)
	pool, cfg := cdcDatabase(t, url)
	cfg.CDCGrace = 300 * time.Millisecond
	r, logs := runLogged(t, pool, cfg)
	eventually(t, "the sender streams", r.cdc(t).Reading)
	addStudents(t, pool, 3)
	deliveredWithin(t, pool, 3, patience, "delivered from the stream")

	dropSlot(t, pool, cfg.CDCSlot)
	addStudents(t, pool, 10)
	deliveredWithin(t, pool, 13, patience, "rows committed while the slot was gone are delivered")
	eventually(t, "the loss is logged as an error", func() bool {
		return strings.Contains(logs.String(), "replication slot is gone")
	})
	source := r.cdc(t)
	eventually(t, "the slot is created again and streamed", func() bool {
		return source.Reading() && slotConfirmed(t, pool, cfg.CDCSlot) != 0
	})
	addStudents(t, pool, 2)
	deliveredWithin(t, pool, 15, patience, "and the stream delivers again")
	r.wait(t)
}

// TestSlotMetrics: in cdc mode the admin port serves the slot's state: it
// exists, is healthy and streamed by this sender, which received every
// insert (at least once: a new session replays what was not confirmed);
// once the slot is dropped, slot_ok says so.
func TestSlotMetrics(t *testing.T) {
	t.Parallel()
	_, url := newFakeUsers(t, nil)
	pool, cfg := cdcDatabase(t, url)
	cfg.PollInterval = time.Hour
	r := run(t, pool, cfg)
	admin := adminRouter(quiet, asSender(t, pool), r.Relay)
	eventually(t, "the sender streams", r.cdc(t).Reading)
	addStudents(t, pool, 7)
	deliveredWithin(t, pool, 7, patience, "delivered from the stream")

	eventually(t, "the slot's figures", func() bool {
		code, body := scrape(t, admin)
		require.Equal(t, http.StatusOK, code)
		for _, want := range []string{
			"outbox_cdc_slot_ok 1", "outbox_cdc_slot_active 1", "outbox_cdc_reading 1", "outbox_cdc_fallback 0",
			"\noutbox_cdc_changes_total ", "outbox_cdc_slot_lag_seconds 0", "\noutbox_cdc_retained_wal_bytes ", "\noutbox_cdc_slot_lag_bytes ",
		} {
			if !strings.Contains(body, want) {
				return false
			}
		}
		return r.metric(t, "outbox_cdc_changes_total") >= 7
	})
	// A polling sender serves none of it.
	sp := asSender(t, pool)
	_, body := scrape(t, adminRouter(quiet, sp, New(quiet, sp, testConfig(url))))
	require.NotContains(t, body, "outbox_cdc_")

	r.wait(t)
	dropSlot(t, pool, cfg.CDCSlot)
	_, body = scrape(t, admin)
	require.Contains(t, body, "outbox_cdc_slot_ok 0")
	require.Contains(t, body, "outbox_cdc_reading 0")
	require.NotContains(t, body, "outbox_cdc_retained_wal_bytes ", "no slot, no figure")
}

// TestInvalidatedSlotIsReplaced: a slot that PostgreSQL invalidated for
// holding more WAL than max_slot_wal_keep_size is logged as an error,
// dropped and made again, and the rows committed while it was unread are
// delivered. It runs on a server of its own: the setting is the whole
// server's, and would invalidate other tests' slots.
func TestInvalidatedSlotIsReplaced(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	require.NoError(t, err, "this test starts a PostgreSQL cluster of its own (it changes a server-wide setting)")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, c.Cleanup(ctx))
	})
	dbURL, err := c.CreateDatabase(ctx, "student")
	require.NoError(t, err)
	admin, err := pgx.ParseConfig(dbURL)
	require.NoError(t, err)
	require.NoError(t, migrations.Migrate(ctx, admin, migrations.Student, pgtest.Passwords))
	pool := pgtest.Connect(t, dbURL)

	_, url := newFakeUsers(t, nil)
	cfg := testConfig(url)
	cfg.Source, cfg.CDCSlot, cfg.CDCGrace = SourceCDC, "invalidated", 300*time.Millisecond
	cfg.CDCDatabaseURL = pgtest.RoleURL(t, dbURL, migrations.OutboxCDC)
	cfg.DatabaseTimeout = 3 * time.Second
	first := run(t, pool, cfg)
	eventually(t, "the first sender streams", first.cdc(t).Reading)
	first.wait(t)

	// Rows committed while nobody reads the slot, then enough WAL past
	// them, and a checkpoint, for the server to give the slot up.
	addStudents(t, pool, 5)
	for _, sql := range []string{
		"ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'", "SELECT pg_reload_conf()",
		"CREATE TABLE filler AS SELECT g, repeat('x', 500) AS pad FROM generate_series(1, 20000) g",
		"SELECT pg_switch_wal()", "CHECKPOINT", "SELECT pg_switch_wal()", "CHECKPOINT",
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	var status string
	require.NoError(t, pool.QueryRow(ctx, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'invalidated'").Scan(&status))
	require.Equal(t, "lost", status, "the test needs the server to invalidate the slot")

	second, logs := runLogged(t, pool, cfg)
	deliveredWithin(t, pool, 5, patience, "the rows committed while the slot was unread are delivered")
	eventually(t, "the invalidation is logged as an error", func() bool {
		return strings.Contains(logs.String(), "replication slot invalidated")
	})
	eventually(t, "a new slot is made and streamed", second.cdc(t).Reading)
	addStudents(t, pool, 2)
	deliveredWithin(t, pool, 7, patience, "and the stream delivers again")
	second.wait(t)
	dropSlot(t, pool, cfg.CDCSlot)
}

// TestRowsHandedBackAreReplayed: rows a stopping sender claimed from the
// stream but never sent are left unconfirmed, so the slot replays them to
// the next reader, which delivers them at once: with the poll an hour away
// and new rows left to the stream for an hour, nothing else could.
func TestRowsHandedBackAreReplayed(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{}, 10)
	proceed := make(chan struct{})
	var hold atomic.Bool
	hold.Store(true)
	_, url := newFakeUsers(t, func(_ http.ResponseWriter, _ *http.Request, _ string, _ int) bool {
		if hold.Load() {
			entered <- struct{}{}
			<-proceed
		}
		return false
	})
	pool, cfg := cdcDatabase(t, url)
	cfg.PollInterval = time.Hour
	cfg.Concurrency, cfg.BatchSize, cfg.RequestTimeout = 1, 5, 5*time.Second
	first := run(t, pool, cfg)
	eventually(t, "the first sender streams", first.cdc(t).Reading)
	addStudents(t, pool, 5)
	<-entered
	eventually(t, "all five claimed", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE lease_token IS NOT NULL") == 5
	})
	first.cancel()
	hold.Store(false)
	close(proceed)
	first.wait(t)
	require.Equal(t, 4, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'pending' AND attempts = 0"), "four handed back")

	second := run(t, pool, cfg)
	deliveredWithin(t, pool, 5, patience, "the rows handed back are delivered")
	// Starting up, a sender polls until it streams, so the delivery alone
	// does not show the replay; the stream's count does.
	eventually(t, "the slot replays the four", func() bool { return second.metric(t, "outbox_cdc_changes_total") >= 4 })
	second.wait(t)
}
