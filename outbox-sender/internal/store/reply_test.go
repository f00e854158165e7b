package store

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/outbox"
)

// TestApplyRepliesInOneBatch: one transaction applies a batch of replies
// as they would be applied one by one, in order, each at most once.
func TestApplyRepliesInOneBatch(t *testing.T) {
	t.Parallel()
	pool, s, students := newStore(t, 3)
	ctx := context.Background()
	keyOf := func(student uuid.UUID) uuid.UUID {
		var k uuid.UUID
		require.NoError(t, pool.QueryRow(ctx, "SELECT idempotency_key FROM outbox WHERE student_id = $1", student).Scan(&k))
		return k
	}
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
