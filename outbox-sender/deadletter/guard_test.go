package deadletter

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestOperatorRoutesNeedAToken: without an operator's token every outbox
// route is 401 with the realm's challenge, before anything is read or
// changed; with one, a redrive is recorded as that operator's.
func TestOperatorRoutesNeedAToken(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	addStudents(t, pool, 1)
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(),
		"UPDATE outbox SET state = 'dead', dead_at = now(), reason_class = 'refused' RETURNING id").Scan(&id))
	r := httpapi.NewRouter(slog.New(slog.DiscardHandler), pool.Ping)
	Routes(r, operator(t, pool, "unnamed"), operators)
	ts := httptest.NewServer(r)
	t.Cleanup(ts.Close)

	routes := []struct{ method, path, body string }{
		{http.MethodGet, "/outbox?state=dead", ""},
		{http.MethodGet, fmt.Sprintf("/outbox/%d", id), ""},
		{http.MethodPost, fmt.Sprintf("/outbox/%d/redrive", id), `{"mode":"new-operation"}`},
		{http.MethodPost, "/outbox/redrive", `{"mode":"retry"}`},
	}
	for _, rt := range routes {
		for name, headers := range map[string][]string{
			"no token":     nil,
			"wrong token":  {"Authorization", "Bearer " + strings.Repeat("x", len(operatorToken))},
			"basic":        {"Authorization", "Basic dGVzdDp0ZXN0"},
			"users' token": {"Authorization", "Bearer sender-token-0123456789abcdef"},
		} {
			res := apitest.Do(t, rt.method, ts.URL+rt.path, rt.body, headers...)
			require.Equal(t, http.StatusUnauthorized, res.Status, "%s %s, %s: %s", rt.method, rt.path, name, res.Body)
			require.Equal(t, httpapi.TypeUnauthorized, res.Problem(t).Type)
			require.Contains(t, res.Header.Get("WWW-Authenticate"), `realm="outbox-sender-admin"`)
			require.NotContains(t, string(res.Body), "refused", "nothing of the rows is shown")
		}
	}
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead' AND redrives = 0"), "nothing was redriven")
	require.Equal(t, 0, count(t, pool, "SELECT count(*) FROM outbox_events"))

	// The health checks need no token.
	require.Equal(t, http.StatusOK, apitest.Do(t, http.MethodGet, ts.URL+"/healthz", "").Status)

	res := apitest.Do(t, http.MethodPost, fmt.Sprintf("%s/outbox/%d/redrive", ts.URL, id), `{"mode":"new-operation"}`,
		"Authorization", "Bearer "+operatorToken)
	require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
	var actor string
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT actor FROM outbox_events WHERE kind = 'redrive'").Scan(&actor))
	require.Equal(t, "test-admin", actor, "the redrive is the operator's, by the name SENDER_ADMIN_TOKENS gives")
}

// TestRedriveLimit: a row redriven MaxRedrives times stays dead; its
// redrive is 409 redrive-limit, a bulk redrive passes it by, and its
// previous keys stop growing.
func TestRedriveLimit(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	addStudents(t, pool, 1)
	o := operator(t, pool, "test")
	o.MaxRedrives = 3
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT id FROM outbox").Scan(&id))
	die := func() {
		_, err := pool.Exec(context.Background(), "UPDATE outbox SET state = 'dead', dead_at = now(), reason_class = 'refused'")
		require.NoError(t, err)
	}
	for range 3 {
		die()
		_, err := o.Redrive(context.Background(), id, "new-operation", false)
		require.NoError(t, err)
	}
	die()
	_, err := o.Redrive(context.Background(), id, "new-operation", false)
	require.ErrorIs(t, err, ErrRedriveLimit)
	require.ErrorContains(t, err, "redriven 3 times")
	bulk, err := o.RedriveMatching(context.Background(), BulkFilter{Mode: "retry", Max: 10})
	require.NoError(t, err)
	require.Zero(t, bulk.Matched, "a bulk redrive passes the row by")
	require.Equal(t, 3, count(t, pool, "SELECT cardinality(previous_keys) FROM outbox"))
	require.Equal(t, 3, count(t, pool, "SELECT redrives FROM outbox WHERE state = 'dead'"))

	srv := operatorAPI(t, pool, o)
	res := apitest.Do(t, http.MethodPost, fmt.Sprintf("%s/outbox/%d/redrive", srv.URL, id), `{"mode":"retry"}`)
	require.Equal(t, http.StatusConflict, res.Status)
	require.Equal(t, httpapi.TypeRedriveLimit, res.Problem(t).Type)
	require.Contains(t, res.Problem(t).Detail, "SENDER_MAX_REDRIVES")
}

// TestRedriveOfALockedRow: a row another transaction has locked is left
// alone at once, not waited for: 409 outbox-row-busy with Retry-After, and
// a bulk redrive redrives the others.
func TestRedriveOfALockedRow(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	admin := adminAPI(t, pool)
	addStudents(t, pool, 2)
	_, err := pool.Exec(context.Background(), "UPDATE outbox SET state = 'dead', dead_at = now(), reason_class = 'refused'")
	require.NoError(t, err)
	var locked int64
	tx, err := pool.Begin(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	require.NoError(t, tx.QueryRow(context.Background(), "SELECT min(id) FROM outbox").Scan(&locked))
	_, err = tx.Exec(context.Background(), "SELECT 1 FROM outbox WHERE id = $1 FOR UPDATE", locked)
	require.NoError(t, err)

	start := time.Now()
	res := apitest.Do(t, http.MethodPost, fmt.Sprintf("%s/outbox/%d/redrive", admin, locked), `{"mode":"retry"}`)
	require.Less(t, time.Since(start), time.Second, "the redrive does not wait for the lock")
	require.Equal(t, http.StatusConflict, res.Status, "%s", res.Body)
	require.Equal(t, httpapi.TypeOutboxRowBusy, res.Problem(t).Type)
	require.Equal(t, "1", res.Header.Get("Retry-After"))

	res = apitest.Do(t, http.MethodPost, admin+"/outbox/redrive", `{"mode":"retry"}`)
	require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
	var bulk Bulk
	res.JSON(t, &bulk)
	require.Equal(t, 2, bulk.Matched)
	require.Equal(t, 1, bulk.Redriven, "the locked row is passed by")
	require.NoError(t, tx.Rollback(context.Background()))
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead' AND id = $1", locked))
}

// TestRetryOfAKeyUsersMayForget: a retry sends the row's key for another
// SENDER_MAX_AGE, so it is refused (409 key-may-be-forgotten, and passed
// by in bulk) once the key is older than KeyWindow; force overrides it,
// and a new-operation redrive mints a key that is young again. The
// protocol's model found the run this prevents (docs/model.md): a key
// Users forgot looks new, and a retry of one that had created the user
// makes Users refuse the student's own document number.
func TestRetryOfAKeyUsersMayForget(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	addStudents(t, pool, 1)
	o := operator(t, pool, "test")
	o.KeyWindow = time.Hour
	ctx := context.Background()
	var id int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT id FROM outbox").Scan(&id))
	die := func(class, keyAge string) {
		_, err := pool.Exec(ctx, "UPDATE outbox SET state = 'dead', dead_at = now(), reason_class = $1, key_minted_at = now() - $2::interval",
			class, keyAge)
		require.NoError(t, err)
	}

	die(outbox.ReasonExpired, "59 minutes")
	_, err := o.Redrive(ctx, id, outbox.RedriveRetry, false)
	require.NoError(t, err, "a key younger than the window may be retried")

	die(outbox.ReasonExpired, "61 minutes")
	_, err = o.Redrive(ctx, id, outbox.RedriveRetry, false)
	require.ErrorIs(t, err, ErrKeyMayBeForgotten)
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead'"), "the row stays dead")
	bulk, err := o.RedriveMatching(ctx, BulkFilter{Mode: outbox.RedriveRetry, Max: 10})
	require.NoError(t, err)
	require.Zero(t, bulk.Matched, "a bulk retry passes the row by")

	srv := operatorAPI(t, pool, o)
	res := apitest.Do(t, http.MethodPost, fmt.Sprintf("%s/outbox/%d/redrive", srv.URL, id), `{"mode":"retry"}`)
	require.Equal(t, http.StatusConflict, res.Status, "%s", res.Body)
	require.Equal(t, httpapi.TypeKeyMayBeForgotten, res.Problem(t).Type)
	require.Contains(t, res.Problem(t).Detail, "force")

	done, err := o.Redrive(ctx, id, outbox.RedriveRetry, true)
	require.NoError(t, err, "forced, after the operator checked Users")
	require.True(t, done.Changed)

	// A new key is young: its row may be retried again.
	die(outbox.ReasonRefused, "10 hours")
	_, err = o.Redrive(ctx, id, outbox.RedriveNewOperation, false)
	require.NoError(t, err)
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE key_minted_at > now() - interval '1 minute'"))
}

// operatorAPI serves o's admin routes, as the sender's admin port does, to
// requests sent as the operator "test-admin".
func operatorAPI(t *testing.T, pool *pgxpool.Pool, o *Operator) *httptest.Server {
	t.Helper()
	r := httpapi.NewRouter(slog.New(slog.DiscardHandler), pool.Ping)
	Routes(r, o, operators)
	srv := httptest.NewServer(apitest.WithToken(r, operatorToken))
	t.Cleanup(srv.Close)
	return srv
}
