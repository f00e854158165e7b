package inbox_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestDoKnown runs DoKnown's branches against Users' database, as its app
// role: the key with its answer and the operation's statement commit
// together; a key already used runs nothing; a holder that rolls back
// while DoKnown waits leaves the key to it; an operation's failure, or its
// wait past the lock timeout, stores nothing, the key included.
func TestDoKnown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t, migrations.Users)
	admin := pgtest.Connect(t, dbURL)
	ib := inbox.New(pgtest.ConnectAs(t, dbURL, migrations.UsersApp))
	ib.LockTimeout = 300 * time.Millisecond
	req := inbox.Request{"name": "Ada"}
	key := func(v string) inbox.Key { return inbox.Key{Caller: "outbox-sender", Value: v} }
	addUser := func(doc string) (inbox.Outcome, []*pgx.QueuedQuery) {
		id := uuid.New()
		b := &pgx.Batch{}
		b.Queue("INSERT INTO users (id, name, email, document_number) VALUES ($1, 'Ada', 'ada@example.com', $2)", id, doc)
		return inbox.Outcome{Status: http.StatusCreated, Body: []byte(`{"userId":"` + id.String() + `"}`), ResourceID: id}, b.QueuedQueries
	}
	users := func(doc string) int {
		return apitest.Count(t, admin, "SELECT count(*) FROM users WHERE document_number = '"+doc+"'")
	}
	stored := func(k string) int {
		return apitest.Count(t, admin, "SELECT count(*) FROM inbox WHERE idempotency_key = '"+k+"'")
	}
	hold := func(sql string) pgx.Tx {
		tx, err := admin.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		_, err = tx.Exec(ctx, sql)
		require.NoError(t, err)
		return tx
	}

	out, effect := addUser("1")
	require.NoError(t, ib.DoKnown(ctx, key("k1"), req, out, effect))
	require.Equal(t, 1, users("1"))
	require.Equal(t, 1, apitest.Count(t, admin, "SELECT count(*) FROM inbox WHERE idempotency_key = 'k1' AND status_code = 201 AND resource_id = '"+out.ResourceID.String()+"'"),
		"the key was stored with its answer")

	_, effect = addUser("2")
	require.ErrorIs(t, ib.DoKnown(ctx, key("k1"), req, out, effect), inbox.ErrKeyUsed)
	require.Equal(t, 0, users("2"), "nothing ran after the key's insert failed")

	// endLater ends tx after a moment, while DoKnown waits for it; the
	// returned wait is for the end itself.
	endLater := func(tx pgx.Tx, end func(pgx.Tx, context.Context) error) (wait func()) {
		done := make(chan error, 1)
		time.AfterFunc(100*time.Millisecond, func() { done <- end(tx, ctx) })
		return func() { require.NoError(t, <-done) }
	}
	wait := endLater(hold(`INSERT INTO inbox (caller, idempotency_key, request_hash, request) VALUES ('outbox-sender', 'k3', '\x00', '{}')`), pgx.Tx.Rollback)
	out, effect = addUser("3")
	require.NoError(t, ib.DoKnown(ctx, key("k3"), req, out, effect), "the holder rolled back while DoKnown waited")
	wait()
	require.Equal(t, 1, users("3"))

	wait = endLater(hold(`INSERT INTO inbox (caller, idempotency_key, request_hash, request) VALUES ('outbox-sender', 'k4', '\x00', '{}')`), pgx.Tx.Commit)
	_, effect = addUser("4")
	require.ErrorIs(t, ib.DoKnown(ctx, key("k4"), req, out, effect), inbox.ErrKeyUsed, "the holder committed while DoKnown waited")
	wait()
	require.Equal(t, 0, users("4"))

	hold(`INSERT INTO inbox (caller, idempotency_key, request_hash, request) VALUES ('outbox-sender', 'k5', '\x00', '{}')`)
	_, effect = addUser("5")
	require.ErrorIs(t, ib.DoKnown(ctx, key("k5"), req, out, effect), inbox.ErrKeyInProgress)
	require.Equal(t, 0, users("5"))

	_, effect = addUser("1") // the document number k1's user holds
	err := ib.DoKnown(ctx, key("k6"), req, out, effect)
	require.Error(t, err)
	require.NotErrorIs(t, err, inbox.ErrKeyUsed)
	require.Equal(t, 0, stored("k6"), "the operation's failure rolled the key back")

	hold("INSERT INTO users (id, name, email, document_number) VALUES (gen_random_uuid(), 'X', 'x@example.com', '7')")
	_, effect = addUser("7")
	require.ErrorIs(t, ib.DoKnown(ctx, key("k7"), req, out, effect), inbox.ErrConflictInProgress)
	require.Equal(t, 0, stored("k7"), "a wait past the lock timeout stores nothing")
}
