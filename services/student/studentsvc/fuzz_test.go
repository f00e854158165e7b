package studentsvc

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// FuzzStudentAPI sends arbitrary requests (method, target, headers, body)
// through Student's real router on a real database. Whatever comes in: no
// 5xx, no panic, and no row written unless the answer says so: a new 201
// writes one student and its outbox row (and the key's inbox row when a key
// was sent), a new 409 for a taken document number under a key stores that
// refusal in the inbox (the contract replays it), and nothing else writes.
func FuzzStudentAPI(f *testing.F) {
	ct := apitest.Lines("Content-Type", "application/json")
	withKey := func(key string) string { return ct + apitest.Lines(httpapi.KeyHeader, key) }
	ada := apitest.PersonBody("Ada Lovelace", "ada@example.com", "F-1")
	adaK := apitest.PersonBody("Ada Lovelace", "ada@example.com", "F-1k")
	id := uuid.MustParse("01a237d2-c993-7626-8986-e2c90b9557fa")
	seeds := []struct {
		method, target, headers, body string
	}{
		// The contract: create, replay, reuse with another body, taken.
		{"POST", "/students", ct, ada},
		{"POST", "/students", withKey("k1"), adaK},
		{"POST", "/students", withKey(`"k1"`), adaK},
		{"POST", "/students", withKey("k1"), apitest.PersonBody("Ada Lovelace", "ada@example.org", "F-1k")},
		{"POST", "/students", withKey("k2"), adaK},
		{"POST", "/students", withKey("k2"), adaK},
		{"POST", "/students", ct + apitest.Lines(httpapi.KeyHeader, "a", httpapi.KeyHeader, "b"), apitest.PersonBody("B", "b@example.com", "F-2")},
		{"POST", "/students", withKey("a,b"), ada},
		{"POST", "/students", withKey(strings.Repeat("k", 256)), ada},
		{"POST", "/students", withKey(`"unterminated`), ada},
		{"POST", "/students", ct + httpapi.KeyHeader + ":\n", ada},
		// Bodies: malformed, wrong shapes, huge, invalid UTF-8.
		{"POST", "/students", ct, `{"name":`},
		{"POST", "/students", ct, `[]`},
		{"POST", "/students", ct, `null`},
		{"POST", "/students", ct, ``},
		{"POST", "/students", ct, `{"name":"A","email":"a@b.co","document_number":"1","x":1}`},
		{"POST", "/students", ct, `{"name":"A","NAME":"B","email":"a@b.co","document_number":"1"}`},
		{"POST", "/students", ct, `{"name":"A","name":"B","email":"a@b.co","document_number":"1"}`},
		{"POST", "/students", ct, `{"name":1,"email":true,"document_number":null}`},
		{"POST", "/students", ct, ada + ada},
		{"POST", "/students", ct, apitest.PersonBody(strings.Repeat("a", 17<<10), "a@b.co", "F-3")},
		{"POST", "/students", ct, apitest.PersonBody("\xff\xfe", "a@b.co", "F-4")},
		{"POST", "/students", ct, "{\"name\":\"A\xffB\",\"email\":\"a@b.co\",\"document_number\":\"F-5\"}"},
		{"POST", "/students", ct, apitest.PersonBody("Nul\x00l", "a@b.co", "F-6")},
		{"POST", "/students", ct, apitest.PersonBody("  ", " ", "\t")},
		{"POST", "/students", ct, apitest.PersonBody(`A\u0000B`, "nul@example.com", "F-12")},
		{"POST", "/students", ct, apitest.PersonBody("Q", `\"q\u0000\"@example.com`, "F-13")},
		{"POST", "/students", ct, apitest.PersonBody("R", `\"r s\"@example.com`, "F-14")},
		{"POST", "/students", ct, apitest.PersonBody(`\ud800`, "s@example.com", "F-15")},
		// Header variants: media types, framing, odd casing and repeats.
		{"POST", "/students", apitest.Lines("Content-Type", "text/plain"), ada},
		{"POST", "/students", apitest.Lines("Content-Type", "application/json; charset=utf-8"), apitest.PersonBody("C", "c@example.com", "F-7")},
		{"POST", "/students", apitest.Lines("Content-Type", "APPLICATION/JSON"), apitest.PersonBody("D", "d@example.com", "F-8")},
		{"POST", "/students", apitest.Lines("Content-Type", "application/json; charset"), ada},
		{"POST", "/students", apitest.Lines("content-type", "application/json", "Content-Type", "text/plain"), ada},
		{"POST", "/students", "", apitest.PersonBody("E", "e@example.com", "F-9")},
		{"POST", "/students", ct + apitest.Lines("Transfer-Encoding", "chunked"), "5\r\n{\"nam\r\n0\r\n\r\n"},
		{"POST", "/students", ct + apitest.Lines("Transfer-Encoding", "chunked"), "zz\r\n"},
		{"POST", "/students", ct + apitest.Lines("Content-Length", "5"), ada},
		{"POST", "/students", ct + apitest.Lines("Expect", "100-continue"), apitest.PersonBody("F", "f@example.com", "F-10")},
		{"POST", "/students", ct + apitest.Lines("Content-Encoding", "gzip"), ada},
		// Credentials: unknown, malformed, repeated, another caller's.
		{"POST", "/students", ct + apitest.Lines("Authorization", "Bearer not-a-known-token-0000"), apitest.PersonBody("G", "g@example.com", "F-16")},
		{"POST", "/students", ct + apitest.Lines("Authorization", "Basic Y2xpZW50OnB3"), apitest.PersonBody("G", "g@example.com", "F-16")},
		{"POST", "/students", ct + apitest.Lines("Authorization", "Bearer "+clientToken, "Authorization", "Bearer "+otherToken), ada},
		{"POST", "/students", ct + apitest.Lines("Authorization", "Bearer "+otherToken, httpapi.KeyHeader, "k1"), ada},
		{"GET", "/students", apitest.Lines("Authorization", "Bearer"), ""},
		// Reads: pages, cursors, ids in every spelling uuid.Parse accepts.
		{"GET", "/students", "", ""},
		{"GET", "/students?limit=1", "", ""},
		{"GET", "/students?limit=0", "", ""},
		{"GET", "/students?limit=99999999999999999999", "", ""},
		{"GET", "/students?limit=1&limit=2", "", ""},
		{"GET", "/students?cursor=%zz", "", ""},
		{"GET", "/students?cursor=MTc2NDY5NjQ5MDc3MTI5MywwMWEy", "", ""},
		{"GET", "/students?cursor=LTEsMDFhMjM3ZDItYzk5My03NjI2LTg5ODYtZTJjOTBiOTU1N2Zh", "", ""},
		{"GET", "/students?x=1", "", ""},
		{"GET", "/students/" + id.String(), "", ""},
		{"GET", "/students/" + strings.ToUpper(id.String()), "", ""},
		{"GET", "/students/urn:uuid:" + id.String(), "", ""},
		{"GET", "/students/{" + id.String() + "}", "", ""},
		{"GET", "/students/" + strings.ReplaceAll(id.String(), "-", ""), "", ""},
		{"GET", "/students/42", "", ""},
		{"GET", "/students/%00", "", ""},
		{"GET", "/students/\xff", "", ""},
		{"HEAD", "/students", "", ""},
		{"HEAD", "/students/" + id.String(), "", ""},
		// Odd methods and paths.
		{"PUT", "/students", ct, ada},
		{"DELETE", "/students/" + id.String(), "", ""},
		{"PATCH", "/students", ct, ada},
		{"OPTIONS", "/students", "", ""},
		{"TRACE", "/", "", ""},
		{"CONNECT", "api.test:443", "", ""},
		{"get", "/students", "", ""},
		{"BREW", "/students", "", ""},
		{"POST", "/students/", ct, ada},
		{"POST", "//students", ct, ada},
		{"POST", "/students/../students", ct, ada},
		{"POST", "/STUDENTS", ct, ada},
		{"POST", "/students;x", ct, ada},
		{"POST", "http://api.test/students", ct, apitest.PersonBody("G", "g@example.com", "F-11")},
		{"GET", "*", "", ""},
		{"GET", "/" + strings.Repeat("a", 8<<10), "", ""},
		{"GET", "/healthz", "", ""},
		{"GET", "/readyz", "", ""},
	}
	for _, s := range seeds {
		f.Add(s.method, s.target, s.headers, []byte(s.body))
	}

	pool := pgtest.Pool(f, migrations.Student)
	logs, log := apitest.NewLogBuffer()
	// A database timeout below the harness's bound, and a key wait below
	// that, as in production; generous, because fuzzing workers share one
	// server and a slow answer is not what this target looks for.
	// Student runs as its own role, as in production; the harness counts
	// rows as the administrator.
	s := newTestServer(log, pgtest.As(f, pool, migrations.StudentApp), Config{KeyWait: 5 * time.Second, DatabaseTimeout: 20 * time.Second})
	apitest.FuzzAPI(f, apitest.FuzzTarget{
		// A request that carries no Authorization header goes as the
		// caller "client"; one that carries any is judged as it is.
		Handler: apitest.WithToken(s.Routes(), clientToken), DB: pool, Log: logs,
		Writes: func(t *testing.T, req *http.Request, res *http.Response) map[string]int {
			keyed := len(req.Header.Values(httpapi.KeyHeader)) > 0
			switch {
			case res.Header.Get(httpapi.ReplayedHeader) != "":
				return nil // a replay creates nothing
			case res.StatusCode == http.StatusCreated:
				// The Location names the new student, which has its outbox
				// row: the two were written together.
				id, err := uuid.Parse(strings.TrimPrefix(res.Header.Get("Location"), "/students/"))
				require.NoError(t, err, "Location %q", res.Header.Get("Location"))
				require.Equal(t, 1, apitest.Count(t, pool,
					"SELECT count(*) FROM students s JOIN outbox o ON o.student_id = s.id WHERE s.id = $1", id))
				w := map[string]int{"students": 1, "outbox": 1}
				if keyed {
					w["inbox"] = 1
				}
				return w
			case res.StatusCode == http.StatusConflict && keyed && apitest.ProblemType(t, res) == httpapi.TypeDocumentTaken:
				return map[string]int{"inbox": 1} // the refusal, stored under the key
			}
			return nil
		},
	})
}
