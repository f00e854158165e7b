package cdc

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/outbox-sender/internal/store"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// The source's runs against a real slot are tested where the relay is put
// together: package sender.

// TestUnclaimedRowNotYetVisibleIsClaimedAgain: a streamed row the claim
// did not return is settled if it exists (another sender holds it, say),
// but claimed again if this transaction cannot see it at all: with
// synchronous commits the stream can announce a commit a moment before
// it shows to other sessions, and settling such a row would leave it to
// the poll, SENDER_CDC_GRACE later.
func TestUnclaimedRowNotYetVisibleIsClaimedAgain(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	pgtest.AddStudents(t, pool, 1)
	var visible int64
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT id FROM outbox").Scan(&visible))
	notYet := visible + 1000
	st := store.New(pgtest.As(t, pool, migrations.OutboxSender), 3*time.Second)
	s := New(slog.New(slog.DiscardHandler), st, Config{Slot: "unused", BatchSize: 10})
	s.tr.committed(100, time.Now(), []int64{visible, notYet})
	require.Len(t, s.tr.take(2), 2)

	// A claim missed both. Neither is settled yet: the claim may not have
	// seen the visible one either, if it became visible just after.
	require.Equal(t, 2, s.feed.settleUnclaimed(context.Background(), []int64{visible, notYet}))
	require.ElementsMatch(t, []int64{visible, notYet}, s.tr.take(10), "both are claimed again")
	// A second claim, begun after the first row was seen visible, missed
	// both again: the visible one is held by another, settled; the other
	// is still not visible, claimed again.
	require.Equal(t, 1, s.feed.settleUnclaimed(context.Background(), []int64{visible, notYet}))
	require.Equal(t, []int64{notYet}, s.tr.take(10), "the row it cannot see is claimed again")
	require.Equal(t, 1, s.tr.unsettled(), "and stays unsettled")
	p, _ := s.tr.position()
	require.Equal(t, pglogrepl.LSN(0), p, "so the slot does not move past it")
}

// TestRowsNobodyCanClaimDoNotHoldTheSlot: while claims fail, a streamed
// row is claimed again, but past unclaimableLimit it is left to the table
// feed, so that the reader can confirm what it was sent. A server in a
// fast shutdown refuses every claim and waits for that confirmation.
func TestRowsNobodyCanClaimDoNotHoldTheSlot(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	senderPool := pgtest.As(t, pool, migrations.OutboxSender)
	st := store.New(senderPool, 3*time.Second)
	s := New(slog.New(slog.DiscardHandler), st, Config{Slot: "unused", BatchSize: 10})
	senderPool.Close() // every claim now fails
	s.tr.reset(100)
	s.tr.committed(200, time.Now(), []int64{1})
	s.tr.committed(300, time.Now(), []int64{2})

	_, err := s.feed.Claim(context.Background(), 10)
	require.Error(t, err)
	require.Equal(t, 2, s.tr.queued(), "young rows of a failed claim are claimed again")
	require.Equal(t, 2, s.tr.unsettled())

	s.tr.mu.Lock()
	s.tr.txns[0].received = time.Now().Add(-unclaimableLimit - time.Second)
	s.tr.mu.Unlock()
	_, err = s.feed.Claim(context.Background(), 10)
	require.Error(t, err)
	require.Equal(t, []int64{2}, s.tr.take(10), "only the young row is claimed again")
	require.Equal(t, 1, s.tr.unsettled())
	p, _ := s.tr.position()
	require.Equal(t, pglogrepl.LSN(200), p, "the slot may move past the row left to the table")
}
