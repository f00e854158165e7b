package natsbus_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/testkit/natsserver"
)

// Each process may do on the broker what its part of the flow needs, and
// nothing else: the sender publishes commands and reads replies, Users
// reads commands and publishes replies.
func TestPermissions(t *testing.T) {
	t.Parallel()
	srv := natsserver.ForTest(t)

	type check struct {
		what string
		do   func(ctx context.Context, js jetstream.JetStream) error
	}
	publish := func(subject string) func(ctx context.Context, js jetstream.JetStream) error {
		return func(ctx context.Context, js jetstream.JetStream) error {
			_, err := js.Publish(ctx, subject, []byte(`{}`))
			return err
		}
	}
	read := func(stream, consumer string) func(ctx context.Context, js jetstream.JetStream) error {
		return func(ctx context.Context, js jetstream.JetStream) error {
			_, err := js.Consumer(ctx, stream, consumer)
			return err
		}
	}
	// fetch asks a consumer for a message (what reading it takes beyond
	// looking at it).
	fetch := func(stream, consumer string) func(ctx context.Context, js jetstream.JetStream) error {
		return func(ctx context.Context, js jetstream.JetStream) error {
			cons, err := js.Consumer(ctx, stream, consumer)
			if err != nil {
				return err
			}
			batch, err := cons.Fetch(1, jetstream.FetchMaxWait(500*time.Millisecond))
			if err != nil {
				return err
			}
			for range batch.Messages() {
				return nil
			}
			if err := batch.Error(); err != nil {
				return err
			}
			return errors.New("nothing fetched")
		}
	}
	deleteConsumer := func(stream, consumer string) func(ctx context.Context, js jetstream.JetStream) error {
		return func(ctx context.Context, js jetstream.JetStream) error {
			return js.DeleteConsumer(ctx, stream, consumer)
		}
	}
	provision := func(ctx context.Context, js jetstream.JetStream) error {
		return natsbus.Provision(ctx, js, natsserver.LocalStreams)
	}
	for _, tc := range []struct {
		user            string
		allowed, denied []check
	}{
		{
			user: natsbus.SenderUser,
			allowed: []check{
				{"publish a command", publish(natsbus.CreateUserSubject)},
				{"read its reply consumer", read(natsbus.ReplyStream, natsbus.SenderConsumer)},
				// How far Users has read: a row is published again only past it.
				{"look at Users' command consumer", read(natsbus.CommandStream, natsbus.UsersConsumer)},
				{"look at the command stream", func(ctx context.Context, js jetstream.JetStream) error {
					_, err := js.Stream(ctx, natsbus.CommandStream)
					return err
				}},
			},
			denied: []check{
				{"publish a reply", publish(natsbus.CreateUserReplySubject)},
				{"fetch from Users' command consumer", fetch(natsbus.CommandStream, natsbus.UsersConsumer)},
				{"delete Users' command consumer", deleteConsumer(natsbus.CommandStream, natsbus.UsersConsumer)},
				{"provision streams", provision},
			},
		},
		{
			user:    natsbus.UsersUser,
			allowed: []check{{"publish a reply", publish(natsbus.CreateUserReplySubject)}, {"read its command consumer", read(natsbus.CommandStream, natsbus.UsersConsumer)}},
			denied: []check{
				{"publish a command", publish(natsbus.CreateUserSubject)},
				{"read the sender's reply consumer", read(natsbus.ReplyStream, natsbus.SenderConsumer)},
				{"provision streams", provision},
			},
		},
	} {
		t.Run(tc.user, func(t *testing.T) {
			t.Parallel()
			nc, err := natsbus.Connect(slog.New(slog.DiscardHandler), srv.Config(tc.user, "test "+tc.user))
			require.NoError(t, err)
			defer nc.Close()
			violations := make(chan error, 16)
			nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err })
			js, err := jetstream.New(nc.Conn)
			require.NoError(t, err)
			for _, c := range tc.allowed {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				require.NoError(t, c.do(ctx, js), "%s may %s", tc.user, c.what)
				cancel()
			}
			for _, c := range tc.denied {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				err := c.do(ctx, js)
				cancel()
				require.Error(t, err, "%s must not %s", tc.user, c.what)
				// The call failed because the server refused it, not for
				// being slow: the server said so on the connection.
				select {
				case v := <-violations:
					require.ErrorContains(t, v, "Permissions Violation", "%s must not %s", tc.user, c.what)
					t.Logf("%s may not %s: %v", tc.user, c.what, v)
				case <-time.After(30 * time.Second):
					t.Fatalf("%s: %s failed (%v) but the server reported no permissions violation", tc.user, c.what, err)
				}
			}
		})
	}
	// Another user's inbox is out of reach too: a subscription there is
	// refused by the server.
	nc, err := natsbus.Connect(slog.New(slog.DiscardHandler), srv.Config(natsbus.SenderUser, "test snoop"))
	require.NoError(t, err)
	defer nc.Close()
	refused := make(chan error, 1)
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { refused <- err })
	_, err = nc.SubscribeSync(natsbus.InboxPrefix(natsbus.UsersUser) + ".>")
	require.NoError(t, err)
	select {
	case err := <-refused:
		require.ErrorContains(t, err, "Permissions Violation")
	case <-time.After(30 * time.Second):
		t.Fatal("the sender subscribed to Users' inbox unrefused")
	}
}

func TestDecodeReply(t *testing.T) {
	t.Parallel()
	r, err := natsbus.DecodeReply([]byte(`{"idempotencyKey":"0193a6a4-1f6e-7c55-9d8e-3b1f0f6c2a10","status":201,"body":{"userId":"0193a6a4-1f6e-7c55-9d8e-3b1f0f6c2a11"}}`))
	require.NoError(t, err)
	require.Equal(t, 201, r.Status)
	for _, bad := range []string{`nope`, `{"status":201}`, `{"idempotencyKey":"0193a6a4-1f6e-7c55-9d8e-3b1f0f6c2a10","status":42}`} {
		_, err := natsbus.DecodeReply([]byte(bad))
		require.Error(t, err, bad)
	}
}

func TestRedacted(t *testing.T) {
	t.Parallel()
	require.Equal(t, "nats://[redacted]@a:4222,nats://b:4222", natsbus.Redacted("nats://u:secret@a:4222,nats://b:4222"))
}

// Publish sends each message with its ID as Nats-Msg-Id and its key as
// Idempotency-Key, answers each in order, and tells a repeat, a stream
// that is not the one expected, and a full stream apart.
func TestPublish(t *testing.T) {
	t.Parallel()
	srv := natsserver.ForTest(t)
	_, js := srv.Admin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	header := nats.Header{}
	header.Set(natsbus.HeaderAttempt, "3")
	msg := func(id string) natsbus.Message {
		return natsbus.Message{Subject: natsbus.CreateUserSubject, ID: id, Key: "key-" + id, Data: []byte(`{}`), Header: header}
	}
	acks := natsbus.Publish(ctx, js, natsbus.CommandStream, []natsbus.Message{msg("a"), msg("b"), msg("a")})
	require.Len(t, acks, 3)
	for _, a := range acks {
		require.NoError(t, a.Err)
	}
	require.False(t, acks[0].Duplicate)
	require.False(t, acks[1].Duplicate)
	require.True(t, acks[2].Duplicate, "the same ID again is a repeat")
	require.Equal(t, acks[0].Seq, acks[2].Seq, "a repeat answers with the first one's place")
	require.NotEqual(t, acks[0].Seq, acks[1].Seq)

	stream, err := js.Stream(ctx, natsbus.CommandStream)
	require.NoError(t, err)
	stored, err := stream.GetMsg(ctx, acks[1].Seq)
	require.NoError(t, err)
	require.Equal(t, "b", stored.Header.Get(jetstream.MsgIDHeader))
	require.Equal(t, "key-b", stored.Header.Get(natsbus.HeaderKey))
	require.Equal(t, "3", stored.Header.Get(natsbus.HeaderAttempt))
	require.Empty(t, header.Get(natsbus.HeaderKey), "the caller's header is left as it was")

	wrong := natsbus.Publish(ctx, js, natsbus.ReplyStream, []natsbus.Message{msg("c")})
	require.Error(t, wrong[0].Err, "a command is not for the reply stream")
	require.False(t, natsbus.StreamFull(wrong[0].Err))

	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "FULL", Subjects: []string{"full.>"}, MaxMsgs: 1, Discard: jetstream.DiscardNew, Storage: jetstream.MemoryStorage,
	})
	require.NoError(t, err)
	full := natsbus.Publish(ctx, js, "FULL", []natsbus.Message{
		{Subject: "full.x", ID: "1", Key: "k1"}, {Subject: "full.x", ID: "2", Key: "k2"},
	})
	require.NoError(t, full[0].Err)
	require.Error(t, full[1].Err)
	require.True(t, natsbus.StreamFull(full[1].Err), "%v", full[1].Err)
}
