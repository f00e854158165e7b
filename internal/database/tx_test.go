package database

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// txPool is a pool of one connection on an empty database with a table t,
// whose round trips are recorded.
func txPool(t *testing.T) (*pgxpool.Pool, *pgtest.Trips, *pgxpool.Pool) {
	t.Helper()
	dbURL := pgtest.EmptyURL(t)
	admin := pgtest.Connect(t, dbURL)
	_, err := admin.Exec(context.Background(), "CREATE TABLE t (id int PRIMARY KEY, note text NOT NULL)")
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	trips := &pgtest.Trips{}
	cfg.ConnConfig.Tracer = trips
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, trips, admin
}

func insert(id int, note string) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue("INSERT INTO t (id, note) VALUES ($1, $2)", id, note)
	return b
}

// TestTxRidesOnItsStatements: BEGIN goes out with the first statement and
// COMMIT with the last, so a transaction of a read and a write costs two
// round trips, and what it wrote is there afterwards.
func TestTxRidesOnItsStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trips, admin := txPool(t)
	trips.Take()

	first := &pgx.Batch{}
	first.Queue("SELECT set_config('lock_timeout', '1500ms', true)")
	tx, err := Begin(ctx, pool, first)
	require.NoError(t, err)
	require.Empty(t, trips.Take(), "nothing is sent by Begin")
	var timeout string
	require.NoError(t, tx.QueryRow(ctx, "SHOW lock_timeout").Scan(&timeout))
	require.Equal(t, "1500ms", timeout, "Begin's statements ran first, in the transaction")
	require.NoError(t, tx.Commit(ctx, insert(1, "one")))
	tx.End(ctx)
	require.Len(t, trips.Take(), 2, "BEGIN with the read, the write with COMMIT")
	require.Equal(t, 1, apitest.Count(t, admin, "SELECT count(*) FROM t WHERE id = 1"))

	var off string
	require.NoError(t, pool.QueryRow(ctx, "SHOW lock_timeout").Scan(&off))
	require.Equal(t, "0", off, "the setting was local to the transaction")
}

// TestTxFailureCommitsNothing: a statement that fails in Commit's batch
// keeps COMMIT from running; End rolls back what came before it, and the
// pool's one connection is idle and usable again.
func TestTxFailureCommitsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _, admin := txPool(t)
	_, err := admin.Exec(ctx, "INSERT INTO t VALUES (7, 'taken')")
	require.NoError(t, err)

	tx, err := Begin(ctx, pool, nil)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO t VALUES (2, 'two')")
	require.NoError(t, err)
	last := insert(7, "duplicate")
	last.Queue("INSERT INTO t VALUES (3, 'three')")
	err = tx.Commit(ctx, last)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23505", pgErr.Code)
	tx.End(ctx)
	require.Zero(t, apitest.Count(t, admin, "SELECT count(*) FROM t WHERE id IN (2, 3)"), "nothing of the transaction committed")

	// The same (only) connection, back in the pool and out of the
	// transaction.
	tx, err = Begin(ctx, pool, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx, insert(4, "four")))
	tx.End(ctx)
	require.Equal(t, 1, apitest.Count(t, admin, "SELECT count(*) FROM t WHERE id = 4"))
}

// TestTxEndRollsBack: a transaction ended without Commit leaves nothing,
// and one that never sent a statement costs no round trip.
func TestTxEndRollsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trips, admin := txPool(t)
	trips.Take()

	tx, err := Begin(ctx, pool, nil)
	require.NoError(t, err)
	tx.End(ctx)
	require.Empty(t, trips.Take())

	tx, err = Begin(ctx, pool, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Send(ctx, insert(5, "five")))
	rows, err := tx.Query(ctx, "SELECT id FROM t")
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	require.Equal(t, []int32{5}, ids, "the transaction sees its own write")
	tx.End(ctx)
	require.Zero(t, apitest.Count(t, admin, "SELECT count(*) FROM t"))
}

// TestTxQueryRowWithBegin: the first statement's row comes back through
// the batch that carried BEGIN, as pgx's QueryRow would give it.
func TestTxQueryRowWithBegin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _, _ := txPool(t)

	tx, err := Begin(ctx, pool, nil)
	require.NoError(t, err)
	var n int
	require.ErrorIs(t, tx.QueryRow(ctx, "SELECT id FROM t").Scan(&n), pgx.ErrNoRows)
	tx.End(ctx)

	tx, err = Begin(ctx, pool, nil)
	require.NoError(t, err)
	err = tx.QueryRow(ctx, "SELECT 1/0").Scan(&n)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "22012", pgErr.Code, "division by zero")
	tx.End(ctx)

	// After the failed statement and the rollback, the connection is
	// still good.
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tx, err = Begin(ctx, pool, nil)
	require.NoError(t, err)
	require.NoError(t, tx.QueryRow(ctx, "SELECT 41 + 1").Scan(&n))
	require.Equal(t, 42, n)
	require.NoError(t, tx.Commit(ctx, nil))
	tx.End(ctx)
}

// TestLaterQueuesExecs: Later takes statements through Exec, as sqlc's
// :exec methods send them, and refuses those whose rows would be read.
func TestLaterQueuesExecs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := &Later{}
	_, err := l.Exec(ctx, "INSERT INTO t VALUES ($1, $2)", 1, "x")
	require.NoError(t, err)
	require.Equal(t, 1, l.Len())
	require.Equal(t, []any{1, "x"}, l.QueuedQueries[0].Arguments)
	rows, err := l.Query(ctx, "SELECT 1") //nolint:rowserrcheck,sqlclosecheck // refused: there are no rows
	require.ErrorIs(t, err, errNotLater)
	require.Nil(t, rows)
	require.ErrorIs(t, l.QueryRow(ctx, "SELECT 1").Scan(), errNotLater)
}

// TestAfterCommit: statements queued after COMMIT run once the transaction
// committed, their failure is handed to their callback and not returned,
// and they do not run when the transaction did not commit.
func TestAfterCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trips, admin := txPool(t)
	trips.Take()

	var failed []error
	tx, err := Begin(ctx, pool, nil)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO t VALUES (1, 'one')")
	require.NoError(t, err)
	tx.AfterCommit(insert(1, "duplicate"), func(err error) { failed = append(failed, err) })
	require.NoError(t, tx.Commit(ctx, nil), "committed: what came after cannot undo it")
	tx.End(ctx)
	require.Len(t, trips.Take(), 2)
	require.Len(t, failed, 1)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, failed[0], &pgErr)
	require.Equal(t, "23505", pgErr.Code)
	require.Equal(t, 1, apitest.Count(t, admin, "SELECT count(*) FROM t WHERE id = 1 AND note = 'one'"))

	tx, err = Begin(ctx, pool, nil)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO t VALUES (2, 'two')")
	require.NoError(t, err)
	tx.AfterCommit(insert(3, "three"), func(err error) { failed = append(failed, err) })
	require.Error(t, tx.Commit(ctx, insert(1, "taken")), "the last statement fails: no commit")
	tx.End(ctx)
	require.Len(t, failed, 1, "nothing after a commit that did not happen")
	require.Zero(t, apitest.Count(t, admin, "SELECT count(*) FROM t WHERE id IN (2, 3)"))

	tx, err = Begin(ctx, pool, nil)
	require.NoError(t, err)
	tx.AfterCommit(insert(5, "five"), nil)
	require.NoError(t, tx.Commit(ctx, insert(4, "four")))
	tx.End(ctx)
	require.Equal(t, 2, apitest.Count(t, admin, "SELECT count(*) FROM t WHERE id IN (4, 5)"), "both ran, each committed")
}

// TestWithCommit: statements queued with COMMIT ride in its round trip,
// ahead of Commit's own, and are the transaction's: one that fails stops
// the commit.
func TestWithCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trips, admin := txPool(t)
	trips.Take()

	tx, err := Begin(ctx, pool, nil)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO t VALUES (1, 'one')")
	require.NoError(t, err)
	tx.WithCommit(insert(2, "two"))
	require.NoError(t, tx.Commit(ctx, insert(3, "three")))
	tx.End(ctx)
	require.Len(t, trips.Take(), 2, "BEGIN with the first insert, the others with COMMIT")
	require.Equal(t, 3, apitest.Count(t, admin, "SELECT count(*) FROM t"))

	tx, err = Begin(ctx, pool, nil)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO t VALUES (4, 'four')")
	require.NoError(t, err)
	tx.WithCommit(insert(1, "taken"))
	require.Error(t, tx.Commit(ctx, insert(5, "five")), "the queued statement fails: no commit")
	tx.End(ctx)
	require.Zero(t, apitest.Count(t, admin, "SELECT count(*) FROM t WHERE id IN (4, 5)"))

	tx, err = Begin(ctx, pool, nil)
	require.NoError(t, err)
	b := insert(6, "six")
	b.QueuedQueries[0].Exec(func(pgconn.CommandTag) error { return nil })
	tx.WithCommit(b)
	require.ErrorIs(t, tx.Commit(ctx, nil), errCommitCallback)
	tx.End(ctx)
}

// TestReadAtCommit: a query read at COMMIT rides in its round trip, with
// BEGIN when nothing went before, and its row is read before Commit
// returns; a query that fails stops the commit; no row is the reader's
// to handle, and the transaction commits.
func TestReadAtCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trips, admin := txPool(t)
	trips.Take()

	upsert := "INSERT INTO t (id, note) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING note"
	read := func(note *string, err *error) func(pgx.Row) {
		return func(row pgx.Row) { *err = row.Scan(note) }
	}
	var note string
	var readErr error
	tx, err := Begin(ctx, pool, nil)
	require.NoError(t, err)
	tx.ReadAtCommit(read(&note, &readErr), upsert, 1, "one")
	tx.AfterCommit(insert(2, "two"), nil)
	require.NoError(t, tx.Commit(ctx, nil))
	tx.End(ctx)
	require.NoError(t, readErr)
	require.Equal(t, "one", note)
	require.Len(t, trips.Take(), 1, "BEGIN, the query, COMMIT and what follows it in one round trip")
	require.Equal(t, 2, apitest.Count(t, admin, "SELECT count(*) FROM t"))

	note, readErr = "", nil
	tx, err = Begin(ctx, pool, nil)
	require.NoError(t, err)
	tx.ReadAtCommit(read(&note, &readErr), upsert, 1, "again")
	require.NoError(t, tx.Commit(ctx, insert(3, "three")))
	tx.End(ctx)
	require.ErrorIs(t, readErr, pgx.ErrNoRows, "the row was there: nothing returned")
	require.Equal(t, 1, apitest.Count(t, admin, "SELECT count(*) FROM t WHERE id = 3"), "and the transaction committed")

	tx, err = Begin(ctx, pool, nil)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO t VALUES (4, 'four')")
	require.NoError(t, err)
	called := false
	tx.ReadAtCommit(func(pgx.Row) { called = true }, "INSERT INTO t (id, note) VALUES (1, 'taken') RETURNING note")
	require.Error(t, tx.Commit(ctx, nil), "the query fails: no commit")
	tx.End(ctx)
	require.False(t, called, "nothing to read from a transaction that did not commit")
	require.Zero(t, apitest.Count(t, admin, "SELECT count(*) FROM t WHERE id = 4"))

	// A row the reader cannot decode is the reader's error, after a
	// commit that happened: Commit must not report it as a failure.
	var wrong int
	readErr = nil
	tx, err = Begin(ctx, pool, nil)
	require.NoError(t, err)
	tx.ReadAtCommit(func(row pgx.Row) { readErr = row.Scan(&wrong) }, upsert, 5, "five")
	require.NoError(t, tx.Commit(ctx, nil))
	tx.End(ctx)
	require.Error(t, readErr, "text into an int")
	require.Equal(t, 1, apitest.Count(t, admin, "SELECT count(*) FROM t WHERE id = 5"), "committed all the same")
}

// TestRunAtCommit: a method of one row, as sqlc writes them, run at
// COMMIT: its second run, in the commit's round trip, is what counts.
func TestRunAtCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trips, admin := txPool(t)
	trips.Take()

	// insertNote is shaped as sqlc's :one methods are.
	insertNote := func(ctx context.Context, db DBTX, id int, note string) (string, error) {
		row := db.QueryRow(ctx, "INSERT INTO t (id, note) VALUES ($1, $2) RETURNING note", id, note)
		var got string
		err := row.Scan(&got)
		return got, err
	}
	var got string
	var err error
	runs := 0
	tx, err := Begin(ctx, pool, nil)
	require.NoError(t, err)
	tx.RunAtCommit(func(db DBTX) {
		runs++
		got, err = insertNote(ctx, db, 1, "one")
	})
	require.ErrorIs(t, err, errNotYet, "the first run only notes the statement")
	require.NoError(t, tx.Commit(ctx, nil))
	tx.End(ctx)
	require.NoError(t, err)
	require.Equal(t, "one", got)
	require.Equal(t, 2, runs)
	require.Len(t, trips.Take(), 1)
	require.Equal(t, 1, apitest.Count(t, admin, "SELECT count(*) FROM t WHERE id = 1"))
}

// TestRunAtCommitManyRows: a method of many rows (sqlc's :many) run at
// COMMIT reads every row; and what is queued at COMMIT runs in the order
// it was queued, ahead of Commit's own statements, so a later statement
// sees an earlier one's writes.
func TestRunAtCommitManyRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trips, _ := txPool(t)
	trips.Take()

	// insertNotes is shaped as sqlc's :many methods are.
	insertNotes := func(ctx context.Context, db DBTX, ids []int) ([]string, error) {
		rows, err := db.Query(ctx, "INSERT INTO t (id, note) SELECT i, 'n' || i FROM unnest($1::int[]) i RETURNING note", ids)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var notes []string
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				return nil, err
			}
			notes = append(notes, n)
		}
		return notes, rows.Err()
	}
	var (
		notes             []string
		insertErr         error
		counted, seenOne  int
		before, seenAfter string
	)
	tx, err := Begin(ctx, pool, nil)
	require.NoError(t, err)
	tx.RunAtCommit(func(db DBTX) { notes, insertErr = insertNotes(ctx, db, []int{1, 2, 3}) })
	require.ErrorIs(t, insertErr, errNotYet)
	tx.WithCommit(insert(4, "four"))
	tx.ReadAtCommit(func(row pgx.Row) { _ = row.Scan(&counted) }, "SELECT count(*)::int FROM t")
	tx.ReadAtCommit(func(row pgx.Row) { _ = row.Scan(&before) }, "SELECT note FROM t WHERE id = 1")
	last := &pgx.Batch{}
	last.Queue("UPDATE t SET note = 'changed by last' WHERE id = 1")
	require.NoError(t, tx.Commit(ctx, last))
	tx.End(ctx)
	require.NoError(t, insertErr)
	require.ElementsMatch(t, []string{"n1", "n2", "n3"}, notes)
	require.Equal(t, 4, counted, "the count ran after the inserts queued before it, WithCommit's among them")
	require.Equal(t, "n1", before, "the reads ran ahead of Commit's own statements")
	require.Len(t, trips.Take(), 1)
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*)::int, max(note) FILTER (WHERE id = 1) FROM t").Scan(&seenOne, &seenAfter))
	require.Equal(t, 4, seenOne)
	require.Equal(t, "changed by last", seenAfter, "and Commit's own ran, then COMMIT")

	// Values decodes a row as pgx's own rows do; a query of no rows
	// reads none.
	var (
		values            []any
		more              bool
		valuesErr, empErr error
	)
	tx, err = Begin(ctx, pool, nil)
	require.NoError(t, err)
	tx.RunAtCommit(func(db DBTX) {
		rows, qerr := db.Query(ctx, "SELECT id, note FROM t WHERE id = 2")
		if qerr != nil {
			valuesErr = qerr
			return
		}
		require.Nil(t, rows.RawValues(), "no row before Next")
		if rows.Next() {
			values, valuesErr = rows.Values()
			more = rows.Next()
		}
		if valuesErr == nil {
			valuesErr = rows.Err()
		}
	})
	tx.RunAtCommit(func(db DBTX) { notes, empErr = insertNotes(ctx, db, nil) })
	require.NoError(t, tx.Commit(ctx, nil))
	tx.End(ctx)
	require.NoError(t, valuesErr)
	require.NoError(t, empErr)
	require.Equal(t, []any{int32(2), "n2"}, values)
	require.False(t, more)
	require.Empty(t, notes)
}

// TestCommitRefusesWhatCannotCommit: statements sent with COMMIT may not
// have callbacks, whose errors could not stop the commit; and a
// transaction an earlier statement aborted is not committed, nor is what
// AfterCommit queued sent.
func TestCommitRefusesWhatCannotCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trips, admin := txPool(t)

	tx, err := Begin(ctx, pool, nil)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO t VALUES (1, 'one')")
	require.NoError(t, err)
	last := &pgx.Batch{}
	last.Queue("INSERT INTO t VALUES (2, 'two')").Exec(func(pgconn.CommandTag) error { return nil })
	trips.Take()
	require.ErrorIs(t, tx.Commit(ctx, last), errCommitCallback)
	require.Empty(t, trips.Take(), "refused before sending")
	tx.End(ctx)
	require.Zero(t, apitest.Count(t, admin, "SELECT count(*) FROM t"))

	tx, err = Begin(ctx, pool, nil)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "INSERT INTO t VALUES (1/0, 'boom')")
	require.Error(t, err)
	tx.AfterCommit(insert(3, "three"), func(err error) { t.Errorf("nothing after COMMIT should run: %v", err) })
	require.ErrorIs(t, tx.Commit(ctx, nil), pgx.ErrTxCommitRollback)
	tx.End(ctx)
	require.Zero(t, apitest.Count(t, admin, "SELECT count(*) FROM t"))
}

// TestExecAll: the statements go out in one round trip and commit together
// as the batch ends; a failure names the statement that failed, rolls back
// what came before it and runs nothing after it; the connection is idle
// again either way, with no ROLLBACK to send.
func TestExecAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trips, admin := txPool(t)
	_, err := admin.Exec(ctx, "INSERT INTO t VALUES (7, 'taken')")
	require.NoError(t, err)
	statements := func(ids ...int) []*pgx.QueuedQuery {
		b := &pgx.Batch{}
		b.Queue("SELECT set_config('lock_timeout', '1500ms', true)")
		for _, id := range ids {
			b.Queue("INSERT INTO t (id, note) VALUES ($1, 'new')", id)
		}
		return b.QueuedQueries
	}
	trips.Take()

	failed, err := ExecAll(ctx, pool, statements(1, 2))
	require.NoError(t, err)
	require.Equal(t, -1, failed)
	require.Len(t, trips.Take(), 1, "one round trip")
	require.Equal(t, 2, apitest.Count(t, admin, "SELECT count(*) FROM t WHERE note = 'new'"))

	failed, err = ExecAll(ctx, pool, statements(3, 7, 4))
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23505", pgErr.Code)
	require.Equal(t, 2, failed, "the second insert, after the setting and the first")
	require.Len(t, trips.Take(), 1, "no ROLLBACK: the batch's end rolled it back")
	require.Equal(t, 0, apitest.Count(t, admin, "SELECT count(*) FROM t WHERE id IN (3, 4)"), "nothing of the failed batch stays")

	var timeout string
	require.NoError(t, pool.QueryRow(ctx, "SHOW lock_timeout").Scan(&timeout))
	require.Equal(t, "0", timeout, "the setting was the batch's transaction's alone")

	withCallback := statements(5)
	withCallback[1].Exec(func(pgconn.CommandTag) error { return nil })
	_, err = ExecAll(ctx, pool, withCallback)
	require.Error(t, err)
	require.Equal(t, 0, apitest.Count(t, admin, "SELECT count(*) FROM t WHERE id = 5"), "refused before sending")
}
