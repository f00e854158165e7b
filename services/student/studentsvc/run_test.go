package studentsvc

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

func TestRunRejectsBadConfig(t *testing.T) {
	t.Parallel()
	err := Run(context.Background(), nil, apitest.Env(
		"STUDENT_INBOX_RETENTION", "forever", "STUDENT_DATABASE_URL", "mysql://x"), &bytes.Buffer{})
	require.ErrorContains(t, err, "STUDENT_INBOX_RETENTION")
	require.ErrorContains(t, err, "STUDENT_DATABASE_URL")

	err = Run(context.Background(), []string{"serve"}, apitest.Env(), &bytes.Buffer{})
	require.ErrorContains(t, err, "want none, or one of healthcheck, migrate")

	// Serving needs callers, and a token a caller could send; the error
	// names the caller, never the token.
	err = Run(context.Background(), nil, apitest.Env(), &bytes.Buffer{})
	require.ErrorContains(t, err, "STUDENT_API_TOKENS (or STUDENT_API_TOKENS_FILE) is required")
	err = Run(context.Background(), nil, apitest.Env("STUDENT_API_TOKENS", "web:hunter2"), &bytes.Buffer{})
	require.ErrorContains(t, err, "STUDENT_API_TOKENS")
	require.NotContains(t, err.Error(), "hunter2")

	// A malformed database URL is named, but its password never shown.
	err = Run(context.Background(), nil, apitest.Env("STUDENT_DATABASE_URL", "postgres://app:hunter2@db:5432/x?sslmode=%zz"), &bytes.Buffer{})
	require.ErrorContains(t, err, "STUDENT_DATABASE_URL")
	require.NotContains(t, err.Error(), "hunter2")

	// Waits nest: the wait for a key happens inside a transaction, so it
	// must end before the transaction's deadline. One message names both.
	err = Run(context.Background(), nil, apitest.Env("STUDENT_IDEMPOTENCY_WAIT", "9s"), &bytes.Buffer{})
	require.ErrorContains(t, err, "STUDENT_IDEMPOTENCY_WAIT=9s must be shorter than STUDENT_DATABASE_TIMEOUT=")
	err = Run(context.Background(), nil, apitest.Env("STUDENT_DATABASE_TIMEOUT", "1s"), &bytes.Buffer{})
	require.ErrorContains(t, err, "must be shorter than STUDENT_DATABASE_TIMEOUT=1s")

	// The pool has room for at least one transaction.
	err = Run(context.Background(), nil, apitest.Env("STUDENT_DB_MAX_CONNS", "0"), &bytes.Buffer{})
	require.ErrorContains(t, err, "STUDENT_DB_MAX_CONNS")
	err = Run(context.Background(), nil, apitest.Env("STUDENT_ADMIN_MAX_CONNS", "0"), &bytes.Buffer{})
	require.ErrorContains(t, err, "STUDENT_ADMIN_MAX_CONNS")
}

// TestConfigDefaults: the admin listener has its own port and cap.
func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	cfg, _, err := LoadConfig(apitest.Env())
	require.NoError(t, err)
	require.Equal(t, ":8080", cfg.HTTPAddr)
	require.Equal(t, "127.0.0.1:8090", cfg.AdminAddr)
	require.Equal(t, 64, cfg.AdminMaxConns)
	cfg, _, err = LoadConfig(apitest.Env("STUDENT_ADMIN_ADDR", "127.0.0.1:9100", "STUDENT_ADMIN_MAX_CONNS", "8"))
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:9100", cfg.AdminAddr)
	require.Equal(t, 8, cfg.AdminMaxConns)
}

// TestRunMigratesThenServes starts from an empty database, as a first
// deployment does: "student migrate", then the server, then a clean shutdown.
func TestRunMigratesThenServes(t *testing.T) {
	t.Parallel()
	// The migration logs in as the administrator and gives the runtime
	// roles their passwords; the server logs in as student_app.
	adminURL := pgtest.EmptyURL(t)
	err := Run(context.Background(), []string{"migrate"}, apitest.Env("STUDENT_MIGRATE_DATABASE_URL", adminURL), &bytes.Buffer{})
	require.ErrorContains(t, err, "STUDENT_DATABASE_PASSWORD (or STUDENT_DATABASE_PASSWORD_FILE), SENDER_DATABASE_PASSWORD (or SENDER_DATABASE_PASSWORD_FILE), SENDER_CDC_DATABASE_PASSWORD (or SENDER_CDC_DATABASE_PASSWORD_FILE) required")
	appURL, err := url.Parse(adminURL)
	require.NoError(t, err)
	appURL.User = url.User(migrations.StudentApp)
	env := apitest.Env("STUDENT_MIGRATE_DATABASE_URL", adminURL, "STUDENT_DATABASE_URL", appURL.String(),
		"STUDENT_DATABASE_PASSWORD", pgtest.Passwords[migrations.StudentApp],
		"SENDER_DATABASE_PASSWORD", pgtest.Passwords[migrations.OutboxSender],
		"SENDER_CDC_DATABASE_PASSWORD", pgtest.Passwords[migrations.OutboxCDC], "STUDENT_HTTP_ADDR", apitest.FreeAddr(t),
		"STUDENT_ADMIN_ADDR", apitest.FreeAddr(t), "STUDENT_API_TOKENS", "client:"+clientToken)
	require.NoError(t, Run(context.Background(), []string{"migrate"}, env, &bytes.Buffer{}))
	require.NoError(t, Run(context.Background(), []string{"migrate"}, env, &bytes.Buffer{}), "migrating twice is a no-op")

	var logs bytes.Buffer
	base := "http://" + env("STUDENT_HTTP_ADDR")
	stop := apitest.RunUntilReady(t, base+"/readyz", func(ctx context.Context) error { return Run(ctx, nil, env, &logs) })
	authed := []string{"Authorization", "Bearer " + clientToken}
	require.Equal(t, http.StatusUnauthorized, apitest.Do(t, http.MethodPost, base+"/students", ada).Status)
	res := apitest.Do(t, http.MethodPost, base+"/students", ada, authed...)
	require.Equal(t, http.StatusCreated, res.Status, "%s", res.Body)
	// The admin listener serves the metrics, the API does not.
	m := apitest.Do(t, http.MethodGet, "http://"+env("STUDENT_ADMIN_ADDR")+"/metrics", "")
	require.Equal(t, http.StatusOK, m.Status)
	require.Contains(t, string(m.Body), "\nstudent_students_created_total 1\n")
	require.Contains(t, string(m.Body), "\nprocess_start_time_seconds ")
	require.Equal(t, http.StatusNotFound, apitest.Do(t, http.MethodGet, base+"/metrics", "").Status)

	// The container image has no curl: "healthcheck" asks /readyz itself.
	var out bytes.Buffer
	require.NoError(t, Run(context.Background(), []string{"healthcheck"}, env, &out))
	require.Equal(t, "ready\n", out.String())

	// A client hoarding every slot, idle keep-alive connections with one
	// request each, and one on this host sending bodies a byte at a time
	// on as many connections as its share, shut no one out: a new client
	// and the health check are answered. Shut out, they would wait for a
	// slot far longer than the health check's 3s and apitest.Do's 10s: a
	// trickled body holds one for ReadTimeout (15s), an idle connection
	// for IdleTimeout (minutes).
	apitest.HoldIdle(t, env("STUDENT_HTTP_ADDR"), 1024)
	apitest.HoldIdle(t, env("STUDENT_ADMIN_ADDR"), 64)
	apitest.Trickle(t, env("STUDENT_HTTP_ADDR"), 1, 256,
		"POST /students HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n", http.StatusUnauthorized)
	apitest.Trickle(t, env("STUDENT_ADMIN_ADDR"), 1, 16,
		"GET /readyz HTTP/1.1\r\nHost: localhost\r\nContent-Length: 4000\r\n\r\n", http.StatusOK)
	require.NoError(t, Run(context.Background(), []string{"healthcheck"}, env, &out))
	res = apitest.Do(t, http.MethodPost, base+"/students", apitest.PersonBody("Bob", "bob@example.com", "222-2"), authed...)
	require.Equal(t, http.StatusCreated, res.Status, "%s", res.Body)
	require.Equal(t, http.StatusOK, apitest.Do(t, http.MethodGet, "http://"+env("STUDENT_ADMIN_ADDR")+"/readyz", "").Status)

	require.NoError(t, stop())
	require.Error(t, Run(context.Background(), []string{"healthcheck"}, env, &out), "nothing listens any more")
	require.Contains(t, logs.String(), `"msg":"listening"`)
	require.Contains(t, logs.String(), `"service":"student"`)
}
