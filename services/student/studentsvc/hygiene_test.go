package studentsvc

import (
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/testkit/contract"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestHTTPHygiene runs the Limits table of docs/operating.md against Student on a real
// database: every refused input gets its answer, and writes nothing.
func TestHTTPHygiene(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, migrations.Student)
	h := newTestServer(slog.New(slog.DiscardHandler), pool, Config{KeyWait: time.Second, DatabaseTimeout: 10 * time.Second}).Routes()
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	short := httptest.NewUnstartedServer(h)
	short.Config = httpapi.NewServer(h)
	short.Config.ReadTimeout = 500 * time.Millisecond
	short.Start()
	t.Cleanup(short.Close)
	e := env{url: ts.URL, pool: pool}
	contract.Hygiene(t, contract.HygieneTarget{
		Target: contract.Target{
			URL: ts.URL + "/students", DB: pool, Token: clientToken, Caller: "client",
			Created: func(t *testing.T) int {
				n := e.count(t, "students")
				require.Equal(t, n, e.count(t, "outbox"), "one outbox row per student")
				return n
			},
		},
		ShortReadURL: short.URL + "/students",
		ItemURL:      ts.URL + "/students/",
	})
	require.Equal(t, 1, e.count(t, "inbox"), "only the accepted request's key is stored")
}
