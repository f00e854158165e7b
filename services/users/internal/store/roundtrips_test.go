package store

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/internal/person"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestRoundTrips counts what a delivery sends to the database: each Exec,
// Query, QueryRow and batch is one round trip, and a request waits for every
// one of them, so a statement added to the path shows here. A first
// delivery: BEGIN with its lock timeout and the key's claim (one batch), the
// user, the stored outcome, COMMIT. A replay reads the stored answer and
// counts the replay instead.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trips := pgtest.TracedPool(t, pgtest.URL(t, migrations.Users), migrations.UsersApp)
	s := New(pool, time.Second, 5*time.Second)
	answer := func(u User, err error) (inbox.Outcome, error) {
		switch {
		case errors.Is(err, ErrDocumentTaken):
			return inbox.Outcome{Status: http.StatusConflict, Body: []byte(`{}`)}, nil
		case err != nil:
			return inbox.Outcome{}, err
		}
		return inbox.Outcome{Status: http.StatusCreated, Body: []byte(`{}`), ResourceID: u.ID}, nil
	}
	deliver := func(key, doc string) []string {
		t.Helper()
		trips.Take()
		_, _, err := s.CreateUser(ctx, inbox.Key{Caller: "outbox-sender", Value: key},
			person.Person{Name: "Ada", Email: "ada@example.com", DocumentNumber: doc}, answer)
		require.NoError(t, err)
		return trips.Take()
	}

	require.Len(t, deliver("k1", "111-1"), 4, "first delivery")
	require.Len(t, deliver("k1", "111-1"), 4, "replay")
	require.Len(t, deliver("k2", "111-1"), 4, "first delivery, document number taken")
}
