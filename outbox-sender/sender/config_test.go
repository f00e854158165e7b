package sender

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/outbox-sender/deadletter"
	"github.com/outboxref/outboxref/testkit/apitest"
)

func TestConfig(t *testing.T) {
	t.Parallel()
	env := apitest.Env
	cfg, r, err := LoadConfig(env())
	require.NoError(t, err, "the defaults are consistent")
	require.Equal(t, 100, cfg.BatchSize)
	require.Equal(t, SourcePoll, cfg.Source, "polling stays the default")
	require.Contains(t, r.Names(), "SENDER_MAX_AGE")
	// With the defaults SENDER_MAX_AGE, not the attempt cap, ends retries:
	// even if every delay were the shortest a capped backoff can draw (half
	// of SENDER_BACKOFF_MAX), the attempts would outlast the age.
	require.Greater(t, time.Duration(cfg.MaxAttempts)*(cfg.BackoffMax/2), cfg.MaxAge)
	// The admin API's and the dead command's default is the defaults' window.
	require.Equal(t, deadletter.DefaultKeyWindow, cfg.KeyWindow())

	for _, bad := range [][]string{
		{"SENDER_BATCH_SIZE", "0"},
		{"SENDER_CONCURRENCY", "many"},
		{"SENDER_USERS_URL", "users:8081"},
		{"SENDER_LEASE", "2s"},
		{"SENDER_USERS_INBOX_RETENTION", "72h"},
		{"SENDER_BACKOFF_MIN", "10m"},
		{"SENDER_SOURCE", "stream"},
		{"SENDER_CDC_SLOT", "Outbox-Slot"},
		{"SENDER_CDC_SLOT", strings.Repeat("s", 64)},
		{"SENDER_CDC_GRACE", "0s"},
		{"SENDER_CDC_DATABASE_URL", "mysql://x"},
	} {
		_, _, err := LoadConfig(env(bad...))
		require.ErrorContains(t, err, bad[0], "%v", bad)
	}
}
