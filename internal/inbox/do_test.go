package inbox_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestDo runs inbox.Do's cases against Users' database, as Users' app role:
// each case may first do something with the same key (before), then calls
// Do once and checks what it answered and what the database holds after.
func TestDo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t, migrations.Users)
	admin := pgtest.Connect(t, dbURL)
	app := pgtest.ConnectAs(t, dbURL, migrations.UsersApp)
	// A short lock timeout, for the cases whose wait runs out; the cases
	// whose holder ends while Do waits use the default, far longer than
	// the end takes on a loaded machine.
	ib := inbox.New(app)
	ib.LockTimeout = 300 * time.Millisecond
	patient := inbox.New(app)

	ada := inbox.Request{"name": "Ada", "document_number": "D1"}
	// createUser is an operation that creates a user with document number
	// doc, and answers 201 with the user's id.
	createUser := func(doc string) inbox.Op {
		id := uuid.New()
		b := &pgx.Batch{}
		b.Queue("INSERT INTO users (id, name, email, document_number) VALUES ($1, 'Ada', 'ada@example.com', $2)", id, doc)
		return inbox.Op{Outcome: inbox.Outcome{Status: http.StatusCreated, Body: []byte(`{"userId":"` + id.String() + `"}`), ResourceID: id}, Effect: b}
	}
	refusal := inbox.Op{Outcome: inbox.Outcome{Status: http.StatusConflict, Body: []byte(`{"type":"document-taken"}`)}}
	users := func(doc string) int {
		return apitest.Count(t, admin, "SELECT count(*) FROM users WHERE document_number = $1", doc)
	}
	stored := func(key string) int {
		return apitest.Count(t, admin, "SELECT count(*) FROM inbox WHERE idempotency_key = $1", key)
	}
	// hold runs sql in a transaction of the administrator's that stays
	// open until end (nil: until the test ends) is called on it, once Do
	// waits for its lock (or after 30s, if Do never does).
	hold := func(sql string, end func(pgx.Tx, context.Context) error) {
		tx, err := admin.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		_, err = tx.Exec(ctx, sql)
		require.NoError(t, err)
		if end != nil {
			ended := make(chan struct{})
			go func() {
				defer close(ended)
				for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
					var waiting bool
					err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
						WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting)
					if err == nil && waiting {
						break
					}
				}
				_ = end(tx, ctx)
			}()
			// Cleanups run last first: the end is over before the rollback.
			t.Cleanup(func() { <-ended })
		}
	}
	holdKey := func(key string, end func(pgx.Tx, context.Context) error) {
		hold(`INSERT INTO inbox (caller, idempotency_key, request_hash, request, status_code, response_body)
			VALUES ('outbox-sender', '`+key+`', '\x00', '{"name":"Grace"}', 201, '{}')`, end)
	}

	for _, tc := range []struct {
		name     string
		before   func(key string) // nil for nothing
		patient  bool             // Do waits with the default lock timeout
		req      inbox.Request
		op       func(doc string) inbox.Op
		replayed bool
		status   int   // the answer's, when err is nil
		err      error // errors.Is, or the *MismatchError's fields below
		fields   []string
		users    int // users with the case's document number after
		keys     int // rows of the case's key after
	}{
		{name: "a new key runs the operation and stores its answer", req: ada, op: createUser,
			status: http.StatusCreated, users: 1, keys: 1},
		{name: "a repeat gets the stored answer and runs nothing",
			before: func(key string) { do(t, ib, key, ada, createUser(key)) },
			req:    ada, op: createUser, replayed: true, status: http.StatusCreated, users: 1, keys: 1},
		{name: "a key reused with another request names the differing fields",
			before: func(key string) { do(t, ib, key, ada, createUser(key)) },
			req:    inbox.Request{"name": "Grace", "document_number": "D1"}, op: createUser,
			fields: []string{"name"}, users: 1, keys: 1},
		{name: "a stored business refusal is replayed, even once the number is free",
			before: func(key string) { do(t, ib, key, ada, refusal) },
			req:    ada, op: createUser, replayed: true, status: http.StatusConflict, users: 0, keys: 1},
		{name: "a key held past the lock timeout is in progress",
			before: func(key string) { holdKey(key, nil) },
			req:    ada, op: createUser, err: inbox.ErrKeyInProgress, users: 0, keys: 0},
		{name: "a holder that rolls back while Do waits leaves the key to it",
			before: func(key string) { holdKey(key, pgx.Tx.Rollback) }, patient: true,
			req: ada, op: createUser, status: http.StatusCreated, users: 1, keys: 1},
		{name: "a holder that commits while Do waits is replayed, or here mismatched",
			before: func(key string) { holdKey(key, pgx.Tx.Commit) }, patient: true,
			req: ada, op: createUser, fields: []string{"document_number", "name"}, users: 0, keys: 1},
		{name: "a conflicting lock held past the lock timeout stores nothing",
			before: func(key string) {
				hold("INSERT INTO users (id, name, email, document_number) VALUES (gen_random_uuid(), 'X', 'x@example.com', '"+key+"')", nil)
			},
			req: ada, op: createUser, err: inbox.ErrConflictInProgress, users: 0, keys: 0},
		{name: "a failed operation leaves no key",
			before: func(key string) {
				_, err := admin.Exec(ctx, "INSERT INTO users (id, name, email, document_number) VALUES (gen_random_uuid(), 'X', 'x@example.com', $1)", key)
				require.NoError(t, err)
			},
			req: ada, op: createUser, err: errAny, users: 1, keys: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := uuid.NewString() // the case's key, and its document number
			if tc.before != nil {
				tc.before(key)
			}
			in := ib
			if tc.patient {
				in = patient
			}
			out, replayed, err := in.Do(ctx, inbox.Key{Caller: "outbox-sender", Value: key}, tc.req, tc.op(key))
			var mismatch *inbox.MismatchError
			switch {
			case tc.fields != nil:
				require.ErrorAs(t, err, &mismatch)
				require.Equal(t, tc.fields, mismatch.Fields)
			case errors.Is(tc.err, errAny):
				require.Error(t, err)
				require.NotErrorIs(t, err, inbox.ErrKeyInProgress)
				require.NotErrorIs(t, err, inbox.ErrConflictInProgress)
			case tc.err != nil:
				require.ErrorIs(t, err, tc.err)
			default:
				require.NoError(t, err)
				require.Equal(t, tc.status, out.Status)
				require.Equal(t, tc.replayed, replayed)
			}
			require.Equal(t, tc.users, users(key), "users with the case's document number")
			require.Equal(t, tc.keys, stored(key), "rows of the case's key")
		})
	}
}

// TestDoRefusesCallbacks: an operation's statement with a callback is
// refused before anything is sent, since Do reads no statement's rows and
// its error would be lost.
func TestDoRefusesCallbacks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t, migrations.Users)
	admin := pgtest.Connect(t, dbURL)
	ib := inbox.New(pgtest.ConnectAs(t, dbURL, migrations.UsersApp))
	b := &pgx.Batch{}
	b.Queue("SELECT 1").Exec(func(pgconn.CommandTag) error { return nil })
	_, _, err := ib.Do(ctx, inbox.Key{Caller: "outbox-sender", Value: "k"}, inbox.Request{"a": "b"}, inbox.Op{Outcome: inbox.Outcome{Status: 201}, Effect: b})
	require.ErrorContains(t, err, "callbacks")
	require.Zero(t, apitest.Count(t, admin, "SELECT count(*) FROM inbox"))
}

// errAny: the case expects an error that is neither of the inbox's own.
var errAny = errors.New("any error")

// do runs op under key and requires that it succeeded.
func do(t *testing.T, ib *inbox.Inbox, key string, req inbox.Request, op inbox.Op) {
	t.Helper()
	_, _, err := ib.Do(context.Background(), inbox.Key{Caller: "outbox-sender", Value: key}, req, op)
	require.NoError(t, err)
}
