package poll

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/outbox-sender/internal/store"
	"github.com/outboxref/outboxref/outbox-sender/relay"
)

// TestWhenAClaimLingers: a notification Wait has to wait for, WakeQuiet or
// more after the one before (or the first since start), is claimed at
// once; one that comes sooner, or was already waiting when Wait began (it
// came during the last claim), lingers relay.WakeLinger for company.
//
// The rule is about intervals of a few milliseconds, which a busy machine
// stretches at will: a notification meant to come right behind another
// could come late enough to count as lone. So the test runs on synctest's
// clock, which moves only when every goroutine of the test waits: each
// interval below is exactly what it says, however slow the scheduler.
func TestWhenAClaimLingers(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		wake := make(chan struct{}, 1)
		table := NewTable(nil, store.Lease{}, time.Hour, wake, nil)
		// The claim loop's last claim came back short: nothing more is due.
		settled := relay.Claimed{Asked: 10, Got: 1}
		// notifiedAfter wakes the feed once Wait has waited for d, and
		// says how long Wait went on after the notification.
		notifiedAfter := func(d time.Duration) time.Duration {
			go func() {
				time.Sleep(d)
				wake <- struct{}{}
			}()
			start := time.Now()
			require.Equal(t, relay.Unknown, table.Wait(t.Context(), settled))
			return time.Since(start) - d
		}

		require.Zero(t, notifiedAfter(time.Millisecond), "the first since start is claimed at once")
		require.Zero(t, notifiedAfter(relay.WakeQuiet), "so is one WakeQuiet after the one before")
		require.Equal(t, relay.WakeLinger, notifiedAfter(relay.WakeQuiet-time.Microsecond), "one right behind another lingers")

		// Already waiting when Wait began, however long ago the one before.
		time.Sleep(time.Hour)
		wake <- struct{}{}
		start := time.Now()
		require.Equal(t, relay.Unknown, table.Wait(t.Context(), settled))
		require.Equal(t, relay.WakeLinger, time.Since(start), "a notification that came during the last claim lingers")
	})
}
