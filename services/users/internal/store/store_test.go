package store

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/internal/person"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestCreateUser runs the create-user operation's cases in order against
// Users' database, as Users' app role: a new key, its replay, a document
// number already taken (refused, and the refusal stored), that refusal's
// replay, and a key reused with another request. Each case also counts the
// round trips it cost (each Exec, Query, QueryRow and batch is one, and the
// request waits for each): a new key is one batch, the key with its answer
// and the user in one implicit transaction; a replay's batch fails on the
// key, then the stored answer is read and the replay counted; a refusal's
// batch fails on the user, then the refusal is stored with the key.
func TestCreateUser(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t, migrations.Users)
	pool, trips := pgtest.TracedPool(t, dbURL, migrations.UsersApp)
	admin := pgtest.Connect(t, dbURL)
	s := New(pool, time.Second, 5*time.Second)
	answer := func(id uuid.UUID, err error) (inbox.Outcome, error) {
		switch {
		case errors.Is(err, ErrDocumentTaken):
			return inbox.Outcome{Status: http.StatusConflict, Body: []byte(`{}`)}, nil
		case err != nil:
			return inbox.Outcome{}, err
		}
		return inbox.Outcome{Status: http.StatusCreated, Body: []byte(`{}`), ResourceID: id}, nil
	}
	var firstUser uuid.UUID
	for _, tc := range []struct {
		name, key, name2, doc string
		status                int
		replayed              bool
		mismatch              []string
		trips                 int
	}{
		{name: "new key", key: "k1", name2: "Ada", doc: "111-1", status: http.StatusCreated, trips: 1},
		{name: "replay", key: "k1", name2: "Ada", doc: "111-1", status: http.StatusCreated, replayed: true, trips: 1 + 2},
		{name: "document number taken", key: "k2", name2: "Ada", doc: "111-1", status: http.StatusConflict, trips: 1 + 1},
		{name: "replay of the refusal", key: "k2", name2: "Ada", doc: "111-1", status: http.StatusConflict, replayed: true, trips: 1 + 2},
		{name: "key reused with another request", key: "k1", name2: "Grace", doc: "111-1", mismatch: []string{"name"}, trips: 1 + 1},
	} {
		trips.Take()
		out, replayed, err := s.CreateUser(ctx, inbox.Key{Caller: "outbox-sender", Value: tc.key},
			person.Person{Name: tc.name2, Email: "ada@example.com", DocumentNumber: tc.doc}, answer)
		require.Len(t, trips.Take(), tc.trips, "%s: round trips", tc.name)
		if tc.mismatch != nil {
			var mismatch *inbox.MismatchError
			require.ErrorAs(t, err, &mismatch, tc.name)
			require.Equal(t, tc.mismatch, mismatch.Fields, tc.name)
			continue
		}
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.status, out.Status, tc.name)
		require.Equal(t, tc.replayed, replayed, tc.name)
		if tc.key == "k1" {
			if firstUser == uuid.Nil {
				firstUser = out.ResourceID
			}
			require.Equal(t, firstUser, out.ResourceID, "%s: the answer names the one user", tc.name)
		}
	}
	require.Equal(t, 1, apitest.Count(t, admin, "SELECT count(*) FROM users"), "one user, whatever was asked")
	require.Equal(t, 1, apitest.Count(t, admin, "SELECT count(*) FROM inbox WHERE idempotency_key = 'k2' AND status_code = 409 AND resource_id IS NULL AND replays = 1"),
		"the refusal is stored under its key, and was replayed once")
	require.Equal(t, 1, apitest.Count(t, admin, "SELECT count(*) FROM inbox i JOIN users u ON u.id = i.resource_id WHERE i.idempotency_key = 'k1' AND i.status_code = 201 AND i.replays = 1"),
		"the stored answer names the user it inserted")
}

// TestRoundTripsReplying: a command from the broker costs what a delivery
// over HTTP does, its answer row riding in the same batch; a replay writes the
// answer row alone afterwards (one more), which adds no row when the first
// delivery wrote it.
func TestRoundTripsReplying(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t, migrations.Users)
	pool, trips := pgtest.TracedPool(t, dbURL, migrations.UsersApp)
	admin := pgtest.Connect(t, dbURL)
	s := New(pool, time.Second, 5*time.Second)
	answer := func(id uuid.UUID, err error) (inbox.Outcome, error) {
		if errors.Is(err, ErrDocumentTaken) {
			return inbox.Outcome{Status: http.StatusConflict, Body: []byte(`{}`)}, nil
		}
		return inbox.Outcome{Status: http.StatusCreated, Body: []byte(`{"userId":"x"}`), ResourceID: id}, err
	}
	key := uuid.New()
	reply := Reply{
		MessageID: uuid.New(), Subject: "users.replies.create-user", Key: key,
		Payload: func(out inbox.Outcome) ([]byte, error) { return out.Body, nil },
	}
	deliver := func() (bool, []string) {
		t.Helper()
		trips.Take()
		_, replayed, err := s.CreateUserReplying(ctx, inbox.Key{Caller: "outbox-sender", Value: key.String()},
			person.Person{Name: "Ada", Email: "ada@example.com", DocumentNumber: "111-1"}, answer, reply)
		require.NoError(t, err)
		return replayed, trips.Take()
	}
	replayed, sent := deliver()
	require.False(t, replayed)
	require.Len(t, sent, 1, "first delivery")
	replayed, sent = deliver()
	require.True(t, replayed)
	require.Len(t, sent, 1+2+1, "the first try, the replay, then the answer row alone")
	require.Equal(t, 1, apitest.Count(t, admin, "SELECT count(*) FROM answers WHERE published_at IS NULL"))
	require.Equal(t, 1, apitest.Count(t, admin, "SELECT count(*) FROM users"))

	// The relay: BEGIN, the claim, the marks, COMMIT.
	trips.Take()
	claimed, published, err := s.RelayAnswers(ctx, 10, func(_ context.Context, as []Answer) ([]int64, error) {
		require.Len(t, as, 1)
		require.Equal(t, reply.MessageID, as[0].MessageID)
		require.JSONEq(t, `{"userId":"x"}`, string(as[0].Payload))
		return []int64{as[0].ID}, nil
	})
	require.NoError(t, err)
	require.Equal(t, 1, claimed)
	require.Equal(t, 1, published)
	require.Len(t, trips.Take(), 4)
	n, err := s.UnpublishedAnswers(ctx)
	require.NoError(t, err)
	require.Zero(t, n)

	// A publish that fails leaves the answer unpublished, and says so.
	require.NoError(t, s.RecordReply(ctx, Reply{MessageID: uuid.New(), Subject: "s", Key: key,
		Payload: func(inbox.Outcome) ([]byte, error) { return []byte(`{}`), nil }}, inbox.Outcome{}))
	_, published, err = s.RelayAnswers(ctx, 10, func(context.Context, []Answer) ([]int64, error) {
		return nil, errors.New("broker down")
	})
	require.ErrorIs(t, err, ErrPublish)
	require.Zero(t, published)
	require.Equal(t, 1, apitest.Count(t, admin, "SELECT count(*) FROM answers WHERE published_at IS NULL"))
}

// TestRelayMarksWhatASlowBrokerAcknowledged: a broker that acknowledges
// some answers and then keeps the relay waiting for the rest leaves the
// relay time to commit the marks of those it did acknowledge, so they are
// not published again.
func TestRelayMarksWhatASlowBrokerAcknowledged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t, migrations.Users)
	admin := pgtest.Connect(t, dbURL)
	// The wait for the broker takes half the transaction's 4s, and
	// leaves the other half for the marks: far more than they take, on a
	// loaded machine too.
	s := New(pgtest.ConnectAs(t, dbURL, migrations.UsersApp), time.Second, 4*time.Second)
	for range 2 {
		require.NoError(t, s.RecordReply(ctx, Reply{MessageID: uuid.New(), Subject: "s", Key: uuid.New(),
			Payload: func(inbox.Outcome) ([]byte, error) { return []byte(`{}`), nil }}, inbox.Outcome{}))
	}
	claimed, published, err := s.RelayAnswers(ctx, 10, func(ctx context.Context, as []Answer) ([]int64, error) {
		<-ctx.Done() // the second acknowledgement never comes
		return []int64{as[0].ID}, ctx.Err()
	})
	require.ErrorIs(t, err, ErrPublish)
	require.Equal(t, 2, claimed)
	require.Equal(t, 1, published)
	require.Equal(t, 1, apitest.Count(t, admin, "SELECT count(*) FROM answers WHERE published_at IS NULL"))
}

// TestParkedCommandsArePurged: a parked command is kept with its size,
// and forgotten once older than the retention, as Users' own role.
func TestParkedCommandsArePurged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t, migrations.Users)
	admin := pgtest.Connect(t, dbURL)
	s := New(pgtest.ConnectAs(t, dbURL, migrations.UsersApp), time.Second, 4*time.Second)
	for seq := range uint64(3) {
		require.NoError(t, s.Park(ctx, ParkedCommand{Stream: "USERS_COMMANDS", Sequence: seq + 1, Subject: "s",
			Headers: []byte(`{}`), Data: []byte("start"), Size: 1 << 20, Reason: "not JSON", Deliveries: 5}))
	}
	_, err := admin.Exec(ctx, "UPDATE parked_commands SET parked_at = now() - interval '31 days' WHERE stream_sequence <= 2")
	require.NoError(t, err)
	n, err := s.PurgeParked(ctx, 30*24*time.Hour, 1)
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "both old ones, a batch of one at a time")
	require.Equal(t, 1, apitest.Count(t, admin, "SELECT count(*) FROM parked_commands WHERE stream_sequence = 3 AND size = 1048576"))
}
