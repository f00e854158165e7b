package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/person"
)

// hygieneRouter is NewRouter with the routes the tests below call: a POST
// that decodes a person, and a GET that reads a UUID from its path.
func hygieneRouter(t *testing.T) http.Handler {
	t.Helper()
	r := NewRouter(slog.New(slog.DiscardHandler), func(context.Context) error { return nil })
	r.Post("/people", Handle(func(w http.ResponseWriter, r *http.Request) error {
		var in person.Input
		if err := DecodeJSON(w, r, &in); err != nil {
			return err
		}
		if _, err := in.Validate(); err != nil {
			return err
		}
		return WriteJSON(w, http.StatusCreated, map[string]string{"status": "created"})
	}))
	r.Get("/people/{id}", Handle(func(w http.ResponseWriter, r *http.Request) error {
		id, err := PathUUID(r, "id")
		if err != nil {
			return err
		}
		return WriteJSON(w, http.StatusOK, map[string]string{"id": id.String()})
	}))
	return r
}

// startServer serves h with the project's server settings, changed by
// adjust, and returns its address.
func startServer(t *testing.T, h http.Handler, adjust func(*http.Server)) string {
	t.Helper()
	ts := httptest.NewUnstartedServer(h)
	ts.Config = NewServer(h)
	if adjust != nil {
		adjust(ts.Config)
	}
	ts.Start()
	t.Cleanup(ts.Close)
	return ts.Listener.Addr().String()
}

func readProblem(t *testing.T, resp *http.Response) Problem {
	t.Helper()
	require.Equal(t, ProblemContentType, resp.Header.Get("Content-Type"))
	var p Problem
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&p))
	require.Equal(t, resp.StatusCode, p.Status)
	return p
}

func fieldsOf(p Problem) []string {
	var out []string
	for _, f := range p.Errors {
		out = append(out, f.Field)
	}
	return out
}

// TestSlowBodyIs408: a body that stops arriving is a 408 problem once the
// server's read deadline passes, not a 400 "malformed JSON", and the
// connection is closed after it.
func TestSlowBodyIs408(t *testing.T) {
	t.Parallel()
	addr := startServer(t, hygieneRouter(t), func(s *http.Server) { s.ReadTimeout = 300 * time.Millisecond })
	for name, request := range map[string]string{
		"content-length": "POST /people HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n" +
			`{"name":"Ada`,
		"chunked": "POST /people HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"6\r\n{\"name\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// Before the dial: the server's clock starts once it has the
			// connection, which on a loaded machine can be well before
			// the dial returns here.
			start := time.Now()
			conn, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			defer conn.Close()
			require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
			_, err = io.WriteString(conn, request) // and then nothing more
			require.NoError(t, err)
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			defer resp.Body.Close()
			require.GreaterOrEqual(t, time.Since(start), 250*time.Millisecond, "answered before the deadline")
			require.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
			require.True(t, resp.Close, "Connection: close")
			p := readProblem(t, resp)
			require.Equal(t, TypeRequestTimeout, p.Type)
			require.Contains(t, p.Detail, ReadTimeout.String(), "the detail gives the production limit")
			_, err = br.ReadByte()
			require.ErrorIs(t, err, io.EOF, "the server closes the connection")
		})
	}
}

// TestDecodeRefusesInvalidText: bytes that are not UTF-8, and escapes of
// half a surrogate pair, are refused before decoding (which would replace
// them with U+FFFD), naming the field whose value holds them.
func TestDecodeRefusesInvalidText(t *testing.T) {
	t.Parallel()
	const rest = `,"email":"a@b.co","document_number":"123"}`
	tests := []struct {
		name, body string
		field      string // "" when the body is accepted
	}{
		{name: "bad byte in name", body: `{"name":"Ad` + "\xff" + `a"` + rest, field: "name"},
		{name: "bad byte in email", body: `{"name":"Ada","email":"a` + "\xc3" + `@b.co","document_number":"123"}`, field: "email"},
		{name: "truncated sequence at the end of a value", body: `{"name":"Ada` + "\xe2\x82" + `"` + rest, field: "name"},
		{name: "overlong encoding", body: `{"name":"` + "\xc0\xaf" + `"` + rest, field: "name"},
		{name: "encoded surrogate", body: `{"name":"` + "\xed\xa0\x80" + `"` + rest, field: "name"},
		{name: "bad byte in a key", body: `{"na` + "\xff" + `me":"Ada"` + rest, field: "body"},
		{name: "bad byte outside an object", body: "[\"\xff\"]", field: "body"},
		{name: "bad byte between fields", body: `{"name":"Ada"` + "\xff" + rest, field: "body"},
		{name: "lone high surrogate", body: `{"name":"Ada\ud800"` + rest, field: "name"},
		{name: "lone low surrogate", body: `{"name":"Ada\udc00"` + rest, field: "name"},
		{name: "high surrogate then a letter", body: `{"name":"\ud800\u0041"` + rest, field: "name"},
		{name: "high surrogate in a truncated body", body: `{"name":"\ud800`, field: "body"},
		{name: "surrogate in an unknown field", body: `{"name":"Ada","x":"\udfff"` + rest[0:len(rest)-1] + `}`, field: "x"},
		{name: "valid pair", body: `{"name":"Ada \ud83d\ude00"` + rest},
		{name: "escaped backslash before u", body: `{"name":"Ada \\ud800"` + rest},
		{name: "U+FFFD sent as such", body: `{"name":"Ada ` + "\uFFFD" + `"` + rest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, pe := decode(tt.body, "application/json")
			if tt.field == "" {
				require.Nil(t, pe)
				return
			}
			require.NotNil(t, pe)
			require.Equal(t, http.StatusBadRequest, pe.Status)
			require.Equal(t, TypeValidation, pe.Type)
			require.Equal(t, []FieldError{{Field: tt.field, Detail: "not valid UTF-8 text"}}, pe.Errors)
		})
	}
}

func TestParseUUIDTakesOnlyTheCanonicalForm(t *testing.T) {
	t.Parallel()
	const canonical = "01a237d2-c993-7626-8986-e2c90b9557fa"
	u, ok := ParseUUID(canonical)
	require.True(t, ok)
	require.Equal(t, canonical, u.String())
	for _, s := range []string{
		"01A237D2-C993-7626-8986-E2C90B9557FA",  // upper case
		"01a237d2-C993-7626-8986-e2c90b9557fa",  // mixed case
		"01a237d2c99376268986e2c90b9557fa",      // no dashes
		"urn:uuid:" + canonical,                 // URN
		"{" + canonical + "}",                   // braces
		"01a237d2-c993-7626-8986e-2c90b9557fa",  // dashes misplaced
		"01a237d2-c993-7626-8986-e2c90b9557fa ", // trailing space
		"01a237d2-c993-7626-8986-e2c90b9557f",   // short
		"01a237d2-c993-7626-8986-e2c90b9557fa0", // long
		"01a237d2-c993-7626-8986-e2c90b9557fg",  // not hex
		"01a237d2_c993_7626_8986_e2c90b9557fa",  // other separators
		"",
	} {
		_, ok := ParseUUID(s)
		require.False(t, ok, "%q", s)
	}
}

// TestPathUUIDNamesTheParameter: a non-canonical id in a path is a 400
// naming it, through the router as a client sees it.
func TestPathUUIDNamesTheParameter(t *testing.T) {
	t.Parallel()
	h := hygieneRouter(t)
	const canonical = "01a237d2-c993-7626-8986-e2c90b9557fa"
	for _, id := range []string{strings.ToUpper(canonical), strings.ReplaceAll(canonical, "-", ""), "urn:uuid:" + canonical, "%7B" + canonical + "%7D", "nope"} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/people/"+id, nil))
		require.Equal(t, http.StatusBadRequest, w.Code, id)
		var p Problem
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
		require.Equal(t, []string{"id"}, fieldsOf(p), id)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/people/"+canonical, nil))
	require.Equal(t, http.StatusOK, w.Code)
}

// TestRepeatedQueryParameterIsRefused: every route refuses a parameter
// given twice, naming each, before its handler runs.
func TestRepeatedQueryParameterIsRefused(t *testing.T) {
	t.Parallel()
	h := hygieneRouter(t)
	tests := []struct {
		query  string
		fields []string // nil when accepted
	}{
		{query: "a=1&b=2"},
		{query: "a="},
		{query: "a=1&a=2", fields: []string{"a"}},
		{query: "a=1&a=1", fields: []string{"a"}},
		{query: "a&a", fields: []string{"a"}},
		{query: "a=1&%61=2", fields: []string{"a"}},
		{query: "b=1&a=1&b=2&a=3", fields: []string{"a", "b"}},
		{query: "a=%zz", fields: []string{"query"}},
		{query: "a=1;b=2", fields: []string{"query"}},
	}
	for _, path := range []string{"/healthz", "/people/01a237d2-c993-7626-8986-e2c90b9557fa", "/nowhere"} {
		for _, tt := range tests {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path+"?"+tt.query, nil))
			if tt.fields == nil {
				require.NotEqual(t, http.StatusBadRequest, w.Code, "%s?%s", path, tt.query)
				continue
			}
			require.Equal(t, http.StatusBadRequest, w.Code, "%s?%s", path, tt.query)
			require.Equal(t, ProblemContentType, w.Header().Get("Content-Type"))
			var p Problem
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
			require.Equal(t, tt.fields, fieldsOf(p), "%s?%s", path, tt.query)
		}
	}
}

// problemTypeInCode matches a problem type URI written in Go source.
var problemTypeInCode = regexp.MustCompile(`"(/problems/[a-z0-9-]+)"`)

// TestEveryProblemTypeResolves: every problem type, whether registered or
// written anywhere in the module's code, resolves to its page on every
// router (every listener of the project is built on NewRouter), and the
// index lists them all.
func TestEveryProblemTypeResolves(t *testing.T) {
	t.Parallel()
	uris := map[string]string{} // URI to where it was seen
	for _, pt := range problemTypes {
		require.NotContains(t, uris, pt.URI, "registered twice")
		uris[pt.URI] = "problemTypes"
		require.NotEmpty(t, pt.Title, pt.URI)
		require.NotEmpty(t, pt.About, pt.URI)
		require.NotEmpty(t, pt.Action, pt.URI)
		require.NotEmpty(t, http.StatusText(pt.Status), pt.URI)
	}
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "tools") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range problemTypeInCode.FindAllStringSubmatch(string(src), -1) {
			if _, ok := uris[m[1]]; !ok {
				uris[m[1]] = path
			}
		}
		return nil
	})
	require.NoError(t, err)

	h := hygieneRouter(t)
	for uri, where := range uris {
		pt, ok := LookupProblemType(uri)
		require.True(t, ok, "%s (in %s) has no entry in problemTypes", uri, where)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, uri, nil))
		require.Equal(t, http.StatusOK, w.Code, uri)
		require.Equal(t, "text/html; charset=utf-8", w.Header().Get("Content-Type"))
		require.Equal(t, "default-src 'none'", w.Header().Get("Content-Security-Policy"))
		require.Contains(t, w.Body.String(), "<h1>"+pt.Title+"</h1>")
	}

	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/problems", nil))
	require.Equal(t, http.StatusOK, w.Code)
	for _, pt := range problemTypes {
		require.Contains(t, w.Body.String(), `href="`+pt.URI+`"`)
	}
	for _, path := range []string{"/problems/no-such-problem", "/problems/validation/x"} {
		w = httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		require.Equal(t, http.StatusNotFound, w.Code, path)
		require.Equal(t, ProblemContentType, w.Header().Get("Content-Type"), path)
	}
}

// TestProblemsUseTheirRegisteredTitle: every problem the package builds
// carries its type's registered title and status, the same for every
// occurrence (RFC 9457 §3.1.4); an unregistered type cannot be built.
func TestProblemsUseTheirRegisteredTitle(t *testing.T) {
	t.Parallel()
	for _, p := range []*Problem{
		Field("x", "y"), NotFound("x"), DocumentTaken("x"), Unavailable("x", nil), RequestTimeout(),
		Unauthorized("x"),
		asProblem(&person.InvalidError{}), asProblem(errors.New("x")),
	} {
		pt, ok := LookupProblemType(p.Type)
		require.True(t, ok, p.Type)
		require.Equal(t, pt.Title, p.Title, p.Type)
		require.Equal(t, pt.Status, p.Status, p.Type)
	}
	require.Panics(t, func() { _ = NewProblem("/problems/unregistered", "") })
}

// serverAnswer is one request net/http answers by itself, before any
// handler runs, in text/plain (or not at all). The README lists them.
type serverAnswer struct {
	name    string
	request string
	status  int // 0: the connection is closed without an answer
}

// serverAnswers are what the README's "What net/http answers itself"
// lists; TestServerAnswersItself keeps the list true.
var serverAnswers = []serverAnswer{
	{name: "headers over MaxHeaderBytes", request: "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", MaxHeaderBytes+4096) + "\r\n\r\n", status: 431},
	{name: "malformed request line", request: "GARBAGE\r\n\r\n", status: 400},
	{name: "TLS handshake on the plain port", request: "\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n", status: 400},
	{name: "malformed escape in the path", request: "GET /students/%zz HTTP/1.1\r\nHost: x\r\n\r\n", status: 400},
	{name: "malformed header line", request: "GET /healthz HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", status: 400},
	{name: "invalid header name", request: "GET /healthz HTTP/1.1\r\nHost: x\r\nBad(Name): x\r\n\r\n", status: 400},
	{name: "control character in a header value", request: "GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n", status: 400},
	{name: "missing Host", request: "GET /healthz HTTP/1.1\r\n\r\n", status: 400},
	{name: "malformed Host", request: "GET /healthz HTTP/1.1\r\nHost: a b\r\n\r\n", status: 400},
	{name: "two different Content-Lengths", request: "POST /people HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", status: 400},
	{name: "malformed Content-Length", request: "POST /people HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", status: 400},
	{name: "unsupported transfer coding", request: "POST /people HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", status: 501},
	{name: "unsupported HTTP version", request: "GET /healthz HTTP/3.0\r\nHost: x\r\n\r\n", status: 505},
	{name: "Expect other than 100-continue", request: "POST /people HTTP/1.1\r\nHost: x\r\nExpect: teapot\r\nContent-Length: 0\r\n\r\n", status: 417},
	{name: "headers that stop arriving", request: "GET /healthz HTTP/1.1\r\nHost: x\r\n", status: 0},
}

// TestServerAnswersItself proves each entry of serverAnswers: net/http
// answers it with the listed status in text/plain (or with an empty body),
// and no handler runs, so no problem+json is possible for it.
func TestServerAnswersItself(t *testing.T) {
	t.Parallel()
	handled := make(chan string, len(serverAnswers))
	h := hygieneRouter(t)
	addr := startServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handled <- r.Method + " " + r.URL.String()
		h.ServeHTTP(w, r)
	}), func(s *http.Server) {
		// Short, for the headers that stop arriving; yet long enough that
		// the whole requests, written the moment the dial returns, are
		// never cut off on a loaded machine.
		s.ReadHeaderTimeout = 2 * time.Second
	})
	for _, tt := range serverAnswers {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			defer conn.Close()
			require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
			_, err = io.WriteString(conn, tt.request)
			require.NoError(t, err)
			br := bufio.NewReader(conn)
			if tt.status == 0 {
				_, err := br.ReadByte()
				require.ErrorIs(t, err, io.EOF, "closed without a byte of answer")
				return
			}
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, tt.status, resp.StatusCode, "%s", body)
			if len(body) > 0 {
				require.Equal(t, "text/plain; charset=utf-8", resp.Header.Get("Content-Type"))
			}
			require.True(t, resp.Close, "Connection: close")
		})
	}
	close(handled)
	var reached []string
	for r := range handled {
		reached = append(reached, r)
	}
	require.Empty(t, reached, "these requests reached the handler, which answers problem+json: drop them from the list")
}
