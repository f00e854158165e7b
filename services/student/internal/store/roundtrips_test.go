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

// TestRoundTrips counts what each kind of intake sends to the database: each
// Exec, Query, QueryRow and batch is one round trip, and a request waits
// for every one of them, so a statement added to the path shows here.
// Without a key: BEGIN with its lock timeout, the student and its outbox
// row (one statement) and COMMIT, in one batch. With a key, the claim rides in
// BEGIN's batch, the student follows, and the outcome is stored in COMMIT's
// batch; a replay reads the stored answer and counts the replay instead.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, trips := pgtest.TracedPool(t, pgtest.URL(t, migrations.Student), migrations.StudentApp)
	s := New(pool, time.Second, 5*time.Second)
	answer := func(st Student, err error) (inbox.Outcome, error) {
		switch {
		case errors.Is(err, ErrDocumentTaken):
			return inbox.Outcome{Status: http.StatusConflict, Body: []byte(`{}`)}, nil
		case err != nil:
			return inbox.Outcome{}, err
		}
		return inbox.Outcome{Status: http.StatusCreated, Body: []byte(`{}`), ResourceID: st.ID}, nil
	}
	intake := func(key, doc string) []string {
		t.Helper()
		trips.Take()
		_, _, err := s.CreateStudent(ctx, "client", key, person.Person{Name: "Ada", Email: "ada@example.com", DocumentNumber: doc}, answer)
		require.NoError(t, err)
		return trips.Take()
	}

	require.Len(t, intake("", "111-1"), 1, "without a key")
	require.Len(t, intake("k1", "222-2"), 3, "with a key, first request")
	require.Len(t, intake("k1", "222-2"), 3, "with a key, replay")
	require.Len(t, intake("", "111-1"), 1, "document number taken")
}
