package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestBoundClaimsAndRecords runs the bound's claim and recording, with the
// statements loaded from db/queries, on a real Student database: a column
// added to ClaimDue's answer, or a change in LinkStudents', fails here, in
// make test, rather than only when someone runs make bench.
func TestBoundClaimsAndRecords(t *testing.T) {
	t.Parallel()
	root, err := repoRoot()
	require.NoError(t, err)
	qs, err := loadQueries(root)
	require.NoError(t, err)
	b := &bench{q: qs}
	admin := pgtest.Pool(t, migrations.Student)
	pool := pgtest.As(t, admin, migrations.OutboxSender)
	ctx := context.Background()

	const n = 3
	for i := range n {
		_, err := admin.Exec(ctx, `
			WITH s AS (INSERT INTO students (id, name, email, document_number) VALUES ($1, 'S', 's@example.com', $2) RETURNING id)
			INSERT INTO outbox (idempotency_key, operation, student_id, payload) SELECT gen_random_uuid(), 'create-user', id, '{}' FROM s`,
			uuid.New(), fmt.Sprintf("BOUND-%d", i))
		require.NoError(t, err)
	}
	jobs := make(chan claimed, n)
	require.NoError(t, b.claimAll(ctx, pool, jobs))
	close(jobs)
	var batch []answered
	for c := range jobs {
		batch = append(batch, answered{claimed: c, userID: uuid.New()})
	}
	require.Len(t, batch, n)
	require.NoError(t, b.record(ctx, pool, batch))
	require.Equal(t, n, apitest.Count(t, admin, "SELECT count(*) FROM outbox WHERE state = 'delivered'"))
	require.Equal(t, n, apitest.Count(t, admin, "SELECT count(*) FROM students WHERE user_id IS NOT NULL"))
	require.Equal(t, n, apitest.Count(t, admin, "SELECT count(*) FROM outbox_events"))
}
