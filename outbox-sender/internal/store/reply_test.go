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
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// outboxKey is the idempotency key of student's outbox row.
func outboxKey(t *testing.T, pool *pgxpool.Pool, student uuid.UUID) uuid.UUID {
	t.Helper()
	var k uuid.UUID
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT idempotency_key FROM outbox WHERE student_id = $1", student).Scan(&k))
	return k
}

// TestApplyRepliesInOneBatch: one transaction applies a batch of replies
// as they would be applied one by one, in order, each at most once.
func TestApplyRepliesInOneBatch(t *testing.T) {
	t.Parallel()
	pool, s, students := newStore(t, 3)
	ctx := context.Background()
	keyOf := func(student uuid.UUID) uuid.UUID { return outboxKey(t, pool, student) }
	a, b, c := keyOf(students[0]), keyOf(students[1]), keyOf(students[2])
	userA, other := uuid.New(), uuid.New()
	old := Reply{MessageID: uuid.New(), Key: c, Outcome: outbox.OutcomeDelivered, UserID: uuid.New()}
	_, err := s.ApplyReplies(ctx, "test", []Reply{old})
	require.NoError(t, err)

	linkA := Reply{MessageID: uuid.New(), Key: a, Outcome: outbox.OutcomeDelivered, UserID: userA}
	batch := []Reply{
		linkA,
		linkA, // the broker delivered it twice
		{MessageID: uuid.New(), Key: a, Outcome: outbox.OutcomeDelivered, UserID: other}, // the row is settled by now
		{MessageID: uuid.New(), Key: b, Outcome: outbox.OutcomeDead, Class: outbox.ReasonRefused, Error: "taken"},
		{MessageID: uuid.New(), Key: uuid.New(), Outcome: outbox.OutcomeDelivered, UserID: uuid.New()}, // no such row
		old, // applied in an earlier batch
	}
	applied, err := s.ApplyReplies(ctx, "test", batch)
	require.NoError(t, err)
	var outcomes []string
	for _, r := range applied {
		outcomes = append(outcomes, r.Outcome)
	}
	require.Equal(t, []string{ReplyLinked, ReplyRepeat, ReplySettled, ReplyRefused, ReplyUnmatched, ReplyRepeat}, outcomes)

	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM students WHERE id = $1 AND user_id = $2", students[0], userA))
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE idempotency_key = $1 AND state = 'delivered'", a))
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE idempotency_key = $1 AND state = 'dead' AND reason_class = $2", b, outbox.ReasonRefused))
	require.Equal(t, 5, count(t, pool, "SELECT count(*) FROM reply_inbox"), "each reply entered once: the old one, and four new")
	require.Equal(t, 3, count(t, pool, "SELECT count(*) FROM outbox_events WHERE kind = 'reply'"), "c linked, a linked, b refused")

	// The same batch again changes nothing.
	applied, err = s.ApplyReplies(ctx, "test", batch)
	require.NoError(t, err)
	for _, r := range applied {
		require.Equal(t, ReplyRepeat, r.Outcome)
	}
	require.Equal(t, 5, count(t, pool, "SELECT count(*) FROM reply_inbox"))
}

// TestApplyRepliesRecordWhatEachDid: a conflict dead-letters its row and
// keeps the student's user; a refusal and then a user id for the same row
// in one batch end as they would one by one (the user id wins); an answer
// that settles nothing leaves its row waiting; and the reply inbox and the
// row's history record what each reply did.
func TestApplyRepliesRecordWhatEachDid(t *testing.T) {
	t.Parallel()
	pool, s, students := newStore(t, 4)
	ctx := context.Background()
	keyOf := func(student uuid.UUID) uuid.UUID { return outboxKey(t, pool, student) }
	d, e, f, g := keyOf(students[0]), keyOf(students[1]), keyOf(students[2]), keyOf(students[3])
	taken := uuid.New() // d's student is linked to this user already
	_, err := pool.Exec(ctx, "UPDATE students SET user_id = $1 WHERE id = $2", taken, students[0])
	require.NoError(t, err)
	userE, userF := uuid.New(), uuid.New()

	batch := []Reply{
		{MessageID: uuid.New(), Key: d, Outcome: outbox.OutcomeDelivered, UserID: uuid.New()},
		{MessageID: uuid.New(), Key: e, Outcome: outbox.OutcomeDead, Class: outbox.ReasonRefused, Error: "taken"},
		{MessageID: uuid.New(), Key: e, Outcome: outbox.OutcomeDelivered, UserID: userE},
		{MessageID: uuid.New(), Key: f, Outcome: outbox.OutcomeDelivered, UserID: userF},
		{MessageID: uuid.New(), Key: f, Outcome: outbox.OutcomeDelivered, UserID: uuid.New()},
		{MessageID: uuid.New(), Key: g, Outcome: outbox.OutcomeRetry},
	}
	applied, err := s.ApplyReplies(ctx, "test", batch)
	require.NoError(t, err)
	want := []string{ReplyConflict, ReplyRefused, ReplyLinked, ReplyLinked, ReplySettled, ReplyIgnored}
	require.Len(t, applied, len(want))
	for i, r := range applied {
		require.Equal(t, want[i], r.Outcome, "reply %d", i)
		var inbox string
		require.NoError(t, pool.QueryRow(ctx, "SELECT outcome FROM reply_inbox WHERE message_id = $1", batch[i].MessageID).Scan(&inbox))
		require.Equal(t, want[i], inbox, "reply %d as the inbox records it", i)
	}

	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM students WHERE id = $1 AND user_id = $2", students[0], taken), "a conflict keeps the student's user")
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE idempotency_key = $1 AND state = 'dead' AND reason_class = $2", d, outbox.ReasonConflict))
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM students WHERE id = $1 AND user_id = $2", students[1], userE), "the user id wins over the refusal")
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE idempotency_key = $1 AND state = 'delivered' AND reason_class IS NULL", e))
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM students WHERE id = $1 AND user_id = $2", students[2], userF), "the first user id is kept")
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE idempotency_key = $1 AND state = 'pending'", g), "an answer that settles nothing leaves the row waiting")

	history := func(key uuid.UUID) []string {
		rows, err := pool.Query(ctx, "SELECT e.outcome || coalesce('/' || e.reason_class, '') FROM outbox_events e JOIN outbox o ON o.id = e.outbox_id WHERE o.idempotency_key = $1 AND e.kind = 'reply' ORDER BY e.id", key)
		require.NoError(t, err)
		var out []string
		for rows.Next() {
			var s string
			require.NoError(t, rows.Scan(&s))
			out = append(out, s)
		}
		require.NoError(t, rows.Err())
		return out
	}
	require.Equal(t, []string{"dead/conflict"}, history(d))
	require.Equal(t, []string{"dead/refused", "delivered"}, history(e), "in the order the replies came")
	require.Equal(t, []string{"delivered"}, history(f))
	require.Empty(t, history(g))
}

// TestParkedRepliesArePurged: a parked reply is kept with its size, and
// forgotten once older than the retention, as the sender's own role.
func TestParkedRepliesArePurged(t *testing.T) {
	t.Parallel()
	pool, s, _ := newStore(t, 0)
	ctx := context.Background()
	for seq := range uint64(3) {
		require.NoError(t, s.ParkReply(ctx, ParkedReply{Stream: "USERS_REPLIES", Sequence: seq + 1, Subject: "s",
			Headers: []byte(`{}`), Data: []byte("start"), Size: 1 << 20, Reason: "unreadable", Deliveries: 5}))
	}
	_, err := pool.Exec(ctx, "UPDATE parked_replies SET parked_at = now() - interval '31 days' WHERE stream_sequence <= 2")
	require.NoError(t, err)
	n, err := s.PurgeParked(ctx, 30*24*time.Hour, 1)
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "both old ones, a batch of one at a time")
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM parked_replies WHERE stream_sequence = 3 AND size = 1048576"))
}

// TestApplyRepliesEnteredMeanwhile: a reply another transaction enters
// while a batch is between its look-up of the reply inbox and its writes
// fails the batch, which then writes nothing (its link included), and the
// batch read again finds the reply entered and applies the rest.
func TestApplyRepliesEnteredMeanwhile(t *testing.T) {
	t.Parallel()
	admin := pgtest.Pool(t, migrations.Student)
	students := pgtest.AddStudents(t, admin, 1)
	st := New(pgtest.As(t, admin, migrations.OutboxSender), 30*time.Second)
	ctx := context.Background()

	// Another transaction enters a reply the batch will look up and not
	// find: one whose key matches no row, so nothing is locked for it.
	other, err := admin.Begin(ctx)
	require.NoError(t, err)
	defer other.Rollback(ctx) //nolint:errcheck // committed below
	entered := Reply{MessageID: uuid.New(), Key: uuid.New(), Outcome: outbox.OutcomeDelivered, UserID: uuid.New()}
	_, err = other.Exec(ctx, "INSERT INTO reply_inbox (message_id, idempotency_key, outcome) VALUES ($1, $2, 'unmatched')", entered.MessageID, entered.Key)
	require.NoError(t, err)
	linkC := Reply{MessageID: uuid.New(), Key: outboxKey(t, admin, students[0]), Outcome: outbox.OutcomeDelivered, UserID: uuid.New()}
	failed := make(chan error, 1)
	go func() {
		_, err := st.ApplyReplies(ctx, "test", []Reply{linkC, entered})
		failed <- err
	}()
	// The batch's insert into the inbox waits on the other's uncommitted key.
	require.Eventually(t, func() bool {
		return count(t, admin, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND usename = $1 AND wait_event_type = 'Lock'", migrations.OutboxSender) == 1
	}, 20*time.Second, 10*time.Millisecond)
	require.NoError(t, other.Commit(ctx))
	select {
	case err = <-failed:
	case <-time.After(20 * time.Second):
		t.Fatal("the batch did not end after the other transaction committed")
	}
	require.Error(t, err, "the reply was entered meanwhile")
	require.Zero(t, count(t, admin, "SELECT count(*) FROM students WHERE id = $1 AND user_id IS NOT NULL", students[0]), "nothing of the failed batch is kept")
	require.Zero(t, count(t, admin, "SELECT count(*) FROM reply_inbox WHERE message_id = $1", linkC.MessageID))

	// Read again, the batch finds the reply entered and links the student.
	applied, err := st.ApplyReplies(ctx, "test", []Reply{linkC, entered})
	require.NoError(t, err)
	require.Equal(t, ReplyLinked, applied[0].Outcome)
	require.Equal(t, ReplyRepeat, applied[1].Outcome)
	require.Equal(t, 1, count(t, admin, "SELECT count(*) FROM students WHERE id = $1 AND user_id = $2", students[0], linkC.UserID))
}

// TestApplyRepliesRunOnGenericPlans: the reply transaction's statements
// are planned once per connection, as the recording's are (genericPlans).
// One connection, so that every call and pg_prepared_statements share a
// session.
func TestApplyRepliesRunOnGenericPlans(t *testing.T) {
	t.Parallel()
	admin := pgtest.Pool(t, migrations.Student)
	students := pgtest.AddStudents(t, admin, 16)
	ctx := context.Background()
	pool, st := oneSession(t, admin)

	for i := range 8 {
		var batch []Reply
		for _, s := range students[2*i : 2*i+2] {
			batch = append(batch, Reply{MessageID: uuid.New(), Key: outboxKey(t, admin, s), Outcome: outbox.OutcomeDelivered, UserID: uuid.New()})
		}
		applied, err := st.ApplyReplies(ctx, "test", batch)
		require.NoError(t, err)
		require.Equal(t, ReplyLinked, applied[1].Outcome)
	}
	require.Equal(t, 16, count(t, admin, "SELECT count(*) FROM outbox WHERE state = 'delivered'"))
	requireGenericPlans(t, pool, 8, "LockRowsForReplies :many", "LinkStudents :many", "ReceiveReplies :many", "RecordEvents :exec")
}
