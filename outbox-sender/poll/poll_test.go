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

// TestLoneNotificationClaimsAtOnce: a notification long after the one
// before is claimed without lingering; one right behind another lingers
// relay.WakeLinger for company. The lone case is judged by the median of
// twenty, so that one slow scheduling on a busy machine does not decide.
func TestLoneNotificationClaimsAtOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	wake := make(chan struct{}, 1)
	table := NewTable(nil, store.Lease{}, time.Hour, wake, nil)
	// The claim loop's last claim came back short: nothing more is due.
	settled := relay.Claimed{Asked: 10, Got: 1}
	waited := func() time.Duration {
		wake <- struct{}{}
		start := time.Now()
		require.Equal(t, relay.Unknown, table.Wait(ctx, settled))
		return time.Since(start)
	}

	var lone []time.Duration
	for range 20 {
		table.woken = time.Now().Add(-relay.WakeQuiet)
		lone = append(lone, waited())
		// Right behind the lone one: this one lingers.
		require.GreaterOrEqual(t, waited(), relay.WakeLinger)
	}
	slices.Sort(lone)
	require.Less(t, lone[len(lone)/2], relay.WakeLinger, "lone notifications: %v", lone)
}
