package studentsvc

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/testkit/contract"
)

// TestIdempotencyContract is the contract table of docs/contract.md for POST
// /students: every student created comes with its outbox row.
func TestIdempotencyContract(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, Config{KeyWait: 300 * time.Millisecond, DatabaseTimeout: 10 * time.Second})
	contract.Run(t, contract.Target{
		URL: e.raw + "/students", DB: e.pool, Token: clientToken, Caller: "client", OtherToken: otherToken,
		Created: func(t *testing.T) int {
			students := e.count(t, "students")
			require.Equal(t, students, e.count(t, "outbox"), "one outbox row per student")
			return students
		},
	})
}
