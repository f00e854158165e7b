package sender

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync/atomic"
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

// TestProvisionBrokerAsksAgainWhenAnAnswerIsLost: the first connection
// loses the broker's answer to the first JetStream request and then
// drops, as when a node dies holding the request. Each try is bounded,
// so the next one asks again on the new connection and the job ends well
// within its budget; a single try would wait out the whole budget for an
// answer that never comes.
func TestProvisionBrokerAsksAgainWhenAnAnswerIsLost(t *testing.T) {
	t.Parallel()
	srv := natsserver.ForTest(t)
	proxy := newLosingProxy(t, strings.TrimPrefix(srv.URL, "nats://"))
	cfg, _, err := LoadConfig(func(k string) string {
		return map[string]string{
			"SENDER_NATS_URL":            "nats://" + proxy,
			"SENDER_NATS_ADMIN_USER":     natsserver.AdminUser,
			"SENDER_NATS_ADMIN_PASSWORD": string(srv.Passwords[natsserver.AdminUser]),
			"SENDER_DATABASE_URL":        "postgres://nobody@127.0.0.1:1/none",
			// Within the test server's storage.
			"SENDER_NATS_STREAM_MAX_BYTES": "8388608",
		}[k]
	})
	require.NoError(t, err)
	var out bytes.Buffer
	const budget = time.Minute
	start := time.Now()
	require.NoError(t, provision(context.Background(), cfg, &out, budget, 2*time.Second), out.String())
	require.Contains(t, out.String(), "try 1 failed")
	require.Contains(t, out.String(), "provisioned streams")
	require.Less(t, time.Since(start), budget, "it did not wait out its budget")
}

// newLosingProxy forwards TCP to target. On its first connection it
// passes the broker's bytes to the client only until the client sends a
// JetStream API request: from then on it drops them, and closes the
// connection half a second later. Later connections are passed whole.
func newLosingProxy(t *testing.T, target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	var first atomic.Bool
	first.Store(true)
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			t.Cleanup(func() { client.Close(); server.Close() })
			lossy := first.Swap(false)
			var asked atomic.Bool
			go func() {
				buf := make([]byte, 32<<10)
				for {
					n, err := client.Read(buf)
					if n > 0 {
						if lossy && bytes.Contains(buf[:n], []byte("$JS.API.")) && !asked.Swap(true) {
							time.AfterFunc(500*time.Millisecond, func() { client.Close(); server.Close() })
						}
						if _, err := server.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						server.Close()
						return
					}
				}
			}()
			go func() {
				buf := make([]byte, 32<<10)
				for {
					n, err := server.Read(buf)
					if n > 0 && !(lossy && asked.Load()) {
						if _, err := client.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						client.Close()
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}
