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
