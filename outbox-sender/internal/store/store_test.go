package store

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/outbox-sender/internal/outboxdb"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

var lease = Lease{Holder: "test-sender", For: time.Minute, MaxAge: time.Hour}

// newStore returns a Student database with n students, and a Store on it
// as the sender's role: the code under test runs with the sender's grants.
func newStore(t *testing.T, n int) (*pgxpool.Pool, *Store, []uuid.UUID) {
	t.Helper()
	pool := pgtest.Pool(t, migrations.Student)
	ids := pgtest.AddStudents(t, pool, n)
	return pool, New(pgtest.As(t, pool, migrations.OutboxSender), 3*time.Second), ids
}

// oneSession is a store of the sender's role on admin's database with a
// pool of one connection, so that every call shares a session (and its
// pg_prepared_statements), and that pool.
func oneSession(t *testing.T, admin *pgxpool.Pool) (*pgxpool.Pool, *Store) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.RoleURL(t, admin.Config().ConnString(), migrations.OutboxSender))
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, New(pool, 3*time.Second)
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	return apitest.Count(t, pool, sql, args...)
}

// TestClaimSkipsTheFlushWait: the claim, and only the claim, commits
// without waiting for a WAL flush (see noFlushWait). Its setting and its
// statement share one transaction, so the statement sees the setting; the
// setting ends with that transaction, so nothing else on the connection
// does. The database is set to synchronous commits first, as a production
// server has it (the test cluster runs without them, for speed).
func TestClaimSkipsTheFlushWait(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	ctx := context.Background()
	_, err := pool.Exec(ctx, "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET synchronous_commit = on', current_database()); END $$")
	require.NoError(t, err)
	sender := pgtest.As(t, pool, migrations.OutboxSender)

	show := func(q outboxdb.DBTX) string {
		rows, err := q.Query(ctx, "SELECT current_setting('synchronous_commit')")
		require.NoError(t, err)
		defer rows.Close()
		var v string
		require.True(t, rows.Next())
		require.NoError(t, rows.Scan(&v))
		require.False(t, rows.Next())
		require.NoError(t, rows.Err())
		return v
	}
	require.Equal(t, "on", show(sender), "the sender's connections commit synchronously")
	require.Equal(t, "off", show(noFlushWait{sender}), "a claim's transaction does not wait for the flush")
	for range 3 { // whichever connection the pool hands out
		require.Equal(t, "on", show(sender), "the setting ended with the claim's transaction")
	}

	// And the claim itself runs that way, returning its rows.
	pgtest.AddStudents(t, pool, 2)
	rows, err := New(sender, 10*time.Second).ClaimDue(ctx, lease, 10)
	require.NoError(t, err)
	require.Len(t, rows, 2)
	require.Equal(t, 2, count(t, pool, "SELECT count(*) FROM outbox WHERE claimed_by = 'test-sender' AND attempts = 1"))
}

// TestClaimDueLeavingNew: the table's claim beside a stream leaves a new,
// untried row to the stream until it is older than the grace, and takes a
// row tried before or redriven at once.
func TestClaimDueLeavingNew(t *testing.T) {
	t.Parallel()
	pool, st, ids := newStore(t, 3)
	ctx := context.Background()
	_, err := pool.Exec(ctx, "UPDATE outbox SET attempts = 1 WHERE student_id = $1", ids[0])
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE outbox SET redrives = 1 WHERE student_id = $1", ids[1])
	require.NoError(t, err)

	rows, err := st.ClaimDueLeavingNew(ctx, lease, 10, time.Hour)
	require.NoError(t, err)
	require.ElementsMatch(t, []uuid.UUID{ids[0], ids[1]}, []uuid.UUID{rows[0].StudentID, rows[1].StudentID})
	require.Len(t, rows, 2, "the new row is the stream's")

	_, err = pool.Exec(ctx, "UPDATE outbox SET available_at = now() - interval '2 hours' WHERE student_id = $1", ids[2])
	require.NoError(t, err)
	rows, err = st.ClaimDueLeavingNew(ctx, lease, 10, time.Hour)
	require.NoError(t, err)
	require.Len(t, rows, 1, "past the grace the table takes it")
	require.Equal(t, ids[2], rows[0].StudentID)
}

// TestLateSuccessWinsOverDeadLetter: a sender whose lease ran out records a
// 201 after another sender dead-lettered the row. The user exists in Users,
// so the student is linked and the row is delivered, not left contradicting.
// A stale retry, by contrast, is fenced out by the lease token.
func TestLateSuccessWinsOverDeadLetter(t *testing.T) {
	t.Parallel()
	pool, st, ids := newStore(t, 1)
	ctx := context.Background()
	rows, err := st.ClaimDue(ctx, lease, 1)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	_, err = pool.Exec(ctx, "UPDATE outbox SET state = 'dead', dead_at = now(), last_error = 'gave up'")
	require.NoError(t, err)

	user := uuid.New()
	rec, err := st.Record(ctx, lease, []Result{{Row: rows[0], Outcome: outbox.OutcomeDelivered, UserID: user}})
	require.NoError(t, err)
	require.True(t, rec.Applied[rows[0].ID])
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM students WHERE id = $1 AND user_id = $2", ids[0], user))
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered' AND dead_at IS NULL AND last_error IS NULL"))

	_, err = pool.Exec(ctx, "UPDATE outbox SET state = 'pending', lease_token = gen_random_uuid()")
	require.NoError(t, err)
	rec, err = st.Record(ctx, lease, []Result{{Row: rows[0], Outcome: outbox.OutcomeRetry, Error: "stale", Delay: time.Second}})
	require.NoError(t, err)
	require.False(t, rec.Applied[rows[0].ID], "the new lease holder's to record")
	require.Zero(t, count(t, pool, "SELECT count(*) FROM outbox WHERE last_error = 'stale'"))
}

// TestConflictIsDeadNotOverwritten: an answer whose user differs from the
// one the student holds dead-letters the row as a conflict and leaves the
// student's link as it is; its history says so. Both ways a batch is
// recorded: deliveries alone (one round trip, the links read after the
// commit) and beside a retry (the links read before the rest is sent).
func TestConflictIsDeadNotOverwritten(t *testing.T) {
	t.Parallel()
	pool, st, ids := newStore(t, 4)
	ctx := context.Background()
	rows, err := st.ClaimDue(ctx, lease, 4)
	require.NoError(t, err)
	require.Len(t, rows, 4)
	other := uuid.New()
	byStudent := map[uuid.UUID]Row{}
	for _, r := range rows {
		byStudent[r.StudentID] = r
	}
	// The first student of each batch holds another user already.
	_, err = pool.Exec(ctx, "UPDATE students SET user_id = $1 WHERE id = ANY($2)", other, []uuid.UUID{ids[0], ids[2]})
	require.NoError(t, err)

	for _, batch := range [][]Result{
		{
			{Row: byStudent[ids[0]], Outcome: outbox.OutcomeDelivered, UserID: uuid.New()},
			{Row: byStudent[ids[1]], Outcome: outbox.OutcomeDelivered, UserID: uuid.New()},
		},
		{
			{Row: byStudent[ids[2]], Outcome: outbox.OutcomeDelivered, UserID: uuid.New()},
			{Row: byStudent[ids[3]], Outcome: outbox.OutcomeRetry, Error: "refused", Delay: time.Second},
		},
	} {
		conflict := batch[0]
		rec, err := st.Record(ctx, lease, batch)
		require.NoError(t, err)
		require.Equal(t, map[int64]uuid.UUID{conflict.Row.ID: conflict.UserID}, rec.Conflicts)
		require.True(t, rec.Applied[conflict.Row.ID])
		require.True(t, rec.Applied[batch[1].Row.ID])
		require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM students WHERE id = $1 AND user_id = $2", conflict.Row.StudentID, other))
		require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE id = $1 AND state = 'dead' AND reason_class = $2 AND last_error = $3",
			conflict.Row.ID, outbox.ReasonConflict, ConflictError(conflict.UserID)))
		require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox_events WHERE outbox_id = $1 AND outcome = 'dead' AND reason_class = $2 AND error = $3",
			conflict.Row.ID, outbox.ReasonConflict, ConflictError(conflict.UserID)))
	}
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox_events WHERE outcome = 'delivered' AND error IS NULL AND reason_class IS NULL"),
		"the delivery beside the conflict is recorded as one, without the conflict's error")
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox_events WHERE outcome = 'retry' AND error = 'refused'"))

	// The same delivery recorded again (another sender's, whose lease ran
	// out): it settles nothing more, and is no conflict.
	again := Result{Row: byStudent[ids[1]], Outcome: outbox.OutcomeDelivered}
	require.NoError(t, pool.QueryRow(ctx, "SELECT user_id FROM students WHERE id = $1", ids[1]).Scan(&again.UserID))
	rec, err := st.Record(ctx, lease, []Result{again})
	require.NoError(t, err)
	require.False(t, rec.Applied[again.Row.ID], "settled once, by the first recording")
	require.Empty(t, rec.Conflicts)
	require.Equal(t, 2, count(t, pool, "SELECT count(*) FROM outbox_events WHERE outbox_id = $1 AND outcome = 'delivered'", again.Row.ID))
}

// TestPurgeKeepsDeadRows: delivered rows past the retention go, with their
// history; younger ones and every dead row stay.
func TestPurgeKeepsDeadRows(t *testing.T) {
	t.Parallel()
	pool, st, _ := newStore(t, 6)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
		UPDATE outbox SET state = CASE WHEN id % 3 = 0 THEN 'dead' ELSE 'delivered' END,
		       delivered_at = CASE WHEN id % 3 = 0 THEN NULL ELSE now() - interval '10 days' END,
		       dead_at = CASE WHEN id % 3 = 0 THEN now() - interval '10 days' END`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE outbox SET delivered_at = now() WHERE id = (SELECT min(id) FROM outbox WHERE state = 'delivered')")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO outbox_events (outbox_id, kind, attempt, outcome, actor, idempotency_key)
		SELECT id, 'attempt', 1, state, 'test', idempotency_key FROM outbox`)
	require.NoError(t, err)
	n, err := st.PurgeDelivered(ctx, 7*24*time.Hour, 1)
	require.NoError(t, err)
	require.EqualValues(t, 3, n, "one batch at a time until none is left")
	require.Equal(t, 2, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead'"))
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'"))
	require.Equal(t, 3, count(t, pool, "SELECT count(*) FROM outbox_events"), "history goes with its row")
}

// TestNewKeySafeIsTheStoresRule: a new-key redrive takes only the rows
// whose class outbox.NewKeySafe lists, unless forced.
func TestNewKeySafeIsTheStoresRule(t *testing.T) {
	t.Parallel()
	pool, st, _ := newStore(t, len(outbox.ReasonClasses))
	ctx := context.Background()
	_, err := pool.Exec(ctx, `
		UPDATE outbox o SET state = 'dead', dead_at = now(), reason_class = c.class
		FROM (SELECT id, ($1::text[])[row_number() OVER (ORDER BY id)] AS class FROM outbox) c
		WHERE o.id = c.id`, outbox.ReasonClasses)
	require.NoError(t, err)
	found, err := st.FindDead(ctx, DeadFilter{Max: 100, NewKey: true, MaxRedrives: 10})
	require.NoError(t, err)
	require.Len(t, found.IDs, len(outbox.NewKeySafe))
	require.Equal(t, len(outbox.ReasonClasses)-len(outbox.NewKeySafe), found.NewKeyUnsafe, "the others are passed by, and counted")
	done, err := st.Redrive(ctx, found.IDs, outbox.RedriveNewOperation, false, 10, time.Hour, "test")
	require.NoError(t, err)
	require.Len(t, done, len(outbox.NewKeySafe))
	require.Equal(t, len(outbox.NewKeySafe), count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'pending' AND cardinality(previous_keys) = 1"))
	forced, err := st.FindDead(ctx, DeadFilter{Max: 100, NewKey: true, Force: true, MaxRedrives: 10})
	require.NoError(t, err)
	require.Len(t, forced.IDs, len(outbox.ReasonClasses)-len(outbox.NewKeySafe))
	require.Zero(t, forced.NewKeyUnsafe)
}

// TestRecordRoundTrips counts what recording sends to the database: each
// batch is one round trip, and every answer waits for all of them. Any
// recording is one batch, one implicit transaction: deliveries, retries,
// dead letters and hand-backs alike. It also checks what the one batch
// must still get right: a retry whose lease another sender took over is
// neither written nor told, and each row's history stays at HistoryKeep.
func TestRecordRoundTrips(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	pgtest.AddStudents(t, pool, 3)
	traced, trips := pgtest.TracedPool(t, pool.Config().ConnString(), migrations.OutboxSender)
	st := New(traced, 3*time.Second)
	ctx := context.Background()
	rows, err := st.ClaimDue(ctx, lease, 3)
	require.NoError(t, err)
	require.Len(t, rows, 3)

	trips.Take()
	_, err = st.Record(ctx, lease, []Result{
		{Row: rows[0], Outcome: outbox.OutcomeDelivered, UserID: uuid.New()},
		{Row: rows[1], Outcome: outbox.OutcomeDelivered, UserID: uuid.New()},
	})
	require.NoError(t, err)
	require.Len(t, trips.Take(), 1, "deliveries")
	require.Equal(t, 2, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'"))
	require.Equal(t, 2, count(t, pool, "SELECT count(*) FROM outbox_events WHERE outcome = 'delivered'"))

	_, err = st.Record(ctx, lease, []Result{{Row: rows[2], Outcome: outbox.OutcomeRetry, Error: "refused", Delay: time.Second}})
	require.NoError(t, err)
	require.Len(t, trips.Take(), 1, "a retry")
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox_events WHERE outcome = 'retry'"))

	// A lease another sender holds now: nothing written, nothing told.
	again, err := st.ClaimDue(ctx, lease, 1)
	require.Empty(t, again, "not due yet")
	require.NoError(t, err)
	taken := rows[2]
	taken.LeaseToken = uuid.New()
	rec, err := st.Record(ctx, lease, []Result{{Row: taken, Outcome: outbox.OutcomeDead, Error: "refused", Class: outbox.ReasonClasses[0]}})
	require.NoError(t, err)
	require.Empty(t, rec.Applied)
	require.Zero(t, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead'"))
	require.Zero(t, count(t, pool, "SELECT count(*) FROM outbox_events WHERE outcome = 'dead'"))

	// Retried again and again, the row keeps its newest HistoryKeep events.
	_, err = pool.Exec(ctx, "UPDATE outbox SET available_at = now() WHERE id = $1", rows[2].ID)
	require.NoError(t, err)
	for range HistoryKeep + 2 {
		claimed, err := st.ClaimDue(ctx, lease, 1)
		require.NoError(t, err)
		require.Len(t, claimed, 1)
		rec, err := st.Record(ctx, lease, []Result{{Row: claimed[0], Outcome: outbox.OutcomeRetry, Error: "refused"}})
		require.NoError(t, err)
		require.True(t, rec.Applied[claimed[0].ID])
	}
	require.Equal(t, HistoryKeep, count(t, pool, "SELECT count(*) FROM outbox_events WHERE outbox_id = $1", rows[2].ID))
	require.Equal(t, HistoryKeep+3, count(t, pool, "SELECT max(attempt) FROM outbox_events WHERE outbox_id = $1", rows[2].ID),
		"the newest kept")
}

// TestClaimAndRecordRunOnGenericPlans: the claim and the recording's
// statements are planned once per connection, not at every call (see
// genericPlans). Without the setting PostgreSQL made a custom plan for
// every ClaimDue, LinkStudents and RecordEvents. One connection, so that
// every call and pg_prepared_statements share a session.
func TestClaimAndRecordRunOnGenericPlans(t *testing.T) {
	t.Parallel()
	admin := pgtest.Pool(t, migrations.Student)
	pgtest.AddStudents(t, admin, 16)
	ctx := context.Background()
	pool, st := oneSession(t, admin)

	for range 8 {
		rows, err := st.ClaimDue(ctx, lease, 2)
		require.NoError(t, err)
		require.Len(t, rows, 2)
		results := make([]Result, len(rows))
		for i, r := range rows {
			results[i] = Result{Row: r, Outcome: outbox.OutcomeDelivered, UserID: uuid.New()}
		}
		_, err = st.Record(ctx, lease, results)
		require.NoError(t, err)
	}
	require.Equal(t, 16, count(t, admin, "SELECT count(*) FROM outbox WHERE state = 'delivered'"))

	requireGenericPlans(t, pool, 8, "ClaimDue :many", "LinkStudents :many", "RecordEvents :exec")
}

// requireGenericPlans fails unless each statement named (sqlc's name and
// kind, as its text's first line says them) ran calls times on the pool's
// one session, each on its generic plan.
func requireGenericPlans(t *testing.T, pool *pgxpool.Pool, calls int64, statements ...string) {
	t.Helper()
	for _, name := range statements {
		var generic, custom int64
		require.NoError(t, pool.QueryRow(context.Background(),
			"SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE starts_with(statement, $1)",
			"-- name: "+name).Scan(&generic, &custom), name)
		require.Equal(t, int64(0), custom, "%s: custom plans", name)
		require.Equal(t, calls, generic, "%s: generic plans", name)
	}
}

// TestPublishesAreCountedNotRepeats: a recorded publish counts in
// publishes (which names the next publish's message id) and as an
// attempt; a repeat the broker dropped counts in publishes but not as an
// attempt; an unread row counts in neither. An unsent retry gives back its
// attempt.
func TestPublishesAreCountedNotRepeats(t *testing.T) {
	t.Parallel()
	pool, st, _ := newStore(t, 1)
	ctx := context.Background()
	claim := func() Row {
		t.Helper()
		_, err := pool.Exec(ctx, "UPDATE outbox SET available_at = now()")
		require.NoError(t, err)
		rows, err := st.ClaimDue(ctx, lease, 1)
		require.NoError(t, err)
		require.Len(t, rows, 1)
		return rows[0]
	}
	record := func(r Result) {
		t.Helper()
		rec, err := st.Record(ctx, lease, []Result{r})
		require.NoError(t, err)
		require.True(t, rec.Applied[r.Row.ID])
	}
	counts := func() (attempts, publishes int) {
		t.Helper()
		require.NoError(t, pool.QueryRow(ctx, "SELECT attempts, publishes FROM outbox").Scan(&attempts, &publishes))
		return attempts, publishes
	}
	row := claim()
	require.Zero(t, row.Publishes)
	record(Result{Row: row, Outcome: outbox.OutcomePublished, Seq: 7, Delay: time.Minute})
	a, p := counts()
	require.Equal(t, [2]int{1, 1}, [2]int{a, p}, "a publish: an attempt, and the next message id's count")

	row = claim()
	require.Equal(t, 1, row.Publishes, "the claim says how many publishes were recorded")
	record(Result{Row: row, Outcome: outbox.OutcomePublished, Seq: 7, Repeat: true, Delay: time.Minute})
	a, p = counts()
	require.Equal(t, [2]int{1, 2}, [2]int{a, p}, "a repeat the broker dropped: no attempt")

	row = claim()
	record(Result{Row: row, Outcome: outbox.OutcomeUnread, Delay: time.Minute})
	a, p = counts()
	require.Equal(t, [2]int{1, 2}, [2]int{a, p}, "unread: neither")

	row = claim()
	record(Result{Row: row, Outcome: outbox.OutcomeRetry, Class: outbox.ReasonBrokerUnreachable, Error: "no connection", Unsent: true, Delay: time.Minute})
	a, p = counts()
	require.Equal(t, [2]int{1, 2}, [2]int{a, p}, "unsent: no attempt")
}
