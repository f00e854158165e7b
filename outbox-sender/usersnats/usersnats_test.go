package usersnats

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/outbox-sender/internal/store"
	"github.com/outboxref/outboxref/outbox-sender/relay"
	"github.com/outboxref/outboxref/testkit/natsserver"
)

func TestUnread(t *testing.T) {
	t.Parallel()
	r := read{floor: 10, last: 20}
	for _, tc := range []struct {
		seq    uint64
		unread bool
		why    string
	}{
		{5, false, "below the floor: read"},
		{10, false, "at the floor: read"},
		{11, true, "past the floor: maybe unread"},
		{20, true, "the newest command: unread"},
		{21, false, "past the newest: the stream was made anew, the command is gone"},
	} {
		require.Equal(t, tc.unread, r.unread(tc.seq), "seq %d: %s", tc.seq, tc.why)
	}
}

// TestEachPublishMeantToReachUsersIsNew: a publish repeated with the same
// count of recorded publishes is the same message to the broker, which
// drops the copy and says it is a repeat (a publish whose recording was
// lost); with one more recorded (the last one read and not answered, or a
// redrive), the publish is a message of its own, which the broker stores
// and Users reads, inside the de-duplication window as well.
func TestEachPublishMeantToReachUsersIsNew(t *testing.T) {
	t.Parallel()
	srv := natsserver.ForTest(t)
	tr, err := New(slog.New(slog.DiscardHandler), Config{NATS: srv.Config(natsbus.SenderUser, "test sender"), Timeout: 10 * time.Second, AnswerWait: time.Second})
	require.NoError(t, err)
	t.Cleanup(tr.Close)
	row := store.Row{ID: 1, IdempotencyKey: uuid.New(), Payload: []byte(`{}`), Attempts: 1}
	ctx := context.Background()

	first := tr.Deliver(ctx, row)
	require.Equal(t, relay.Published, first.Verdict, first.Error)
	require.False(t, first.Repeat)
	again := tr.Deliver(ctx, row)
	require.Equal(t, relay.Published, again.Verdict, again.Error)
	require.True(t, again.Repeat, "the same publish: the broker kept the first")
	require.Equal(t, first.Seq, again.Seq, "and says where it is")

	row.Publishes++
	next := tr.Deliver(ctx, row)
	require.Equal(t, relay.Published, next.Verdict, next.Error)
	require.False(t, next.Repeat, "a publish meant to reach Users is a message of its own")
	require.Greater(t, next.Seq, first.Seq)
	require.Equal(t, row.IdempotencyKey.String()+".1", MessageID(row))
}
