package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"
)

// requestIDRouter is NewRouter with a route that answers 204 and one that
// fails with an internal error, logging as JSON into logs.
func requestIDRouter(logs *bytes.Buffer) http.Handler {
	r := NewRouter(slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), func(context.Context) error { return nil })
	r.Get("/ok", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	r.Get("/fail", Handle(func(http.ResponseWriter, *http.Request) error { return errors.New("boom") }))
	return r
}

// logLines decodes every JSON line in logs.
func logLines(t *testing.T, logs *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for l := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), "log line %q", l)
		out = append(out, m)
	}
	return out
}

func TestRequestIDIsTakenAndEchoed(t *testing.T) {
	t.Parallel()
	for _, id := range []string{
		"a",
		"0f8c3a5e-7b1d-4c2e-9a6f-3d2b1c0e9f8a/3", // the sender's "<key>/<attempt>"
		"svc.name:req_42-x",
		strings.Repeat("x", 128),
	} {
		t.Run(id[:min(len(id), 20)], func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			req := httptest.NewRequest(http.MethodGet, "/ok", nil)
			req.Header.Set(RequestIDHeader, id)
			w := httptest.NewRecorder()
			requestIDRouter(&logs).ServeHTTP(w, req)
			require.Equal(t, http.StatusNoContent, w.Code)
			require.Equal(t, id, w.Header().Get(RequestIDHeader))
			lines := logLines(t, &logs)
			require.Len(t, lines, 1)
			require.Equal(t, id, lines[0]["request_id"])
		})
	}
}

// TestRequestIDInvalidIsReplaced: an id that is missing, too long or holds
// characters outside the allowed set is replaced by a fresh random one, in
// the answer and in the log alike.
func TestRequestIDInvalidIsReplaced(t *testing.T) {
	t.Parallel()
	for name, id := range map[string]string{
		"missing":  "",
		"too long": strings.Repeat("x", 129),
		"space":    "a b",
		"quote":    `a"b`,
		"newline":  "a\nb",
		"unicode":  "ñ",
		"percent":  "a%20b",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			req := httptest.NewRequest(http.MethodGet, "/ok", nil)
			if id != "" {
				req.Header[RequestIDHeader] = []string{id}
			}
			w := httptest.NewRecorder()
			requestIDRouter(&logs).ServeHTTP(w, req)
			got := w.Header().Get(RequestIDHeader)
			require.NotEqual(t, id, got)
			_, err := uuid.Parse(got)
			require.NoError(t, err, "a generated id is a UUID: %q", got)
			lines := logLines(t, &logs)
			require.Len(t, lines, 1)
			require.Equal(t, got, lines[0]["request_id"])
		})
	}
}

func TestRequestIDsDifferPerRequest(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	h := requestIDRouter(&logs)
	seen := map[string]bool{}
	for range 5 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/ok", nil))
		seen[w.Header().Get(RequestIDHeader)] = true
	}
	require.Len(t, seen, 5)
}

// TestRequestLogHasTraceID: with a span in the request's context, as the
// tracing middleware puts there, the line names its trace; without one it
// has no trace_id at all rather than a zero one.
func TestRequestLogHasTraceID(t *testing.T) {
	t.Parallel()
	traceID := trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    traceID,
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	require.True(t, sc.IsValid())

	var logs bytes.Buffer
	h := requestIDRouter(&logs)
	req := httptest.NewRequest(http.MethodGet, "/ok", nil)
	h.ServeHTTP(httptest.NewRecorder(), req.WithContext(trace.ContextWithSpanContext(req.Context(), sc)))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/ok", nil))

	lines := logLines(t, &logs)
	require.Len(t, lines, 2)
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", lines[0]["trace_id"])
	require.NotContains(t, lines[1], "trace_id")
	require.NotEmpty(t, lines[1]["request_id"])
}

// TestRequestID5xxLoggedOnce: a failed request is one line, at error level,
// with its cause, its request id and its trace id.
func TestRequestID5xxLoggedOnce(t *testing.T) {
	t.Parallel()
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:  trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8},
	})
	var logs bytes.Buffer
	req := httptest.NewRequest(http.MethodGet, "/fail", nil)
	req.Header.Set(RequestIDHeader, "client-req-1")
	w := httptest.NewRecorder()
	requestIDRouter(&logs).ServeHTTP(w, req.WithContext(trace.ContextWithSpanContext(req.Context(), sc)))
	require.Equal(t, http.StatusInternalServerError, w.Code)
	require.Equal(t, "client-req-1", w.Header().Get(RequestIDHeader), "a failed answer names its request too")

	lines := logLines(t, &logs)
	require.Len(t, lines, 1, "one line per failure: %v", lines)
	require.Equal(t, "ERROR", lines[0]["level"])
	require.Equal(t, "http request", lines[0]["msg"])
	require.Equal(t, "boom", lines[0]["error"])
	require.Equal(t, "client-req-1", lines[0]["request_id"])
	require.Equal(t, sc.TraceID().String(), lines[0]["trace_id"])
}

func TestValidRequestID(t *testing.T) {
	t.Parallel()
	for id, want := range map[string]bool{
		"":                        false,
		"-":                       true,
		"A-Za-z0-9._:/-":          true,
		strings.Repeat("a", 128):  true,
		strings.Repeat("a", 129):  false,
		"a\tb":                    false,
		"a;b":                     false,
		"a,b":                     false,
		"\u00e9":                  false,
		"key/attempt=2":           false,
		"11111111-2222-3333-4444": true,
	} {
		require.Equal(t, want, validRequestID(id), "%q", id)
	}
}
