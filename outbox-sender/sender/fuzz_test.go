package sender

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/outbox-sender/deadletter"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// FuzzSenderAdminAPI sends arbitrary requests through the sender's real
// admin router (Host check, operator tokens, the outbox routes, /metrics)
// on a real database. Whatever comes in: no 5xx, no panic, and the outbox
// changes only by a redrive the answer reports: a 200 to a redrive adds
// one history event per row it says it redrove, and any other answer
// leaves every outbox row as it was.
func FuzzSenderAdminAPI(f *testing.F) {
	const otherToken = "fuzz-other-operator-token-0123"
	ct := apitest.Lines("Content-Type", "application/json")
	seeds := []struct{ method, target, headers, body string }{
		// The operator's routes, as the runbook uses them.
		{"GET", "/outbox?state=dead", "", ""},
		{"GET", "/outbox?state=dead&reason_class=refused&limit=1", "", ""},
		{"GET", "/outbox?state=pending&since=2026-01-01T00:00:00Z&until=2100-01-01T00:00:00Z", "", ""},
		{"GET", "/outbox/1", "", ""},
		{"POST", "/outbox/1/redrive", ct, `{"mode":"retry"}`},
		{"POST", "/outbox/2/redrive", ct, `{"mode":"new-operation"}`},
		{"POST", "/outbox/3/redrive", ct, `{"mode":"new-operation","force":true}`},
		{"POST", "/outbox/redrive", ct, `{"mode":"retry","reason_class":"refused","max":2,"dry_run":true}`},
		{"POST", "/outbox/redrive", ct, `{"mode":"retry","dead_since":"2026-01-01T00:00:00Z","dead_until":"2100-01-01T00:00:00Z"}`},
		// Bad filters, ids, bodies and modes.
		{"GET", "/outbox", "", ""},
		{"GET", "/outbox?state=dead&limit=05", "", ""},
		{"GET", "/outbox?state=dead&cursor=%zz", "", ""},
		{"GET", "/outbox?state=dead&state=pending", "", ""},
		{"GET", "/outbox/007", "", ""},
		{"GET", "/outbox/+7", "", ""},
		{"GET", "/outbox/99999999999999999999", "", ""},
		{"POST", "/outbox/1/redrive", ct, `{"mode":"again"}`},
		{"POST", "/outbox/1/redrive", ct, `{"mode":"retry","mode":"retry"}`},
		{"POST", "/outbox/1/redrive", apitest.Lines("Content-Type", "text/plain"), `{"mode":"retry"}`},
		{"POST", "/outbox/1/redrive", ct, "{\"mode\":\"retry\xff\"}"},
		{"POST", "/outbox/redrive", ct, `{"mode":"retry","max":0}`},
		{"POST", "/outbox/redrive", ct, `{"mode":"retry","max":100000}`},
		{"PUT", "/outbox/redrive", ct, `{"mode":"retry"}`},
		{"DELETE", "/outbox/1", "", ""},
		// Credentials: none, unknown, malformed, repeated, another's.
		{"GET", "/outbox?state=dead", apitest.Lines("Authorization", "Bearer not-a-known-token-0000"), ""},
		{"POST", "/outbox/1/redrive", ct + apitest.Lines("Authorization", "Basic b3BzOm9wcw=="), `{"mode":"retry"}`},
		{"POST", "/outbox/1/redrive", ct + apitest.Lines("Authorization", "Bearer "+adminToken, "Authorization", "Bearer "+otherToken), `{"mode":"retry"}`},
		{"POST", "/outbox/4/redrive", ct + apitest.Lines("Authorization", "Bearer "+otherToken), `{"mode":"retry"}`},
		{"GET", "/outbox?state=dead", apitest.Lines("Authorization", "Bearer"), ""},
		// The open routes.
		{"GET", "/metrics", "", ""},
		{"GET", "/healthz", "", ""},
		{"GET", "/readyz", "", ""},
		{"HEAD", "/metrics", "", ""},
		{"GET", httpapi.TypeRedriveLimit, "", ""},
	}
	for _, s := range seeds {
		f.Add(s.method, s.target, s.headers, []byte(s.body))
	}

	pool := pgtest.Pool(f, migrations.Student)
	pgtest.AddStudents(f, pool, 6)
	_, err := pool.Exec(context.Background(), `UPDATE outbox SET state = 'dead', dead_at = now(), attempts = 1,
		reason_class = (ARRAY['refused','expired','users-unavailable'])[1 + id % 3], last_error = 'Users said no'
		WHERE id <= 5`)
	require.NoError(f, err)
	logs, log := apitest.NewLogBuffer()
	// Nothing is delivered: the relay is built for its metrics only.
	cfg := testConfig("http://127.0.0.1:1")
	cfg.AdminAllowedHosts = []string{"api.test"} // the harness's Host
	cfg.Operators = append(cfg.Operators, auth.Credential{Caller: "other", Token: otherToken})
	sp := pgtest.As(f, pool, migrations.OutboxSender)
	admin := adminRouter(log, sp, New(log, sp, cfg))

	// The outbox as it was before each request, to compare after it.
	var before string
	var beforeErr error
	read := func() (string, error) {
		var s string
		err := pool.QueryRow(context.Background(),
			`SELECT coalesce(string_agg(concat_ws('|', id, state, attempts, idempotency_key, redrives, reason_class), ',' ORDER BY id), '') FROM outbox`).Scan(&s)
		return s, err
	}
	state := func(t *testing.T) string {
		t.Helper()
		require.NoError(t, beforeErr)
		s, err := read()
		require.NoError(t, err)
		return s
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		before, beforeErr = read()
		// A request that carries no Authorization header goes as the
		// operator "test-admin"; one that carries any is judged as it is.
		apitest.WithToken(admin, adminToken).ServeHTTP(w, r)
	})
	apitest.FuzzAPI(f, apitest.FuzzTarget{
		Handler: handler, DB: pool, Log: logs, TextPaths: []string{"/metrics", "/problems"},
		Writes: func(t *testing.T, req *http.Request, res *http.Response) map[string]int {
			redrive := req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/redrive")
			if res.StatusCode != http.StatusOK || !redrive {
				require.Equal(t, before, state(t), "%d to %s %s changed the outbox", res.StatusCode, req.Method, req.URL)
				return nil
			}
			body, err := io.ReadAll(res.Body)
			require.NoError(t, err)
			if req.URL.Path == "/outbox/redrive" {
				var bulk deadletter.Bulk
				require.NoError(t, json.Unmarshal(body, &bulk), "%s", body)
				require.Len(t, bulk.IDs, bulk.Matched, "%s", body)
				if bulk.DryRun {
					require.Equal(t, before, state(t), "a dry run changes nothing")
				} else {
					require.Equal(t, bulk.Matched, bulk.Redriven, "every row matched is redriven, or counted as skipped: %s", body)
				}
				return map[string]int{"outbox_events": bulk.Redriven}
			}
			var one deadletter.Redriven
			require.NoError(t, json.Unmarshal(body, &one), "%s", body)
			if !one.Changed {
				require.Equal(t, before, state(t), "a redrive that changed nothing")
				return nil
			}
			return map[string]int{"outbox_events": 1}
		},
	})
}
