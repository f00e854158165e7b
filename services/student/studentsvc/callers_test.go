package studentsvc

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// The callers of these tests: most requests go as "client" (the servers
// the tests start send a request without a token as client's,
// apitest.WithToken); "other" is a second caller.
const (
	clientToken = "student-client-token-0123456789"
	otherToken  = "student-other-token-0123456789"
)

var testCallers = []auth.Credential{{Caller: "client", Token: clientToken}, {Caller: "other", Token: otherToken}}

// newTestServer is NewServer answering testCallers when cfg names none.
func newTestServer(log *slog.Logger, pool *pgxpool.Pool, cfg Config) *Server {
	if cfg.Callers == nil {
		cfg.Callers = testCallers
	}
	return NewServer(log, pool, cfg)
}

// serveCallers serves Student to testCallers, each request judged by the
// token it carries.
func serveCallers(t *testing.T) (*httptest.Server, *pgxpool.Pool) {
	t.Helper()
	pool := pgtest.Pool(t, migrations.Student)
	s := newTestServer(slog.New(slog.DiscardHandler), pgtest.As(t, pool, migrations.StudentApp),
		Config{KeyWait: time.Second, DatabaseTimeout: 10 * time.Second})
	ts := httptest.NewServer(s.Routes())
	t.Cleanup(ts.Close)
	return ts, pool
}

// TestAPIAnswersCallersOnly: without a token Student lists, shows and
// creates nothing: 401 with its challenge, before any body is read, and
// nothing written. The health routes stay open.
func TestAPIAnswersCallersOnly(t *testing.T) {
	t.Parallel()
	ts, pool := serveCallers(t)
	res := apitest.Do(t, http.MethodPost, ts.URL+"/students", ada, "Authorization", "Bearer "+clientToken, httpapi.KeyHeader, "k1")
	require.Equal(t, http.StatusCreated, res.Status, "%s", res.Body)
	id := res.Header.Get("Location")

	for name, headers := range map[string][]string{
		"no token":     nil,
		"wrong token":  {"Authorization", "Bearer not-a-known-token-0000"},
		"basic":        {"Authorization", "Basic Y2xpZW50OnB3"},
		"two headers":  {"Authorization", "Bearer " + clientToken, "Authorization", "Bearer " + otherToken},
		"empty bearer": {"Authorization", "Bearer"},
	} {
		for _, rt := range []struct{ method, path, body string }{
			{http.MethodPost, "/students", apitest.PersonBody("Eve", "eve@example.com", "999-9")},
			{http.MethodPost, "/students", "{not json"},
			{http.MethodGet, "/students", ""},
			{http.MethodGet, id, ""},
		} {
			res := apitest.Do(t, rt.method, ts.URL+rt.path, rt.body, append(headers, httpapi.KeyHeader, "k2")...)
			require.Equal(t, http.StatusUnauthorized, res.Status, "%s %s, %s: %s", rt.method, rt.path, name, res.Body)
			require.Equal(t, httpapi.TypeUnauthorized, res.Problem(t).Type)
			require.Equal(t, Challenge+map[bool]string{true: "", false: `, error="invalid_token"`}[headers == nil],
				res.Header.Get("WWW-Authenticate"), name)
			require.NotContains(t, string(res.Body), "ada@example.com", "nothing of a student is shown")
		}
	}
	require.Equal(t, 1, apitest.Count(t, pool, "SELECT count(*) FROM students"), "nothing was written")
	require.Equal(t, 1, apitest.Count(t, pool, "SELECT count(*) FROM inbox"), "no key was consumed")
	for _, path := range []string{"/healthz", "/readyz", httpapi.TypeValidation} {
		require.Equal(t, http.StatusOK, apitest.Do(t, http.MethodGet, ts.URL+path, "").Status, path)
	}
}

// TestKeysAreTheCallers: two callers may use the same key; neither
// replays the other's answer nor learns, from a 422, which fields of the
// other's request it guessed.
func TestKeysAreTheCallers(t *testing.T) {
	t.Parallel()
	ts, pool := serveCallers(t)
	post := func(token, key, body string) apitest.Response {
		return apitest.Do(t, http.MethodPost, ts.URL+"/students", body, "Authorization", "Bearer "+token, httpapi.KeyHeader, key)
	}
	bob := apitest.PersonBody("Bob", "bob@example.com", "222-2")
	first := post(clientToken, "k1", ada)
	require.Equal(t, http.StatusCreated, first.Status, "%s", first.Body)
	require.Equal(t, http.StatusCreated, post(clientToken, "k2", bob).Status)

	// The victim's exact body under the victim's key, sent by another
	// caller, is a request of its own: the business rule refuses the
	// document number; the victim's 201 is not replayed.
	res := post(otherToken, "k1", ada)
	require.Equal(t, http.StatusConflict, res.Status, "%s", res.Body)
	require.Empty(t, res.Header.Get(httpapi.ReplayedHeader))
	// A near guess of the victim's other request is no 422 naming the
	// fields that differ: it creates a student of its own.
	res = post(otherToken, "k2", apitest.PersonBody("Bob", "someone@example.com", "555-5"))
	require.Equal(t, http.StatusCreated, res.Status, "%s", res.Body)
	require.Equal(t, 2, apitest.Count(t, pool, "SELECT count(*) FROM inbox WHERE idempotency_key = 'k1'"), "one key per caller")

	// The first caller's replay is still its own answer.
	res = post(clientToken, "k1", ada)
	require.Equal(t, http.StatusCreated, res.Status)
	require.Equal(t, "true", res.Header.Get(httpapi.ReplayedHeader))
	require.Equal(t, first.Header.Get("Location"), res.Header.Get("Location"))
}
