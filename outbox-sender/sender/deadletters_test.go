package sender

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/outbox-sender/deadletter"
	"github.com/outboxref/outboxref/outbox-sender/internal/store"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// These tests follow dead letters through the running relay: how a row
// dies, what the operator sees of it, and what a redrive does next.

// adminAPI serves the relay's admin port, as Run does, to requests sent
// as the operator "test-admin".
func adminAPI(t *testing.T, pool *pgxpool.Pool, r *Relay) string {
	t.Helper()
	ts := httptest.NewServer(apitest.WithToken(adminRouter(quiet, asSender(t, pool), r), adminToken))
	t.Cleanup(ts.Close)
	return ts.URL
}

// operator is an Operator on pool's database, logged in as the sender.
func operator(t *testing.T, pool *pgxpool.Pool) *deadletter.Operator {
	t.Helper()
	return deadletter.New(asSender(t, pool), "test-admin", 0)
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
	require.InDelta(t, 1, r.metric(t, "outbox_sender_dead_letters_total", "reason_class", outbox.ReasonRefused), 0, "the dead-letter metric counts it by reason")
	admin := adminAPI(t, pool, r.Relay)
	id := outboxID(t, pool, refused())

	res := apitest.Do(t, http.MethodGet, admin+"/outbox?state=dead&reason_class=refused", "")
	require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
	var page deadletter.RowPage
	res.JSON(t, &page)
	require.Len(t, page.Items, 1)
	require.Equal(t, id, page.Items[0].ID)
	require.Equal(t, outbox.ReasonRefused, *page.Items[0].ReasonClass)
	require.Contains(t, *page.Items[0].LastError, "Document number already in use")
	require.Nil(t, page.NextCursor)

	res = apitest.Do(t, http.MethodGet, admin+"/outbox?state=dead&reason_class=expired", "")
	res.JSON(t, &page)
	require.Empty(t, page.Items, "the reason filter filters")

	res = apitest.Do(t, http.MethodGet, fmt.Sprintf("%s/outbox/%d", admin, id), "")
	require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
	var row deadletter.Row
	res.JSON(t, &row)
	require.Equal(t, "dead", row.State)
	require.NotEmpty(t, row.Student.Name)
	require.Len(t, row.History, 1)
	ev := row.History[0]
	require.Equal(t, "attempt", ev.Kind)
	require.Equal(t, 1, ev.Attempt)
	require.Equal(t, "dead", ev.Outcome)
	require.Equal(t, outbox.ReasonRefused, *ev.ReasonClass)
	require.Equal(t, "test-sender", ev.Actor)
	require.Equal(t, refused(), ev.IdempotencyKey.String())
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
	done, err := operator(t, pool).Redrive(context.Background(), id, outbox.RedriveRetry, false)
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
	cfg.MaxAttempts = store.HistoryKeep + 5
	r := run(t, pool, cfg)
	eventually(t, "dead after its attempts", func() bool { return count(t, pool, "SELECT count(*) FROM outbox WHERE state = 'dead'") == 1 })
	r.wait(t) // the redrives below must not race the sender's attempts
	require.Equal(t, store.HistoryKeep, count(t, pool, "SELECT count(*) FROM outbox_events"))
	require.Equal(t, store.HistoryKeep+5, count(t, pool, "SELECT max(attempt) FROM outbox_events"), "the newest are kept")
	require.Equal(t, 1, count(t, pool, "SELECT count(*) FROM outbox WHERE reason_class = 'attempts-exhausted'"))
	require.Equal(t, store.HistoryKeep-1, count(t, pool, "SELECT count(*) FROM outbox_events WHERE reason_class = 'users-unavailable'"))

	// Redrives start the attempts again; the history stays bounded all the same.
	o := operator(t, pool)
	o.MaxRedrives = store.HistoryKeep + 5
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT id FROM outbox").Scan(&id))
	for range store.HistoryKeep + 5 {
		_, err := pool.Exec(context.Background(), "UPDATE outbox SET state = 'dead', dead_at = now(), reason_class = 'expired'")
		require.NoError(t, err)
		done, err := o.Redrive(context.Background(), id, outbox.RedriveRetry, false)
		require.NoError(t, err)
		require.True(t, done.Changed)
	}
	require.LessOrEqual(t, count(t, pool, "SELECT count(*) FROM outbox_events"), store.HistoryKeep)
	require.Equal(t, store.HistoryKeep, count(t, pool, "SELECT count(*) FROM outbox_events WHERE kind = 'redrive'"), "the newest are kept")
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
