package store

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/internal/outboxwake"
	"github.com/outboxref/outboxref/internal/person"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestNewRowsWakeTheSender: a committed student wakes the sender; a
// refusal and a replay under a key wrote no outbox row and do not.
// (Without a key the wake-up rides with COMMIT before the answer is known,
// so a taken document number wakes the sender for a claim that finds
// nothing: createOnce.)
func TestNewRowsWakeTheSender(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t, migrations.Student)
	s := New(pgtest.ConnectAs(t, url, migrations.StudentApp), time.Second, 5*time.Second)
	apitest.Start(t, func(ctx context.Context) error {
		s.Wake.Run(ctx, slog.New(slog.DiscardHandler))
		return nil
	})

	listener := pgtest.Listen(t, url, migrations.OutboxSender, outboxwake.Channel)

	answer := func(st Student, err error) (inbox.Outcome, error) {
		if errors.Is(err, ErrDocumentTaken) {
			return inbox.Outcome{Status: http.StatusConflict, Body: []byte(`{}`)}, nil
		}
		return inbox.Outcome{Status: http.StatusCreated, Body: []byte(`{}`), ResourceID: st.ID}, err
	}
	create := func(key, doc string) {
		t.Helper()
		_, _, err := s.CreateStudent(ctx, "client", key, person.Person{Name: "Ada", Email: "ada@example.com", DocumentNumber: doc}, answer)
		require.NoError(t, err)
	}

	create("k1", "111-1")
	require.Positive(t, listener.Count(500*time.Millisecond), "a new student wakes the sender")
	create("k1", "111-1")
	require.True(t, listener.Quiet(500*time.Millisecond), "a replay wrote nothing")
	create("k2", "111-1")
	require.True(t, listener.Quiet(500*time.Millisecond), "a taken document number wrote nothing")
}
