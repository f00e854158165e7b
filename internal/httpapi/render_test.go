package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/internal/person"
)

// serve sends one request to a router whose only route returns err (or
// panics with it), and returns the answer and the log lines.
func serve(t *testing.T, fail func() error) (*httptest.ResponseRecorder, []string) {
	t.Helper()
	var logs bytes.Buffer
	r := NewRouter(slog.New(slog.NewJSONHandler(&logs, nil)), func(context.Context) error { return nil })
	r.Post("/x", Handle(func(http.ResponseWriter, *http.Request) error { return fail() }))
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/x", nil))
	var lines []string
	for l := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
		if l != "" {
			lines = append(lines, l)
		}
	}
	return w, lines
}

// TestRenderHidesAndLogsInternalErrorsOnce: the client gets a bare 500; the
// cause is in exactly one log line, the request's.
func TestRenderHidesAndLogsInternalErrorsOnce(t *testing.T) {
	t.Parallel()
	w, logs := serve(t, func() error {
		return fmt.Errorf("insert student: %w", errors.New(`relation "students" secret detail`))
	})
	require.Equal(t, http.StatusInternalServerError, w.Code)
	require.Equal(t, ProblemContentType, w.Header().Get("Content-Type"))
	require.JSONEq(t, `{"type":"/problems/internal","title":"Internal server error","status":500}`, w.Body.String())
	require.Len(t, logs, 1, "one line per failure: %v", logs)
	require.Contains(t, logs[0], `"level":"ERROR"`)
	require.Contains(t, logs[0], `"status":500`)
	require.Contains(t, logs[0], "secret detail")
}

func TestRenderPanicIsA500LoggedOnce(t *testing.T) {
	t.Parallel()
	w, logs := serve(t, func() error { panic("boom") })
	require.Equal(t, http.StatusInternalServerError, w.Code)
	require.Equal(t, ProblemContentType, w.Header().Get("Content-Type"))
	require.NotContains(t, w.Body.String(), "boom")
	require.Len(t, logs, 1, "%v", logs)
	require.Contains(t, logs[0], "panic: boom")
}

// TestRenderDatabaseUnavailable: a database that is down or too slow is a
// 503 the caller may retry, saying no more than that; the request's one log
// line keeps the cause.
func TestRenderDatabaseUnavailable(t *testing.T) {
	t.Parallel()
	cause := errors.New("failed to connect to `user=app database=users`: 10.0.0.7:5432: connection refused")
	w, logs := serve(t, func() error {
		return database.Classify(fmt.Errorf("get user: %w",
			&pgconn.PgError{Severity: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"}))
	})
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.Equal(t, "1", w.Header().Get("Retry-After"))
	require.JSONEq(t, `{"type":"/problems/unavailable","title":"Service unavailable","status":503,
		"detail":"the database is unavailable or did not answer in time; retry later"}`, w.Body.String())
	require.Len(t, logs, 1)
	require.Contains(t, logs[0], `"status":503`)
	require.Contains(t, logs[0], "database unavailable: get user: FATAL: terminating connection due to administrator command (SQLSTATE 57P01)")

	w, logs = serve(t, func() error { return fmt.Errorf("%w: %w", database.ErrUnavailable, cause) })
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.NotContains(t, w.Body.String(), "10.0.0.7")
	require.Contains(t, logs[0], "10.0.0.7:5432: connection refused")
}

// TestReadyzNamesTheDependency: when the database does not answer, /readyz
// says so in its body, so that whoever reads it knows where to look.
func TestReadyzNamesTheDependency(t *testing.T) {
	t.Parallel()
	r := NewRouter(slog.New(slog.DiscardHandler), func(context.Context) error { return errors.New("dial tcp 10.0.0.7:5432: refused") })
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.Equal(t, "1", w.Header().Get("Retry-After"))
	require.JSONEq(t, `{"type":"/problems/unavailable","title":"Service unavailable","status":503,
		"detail":"database: not reachable","dependencies":{"database":"down"}}`, w.Body.String())

	r = NewRouter(slog.New(slog.DiscardHandler), func(context.Context) error { return nil })
	w = httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	require.Equal(t, http.StatusOK, w.Code)
	require.JSONEq(t, `{"status":"ready"}`, w.Body.String())
}

func TestRenderUnavailableLogsItsCause(t *testing.T) {
	t.Parallel()
	w, logs := serve(t, func() error { return Unavailable("the database is not reachable", errors.New("dial tcp: refused")) })
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.NotContains(t, w.Body.String(), "refused")
	require.Len(t, logs, 1)
	require.Contains(t, logs[0], "dial tcp: refused")
}

// TestRenderDomainErrors: the errors of the packages that know nothing of
// HTTP become their problems here, and a 4xx is not logged as a failure.
func TestRenderDomainErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		err        error
		status     int
		typ        string
		fields     []string
		retryAfter string
	}{
		{name: "invalid person", err: &person.InvalidError{Fields: []person.FieldError{{Field: "name", Detail: "required"}, {Field: "email", Detail: "required"}}},
			status: 400, typ: TypeValidation, fields: []string{"name", "email"}},
		{name: "key reused", err: fmt.Errorf("create: %w", &inbox.MismatchError{Fields: []string{"email"}}),
			status: 422, typ: TypeIdempotencyMismatch, fields: []string{"email"}},
		{name: "key in progress", err: inbox.ErrKeyInProgress, status: 409, typ: TypeIdempotencyBusy, retryAfter: "1"},
		{name: "conflict in progress", err: fmt.Errorf("%w: lock timeout", inbox.ErrConflictInProgress), status: 503, typ: TypeUnavailable, retryAfter: "1"},
		{name: "retry after rounds up", err: &Problem{Type: TypeIdempotencyBusy, Title: "Busy", Status: 409, RetryAfter: 1500 * time.Millisecond},
			status: 409, typ: TypeIdempotencyBusy, retryAfter: "2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w, logs := serve(t, func() error { return tt.err })
			require.Equal(t, tt.status, w.Code)
			require.Equal(t, ProblemContentType, w.Header().Get("Content-Type"))
			require.Contains(t, w.Body.String(), `"type":"`+tt.typ+`"`)
			for _, f := range tt.fields {
				require.Contains(t, w.Body.String(), `"field":"`+f+`"`)
			}
			require.Equal(t, tt.retryAfter, w.Header().Get("Retry-After"))
			if tt.status < 500 {
				require.Empty(t, logs, "a client's mistake is logged at debug level only")
			}
		})
	}
}

func TestProblemBodyIsNotHTMLEscaped(t *testing.T) {
	t.Parallel()
	require.JSONEq(t, `{"type":"/problems/validation","title":"Invalid request","status":400,
		"detail":"document_number: may hold only letters & digits",
		"errors":[{"field":"document_number","detail":"may hold only letters & digits"}]}`,
		string(Field("document_number", "may hold only letters & digits").Body()))
	require.Contains(t, string(Field("x", "a & b").Body()), "a & b")
}

func TestUnknownRouteAndMethodAreProblems(t *testing.T) {
	t.Parallel()
	r := NewRouter(slog.New(slog.DiscardHandler), func(context.Context) error { return nil })
	r.Post("/x", Handle(func(http.ResponseWriter, *http.Request) error { return nil }))
	r.Get("/x", Handle(func(w http.ResponseWriter, _ *http.Request) error {
		return WriteJSON(w, http.StatusOK, map[string]string{"x": "y"})
	}))
	// A static route beside a pattern it also matches, as the sender's
	// POST /outbox/redrive beside GET /outbox/{id}: its Allow is its own.
	noop := Handle(func(http.ResponseWriter, *http.Request) error { return nil })
	r.Get("/outbox/{id}", noop)
	r.Post("/outbox/{id}/redrive", noop)
	r.Post("/outbox/redrive", noop)
	for _, tt := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{http.MethodGet, "/nowhere", 404, ""}, {http.MethodDelete, "/x", 405, "GET, HEAD, POST"}, {http.MethodPost, "/healthz", 405, "GET, HEAD"},
		{http.MethodPut, "/outbox/redrive", 405, "POST"}, {http.MethodPut, "/outbox/7", 405, "GET, HEAD"},
		{http.MethodGet, "/outbox/7/redrive", 405, "POST"},
	} {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(tt.method, tt.path, nil))
		require.Equal(t, tt.status, w.Code)
		require.Equal(t, ProblemContentType, w.Header().Get("Content-Type"))
		require.Equal(t, tt.allow, w.Header().Get("Allow"), "%s %s", tt.method, tt.path)
	}
}

// TestHeadWhereverGet: HEAD is answered by the GET route, without a body.
func TestHeadWhereverGet(t *testing.T) {
	t.Parallel()
	r := NewRouter(slog.New(slog.DiscardHandler), func(context.Context) error { return nil })
	srv := httptest.NewServer(r)
	defer srv.Close()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodHead, srv.URL+"/healthz", http.NoBody)
	require.NoError(t, err)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
}

// TestWriteOutcome: a stored success is JSON, a stored refusal a problem,
// and a replay says so.
func TestWriteOutcome(t *testing.T) {
	t.Parallel()
	created, err := Answer(http.StatusCreated, map[string]string{"id": "x"}, [16]byte{1})
	require.NoError(t, err)
	w := httptest.NewRecorder()
	WriteOutcome(w, created, false, "/things/")
	require.Equal(t, "application/json", w.Header().Get("Content-Type"))
	require.Equal(t, "/things/01000000-0000-0000-0000-000000000000", w.Header().Get("Location"))
	require.Empty(t, w.Header().Get(ReplayedHeader))

	w = httptest.NewRecorder()
	WriteOutcome(w, Refusal(DocumentTaken("taken")), true, "/things/")
	require.Equal(t, http.StatusConflict, w.Code)
	require.Equal(t, ProblemContentType, w.Header().Get("Content-Type"))
	require.Equal(t, "true", w.Header().Get(ReplayedHeader))
	require.Empty(t, w.Header().Get("Location"))
}

// TestClientGoneIsNotAnError: work cut short because the client hung up is
// logged once, at info and marked, not as a server error to alert on; a
// cancellation while the client is still there stays an error.
func TestClientGoneIsNotAnError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		hangUp    bool
		wantLevel string
	}{
		{"client hung up", true, `"level":"INFO"`},
		{"client still there", false, `"level":"ERROR"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			r := NewRouter(slog.New(slog.NewJSONHandler(&logs, nil)), func(context.Context) error { return nil })
			r.Post("/x", Handle(func(http.ResponseWriter, *http.Request) error {
				return fmt.Errorf("begin transaction: %w", context.Canceled)
			}))
			ctx, cancel := context.WithCancel(context.Background())
			if tc.hangUp {
				cancel()
			} else {
				defer cancel()
			}
			r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequestWithContext(ctx, http.MethodPost, "/x", nil))
			lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
			require.Len(t, lines, 1, "%v", lines)
			require.Contains(t, lines[0], tc.wantLevel)
			require.Contains(t, lines[0], "begin transaction: context canceled")
			require.Equal(t, tc.hangUp, strings.Contains(lines[0], `"client_gone":true`))
		})
	}
}
