package database

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestMain fails the package's tests if a pool they opened is left running.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func open(t *testing.T, dbURL string, l Limits) *pgxpool.Pool {
	t.Helper()
	pool, err := Open(context.Background(), dbURL, l)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func show(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, setting string) string {
	t.Helper()
	var v string
	require.NoError(t, q.QueryRow(context.Background(), "SHOW "+setting).Scan(&v))
	return v
}

// TestServerSideLimitsAreInEffect: the settings Open sends are the ones a
// pooled connection runs with, even where the URL asks for others.
func TestServerSideLimitsAreInEffect(t *testing.T) {
	t.Parallel()
	pool := open(t, pgtest.EmptyURL(t)+"&statement_timeout=0", Limits{StatementTimeout: 4 * time.Second, MaxConns: 3})
	require.EqualValues(t, 3, pool.Config().MaxConns)
	for setting, want := range map[string]string{
		"statement_timeout":                   "4s",
		"lock_timeout":                        "2s",
		"idle_in_transaction_session_timeout": "10s",
		"tcp_keepalives_idle":                 "5",
		"tcp_keepalives_interval":             "5",
		"tcp_keepalives_count":                "3",
		"tcp_user_timeout":                    "15000", // milliseconds, shown without a unit
	} {
		require.Equal(t, want, show(t, pool, setting), setting)
	}

	// Migrations run without a statement timeout; the other limits stay.
	migrate := open(t, pgtest.EmptyURL(t), Limits{})
	require.Equal(t, "0", show(t, migrate, "statement_timeout"))
	require.Equal(t, "0", show(t, migrate, "lock_timeout"))
	require.Equal(t, "10s", show(t, migrate, "idle_in_transaction_session_timeout"))
}

func TestConfigBoundsConnecting(t *testing.T) {
	t.Parallel()
	cfg, err := Config("postgres://u:secret@db.invalid:5432/x", Limits{})
	require.NoError(t, err)
	require.Equal(t, ConnectTimeout, cfg.ConnConfig.ConnectTimeout)
	cfg, err = Config("postgres://u:secret@db.invalid:5432/x?connect_timeout=2", Limits{})
	require.NoError(t, err)
	require.Equal(t, 2*time.Second, cfg.ConnConfig.ConnectTimeout, "a shorter bound in the URL stays")
	cfg, err = Config("postgres://u:secret@db.invalid:5432/x?connect_timeout=0", Limits{})
	require.NoError(t, err)
	require.Equal(t, ConnectTimeout, cfg.ConnConfig.ConnectTimeout, "no bound in the URL is not no bound at all")

	_, err = Config("postgres://u:secret@db:5432/x?sslmode=%zz", Limits{})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "secret", "a URL may hold a password")
}

// TestIdleInTransactionSessionIsEnded: a client that stops talking inside a
// transaction (frozen, or gone without closing) loses its session, and its
// locks, once the limit passes, instead of holding them for hours.
func TestIdleInTransactionSessionIsEnded(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.EmptyURL(t)
	const limit = 500 * time.Millisecond
	pool := open(t, dbURL, Limits{IdleInTransaction: limit})
	other := pgtest.Connect(t, dbURL)
	ctx := context.Background()

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	// Taken before the query: the server's idle clock starts when it has
	// answered, which on a loaded machine can be well before this client
	// reads the answer, so a clock started after it would run short.
	started := time.Now()
	var pid int
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid() FROM (SELECT pg_advisory_xact_lock(42)) AS locked").Scan(&pid))

	// The transaction now sits idle, holding the lock. Another session
	// gets it once the server has ended the idle one.
	require.Eventually(t, func() bool {
		var got bool
		require.NoError(t, other.QueryRow(ctx, "SELECT pg_try_advisory_lock(42)").Scan(&got))
		return got
	}, 30*time.Second, 20*time.Millisecond)
	require.GreaterOrEqual(t, time.Since(started), limit, "not before the limit")
	require.Zero(t, apitest.Count(t, other, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid), "the session is gone")

	// The frozen client, when it speaks again, learns its transaction is
	// gone, and that is the database being unavailable to it, not a bug.
	_, err = tx.Exec(ctx, "SELECT 1")
	require.Error(t, err)
	require.ErrorIs(t, Classify(err), ErrUnavailable, "%v", err)
}

// TestStatementTimeout: a statement that runs past the limit is cancelled
// by the server, and counts as "did not answer in time". Nothing else
// cancels it here: a sleep that ran its course would return no error.
func TestStatementTimeout(t *testing.T) {
	t.Parallel()
	pool := open(t, pgtest.EmptyURL(t), Limits{StatementTimeout: 200 * time.Millisecond})
	_, err := pool.Exec(context.Background(), "SELECT pg_sleep(5)")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "57014", pgErr.Code)
	require.ErrorIs(t, Classify(err), ErrUnavailable)
}

func TestUnavailableDatabaseIsClassified(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// Nothing listens: the connect error is unavailability.
	down := open(t, pgtest.DownURL(t), Limits{})
	err := down.Ping(ctx)
	require.ErrorIs(t, Classify(err), ErrUnavailable, "%v", err)

	// Something listens but never answers: the caller's deadline ends the
	// wait, and that is unavailability too. Without it, ConnectTimeout
	// would end it, far later than the deadline.
	silent := open(t, pgtest.SilentURL(t), Limits{})
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	started := time.Now()
	err = silent.Ping(dctx)
	require.Less(t, time.Since(started), ConnectTimeout, "the caller's deadline ended the wait")
	require.ErrorIs(t, Classify(err), ErrUnavailable, "%v", err)

	// Without a deadline of the caller's, connecting is bounded anyway: by
	// the URL's shorter connect_timeout here.
	slow := open(t, pgtest.SilentURL(t)+"&connect_timeout=1", Limits{})
	started = time.Now()
	err = slow.Ping(ctx)
	require.Less(t, time.Since(started), ConnectTimeout, "the URL's connect_timeout ended the wait")
	require.ErrorIs(t, Classify(err), ErrUnavailable, "%v", err)
}

func TestClassify(t *testing.T) {
	t.Parallel()
	require.NoError(t, Classify(nil))
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name        string
		err         error
		unavailable bool
	}{
		{"deadline", fmt.Errorf("get user: %w", context.DeadlineExceeded), true},
		{"caller gave up", fmt.Errorf("get user: %w", cancelled.Err()), false},
		{"connection failure", &pgconn.PgError{Code: "08006"}, true},
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, true},
		{"crash shutdown", &pgconn.PgError{Code: "57P02"}, true},
		{"starting up", &pgconn.PgError{Code: "57P03"}, true},
		{"too many connections", &pgconn.PgError{Code: "53300"}, true},
		{"statement timeout", &pgconn.PgError{Code: "57014"}, true},
		{"unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"lock timeout", &pgconn.PgError{Code: "55P03"}, false},
		{"no rows", pgx.ErrNoRows, false},
		{"broken connection", fmt.Errorf("insert: %w", &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}), true},
		{"closed connection", fmt.Errorf("insert: %w", pgconn.ErrConnClosed), true},
		{"anything else", errors.New("encode payload: bad"), false},
		{"refused login", &pgconn.PgError{Code: "28P01"}, false},
		{"no such database", &pgconn.PgError{Code: "3D000"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Classify(tt.err)
			require.ErrorIs(t, got, tt.err, "the cause is kept")
			require.Equal(t, tt.unavailable, errors.Is(got, ErrUnavailable))
		})
	}
	twice := Classify(Classify(context.DeadlineExceeded))
	require.Equal(t, "database unavailable: context deadline exceeded", twice.Error(), "classified once")
}

// TestWithDeadline: a caller that configured no timeout still gets one.
func TestWithDeadline(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]time.Duration{0: DefaultTimeout, -time.Second: DefaultTimeout, time.Second: time.Second} {
		before := time.Now()
		ctx, cancel := WithDeadline(context.Background(), d)
		after := time.Now()
		deadline, ok := ctx.Deadline()
		cancel()
		require.True(t, ok)
		require.WithinRange(t, deadline, before.Add(want), after.Add(want), "%s after the call", want)
	}
}

// TestMisconfigurationIsNotAnOutage: a database that does not exist is a
// mistake to fix, not an outage to wait out, so it is not "unavailable"
// (a 500, not a 503 with Retry-After).
func TestMisconfigurationIsNotAnOutage(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(pgtest.ServerURL(t))
	require.NoError(t, err)
	u.Path = "/no_such_database_here"
	pool := open(t, u.String(), Limits{StatementTimeout: time.Second})
	err = pool.Ping(context.Background())
	var connectErr *pgconn.ConnectError
	require.ErrorAs(t, err, &connectErr)
	require.NotErrorIs(t, Classify(err), ErrUnavailable)
}

// TestWhere names the server and database of a URL, never its login.
func TestWhere(t *testing.T) {
	t.Parallel()
	require.Equal(t, "db.example:5433/student", Where("postgres://outbox_sender:s3cret@db.example:5433/student?sslmode=disable"))
	require.Equal(t, "localhost:5432/users", Where("postgres://lab_reader@localhost/users?sslmode=disable"))
	require.NotContains(t, Where("postgres://u:s3cret@h:1/d"), "s3cret")
	require.Equal(t, "(unparsable)", Where("postgres://h:notaport/d"))
}

// TestDeleteInBatches: the delete runs until one run deletes fewer than a
// batch, each run under a deadline of its own, and a failure stops it
// with what was deleted so far, classified and named.
func TestDeleteInBatches(t *testing.T) {
	t.Parallel()
	runs := []int64{3, 3, 1}
	var calls int
	total, err := DeleteInBatches(context.Background(), time.Second, 3, "purge things", func(ctx context.Context) (int64, error) {
		_, ok := ctx.Deadline()
		require.True(t, ok, "each run is bounded")
		calls++
		return runs[calls-1], nil
	})
	require.NoError(t, err)
	require.Equal(t, int64(7), total)
	require.Equal(t, 3, calls)

	total, err = DeleteInBatches(context.Background(), time.Second, 3, "purge things", func(context.Context) (int64, error) {
		return 0, &pgconn.PgError{Code: "57P01"}
	})
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorContains(t, err, "purge things: ")
	require.Zero(t, total)
}
