package usersvc

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// Fuzzing callers: two, so that the same key under two callers is two keys.
const (
	fuzzToken      = "fuzz-sender-token-0123456789"
	fuzzOtherToken = "fuzz-other-token-0123456789"
)

// FuzzUsersAPI sends arbitrary requests (method, target, headers, body)
// through Users' real router on a real database. Whatever comes in: no 5xx,
// no panic, and no row written unless the answer says so: a new 201 writes
// one user and its key's inbox row, a new 409 for a taken document number
// stores that refusal under the key (the contract replays it), and nothing
// else writes: not a 401, not a 400, not a replay.
func FuzzUsersAPI(f *testing.F) {
	authed := apitest.Lines("Authorization", "Bearer "+fuzzToken)
	ct := authed + apitest.Lines("Content-Type", "application/json")
	withKey := func(key string) string { return ct + apitest.Lines(httpapi.KeyHeader, key) }
	ada := apitest.PersonBody("Ada Lovelace", "ada@example.com", "F-1")
	id := uuid.MustParse("01a237d2-c9b3-7611-8201-c34152834767")
	seeds := []struct {
		method, target, headers, body string
	}{
		// The contract: create, replay, reuse with another body, taken.
		{"POST", "/users", withKey("k1"), ada},
		{"POST", "/users", withKey(`"k1"`), ada},
		{"POST", "/users", withKey("k1"), apitest.PersonBody("Ada Lovelace", "ada@example.org", "F-1")},
		{"POST", "/users", withKey("k2"), ada},
		{"POST", "/users", withKey("k2"), ada},
		{"POST", "/users", ct, apitest.PersonBody("B", "b@example.com", "F-2")},
		{"POST", "/users", ct + apitest.Lines(httpapi.KeyHeader, "a", httpapi.KeyHeader, "b"), apitest.PersonBody("B", "b@example.com", "F-2")},
		{"POST", "/users", withKey("a,b"), ada},
		{"POST", "/users", withKey(strings.Repeat("k", 256)), ada},
		{"POST", "/users", withKey(`"unterminated`), ada},
		{"POST", "/users", ct + httpapi.KeyHeader + ":\n", ada},
		// Credentials: none, unknown, malformed, another caller's, twice.
		{"POST", "/users", apitest.Lines("Content-Type", "application/json", httpapi.KeyHeader, "k3"), apitest.PersonBody("C", "c@example.com", "F-3")},
		{"POST", "/users", apitest.Lines("Authorization", "Bearer not-a-known-token-0000", httpapi.KeyHeader, "k3"), apitest.PersonBody("C", "c@example.com", "F-3")},
		{"POST", "/users", apitest.Lines("Authorization", "bearer "+fuzzToken, httpapi.KeyHeader, "k3"), apitest.PersonBody("C", "c@example.com", "F-3")},
		{"POST", "/users", apitest.Lines("Authorization", "Bearer  "+fuzzToken+" ", httpapi.KeyHeader, "k3"), apitest.PersonBody("C", "c@example.com", "F-3")},
		{"POST", "/users", apitest.Lines("Authorization", "Basic c2VuZGVyOnB3", httpapi.KeyHeader, "k3"), apitest.PersonBody("C", "c@example.com", "F-3")},
		{"POST", "/users", apitest.Lines("Authorization", "Bearer", httpapi.KeyHeader, "k3"), apitest.PersonBody("C", "c@example.com", "F-3")},
		{"POST", "/users", apitest.Lines("Authorization", "Bearer "+fuzzToken, "Authorization", "Bearer "+fuzzOtherToken, httpapi.KeyHeader, "k3"), apitest.PersonBody("C", "c@example.com", "F-3")},
		{"POST", "/users", apitest.Lines("Authorization", "Bearer "+fuzzOtherToken, httpapi.KeyHeader, "k1"), ada},
		{"GET", "/users/" + id.String(), "", ""},
		// Bodies: malformed, wrong shapes, huge, invalid UTF-8, escapes.
		{"POST", "/users", withKey("b1"), `{"name":`},
		{"POST", "/users", withKey("b2"), `[]`},
		{"POST", "/users", withKey("b3"), `null`},
		{"POST", "/users", withKey("b4"), ``},
		{"POST", "/users", withKey("b5"), `{"name":"A","email":"a@b.co","document_number":"F-4","x":1}`},
		{"POST", "/users", withKey("b6"), `{"name":"A","NAME":"B","email":"a@b.co","document_number":"F-4"}`},
		{"POST", "/users", withKey("b7"), `{"name":"A","name":"B","email":"a@b.co","document_number":"F-4"}`},
		{"POST", "/users", withKey("b8"), `{"name":1,"email":true,"document_number":null}`},
		{"POST", "/users", withKey("b9"), ada + ada},
		{"POST", "/users", withKey("b10"), apitest.PersonBody(strings.Repeat("a", 17<<10), "a@b.co", "F-5")},
		{"POST", "/users", withKey("b11"), apitest.PersonBody("\xff\xfe", "a@b.co", "F-6")},
		{"POST", "/users", withKey("b12"), apitest.PersonBody(`A\u0000B`, "nul@example.com", "F-7")},
		{"POST", "/users", withKey("b13"), apitest.PersonBody("Q", `\"q\u0000\"@example.com`, "F-8")},
		{"POST", "/users", withKey("b14"), apitest.PersonBody("R", `\"r s\"@example.com`, "F-9")},
		{"POST", "/users", withKey("b15"), apitest.PersonBody(`\ud800`, "s@example.com", "F-10")},
		{"POST", "/users", withKey("b16"), apitest.PersonBody("  ", " ", "\t")},
		// Header variants: media types and framing.
		{"POST", "/users", authed + apitest.Lines("Content-Type", "text/plain", httpapi.KeyHeader, "h1"), ada},
		{"POST", "/users", authed + apitest.Lines("Content-Type", "application/json; charset=utf-8", httpapi.KeyHeader, "h2"), apitest.PersonBody("D", "d@example.com", "F-11")},
		{"POST", "/users", authed + apitest.Lines("Content-Type", "APPLICATION/JSON", httpapi.KeyHeader, "h3"), apitest.PersonBody("E", "e@example.com", "F-12")},
		{"POST", "/users", authed + apitest.Lines(httpapi.KeyHeader, "h4"), apitest.PersonBody("F", "f@example.com", "F-13")},
		{"POST", "/users", withKey("h5") + apitest.Lines("Transfer-Encoding", "chunked"), "5\r\n{\"nam\r\n0\r\n\r\n"},
		{"POST", "/users", withKey("h6") + apitest.Lines("Transfer-Encoding", "chunked"), "zz\r\n"},
		{"POST", "/users", withKey("h7") + apitest.Lines("Content-Length", "5"), ada},
		{"POST", "/users", withKey("h8") + apitest.Lines("Expect", "100-continue"), apitest.PersonBody("G", "g@example.com", "F-14")},
		{"POST", "/users", withKey("h9") + apitest.Lines("Content-Encoding", "gzip"), ada},
		// Reads: ids in every spelling uuid.Parse accepts.
		{"GET", "/users/" + id.String(), authed, ""},
		{"GET", "/users/" + strings.ToUpper(id.String()), authed, ""},
		{"GET", "/users/urn:uuid:" + id.String(), authed, ""},
		{"GET", "/users/{" + id.String() + "}", authed, ""},
		{"GET", "/users/" + strings.ReplaceAll(id.String(), "-", ""), authed, ""},
		{"GET", "/users/42", authed, ""},
		{"GET", "/users/%00", authed, ""},
		{"GET", "/users/\xff", authed, ""},
		{"HEAD", "/users/" + id.String(), authed, ""},
		{"GET", "/users", authed, ""},
		// Odd methods and paths.
		{"PUT", "/users", withKey("m1"), ada},
		{"DELETE", "/users/" + id.String(), authed, ""},
		{"PATCH", "/users/" + id.String(), withKey("m2"), ada},
		{"OPTIONS", "/users", authed, ""},
		{"TRACE", "/", "", ""},
		{"CONNECT", "api.test:443", "", ""},
		{"post", "/users", withKey("m3"), ada},
		{"BREW", "/users", withKey("m4"), ada},
		{"POST", "/users/", withKey("m5"), ada},
		{"POST", "//users", withKey("m6"), ada},
		{"POST", "/users/../users", withKey("m7"), apitest.PersonBody("H", "h@example.com", "F-15")},
		{"POST", "/USERS", withKey("m8"), ada},
		{"POST", "http://api.test/users", withKey("m9"), apitest.PersonBody("I", "i@example.com", "F-16")},
		{"GET", "*", "", ""},
		{"GET", "/" + strings.Repeat("a", 8<<10), "", ""},
		{"GET", "/healthz", "", ""},
		{"GET", "/readyz", "", ""},
	}
	for _, s := range seeds {
		f.Add(s.method, s.target, s.headers, []byte(s.body))
	}

	pool := pgtest.Pool(f, migrations.Users)
	logs, log := apitest.NewLogBuffer()
	// Generous timeouts, below the harness's bound: fuzzing workers share
	// one server, and a slow answer is not what this target looks for.
	// Users runs as its own role, as in production; the harness counts rows
	// as the administrator.
	s := NewServer(log, pgtest.As(f, pool, migrations.UsersApp), Config{
		KeyWait: 5 * time.Second, DatabaseTimeout: 20 * time.Second,
		Callers: []auth.Credential{{Caller: "sender", Token: fuzzToken}, {Caller: "other", Token: fuzzOtherToken}},
	})
	apitest.FuzzAPI(f, apitest.FuzzTarget{
		Handler: s.Routes(), DB: pool, Log: logs,
		Writes: func(t *testing.T, _ *http.Request, res *http.Response) map[string]int {
			switch {
			case res.Header.Get(httpapi.ReplayedHeader) != "":
				return nil // a replay creates nothing
			case res.StatusCode == http.StatusCreated:
				id, err := uuid.Parse(strings.TrimPrefix(res.Header.Get("Location"), "/users/"))
				require.NoError(t, err, "Location %q", res.Header.Get("Location"))
				require.Equal(t, 1, apitest.Count(t, pool,
					"SELECT count(*) FROM users u JOIN inbox i ON i.resource_id = u.id WHERE u.id = $1", id),
					"the user and its key's answer were written together")
				return map[string]int{"users": 1, "inbox": 1}
			case res.StatusCode == http.StatusConflict && apitest.ProblemType(t, res) == httpapi.TypeDocumentTaken:
				return map[string]int{"inbox": 1} // the refusal, stored under the key
			}
			return nil
		},
	})
}
