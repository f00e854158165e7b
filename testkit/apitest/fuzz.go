package apitest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// FuzzTarget is a service's whole HTTP stack on a real database, for
// FuzzAPI.
type FuzzTarget struct {
	// Handler is the service's real router, built on DB and logging to Log.
	Handler http.Handler
	DB      *pgxpool.Pool
	Log     *Logs // from NewLogBuffer: warnings and errors only
	// Writes returns what an answer may have added to each table; every
	// table it does not name must be unchanged. It may check the answer
	// further (that a Location names a row that exists) with t.
	Writes func(t *testing.T, req *http.Request, res *http.Response) map[string]int
	// TextPaths are the beginnings of paths whose success is not JSON
	// (/metrics, in Prometheus' text format; the HTML problem pages);
	// their errors are problem+json all the same.
	TextPaths []string
}

// FuzzTimeout bounds one fuzz input. It is longer than the services'
// database timeouts in the fuzz targets, so that a slow database shows as
// the service's own 503 rather than as a context this harness cancelled.
const FuzzTimeout = 30 * time.Second

// FuzzAPI fuzzes tg with a method, a request target, a header blob ("Name:
// value" lines) and a body: each input is one request through the real
// handler. Whatever comes in, the answer is below 500, nothing is logged at
// warn or above (a 5xx, or a panic the router recovered into one), and every
// table's row count changes exactly as tg.Writes says.
//
// Fuzzing runs each worker process's Fuzz function from the top, so each
// worker has its own database, and rows accumulate there across inputs:
// counts are compared before and after each input.
func FuzzAPI(f *testing.F, tg FuzzTarget) {
	f.Helper()
	tables := userTables(f, tg.DB)
	stats := newFuzzStats(f.Name())
	f.Fuzz(func(t *testing.T, method, target, headers string, body []byte) {
		req, ok := FuzzRequest(method, target, headers, body)
		if !ok {
			stats.note(0)
			t.Skip("net/http's server answers this itself, before any handler runs")
		}
		ctx, cancel := context.WithTimeout(t.Context(), FuzzTimeout)
		defer cancel()
		req = req.WithContext(ctx)
		tg.Log.Reset()
		before := countRows(ctx, t, tg.DB, tables)

		rec := httptest.NewRecorder()
		tg.Handler.ServeHTTP(rec, req)
		res := rec.Result()
		defer res.Body.Close()
		t.Logf("%s %q: %d %.200s", req.Method, req.RequestURI, res.StatusCode, rec.Body)
		stats.note(res.StatusCode)

		require.Less(t, res.StatusCode, 500, "%s %q\n%s\nlog: %s", req.Method, req.RequestURI, rec.Body, tg.Log)
		require.Empty(t, tg.Log.String(), "nothing is logged at warn or above for a request the service handled")
		text := slices.ContainsFunc(tg.TextPaths, func(p string) bool { return strings.HasPrefix(req.URL.Path, p) })
		if res.StatusCode >= 400 || !text {
			checkShape(t, res.StatusCode, res.Header.Get("Content-Type"), rec.Body.Bytes())
		}
		after := countRows(ctx, t, tg.DB, tables)
		want := maps.Clone(before)
		for table, n := range tg.Writes(t, req, res) {
			_, known := want[table]
			require.True(t, known, "Writes names %q, which is not a table", table)
			want[table] += n
		}
		require.Equal(t, want, after, "%d to %s %q (before: %v)\n%s", res.StatusCode, req.Method, req.RequestURI, before, rec.Body)
	})
}

// checkShape holds every answer to the docs' promise (docs/contract.md): a success is JSON,
// and every error (an unknown route or method included) is problem+json
// whose status member is the answer's status.
func checkShape(t *testing.T, status int, contentType string, body []byte) {
	t.Helper()
	if status < 400 {
		require.Equal(t, "application/json", contentType, "%d: %s", status, body)
		require.True(t, json.Valid(body), "%d: not JSON: %s", status, body)
		return
	}
	require.Equal(t, "application/problem+json", contentType, "%d: %s", status, body)
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	require.NoError(t, json.Unmarshal(body, &p), "%d: %s", status, body)
	require.Equal(t, status, p.Status, "%s", body)
	require.NotEmpty(t, p.Type, "%s", body)
}

// FuzzStatsEnv names a directory where each fuzzing process keeps a tally
// of its inputs (skipped ones, and answers by status) as JSON, rewritten
// every 1,000 inputs: how to tell what a run exercised, since the fuzzer
// itself counts only executions.
const FuzzStatsEnv = "FUZZ_STATS_DIR"

type fuzzStats struct {
	mu      sync.Mutex
	path    string
	Inputs  int         `json:"inputs"`
	Skipped int         `json:"skipped"`
	Status  map[int]int `json:"status"`
}

func newFuzzStats(name string) *fuzzStats {
	s := &fuzzStats{Status: map[int]int{}}
	if dir := os.Getenv(FuzzStatsEnv); dir != "" {
		s.path = filepath.Join(dir, fmt.Sprintf("%s-%d.json", name, os.Getpid()))
	}
	return s
}

// note counts one input: its answer's status, or 0 for a skipped one.
func (s *fuzzStats) note(status int) {
	if s.path == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Inputs++
	if status == 0 {
		s.Skipped++
	} else {
		s.Status[status]++
	}
	if s.Inputs%1000 == 0 {
		if b, err := json.Marshal(s); err == nil {
			_ = os.WriteFile(s.path, b, 0o600)
		}
	}
}

// FuzzRequest turns fuzz input into the request a server would hand its
// handler: the request line, a Host, the header lines and the body go
// through net/http's own parser, with a Content-Length unless the headers
// frame the body themselves. Lines of the header blob that are not a valid
// "Name: value" are dropped rather than sent: a server would refuse the
// whole request for one, and the fuzzer would spend its time on net/http's
// parser instead of the handler. ok is false for input net/http's server
// refuses (with its own 400) before any handler sees it, or that would not
// be the one request it looks like (a line break in the method or target).
func FuzzRequest(method, target, headers string, body []byte) (req *http.Request, ok bool) {
	if strings.ContainsAny(method+target, "\r\n") {
		return nil, false
	}
	var wire bytes.Buffer
	wire.WriteString(method + " " + target + " HTTP/1.1\r\nHost: api.test\r\n")
	framed := false
	for line := range strings.SplitSeq(headers, "\n") {
		name, value, found := strings.Cut(strings.TrimSuffix(line, "\r"), ":")
		value = strings.Trim(value, " \t")
		if !found || !validFieldName(name) || !validFieldValue(value) {
			continue
		}
		switch textproto.CanonicalMIMEHeaderKey(name) {
		case "Host":
			continue // ours is the request's Host
		case "Content-Length", "Transfer-Encoding":
			framed = true
		}
		wire.WriteString(name + ": " + value + "\r\n")
	}
	if !framed {
		fmt.Fprintf(&wire, "Content-Length: %d\r\n", len(body))
	}
	wire.WriteString("\r\n")
	wire.Write(body)
	req, err := http.ReadRequest(bufio.NewReader(&wire))
	if err != nil || req.ProtoMajor != 1 {
		return nil, false
	}
	// What the server checks after parsing (net/http's conn.readRequest,
	// through httpguts), before it calls the handler.
	for name, values := range req.Header {
		if !validFieldName(name) {
			return nil, false
		}
		for _, v := range values {
			if !validFieldValue(v) {
				return nil, false
			}
		}
	}
	req.RemoteAddr = "192.0.2.1:40000"
	return req, true
}

// validFieldName is httpguts.ValidHeaderFieldName: a non-empty token.
func validFieldName(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// validFieldValue is httpguts.ValidHeaderFieldValue: no control bytes but
// space and tab.
func validFieldValue(s string) bool {
	for i := range len(s) {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// userTables lists every table of the database but the migrations' own.
func userTables(t testing.TB, db *pgxpool.Pool) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), `
		SELECT quote_ident(table_schema) || '.' || quote_ident(table_name)
		FROM information_schema.tables
		WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')
		  AND table_name <> 'goose_db_version'
		ORDER BY 1`)
	require.NoError(t, err)
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NotEmpty(t, tables)
	return tables
}

// countRows counts every table in one statement, so the counts are one
// snapshot. Tables are keyed by name without the schema.
func countRows(ctx context.Context, t testing.TB, db *pgxpool.Pool, tables []string) map[string]int {
	t.Helper()
	exprs := make([]string, len(tables))
	for i, tb := range tables {
		exprs[i] = "(SELECT count(*) FROM " + tb + ")"
	}
	vals := make([]int, len(tables))
	ptrs := make([]any, len(tables))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	require.NoError(t, db.QueryRow(ctx, "SELECT "+strings.Join(exprs, ", ")).Scan(ptrs...))
	out := make(map[string]int, len(tables))
	for i, tb := range tables {
		_, name, _ := strings.Cut(tb, ".")
		out[strings.Trim(name, `"`)] = vals[i]
	}
	return out
}

// NewLogBuffer returns a buffer and a JSON logger that writes warnings and
// errors to it, so an empty buffer means nothing went wrong.
func NewLogBuffer() (*Logs, *slog.Logger) {
	b := &Logs{}
	return b, slog.New(slog.NewJSONHandler(b, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// PersonBody is a person's JSON body with the values spliced in as they
// are: unlike contract.Body, it keeps invalid UTF-8 and escapes, which %q
// would rewrite.
func PersonBody(name, email, doc string) string {
	return `{"name":"` + name + `","email":"` + email + `","document_number":"` + doc + `"}`
}

// ProblemType reads the type of a problem+json answer ("" for any other).
func ProblemType(t testing.TB, res *http.Response) string {
	t.Helper()
	// Spelled out: apitest may not import httpapi, which imports
	// internal/database, whose tests use apitest.
	if res.Header.Get("Content-Type") != "application/problem+json" {
		return ""
	}
	var p struct {
		Type string `json:"type"`
	}
	require.NoError(t, json.NewDecoder(res.Body).Decode(&p))
	return p.Type
}

// Lines returns the header blob FuzzAPI takes for name, value pairs.
func Lines(kv ...string) string {
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		b.WriteString(kv[i] + ": " + kv[i+1] + "\n")
	}
	return b.String()
}
