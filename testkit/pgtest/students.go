package pgtest

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/outbox"
)

// AddStudents writes n students and their create-user outbox rows into a
// Student database, as Student's transaction does (without going through
// Student), and returns the students' ids. Each has a document number of
// its own, and its row a fresh idempotency key.
func AddStudents(t testing.TB, pool *pgxpool.Pool, n int) []uuid.UUID {
	t.Helper()
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.New()
		payload := fmt.Sprintf(`{"name":"S %d","email":"s%d@example.com","document_number":"doc-%s"}`, i, i, ids[i])
		_, err := pool.Exec(context.Background(), `
			WITH s AS (INSERT INTO students (id, name, email, document_number) VALUES ($1, 'S', 's@example.com', $2) RETURNING id)
			INSERT INTO outbox (idempotency_key, operation, student_id, payload) SELECT gen_random_uuid(), $3, id, $4 FROM s`,
			ids[i], "doc-"+ids[i].String(), outbox.OperationCreateUser, payload)
		require.NoError(t, err)
	}
	return ids
}
