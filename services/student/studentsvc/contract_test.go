package studentsvc

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/testkit/contract"
)

// TestIdempotencyContract is the README's contract table for POST
// /students: every student created comes with its outbox row.
func TestIdempotencyContract(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	contract.Run(t, contract.Target{
		URL: e.url + "/students",
		Created: func(t *testing.T) int {
			students := e.count(t, "students")
			require.Equal(t, students, e.count(t, "outbox"), "one outbox row per student")
			return students
		},
	})
}
