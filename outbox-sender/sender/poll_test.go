package sender

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/internal/outboxwake"
	"github.com/outboxref/outboxref/outbox-sender/deadletter"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// These tests are about the polling source: notifications wake it long
// before its poll.

// sleepyConfig is testConfig with a poll so slow that only a notification
// can explain a delivery within seconds.
func sleepyConfig(usersURL string) Config {
	cfg := testConfig(usersURL)
	cfg.PollInterval = time.Hour
	return cfg
}

// listenerPID is the backend of the sender's listening connection on
// pool's database, or 0 while there is none.
func listenerPID(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var pid int
	err := pool.QueryRow(context.Background(), `
		SELECT COALESCE(max(pid), 0) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'outbox-sender listener'`).Scan(&pid)
	require.NoError(t, err)
	return pid
}

// notify wakes the senders as Student does once rows are committed.
func notify(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	require.NoError(t, outboxwake.Notify(context.Background(), pool))
}

func TestNotificationWakesTheSender(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	_, url := newFakeUsers(t, nil)
	run(t, pool, sleepyConfig(url))
	eventually(t, "the sender listens", func() bool { return listenerPID(t, pool) != 0 })

	addStudents(t, pool, 1)
	notify(t, pool)
	deliveredWithin(t, pool, 1, patience, "a new row is delivered without waiting for the poll")
	addStudents(t, pool, 3)
	notify(t, pool)
	deliveredWithin(t, pool, 4, patience, "and so is the next, once the sender slept again")
}

// TestListenerReconnects: a listening connection that breaks is replaced,
// and rows committed meanwhile are not left to the poll.
func TestListenerReconnects(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	_, url := newFakeUsers(t, nil)
	run(t, pool, sleepyConfig(url))
	eventually(t, "the sender listens", func() bool { return listenerPID(t, pool) != 0 })

	first := listenerPID(t, pool)
	_, err := pool.Exec(context.Background(), "SELECT pg_terminate_backend($1)", first)
	require.NoError(t, err)
	addStudents(t, pool, 2) // most likely while nobody listens,
	notify(t, pool)         // so this is lost: the reconnection covers for it
	deliveredWithin(t, pool, 2, patience, "rows committed around the break are delivered")
	eventually(t, "a new listener", func() bool {
		pid := listenerPID(t, pool)
		return pid != 0 && pid != first
	})
	addStudents(t, pool, 1)
	notify(t, pool)
	deliveredWithin(t, pool, 3, patience, "the new listener is heard")
}

// TestRedriveWakesTheSender: a redriven row is due at once, and the
// database says so.
func TestRedriveWakesTheSender(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	_, url := newFakeUsers(t, nil)
	addStudents(t, pool, 1)
	_, err := pool.Exec(context.Background(), "UPDATE outbox SET state = 'dead', dead_at = now(), reason_class = 'invalid'")
	require.NoError(t, err)
	run(t, pool, sleepyConfig(url))
	eventually(t, "the sender listens", func() bool { return listenerPID(t, pool) != 0 })

	var id int64
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT id FROM outbox").Scan(&id))
	_, err = deadletter.New(asSender(t, pool), "test", 0).Redrive(context.Background(), id, outbox.RedriveRetry, false)
	require.NoError(t, err)
	deliveredWithin(t, pool, 1, patience, "the redriven row is delivered without waiting for the poll")
}
