package usersvc

import (
	"testing"

	"github.com/outboxref/outboxref/testkit/contract"
)

// TestIdempotencyContract is the README's contract table for POST /users.
func TestIdempotencyContract(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{})
	contract.Run(t, contract.Target{
		URL: e.url + "/users", KeyRequired: true,
		Created: func(t *testing.T) int { return e.count(t, "users") },
	})
}
