package outboxwake_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/outboxwake"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// listen returns a function that counts the notifications on Channel
// arriving within a moment, as the sender would see them.
func listen(t *testing.T, url string) func() int {
	t.Helper()
	l := pgtest.Listen(t, url, migrations.OutboxSender, outboxwake.Channel)
	return func() int { return l.Count(300 * time.Millisecond) }
}

func TestNotifyReachesTheListener(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t, migrations.Student)
	notifications := listen(t, url)
	require.NoError(t, outboxwake.Notify(context.Background(), pgtest.ConnectAs(t, url, migrations.StudentApp)))
	require.Equal(t, 1, notifications())
}

// TestKicksCoalesce: kicks that arrive while the notifier is busy (here:
// not yet running) are answered by one notification, and a later kick by
// another.
func TestKicksCoalesce(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t, migrations.Student)
	notifications := listen(t, url)
	n := outboxwake.NewNotifier(pgtest.ConnectAs(t, url, migrations.StudentApp), time.Second)
	for range 50 {
		n.Kick()
	}
	apitest.Start(t, func(ctx context.Context) error {
		n.Run(ctx, slog.New(slog.DiscardHandler))
		return nil
	})
	require.Equal(t, 1, notifications(), "fifty kicks, one notification")
	n.Kick()
	require.Equal(t, 1, notifications(), "a later kick is answered too")
}

// TestRidesAreSpaced: a commit rides when the one before asked RideGap
// ago or more, and kicks instead when it follows closer. Each call's gap
// is bounded by the test's clock from both sides, so a descheduled test
// goroutine cannot make it fail.
func TestRidesAreSpaced(t *testing.T) {
	t.Parallel()
	n := outboxwake.NewNotifier(nil, time.Second)
	// The clock is read around the first call too: read after it, a test
	// descheduled between the two would take the ride's time for later.
	prevStart := time.Now()
	b, ok := n.Ride()
	prevEnd := time.Now()
	require.True(t, ok, "the first rides")
	require.Equal(t, 1, b.Len())
	require.Contains(t, b.QueuedQueries[0].SQL, "pg_notify")
	rides, asked := 0, 0
	for start := time.Now(); asked < 200 || time.Since(start) < 3*outboxwake.RideGap; asked++ {
		t0 := time.Now()
		_, ok := n.Ride()
		t1 := time.Now()
		if ok {
			rides++
			require.GreaterOrEqual(t, t1.Sub(prevStart), outboxwake.RideGap, "rode though the one before was close")
		} else {
			require.Less(t, t0.Sub(prevEnd), outboxwake.RideGap, "kicked though the one before was far")
		}
		prevStart, prevEnd = t0, t1
	}
	require.Less(t, rides, asked, "a dense stream kicks")
	time.Sleep(outboxwake.RideGap)
	_, ok = n.Ride()
	require.True(t, ok, "a gap later, one rides again")
}
