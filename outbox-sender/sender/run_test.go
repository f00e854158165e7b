package sender

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

func TestRunRejectsBadConfig(t *testing.T) {
	t.Parallel()
	err := Run(context.Background(), nil, apitest.Env("SENDER_REQUEST_TIMEOUT", "20s"), &bytes.Buffer{})
	require.ErrorContains(t, err, "SENDER_LEASE=30s is too short")
	// Waits nest: a claim must end within the lease it hands out.
	err = Run(context.Background(), nil, apitest.Env("SENDER_DATABASE_TIMEOUT", "30s"), &bytes.Buffer{})
	require.ErrorContains(t, err, "SENDER_DATABASE_TIMEOUT=30s must be shorter than SENDER_LEASE=30s")
	err = Run(context.Background(), []string{"migrate"}, apitest.Env(), &bytes.Buffer{})
	require.ErrorContains(t, err, "want none, or one of dead, healthcheck")

	// Delivering needs a token Users could accept; the error never shows it.
	err = Run(context.Background(), nil, apitest.Env(), &bytes.Buffer{})
	require.ErrorContains(t, err, "SENDER_USERS_TOKEN (or SENDER_USERS_TOKEN_FILE) is required")
	err = Run(context.Background(), nil, apitest.Env("SENDER_USERS_TOKEN", "hunter2"), &bytes.Buffer{})
	require.ErrorContains(t, err, "SENDER_USERS_TOKEN: a token must be at least 16 characters")
	require.NotContains(t, err.Error(), "hunter2")
	require.NotContains(t, err.Error(), "is required")
	cfg, _, err := LoadConfig(apitest.Env("SENDER_USERS_TOKEN", testToken))
	require.NoError(t, err)
	require.NotContains(t, fmt.Sprintf("%v %+v %#v", cfg, cfg, cfg), testToken, "a printed Config hides the token")
}

// senderEnv is the environment of a sender on Student's database at
// dbURL, delivering to usersURL, its admin port on admin, plus kv. It logs
// in as its own role, its password from a variable.
func senderEnv(t *testing.T, dbURL, usersURL, admin string, kv ...string) func(string) string {
	t.Helper()
	roleURL, err := url.Parse(pgtest.RoleURL(t, dbURL, migrations.OutboxSender))
	require.NoError(t, err)
	password, _ := roleURL.User.Password()
	roleURL.User = url.User(migrations.OutboxSender)
	return apitest.Env(append([]string{"SENDER_DATABASE_URL", roleURL.String(), "SENDER_DATABASE_PASSWORD", password,
		"SENDER_USERS_URL", usersURL, "SENDER_ADMIN_ADDR", admin, "SENDER_USERS_TOKEN", testToken}, kv...)...)
}

// TestRunDeliversAndStops runs the sender as main does: admin endpoints up,
// a row delivered, a clean stop on cancel.
func TestRunDeliversAndStops(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t, migrations.Student)
	pool := pgtest.Connect(t, dbURL)
	addStudents(t, pool, 3)
	_, usersURL := newFakeUsers(t, nil)
	admin := apitest.FreeAddr(t)
	env := senderEnv(t, dbURL, usersURL, admin, "SENDER_POLL_INTERVAL", "10ms", "LOG_LEVEL", "debug")
	var logs bytes.Buffer
	stop := apitest.RunUntilReady(t, "http://"+admin+"/readyz", func(ctx context.Context) error { return Run(ctx, nil, env, &logs) })
	eventually(t, "three rows delivered", func() bool {
		return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == 3
	})

	// Results are counted just after their recording commits, so the
	// database can be a moment ahead of the scrape: wait for it.
	eventually(t, "three deliveries counted", func() bool {
		m := string(apitest.Do(t, http.MethodGet, "http://"+admin+"/metrics", "").Body)
		return strings.Contains(m, `outbox_sender_results_total{reason_class="none",verdict="delivered"} 3`)
	})
	m := string(apitest.Do(t, http.MethodGet, "http://"+admin+"/metrics", "").Body)
	require.Contains(t, m, `outbox_rows{state="delivered"} 3`)
	require.Contains(t, m, `outbox_rows{state="pending"} 0`)
	require.Contains(t, m, "outbox_sender_claimed_total 3")
	require.Contains(t, m, "outbox_oldest_pending_age_seconds 0")
	require.Contains(t, m, "outbox_oldest_published_age_seconds 0")
	require.Contains(t, m, "outbox_stats_read_ok 1")
	require.Contains(t, m, "outbox_sender_delivery_lag_seconds_count 3")
	require.Contains(t, m, "outbox_sender_settled_row_attempts_count 3")
	// The admin listener is built like the services': /metrics is a GET
	// route (405 with Allow otherwise), and the problem pages are served.
	post := apitest.Do(t, http.MethodPost, "http://"+admin+"/metrics", "{}")
	require.Equal(t, http.StatusMethodNotAllowed, post.Status)
	require.Equal(t, "GET, HEAD", post.Header.Get("Allow"))
	require.Equal(t, http.StatusOK, apitest.Do(t, http.MethodGet, "http://"+admin+httpapi.TypeOutboxRowNotDead, "").Status)
	var out bytes.Buffer
	require.NoError(t, Run(context.Background(), []string{"healthcheck"}, apitest.Env("SENDER_ADMIN_ADDR", admin), &out), "healthcheck needs no token")
	// A client hoarding the admin port's 64 slots, and one on this host
	// sending bodies a byte at a time on its share of them, leave room for
	// the health check. Shut out, it would wait for a slot far longer than
	// the 3s it gives itself: a trickled body holds one for ReadTimeout
	// (15s), an idle connection for IdleTimeout (minutes).
	apitest.HoldIdle(t, admin, 64)
	apitest.Trickle(t, admin, 1, 16,
		"POST /outbox/redrive HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n", http.StatusUnauthorized)
	require.NoError(t, Run(context.Background(), []string{"healthcheck"}, apitest.Env("SENDER_ADMIN_ADDR", admin), &out),
		"answered while the slots were hoarded")
	require.NoError(t, stop())
	require.Contains(t, logs.String(), `"msg":"sender stopped"`)
	require.Contains(t, logs.String(), `"service":"outbox-sender"`)
}
