package sender

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/testkit/natsserver"
)

// "outbox-sender provision-broker" creates the streams and consumers as
// the broker's admin, needs no database, and can run again unchanged.
func TestProvisionBroker(t *testing.T) {
	t.Parallel()
	srv := natsserver.ForTest(t)
	_, js := srv.Admin(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The embedded server comes provisioned: start from nothing, but for
	// a command stream as an earlier version made it (limits retention,
	// no byte limit), which provisioning brings up to date.
	require.NoError(t, js.DeleteStream(ctx, natsbus.CommandStream))
	require.NoError(t, js.DeleteStream(ctx, natsbus.ReplyStream))
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: natsbus.CommandStream, Subjects: []string{"users.commands.>"}, Retention: jetstream.LimitsPolicy})
	require.NoError(t, err)

	env := map[string]string{
		"SENDER_NATS_URL":              srv.URL,
		"SENDER_NATS_ADMIN_USER":       natsserver.AdminUser,
		"SENDER_NATS_ADMIN_PASSWORD":   string(srv.Passwords[natsserver.AdminUser]),
		"SENDER_DATABASE_URL":          "postgres://nobody@127.0.0.1:1/none", // never used
		"SENDER_NATS_STREAM_MAX_BYTES": "8388608",
	}
	for range 2 {
		var out bytes.Buffer
		require.NoError(t, Run(ctx, []string{"provision-broker"}, func(k string) string { return env[k] }, &out))
		require.Contains(t, out.String(), "provisioned streams USERS_COMMANDS and USERS_REPLIES (1 replicas, 8388608 bytes each at most)")
	}
	for _, name := range []string{natsbus.CommandStream, natsbus.ReplyStream} {
		s, err := js.Stream(ctx, name)
		require.NoError(t, err)
		cfg := s.CachedInfo().Config
		require.Equal(t, jetstream.InterestPolicy, cfg.Retention, "%s: read messages leave", name)
		require.Equal(t, jetstream.DiscardNew, cfg.Discard, "%s: a full stream keeps what it holds", name)
		require.Equal(t, int64(8388608), cfg.MaxBytes, name)
	}
	_, err = js.Consumer(ctx, natsbus.CommandStream, natsbus.UsersConsumer)
	require.NoError(t, err)
	_, err = js.Consumer(ctx, natsbus.ReplyStream, natsbus.SenderConsumer)
	require.NoError(t, err)

	// Without the admin's password it says which variable is missing.
	delete(env, "SENDER_NATS_ADMIN_PASSWORD")
	err = Run(ctx, []string{"provision-broker"}, func(k string) string { return env[k] }, &bytes.Buffer{})
	require.ErrorContains(t, err, "SENDER_NATS_ADMIN_PASSWORD")
}
