package usersvc

import (
	"testing"
	"time"

	"github.com/outboxref/outboxref/testkit/contract"
)

// TestIdempotencyContract is the contract table of docs/contract.md for POST /users.
func TestIdempotencyContract(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{KeyWait: 300 * time.Millisecond})
	contract.Run(t, contract.Target{
		URL: e.url + "/users", KeyRequired: true, DB: e.pool,
		Token: senderToken, Caller: "outbox-sender", OtherToken: otherToken,
		Created: func(t *testing.T) int { return e.count(t, "users") },
	})
}
