package deadletter

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// operatorToken is the token of the operator "test-admin" in these tests.
const operatorToken = "operator-token-0123456789abcdef"

// operators lists the one operator of these tests.
var operators = auth.NewTokens([]auth.Credential{{Caller: "test-admin", Token: operatorToken}})

// adminAPI serves the admin routes on pool, as the sender's admin port
// does, to requests sent as the operator "test-admin".
func adminAPI(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	r := httpapi.NewRouter(slog.New(slog.DiscardHandler), pool.Ping)
	Routes(r, operator(t, pool, "unnamed"), operators)
	ts := httptest.NewServer(apitest.WithToken(r, operatorToken))
	t.Cleanup(ts.Close)
	return ts.URL
}

// operator is an Operator on pool's database, logged in as the sender.
func operator(t *testing.T, pool *pgxpool.Pool, actor string) *Operator {
	t.Helper()
	return New(pgtest.As(t, pool, migrations.OutboxSender), actor, 0)
}

func addStudents(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	pgtest.AddStudents(t, pool, n)
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	return apitest.Count(t, pool, sql, args...)
}

// TestRedriveModes walks both modes and every refusal of the redrive
// endpoint.
func TestRedriveModes(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	addStudents(t, pool, 2)
	_, err := pool.Exec(context.Background(),
		"UPDATE outbox SET state = 'dead', dead_at = now(), attempts = 3, reason_class = 'refused', last_error = 'Users answered 409', published_at = now(), published_seq = 7")
	require.NoError(t, err)
	var ids []int64
	rows, err := pool.Query(context.Background(), "SELECT id FROM outbox ORDER BY id")
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		ids = append(ids, id)
	}
	require.NoError(t, rows.Err())
	admin := adminAPI(t, pool)
	redrive := func(id int64, body string) apitest.Response {
		return apitest.Do(t, http.MethodPost, fmt.Sprintf("%s/outbox/%d/redrive", admin, id), body)
	}
	keyOf := func(id int64) (key string, previous []string) {
		require.NoError(t, pool.QueryRow(context.Background(),
			"SELECT idempotency_key::text, previous_keys::text[] FROM outbox WHERE id = $1", id).Scan(&key, &previous))
		return key, previous
	}

	// Bad requests change nothing.
	for _, bad := range []struct{ body, field string }{
		{`{}`, "mode"}, {`{"mode":"again"}`, "mode"}, {`{"mode":"retry","forced":true}`, "forced"},
	} {
		res := redrive(ids[0], bad.body)
		require.Equal(t, http.StatusBadRequest, res.Status, bad.body)
		require.Equal(t, []string{bad.field}, res.Problem(t).Fields(), bad.body)
	}
	require.Equal(t, http.StatusNotFound, redrive(999999, `{"mode":"retry"}`).Status)
	res := apitest.Do(t, http.MethodPost, fmt.Sprintf("%s/outbox/%d/redrive", admin, ids[0]), `{"mode":"retry"}`, "Content-Type", "text/plain")
	require.Equal(t, http.StatusUnsupportedMediaType, res.Status, "a cross-site form post is refused")
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE id = $1 AND state = 'dead'", ids[0]))

	// retry keeps the key.
	before, _ := keyOf(ids[0])
	res = redrive(ids[0], `{"mode":"retry"}`)
	require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
	var done Redriven
	res.JSON(t, &done)
	require.True(t, done.Changed)
	after, previous := keyOf(ids[0])
	require.Equal(t, before, after)
	require.Empty(t, previous)
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE id = $1 AND state = 'pending' AND attempts = 0 AND redrives = 1 AND last_error IS NULL AND available_at <= now()", ids[0]))
	// With the broker transport, the next publish is not held back until
	// Users has read the command of a publish before the redrive.
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE id = $1 AND published_seq IS NULL AND published_at IS NULL", ids[0]))

	// A repeat changes nothing more, and says so, in whichever mode.
	res = redrive(ids[0], `{"mode":"new-operation"}`)
	require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
	res.JSON(t, &done)
	require.False(t, done.Changed)
	require.Equal(t, outbox.RedriveRetry, done.Mode, "the mode that was applied")
	require.Contains(t, done.Detail, "already redriven (retry)")
	require.Equal(t, 1, count(t, pool, "SELECT redrives FROM outbox WHERE id = $1", ids[0]))

	// new-operation mints a key and keeps the old one.
	before, _ = keyOf(ids[1])
	res = redrive(ids[1], `{"mode":"new-operation"}`)
	require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
	after, previous = keyOf(ids[1])
	require.NotEqual(t, before, after)
	require.Equal(t, []string{before}, previous)

	// A new key where the old one may have created the user is refused,
	// unless forced.
	_, err = pool.Exec(context.Background(), "UPDATE outbox SET state = 'dead', dead_at = now(), reason_class = 'expired' WHERE id = $1", ids[0])
	require.NoError(t, err)
	res = redrive(ids[0], `{"mode":"new-operation"}`)
	require.Equal(t, http.StatusConflict, res.Status, "%s", res.Body)
	require.Equal(t, httpapi.TypeNewKeyUnsafe, res.Problem(t).Type)
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE id = $1 AND state = 'dead'", ids[0]))
	res = redrive(ids[0], `{"mode":"new-operation","force":true}`)
	require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)

	// A row that is not dead (and was not just redriven) is a 409.
	_, err = pool.Exec(context.Background(), "UPDATE outbox SET state = 'delivered', delivered_at = now() WHERE id = $1", ids[1])
	require.NoError(t, err)
	res = redrive(ids[1], `{"mode":"retry"}`)
	require.Equal(t, http.StatusConflict, res.Status)
	p := res.Problem(t)
	require.Equal(t, httpapi.TypeOutboxRowNotDead, p.Type)
	require.Contains(t, p.Detail, "delivered")

	// The history shows the redrives, with the key each one left.
	res = apitest.Do(t, http.MethodGet, fmt.Sprintf("%s/outbox/%d", admin, ids[1]), "")
	var row Row
	res.JSON(t, &row)
	require.Len(t, row.History, 1)
	require.Equal(t, "redrive", row.History[0].Kind)
	require.Equal(t, outbox.RedriveNewOperation, row.History[0].Outcome)
	require.Equal(t, "test-admin", row.History[0].Actor)
	require.Equal(t, 3, row.History[0].Attempt, "the attempts the row had made before")
	require.Equal(t, after, row.History[0].IdempotencyKey.String())
}

// TestBulkRedrive: a dry run says what it would take and changes nothing;
// the filter and the maximum bound what is taken.
func TestBulkRedrive(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	addStudents(t, pool, 5)
	_, err := pool.Exec(context.Background(), `
		UPDATE outbox SET state = 'dead', dead_at = now() - (id || ' minutes')::interval,
		       reason_class = CASE WHEN id % 2 = 0 THEN 'refused' ELSE 'expired' END`)
	require.NoError(t, err)
	admin := adminAPI(t, pool)
	bulk := func(body string) Bulk {
		res := apitest.Do(t, http.MethodPost, admin+"/outbox/redrive", body)
		require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
		var b Bulk
		res.JSON(t, &b)
		return b
	}
	expired := count(t, pool, "SELECT count(*) FROM outbox WHERE reason_class = 'expired'")
	dry := bulk(`{"mode":"retry","reason_class":"expired","dry_run":true}`)
	require.True(t, dry.DryRun)
	require.Equal(t, expired, dry.Matched)
	require.Zero(t, dry.Redriven)
	require.Equal(t, 5, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead'"), "a dry run changes nothing")

	done := bulk(`{"mode":"retry","reason_class":"expired","max":1}`)
	require.Equal(t, 1, done.Redriven)
	require.Equal(t, 4, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead'"))
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'pending' AND id = $1 AND reason_class IS NULL", done.IDs[0]))

	res := apitest.Do(t, http.MethodPost, admin+"/outbox/redrive", `{"mode":"again","reason_class":"bored","dead_since":"yesterday","max":0}`)
	require.Equal(t, http.StatusBadRequest, res.Status)
	require.Equal(t, []string{"mode", "reason_class", "dead_since", "max"}, res.Problem(t).Fields(), "every mistake at once")
	res = apitest.Do(t, http.MethodPost, admin+"/outbox/redrive", `{"mode":"retry","dead_since":"2026-12-03T10:00:00Z","dead_until":"2026-12-03T09:00:00Z"}`)
	require.Equal(t, []string{"dead_until"}, res.Problem(t).Fields())
	require.Equal(t, 4, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead'"))

	// A new key only for Users' refusals: the expired rows are left alone.
	refused := count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead' AND reason_class = 'refused'")
	done = bulk(`{"mode":"new-operation","max":10}`)
	require.Equal(t, refused, done.Redriven)
	require.Equal(t, 0, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead' AND reason_class = 'refused'"))
}

func TestListRefusesBadFilters(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	admin := adminAPI(t, pool)
	for _, tt := range []struct{ query, field string }{
		{"", "state"},
		{"state=gone", "state"},
		{"state=dead&reason_class=bored", "reason_class"},
		{"state=dead&since=yesterday", "since"},
		{"state=dead&limit=0", "limit"},
		{"state=dead&limit=05", "limit"},
		{"state=dead&limit=%2B5", "limit"},
		{"state=dead&limit=", "limit"},
		{"state=dead&limit=5%20", "limit"},
		{"state=dead&cursor=xyz", "cursor"},
		{"state=dead&state=pending", "state"},
		{"state=dead&color=red", "color"},
	} {
		res := apitest.Do(t, http.MethodGet, admin+"/outbox?"+tt.query, "")
		require.Equal(t, http.StatusBadRequest, res.Status, tt.query)
		require.Equal(t, []string{tt.field}, res.Problem(t).Fields(), tt.query)
	}
}

// TestListPagesNewestFirst: pages of dead letters, newest death first, with
// no repeats or gaps.
func TestListPagesNewestFirst(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	addStudents(t, pool, 5)
	_, err := pool.Exec(context.Background(), "UPDATE outbox SET state = 'dead', dead_at = now() - (id || ' minutes')::interval")
	require.NoError(t, err)
	o := operator(t, pool, "test")
	var seen []int64
	f := Filter{State: "dead", Limit: 2}
	for range 5 {
		rows, next, err := o.List(context.Background(), f)
		require.NoError(t, err)
		for _, r := range rows {
			seen = append(seen, r.ID)
		}
		if next == nil {
			break
		}
		f.After = *next
	}
	require.Len(t, seen, 5)
	for i := 1; i < len(seen); i++ {
		require.Less(t, seen[i-1], seen[i], "the smallest id died last (newest first)")
	}
}
