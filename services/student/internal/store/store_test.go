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
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestCreateStudent runs the create-student operation's cases in order
// against Student's database, as Student's app role, with and without a
// client's key: a new student, a replay, a document number already taken
// (refused; with a key, the refusal stored), and that refusal's replay.
// Each case also counts the round trips it cost (each Exec, Query, QueryRow
// and batch is one, and the request waits for each): without a key, the
// one statement that writes the student and its outbox row; with one, a
// batch of the key with its answer and that statement; a replay's batch
// fails on the key, then the stored answer is read and the replay counted.
func TestCreateStudent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t, migrations.Student)
	pool, trips := pgtest.TracedPool(t, dbURL, migrations.StudentApp)
	admin := pgtest.Connect(t, dbURL)
	s := New(pool, time.Second, 5*time.Second)
	answer := func(st Student, err error) (inbox.Outcome, error) {
		switch {
		case errors.Is(err, ErrDocumentTaken):
			return inbox.Outcome{Status: http.StatusConflict, Body: []byte(`{}`)}, nil
		case err != nil:
			return inbox.Outcome{}, err
		}
		return inbox.Outcome{Status: http.StatusCreated, Body: []byte(st.CreatedAt.Format(time.RFC3339Nano)), ResourceID: st.ID}, nil
	}
	for _, tc := range []struct {
		name, key, doc string
		status         int
		replayed       bool
		trips          int
	}{
		{name: "without a key", doc: "111-1", status: http.StatusCreated, trips: 1},
		{name: "without a key, document number taken", doc: "111-1", status: http.StatusConflict, trips: 1},
		{name: "with a key", key: "k1", doc: "222-2", status: http.StatusCreated, trips: 1},
		{name: "with a key, replay", key: "k1", doc: "222-2", status: http.StatusCreated, replayed: true, trips: 1 + 2},
		{name: "with a key, document number taken", key: "k2", doc: "222-2", status: http.StatusConflict, trips: 1 + 1},
		{name: "with a key, replay of the refusal", key: "k2", doc: "222-2", status: http.StatusConflict, replayed: true, trips: 1 + 2},
	} {
		trips.Take()
		out, replayed, err := s.CreateStudent(ctx, "client", tc.key, person.Person{Name: "Ada", Email: "ada@example.com", DocumentNumber: tc.doc}, answer)
		require.NoError(t, err, tc.name)
		require.Len(t, trips.Take(), tc.trips, "%s: round trips", tc.name)
		require.Equal(t, tc.status, out.Status, tc.name)
		require.Equal(t, tc.replayed, replayed, tc.name)
		if out.Status == http.StatusCreated {
			require.Equal(t, 1, apitest.Count(t, admin, "SELECT count(*) FROM students s JOIN outbox o ON o.student_id = s.id WHERE s.id = $1 AND s.created_at = $2",
				out.ResourceID, string(out.Body)), "%s: the student and its outbox row, as the answer says", tc.name)
		}
	}
	require.Equal(t, 2, apitest.Count(t, admin, "SELECT count(*) FROM students"))
	require.Equal(t, 2, apitest.Count(t, admin, "SELECT count(*) FROM outbox"))
	require.Equal(t, 1, apitest.Count(t, admin, "SELECT count(*) FROM inbox WHERE idempotency_key = 'k2' AND status_code = 409 AND replays = 1"))
}
