package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestOutboxNotifies: Student's database notifies 'outbox_due' (the
// sender's wake-up) once per committed INSERT statement into the outbox
// and for every redrive, and never for a rolled-back insert or for the
// sender's own claims and records, which would wake it in a loop.
func TestOutboxNotifies(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := pgtest.URL(t, migrations.Student)
	app := pgtest.ConnectAs(t, url, migrations.StudentApp)
	sender := pgtest.ConnectAs(t, url, migrations.OutboxSender)

	listener, err := pgx.Connect(ctx, pgtest.RoleURL(t, url, migrations.OutboxSender))
	require.NoError(t, err)
	defer listener.Close(context.Background())
	_, err = listener.Exec(ctx, "LISTEN outbox_due")
	require.NoError(t, err)
	// notifications counts what arrives within a moment.
	notifications := func() int {
		n := 0
		for {
			wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err := listener.WaitForNotification(wctx)
			wcancel()
			if err != nil {
				return n
			}
			n++
		}
	}

	insert := `
		WITH s AS (
			INSERT INTO students (id, name, email, document_number)
			SELECT gen_random_uuid(), 'S', 's@example.com', 'doc-' || gen_random_uuid() FROM generate_series(1, 3)
			RETURNING id)
		INSERT INTO outbox (idempotency_key, operation, student_id, payload)
		SELECT gen_random_uuid(), 'create-user', id, '{}' FROM s`
	_, err = app.Exec(ctx, insert)
	require.NoError(t, err)
	require.Equal(t, 1, notifications(), "one notification for a statement of three rows")

	tx, err := app.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, insert)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 0, notifications(), "none for a rolled-back insert")

	_, err = sender.Exec(ctx, `UPDATE outbox SET attempts = attempts + 1, available_at = now() + interval '1 minute'`)
	require.NoError(t, err)
	_, err = sender.Exec(ctx, `UPDATE outbox SET state = 'dead', dead_at = now()`)
	require.NoError(t, err)
	require.Equal(t, 0, notifications(), "none for claims, records or dead-letters")

	_, err = sender.Exec(ctx, `UPDATE outbox SET state = 'pending', available_at = now()`)
	require.NoError(t, err)
	require.Equal(t, 1, notifications(), "a redrive notifies, once per transaction")
}
