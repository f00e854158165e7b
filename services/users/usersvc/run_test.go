package usersvc

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

func TestRunRejectsBadConfig(t *testing.T) {
	t.Parallel()
	err := Run(context.Background(), nil, apitest.Env(
		"USERS_INBOX_RETENTION", "forever", "USERS_DATABASE_URL", "mysql://x"), &bytes.Buffer{})
	require.ErrorContains(t, err, "USERS_INBOX_RETENTION")
	require.ErrorContains(t, err, "USERS_DATABASE_URL")

	err = Run(context.Background(), []string{"serve"}, apitest.Env(), &bytes.Buffer{})
	require.ErrorContains(t, err, "want none, or one of healthcheck, migrate")

	// A malformed database URL is named, but its password never shown.
	err = Run(context.Background(), nil, apitest.Env("USERS_DATABASE_URL", "postgres://app:hunter2@db:5432/x?sslmode=%zz"), &bytes.Buffer{})
	require.ErrorContains(t, err, "USERS_DATABASE_URL")
	require.NotContains(t, err.Error(), "hunter2")

	// Waits nest: the wait for a key happens inside a transaction, so it
	// must end before the transaction's deadline. One message names both.
	err = Run(context.Background(), nil, apitest.Env("USERS_IDEMPOTENCY_WAIT", "5s"), &bytes.Buffer{})
	require.ErrorContains(t, err, "USERS_IDEMPOTENCY_WAIT=5s must be shorter than USERS_DATABASE_TIMEOUT=")
	err = Run(context.Background(), nil, apitest.Env("USERS_DATABASE_TIMEOUT", "1s"), &bytes.Buffer{})
	require.ErrorContains(t, err, "must be shorter than USERS_DATABASE_TIMEOUT=1s")

	// The pool has room for at least one transaction.
	err = Run(context.Background(), nil, apitest.Env("USERS_DB_MAX_CONNS", "0"), &bytes.Buffer{})
	require.ErrorContains(t, err, "USERS_DB_MAX_CONNS")
	err = Run(context.Background(), nil, apitest.Env("USERS_ADMIN_MAX_CONNS", "0"), &bytes.Buffer{})
	require.ErrorContains(t, err, "USERS_ADMIN_MAX_CONNS")
}

// TestConfigDefaults: the admin listener has its own port and cap.
func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	cfg, _, err := LoadConfig(apitest.Env())
	require.NoError(t, err)
	require.Equal(t, ":8081", cfg.HTTPAddr)
	require.Equal(t, "127.0.0.1:8091", cfg.AdminAddr)
	require.Equal(t, 64, cfg.AdminMaxConns)
	cfg, _, err = LoadConfig(apitest.Env("USERS_ADMIN_ADDR", "127.0.0.1:9101", "USERS_ADMIN_MAX_CONNS", "8"))
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:9101", cfg.AdminAddr)
	require.Equal(t, 8, cfg.AdminMaxConns)
}

// TestRunNeedsCallers: Users will not serve without callers (secure by
// default), and names the variable; mistakes in the list name the caller
// or entry, never a token. "migrate" needs no callers.
func TestRunNeedsCallers(t *testing.T) {
	t.Parallel()
	err := Run(context.Background(), nil, apitest.Env(), &bytes.Buffer{})
	require.ErrorContains(t, err, "USERS_API_TOKENS (or USERS_API_TOKENS_FILE) is required")
	err = Run(context.Background(), nil, apitest.Env("USERS_API_TOKENS", " , \n ,"), &bytes.Buffer{})
	require.ErrorContains(t, err, "USERS_API_TOKENS: lists no caller", "blank entries are no callers")

	err = Run(context.Background(), nil, apitest.Env("USERS_API_TOKENS", "outbox-sender:"+senderToken+",other:"+senderToken+",admin:hunter2"), &bytes.Buffer{})
	require.ErrorContains(t, err, `USERS_API_TOKENS: `)
	require.ErrorContains(t, err, `callers "outbox-sender" and "other" have the same token`)
	require.ErrorContains(t, err, "entry 3: a token must be at least 16 characters")
	for _, secret := range []string{senderToken, otherToken, "hunter2"} {
		require.NotContains(t, err.Error(), secret)
	}
	require.NotContains(t, err.Error(), "is required", "a list with mistakes is not a missing list")

	file := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(file, []byte("outbox-sender:"+senderToken+"\nother:"+otherToken+"\n"), 0o600))
	cfg, _, err := LoadConfig(apitest.Env("USERS_API_TOKENS_FILE", file))
	require.NoError(t, err)
	require.Equal(t, testCallers, cfg.Callers)
	err = Run(context.Background(), nil, apitest.Env("USERS_API_TOKENS_FILE", file, "USERS_API_TOKENS", "x:"+senderToken), &bytes.Buffer{})
	require.ErrorContains(t, err, "USERS_API_TOKENS and USERS_API_TOKENS_FILE are both set")
	require.NotContains(t, err.Error(), "is required")
}

// TestRunMigratesThenServes starts from an empty database, as a first
// deployment does: "users migrate", then the server, then a clean shutdown.
func TestRunMigratesThenServes(t *testing.T) {
	t.Parallel()
	// The migration is not handed the API's tokens; the server is. The
	// migration logs in as the administrator and needs users_app's
	// password; the server logs in as users_app.
	adminURL, addr := pgtest.EmptyURL(t), apitest.FreeAddr(t)
	err := Run(context.Background(), []string{"migrate"}, apitest.Env("USERS_MIGRATE_DATABASE_URL", adminURL), &bytes.Buffer{})
	require.ErrorContains(t, err, "USERS_DATABASE_PASSWORD (or USERS_DATABASE_PASSWORD_FILE) required")
	password := pgtest.Passwords[migrations.UsersApp]
	migrate := apitest.Env("USERS_MIGRATE_DATABASE_URL", adminURL, "USERS_DATABASE_PASSWORD", password)
	require.NoError(t, Run(context.Background(), []string{"migrate"}, migrate, &bytes.Buffer{}))
	require.NoError(t, Run(context.Background(), []string{"migrate"}, migrate, &bytes.Buffer{}), "migrating twice is a no-op")
	appURL, err := url.Parse(adminURL)
	require.NoError(t, err)
	appURL.User = url.User(migrations.UsersApp)
	env := apitest.Env("USERS_DATABASE_URL", appURL.String(), "USERS_DATABASE_PASSWORD", password,
		"USERS_HTTP_ADDR", addr, "USERS_ADMIN_ADDR", apitest.FreeAddr(t), "USERS_API_TOKENS", "outbox-sender:"+senderToken)

	var logs bytes.Buffer
	base := "http://" + env("USERS_HTTP_ADDR")
	stop := apitest.RunUntilReady(t, base+"/readyz", func(ctx context.Context) error { return Run(ctx, nil, env, &logs) })
	res := apitest.Do(t, http.MethodPost, base+"/users", ada, "Idempotency-Key", "run-1")
	require.Equal(t, http.StatusUnauthorized, res.Status, "%s", res.Body)
	res = apitest.Do(t, http.MethodPost, base+"/users", ada, "Idempotency-Key", "run-1", "Authorization", "Bearer "+senderToken)
	require.Equal(t, http.StatusCreated, res.Status, "%s", res.Body)
	// The admin listener serves the metrics, without a token; the API
	// does not.
	m := apitest.Do(t, http.MethodGet, "http://"+env("USERS_ADMIN_ADDR")+"/metrics", "")
	require.Equal(t, http.StatusOK, m.Status)
	require.Contains(t, string(m.Body), "\nusers_inbox_requests_total{outcome=\"created\"} 1\n")
	require.Contains(t, string(m.Body), "\nprocess_start_time_seconds ")
	require.Equal(t, http.StatusNotFound, apitest.Do(t, http.MethodGet, base+"/metrics", "", "Authorization", "Bearer "+senderToken).Status)

	// The container image has no curl: "healthcheck" asks /readyz itself.
	var out bytes.Buffer
	require.NoError(t, Run(context.Background(), []string{"healthcheck"}, apitest.Env("USERS_HTTP_ADDR", addr), &out), "healthcheck needs no tokens")
	require.Equal(t, "ready\n", out.String())

	// A process on the sender's host sending bodies a byte at a time, on
	// more connections than its share (256), shuts no one out: the health
	// check, a new client and a delivery over the sender's kept-alive
	// connection are answered, each within its own bound (3s, 5s), far
	// short of the 15s (ReadTimeout) a trickled body could hold a slot.
	// Each delivery is run-1's again, which Users answers as it did the
	// first time.
	kept := &http.Transport{}
	t.Cleanup(kept.CloseIdleConnections)
	sender := &http.Client{Timeout: 5 * time.Second, Transport: kept}
	deliver := func(client *http.Client) (reused bool) {
		return apitest.PostOver(t, client, base+"/users", ada, http.StatusCreated,
			"Idempotency-Key", "run-1", "Authorization", "Bearer "+senderToken)
	}
	deliver(sender)
	apitest.Trickle(t, addr, 1, 320,
		"POST /users HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n", http.StatusUnauthorized)
	require.NoError(t, Run(context.Background(), []string{"healthcheck"}, apitest.Env("USERS_HTTP_ADDR", addr), &out))
	deliver(&http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}})
	require.True(t, deliver(sender), "the sender's connection was kept")

	require.NoError(t, stop())
	require.Error(t, Run(context.Background(), []string{"healthcheck"}, env, &out), "nothing listens any more")
	require.Contains(t, logs.String(), `"msg":"listening"`)
	require.Contains(t, logs.String(), `"service":"users"`)
}
