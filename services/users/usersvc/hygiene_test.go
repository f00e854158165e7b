package usersvc

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/testkit/contract"
)

// TestHTTPHygiene runs the Limits table of docs/operating.md against Users on a real
// database: every refused input gets its answer, and writes nothing.
func TestHTTPHygiene(t *testing.T) {
	t.Parallel()
	e := newEnv(t, Config{})
	h := e.srv.Routes()
	short := httptest.NewUnstartedServer(h)
	short.Config = httpapi.NewServer(h)
	short.Config.ReadTimeout = 500 * time.Millisecond
	short.Start()
	t.Cleanup(short.Close)
	contract.Hygiene(t, contract.HygieneTarget{
		Target: contract.Target{
			URL: e.url + "/users", DB: e.pool, Token: senderToken, Caller: "outbox-sender",
			Created: func(t *testing.T) int { return e.count(t, "users") },
		},
		ShortReadURL: short.URL + "/users",
		ItemURL:      e.url + "/users/",
	})
	require.Equal(t, 1, e.count(t, "inbox"), "only the accepted request's key is stored")
}
