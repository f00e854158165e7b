package sender

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/apitest"
	"github.com/outboxref/outboxref/internal/pgtest"
)

func TestMainRejectsBadConfig(t *testing.T) {
	t.Parallel()
	err := Main(context.Background(), nil, apitest.Env("SENDER_REQUEST_TIMEOUT", "20s"), &bytes.Buffer{})
	require.ErrorContains(t, err, "SENDER_LEASE=30s is too short")
	err = Main(context.Background(), []string{"migrate"}, apitest.Env(), &bytes.Buffer{})
	require.ErrorContains(t, err, "takes none")
}

// TestMainDeliversAndStops runs the sender as main does: admin endpoints up,
// a row delivered, a clean stop on cancel.
func TestMainDeliversAndStops(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t, migrations.Student)
	pool := pgtest.Connect(t, dbURL)
	addStudents(t, pool, 3)
	_, usersURL := newFakeUsers(t, nil)
	admin := apitest.FreeAddr(t)
	env := apitest.Env("SENDER_DATABASE_URL", dbURL, "SENDER_USERS_URL", usersURL, "SENDER_ADMIN_ADDR", admin,
		"SENDER_POLL_INTERVAL", "10ms", "LOG_LEVEL", "debug")
	var logs bytes.Buffer
	stop := apitest.RunUntilReady(t, "http://"+admin+"/readyz", func(ctx context.Context) error { return Main(ctx, nil, env, &logs) })
	require.Eventually(t, func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == 3
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, stop())
	require.Contains(t, logs.String(), `"msg":"sender stopped"`)
}
