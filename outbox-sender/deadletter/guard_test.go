package deadletter

import (
	"bytes"
	"context"
	"encoding/json"
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
	require.Equal(t, 1, bulk.Skipped.RedriveLimit, "and says why")
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

	// A redrive that waited for the lock would wait until the cleanup:
	// apitest.Do would give up after 10s, with no answer at all.
	res := apitest.Do(t, http.MethodPost, fmt.Sprintf("%s/outbox/%d/redrive", admin, locked), `{"mode":"retry"}`)
	require.Equal(t, http.StatusConflict, res.Status, "%s", res.Body)
	require.Equal(t, httpapi.TypeOutboxRowBusy, res.Problem(t).Type)
	require.Equal(t, "1", res.Header.Get("Retry-After"))

	res = apitest.Do(t, http.MethodPost, admin+"/outbox/redrive", `{"mode":"retry"}`)
	require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
	var bulk Bulk
	res.JSON(t, &bulk)
	require.Equal(t, 1, bulk.Matched)
	require.Equal(t, 1, bulk.Redriven)
	require.Equal(t, 1, bulk.Skipped.Busy, "the locked row is passed by, and counted")
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
	require.Equal(t, 1, bulk.Skipped.KeyMayBeForgotten, "and says why")

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

// TestBulkRedriveSaysWhatItPassedBy: a bulk redrive, dry or not, through
// the API and the command line, counts each row it passes by under its
// reason (at the redrive limit, a key Users may forget, a new key that is
// not safe, locked by another transaction), and the matched rows and the
// skipped ones add up to the filter's dead rows as far as the walk went.
func TestBulkRedriveSaysWhatItPassedBy(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	addStudents(t, pool, 6)
	sender := pgtest.As(t, pool, migrations.OutboxSender)
	ctx := context.Background()
	// Oldest death first: at the limit (its key old too, counted once),
	// one to take, a key past the window (and not safe for a new key),
	// one locked, two more to take.
	var ids []int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT array_agg(id ORDER BY id) FROM outbox").Scan(&ids))
	limit, first, oldKey, locked, rest := ids[0], ids[1], ids[2], ids[3], ids[4:]
	_, err := pool.Exec(ctx, `UPDATE outbox SET state = 'dead', reason_class = 'refused',
		dead_at = '2026-01-01T00:00:00Z'::timestamptz + array_position($1::bigint[], id) * interval '1 minute'`, ids)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE outbox SET redrives = 3, key_minted_at = now() - interval '2 hours' WHERE id = $1", limit)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE outbox SET reason_class = 'expired', key_minted_at = now() - interval '2 hours' WHERE id = $1", oldKey)
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, "SELECT 1 FROM outbox WHERE id = $1 FOR UPDATE", locked)
	require.NoError(t, err)

	o := New(sender, "test", 0)
	o.MaxRedrives, o.KeyWindow = 3, time.Hour
	srv := operatorAPI(t, pool, o)
	bulk := func(body string) (Bulk, map[string]any) {
		t.Helper()
		res := apitest.Do(t, http.MethodPost, srv.URL+"/outbox/redrive", body)
		require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
		var b Bulk
		res.JSON(t, &b)
		var raw struct{ Skipped map[string]any }
		res.JSON(t, &raw)
		return b, raw.Skipped
	}
	skipped := func(limit, newKey, keyAge, busy int) Skipped {
		return Skipped{RedriveLimit: limit, NewKeyUnsafe: newKey, KeyMayBeForgotten: keyAge, Busy: busy}
	}
	dead := `SELECT count(*) FROM outbox WHERE state = 'dead'`

	b, raw := bulk(`{"mode":"retry","dry_run":true}`)
	require.Equal(t, map[string]any{"redrive-limit": 1.0, "new-key-unsafe": 0.0, "key-may-be-forgotten": 1.0, "busy": 1.0}, raw,
		"every reason is written, 0 when none")
	require.Equal(t, Bulk{Mode: "retry", DryRun: true, Matched: 3, IDs: append([]int64{first}, rest...), Skipped: skipped(1, 0, 1, 1)}, b)
	b, _ = bulk(`{"mode":"retry","dry_run":true,"force":true}`)
	require.Equal(t, []int64{first, oldKey, rest[0], rest[1]}, b.IDs, "forced, a key past the window is taken")
	require.Equal(t, skipped(1, 0, 0, 1), b.Skipped)
	b, _ = bulk(`{"mode":"new-operation","dry_run":true}`)
	require.Equal(t, 3, b.Matched)
	require.Equal(t, skipped(1, 1, 0, 1), b.Skipped, "an expired row's old key may have created a user")
	b, _ = bulk(`{"mode":"retry","dry_run":true,"max":1}`)
	require.Equal(t, []int64{first}, b.IDs)
	require.Equal(t, skipped(1, 0, 0, 0), b.Skipped, "the walk ends at the last row it takes")
	require.Equal(t, 6, count(t, pool, dead), "a dry run changes nothing")

	// The command line says the same, and says it in words.
	cli := Command(3*time.Second, 3, time.Hour)
	run := func(args ...string) (Bulk, string) {
		t.Helper()
		var out bytes.Buffer
		require.NoError(t, cli(ctx, sender, args, &out))
		text, line, ok := strings.Cut(strings.TrimSuffix(out.String(), "\n"), "\nskipped: ")
		require.True(t, ok, "a line of what was skipped after the answer: %q", out.String())
		var b Bulk
		require.NoError(t, json.Unmarshal([]byte(text), &b), "%s", text)
		return b, line
	}
	b, line := run("redrive-all", "--mode", "retry", "--dry-run")
	require.Equal(t, skipped(1, 0, 1, 1), b.Skipped)
	require.Equal(t, "1 at the redrive limit (SENDER_MAX_REDRIVES=3: read the row's history with dead show, fix the cause, raise the limit), "+
		"1 whose key Users may forget before a retry ends (minted over 1h0m0s ago: look in Users for the student's user; "+
		"if none holds the document number, --force), 1 busy (locked by another transaction: run again)", line)
	_, line = run("redrive-all", "--mode", "new-operation", "--dry-run")
	require.Contains(t, line, "1 at the redrive limit")
	require.Contains(t, line, "1 whose old key may have created a user (--mode retry, or check Users for the row's keys, then --force), 1 busy")

	// Redriven: what it matched is what it redrove; the rest stays dead.
	b, _ = bulk(`{"mode":"retry"}`)
	require.Equal(t, Bulk{Mode: "retry", Matched: 3, Redriven: 3, IDs: append([]int64{first}, rest...), Skipped: skipped(1, 0, 1, 1)}, b)
	require.Equal(t, 3, count(t, pool, dead))
	b, line = run("redrive-all", "--mode", "retry", "--force")
	require.Equal(t, Bulk{Mode: "retry", Matched: 1, Redriven: 1, IDs: []int64{oldKey}, Skipped: skipped(1, 0, 0, 1)}, b)
	require.Contains(t, line, "0 whose key Users may forget")
	require.Equal(t, 2, count(t, pool, dead))

	require.NoError(t, tx.Rollback(ctx))
	b, _ = bulk(`{"mode":"new-operation"}`)
	require.Equal(t, Bulk{Mode: "new-operation", Matched: 1, Redriven: 1, IDs: []int64{locked}, Skipped: skipped(1, 0, 0, 0)}, b,
		"the lock let go, the row is taken")
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead' AND id = $1", limit))
	require.Equal(t, 5, count(t, pool, "SELECT count(*) FROM outbox_events WHERE kind = 'redrive'"))
}
