package sender

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// adminAPI serves the admin routes on pool, as the sender's admin port does.
func adminAPI(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	r := httpapi.NewRouter(slog.New(slog.DiscardHandler), pool.Ping)
	AdminRoutes(r, NewOperator(asSender(t, pool), "test-admin", 0))
	ts := httptest.NewServer(r)
	t.Cleanup(ts.Close)
	return ts.URL
}

// refuseFirst answers 409 document-number-taken to the first key it sees
// and creates users for every other key.
func refuseFirst() (func(w http.ResponseWriter, r *http.Request, key string, n int) bool, func() string) {
	var refused string
	answer := func(w http.ResponseWriter, _ *http.Request, key string, _ int) bool {
		if refused == "" {
			refused = key
		}
		if key != refused {
			return false
		}
		writeProblem(w, httpapi.DocumentTaken("an enabled user already has this document number"))
		return true
	}
	return answer, func() string { return refused }
}

func outboxID(t *testing.T, pool *pgxpool.Pool, key string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT id FROM outbox WHERE idempotency_key = $1", key).Scan(&id))
	return id
}

// TestDeadLetterIsListedWithItsHistory: a refused row is dead with its
// reason class, listed newest first, and its history tells each attempt.
func TestDeadLetterIsListedWithItsHistory(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	answer, refused := refuseFirst()
	_, url := newFakeUsers(t, answer)
	addStudents(t, pool, 1)
	r := run(t, pool, testConfig(url))
	eventually(t, "dead", func() bool { return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead'") == 1 })
	r.wait(t)
	require.InDelta(t, 1, testutil.ToFloat64(r.metrics.dead.WithLabelValues(ReasonRefused)), 0, "the dead-letter metric counts it by reason")
	admin := adminAPI(t, pool)
	id := outboxID(t, pool, refused())

	res := apitest.Do(t, http.MethodGet, admin+"/outbox?state=dead&reason_class=refused", "")
	require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
	var page RowPage
	res.JSON(t, &page)
	require.Len(t, page.Items, 1)
	require.Equal(t, id, page.Items[0].ID)
	require.Equal(t, ReasonRefused, *page.Items[0].ReasonClass)
	require.Contains(t, *page.Items[0].LastError, "Document number already in use")
	require.Nil(t, page.NextCursor)

	res = apitest.Do(t, http.MethodGet, admin+"/outbox?state=dead&reason_class=expired", "")
	res.JSON(t, &page)
	require.Empty(t, page.Items, "the reason filter filters")

	res = apitest.Do(t, http.MethodGet, fmt.Sprintf("%s/outbox/%d", admin, id), "")
	require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
	var row Row
	res.JSON(t, &row)
	require.Equal(t, "dead", row.State)
	require.NotEmpty(t, row.Student.Name)
	require.Len(t, row.History, 1)
	ev := row.History[0]
	require.Equal(t, "attempt", ev.Kind)
	require.Equal(t, 1, ev.Attempt)
	require.Equal(t, "dead", ev.Outcome)
	require.Equal(t, ReasonRefused, *ev.ReasonClass)
	require.Equal(t, "test-sender", ev.Actor)
	require.Equal(t, refused(), ev.IdempotencyKey.String())
}

// TestRedriveModes walks both modes and every refusal of the redrive
// endpoint.
func TestRedriveModes(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	addStudents(t, pool, 2)
	_, err := pool.Exec(context.Background(),
		"UPDATE outbox SET state = 'dead', dead_at = now(), attempts = 3, reason_class = 'refused', last_error = 'Users answered 409'")
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

	// A repeat changes nothing more, and says so, in whichever mode.
	res = redrive(ids[0], `{"mode":"new-operation"}`)
	require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
	res.JSON(t, &done)
	require.False(t, done.Changed)
	require.Equal(t, ModeRetry, done.Mode, "the mode that was applied")
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
	require.Equal(t, TypeNewKeyUnsafe, res.Problem(t).Type)
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE id = $1 AND state = 'dead'", ids[0]))
	res = redrive(ids[0], `{"mode":"new-operation","force":true}`)
	require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)

	// A row that is not dead (and was not just redriven) is a 409.
	_, err = pool.Exec(context.Background(), "UPDATE outbox SET state = 'delivered', delivered_at = now() WHERE id = $1", ids[1])
	require.NoError(t, err)
	res = redrive(ids[1], `{"mode":"retry"}`)
	require.Equal(t, http.StatusConflict, res.Status)
	p := res.Problem(t)
	require.Equal(t, TypeNotDead, p.Type)
	require.Contains(t, p.Detail, "delivered")

	// The history shows the redrives, with the key each one left.
	res = apitest.Do(t, http.MethodGet, fmt.Sprintf("%s/outbox/%d", admin, ids[1]), "")
	var row Row
	res.JSON(t, &row)
	require.Len(t, row.History, 1)
	require.Equal(t, "redrive", row.History[0].Kind)
	require.Equal(t, ModeNewOperation, row.History[0].Outcome)
	require.Equal(t, "test-admin", row.History[0].Actor)
	require.Equal(t, 3, row.History[0].Attempt, "the attempts the row had made before")
	require.Equal(t, after, row.History[0].IdempotencyKey.String())
}

// TestRedrivenRowIsDeliveredAndLinked: after a redrive the sender takes the
// row again, and SENDER_MAX_AGE counts from the redrive.
func TestRedrivenRowIsDeliveredAndLinked(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	users, url := newFakeUsers(t, nil)
	ids := addStudents(t, pool, 1)
	_, err := pool.Exec(context.Background(),
		"UPDATE outbox SET state = 'dead', dead_at = now(), reason_class = 'expired', created_at = now() - interval '2 hours', age_from = now() - interval '2 hours'")
	require.NoError(t, err)
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT id FROM outbox").Scan(&id))
	done, err := NewOperator(asSender(t, pool), "test", 0).Redrive(context.Background(), id, ModeRetry, false)
	require.NoError(t, err)
	require.True(t, done.Changed)

	run(t, pool, testConfig(url)) // MaxAge is an hour: the row was created two hours ago
	eventually(t, "linked", func() bool {
		return count(t, pool, "SELECT count(*) FROM students WHERE user_id IS NOT NULL") == 1
	})
	require.Equal(t, 1, users.keys())
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'"))
	var linked uuid.UUID
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT user_id FROM students WHERE id = $1", ids[0]).Scan(&linked))
	require.Equal(t, users.idFor(done.IdempotencyKey.String()), linked)
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
	o := NewOperator(asSender(t, pool), "test", 0)
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

// TestHistoryIsBounded: a row retried many times keeps its newest events.
func TestHistoryIsBounded(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	_, url := newFakeUsers(t, func(w http.ResponseWriter, _ *http.Request, _ string, _ int) bool {
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	})
	addStudents(t, pool, 1)
	cfg := testConfig(url)
	cfg.MaxAttempts = historyKeep + 5
	r := run(t, pool, cfg)
	eventually(t, "dead after its attempts", func() bool { return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead'") == 1 })
	r.wait(t) // the redrives below must not race the sender's attempts
	require.Equal(t, historyKeep, count(t, pool, "SELECT count(*) FROM outbox_events"))
	require.Equal(t, historyKeep+5, count(t, pool, "SELECT max(attempt) FROM outbox_events"), "the newest are kept")
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE reason_class = 'attempts-exhausted'"))
	require.Equal(t, historyKeep-1, count(t, pool, "SELECT count(*) FROM outbox_events WHERE reason_class = 'users-unavailable'"))

	// Redrives start the attempts again; the history stays bounded all the same.
	o := NewOperator(asSender(t, pool), "test", 0)
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT id FROM outbox").Scan(&id))
	for range historyKeep + 5 {
		_, err := pool.Exec(context.Background(), "UPDATE outbox SET state = 'dead', dead_at = now(), reason_class = 'expired'")
		require.NoError(t, err)
		done, err := o.Redrive(context.Background(), id, ModeRetry, false)
		require.NoError(t, err)
		require.True(t, done.Changed)
	}
	require.LessOrEqual(t, count(t, pool, "SELECT count(*) FROM outbox_events"), historyKeep)
	require.Equal(t, historyKeep, count(t, pool, "SELECT count(*) FROM outbox_events WHERE kind = 'redrive'"), "the newest are kept")
}

// TestPurgeKeepsDeadRows: delivered rows past the retention go, with their
// history; younger ones and every dead row stay.
func TestPurgeKeepsDeadRows(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	addStudents(t, pool, 6)
	_, err := pool.Exec(context.Background(), `
		UPDATE outbox SET state = CASE WHEN id % 3 = 0 THEN 'dead' ELSE 'delivered' END,
		       delivered_at = CASE WHEN id % 3 = 0 THEN NULL ELSE now() - interval '10 days' END,
		       dead_at = CASE WHEN id % 3 = 0 THEN now() - interval '10 days' END`)
	require.NoError(t, err)
	_, err = pool.Exec(context.Background(), "UPDATE outbox SET delivered_at = now() WHERE id = (SELECT min(id) FROM outbox WHERE state = 'delivered')")
	require.NoError(t, err)
	_, err = pool.Exec(context.Background(), `INSERT INTO outbox_events (outbox_id, kind, attempt, outcome, actor, idempotency_key)
		SELECT id, 'attempt', 1, state, 'test', idempotency_key FROM outbox`)
	require.NoError(t, err)
	s := New(quiet, asSender(t, pool), Config{DeliveredRetention: 7 * 24 * time.Hour})
	n, err := s.PurgeDelivered(context.Background(), 1)
	require.NoError(t, err)
	require.EqualValues(t, 3, n, "one batch at a time until none is left")
	require.Equal(t, 2, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead'"))
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'delivered'"))
	require.Equal(t, 3, count(t, pool, "SELECT count(*) FROM outbox_events"), "history goes with its row")
}

// TestDeadCommands runs "outbox-sender dead ..." as a person would inside
// the container.
func TestDeadCommands(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t, migrations.Student)
	pool := pgtest.Connect(t, dbURL)
	addStudents(t, pool, 1)
	_, err := pool.Exec(context.Background(), "UPDATE outbox SET state = 'dead', dead_at = now(), reason_class = 'refused', last_error = 'Users answered 409 Document number already in use'")
	require.NoError(t, err)
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT id FROM outbox").Scan(&id))
	env := apitest.Env("SENDER_DATABASE_URL", pgtest.RoleURL(t, dbURL, migrations.OutboxSender))
	cli := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := Run(context.Background(), append([]string{"dead"}, args...), env, &out)
		return out.String(), err
	}

	out, err := cli("list")
	require.NoError(t, err)
	require.Contains(t, out, "REASON")
	require.Contains(t, out, fmt.Sprintf("%d  ", id))
	require.Contains(t, out, "refused")

	out, err = cli("show", strconv.FormatInt(id, 10))
	require.NoError(t, err)
	require.Contains(t, out, `"state": "dead"`)

	_, err = cli("redrive", strconv.FormatInt(id, 10))
	require.ErrorContains(t, err, "mode")
	out, err = cli("redrive", strconv.FormatInt(id, 10), "--mode", "retry")
	require.NoError(t, err)
	require.Contains(t, out, `"changed": true`)
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'pending'"))
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox_events WHERE kind = 'redrive' AND actor LIKE 'cli@%'"))

	out, err = cli("redrive-all", "--mode", "retry", "--dry-run")
	require.NoError(t, err)
	require.Contains(t, out, `"matched": 0`)

	_, err = cli("bury")
	require.ErrorContains(t, err, "usage")
	require.ErrorContains(t, err, "redrive-all")
}
