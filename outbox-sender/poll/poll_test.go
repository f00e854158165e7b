package poll

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/outbox-sender/internal/store"
	"github.com/outboxref/outboxref/outbox-sender/relay"
)

// TestWhenAClaimLingers: a notification Wait has to wait for, WakeQuiet or
// more after the one before (or the first since start), is claimed at
// once; one that comes sooner, or was already waiting when Wait began (it
// came during the last claim), lingers relay.WakeLinger for company.
// "At once" is judged by the median of twenty, so that one slow
// scheduling on a busy machine does not decide; a linger is a lower
// bound, which no slowness can break.
func TestWhenAClaimLingers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	wake := make(chan struct{}, 1)
	table := NewTable(nil, store.Lease{}, time.Hour, wake, nil)
	// The claim loop's last claim came back short: nothing more is due.
	settled := relay.Claimed{Asked: 10, Got: 1}
	// notifiedAfter wakes the feed once Wait has waited for d, and says
	// how long Wait went on after the notification.
	notifiedAfter := func(d time.Duration) time.Duration {
		sent := make(chan time.Time, 1)
		go func() {
			time.Sleep(d)
			sent <- time.Now()
			wake <- struct{}{}
		}()
		require.Equal(t, relay.Unknown, table.Wait(ctx, settled))
		return time.Since(<-sent)
	}

	var lone []time.Duration
	lone = append(lone, notifiedAfter(time.Millisecond)) // the first since start
	for range 19 {
		table.woken = time.Now().Add(-relay.WakeQuiet)
		lone = append(lone, notifiedAfter(time.Millisecond))
	}
	slices.Sort(lone)
	require.Less(t, lone[len(lone)/2], relay.WakeLinger, "lone notifications: %v", lone)

	// Right behind another: lingers.
	table.woken = time.Now()
	require.GreaterOrEqual(t, notifiedAfter(time.Millisecond), relay.WakeLinger)

	// Already waiting when Wait began, however long ago the one before.
	table.woken = time.Time{}
	wake <- struct{}{}
	start := time.Now()
	require.Equal(t, relay.Unknown, table.Wait(ctx, settled))
	require.GreaterOrEqual(t, time.Since(start), relay.WakeLinger)
}
