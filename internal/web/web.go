// Package web owns what the three binaries share about serving HTTP: strict
// JSON decoding that names the field at fault, JSON responses, health and
// readiness endpoints, structured logs and graceful shutdown.
package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/outboxref/outboxref/internal/problem"
)

// MaxBodyBytes bounds every request body; the services accept small JSON
// objects only.
const MaxBodyBytes = 16 << 10

// NewLogger returns a JSON logger; level is debug, info, warn or error.
func NewLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("LOG_LEVEL=%q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// DecodeJSON reads one JSON object from the body into dst, a pointer to a
// struct. Unknown fields (including a known name in another case, which
// encoding/json would quietly accept), repeated fields, trailing data, wrong
// types and oversized bodies are problems naming the field (or "body" when
// no field is to blame).
func DecodeJSON(w http.ResponseWriter, r *http.Request, dst any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return &problem.Error{
				Type: problem.TypeUnsupportedMediaType, Title: "Unsupported media type",
				Status: http.StatusUnsupportedMediaType, Detail: "send the body as application/json",
			}
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		return decodeProblem(err)
	}
	if err := checkKeys(body, jsonNames(dst)); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(dst); err != nil {
		return decodeProblem(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return problem.Field("body", "unexpected data after the JSON object")
	}
	return nil
}

// checkKeys walks the top level of a JSON object and rejects any key that
// is not exactly one of names, and any key given twice. Anything that is not
// an object is left to the decoder, which reports it precisely.
func checkKeys(body []byte, names []string) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		key, _ := tok.(string)
		switch {
		case !slices.Contains(names, key):
			return problem.Field(key, "unknown field")
		case seen[key]:
			return problem.Field(key, "given more than once")
		}
		seen[key] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	return nil
}

// jsonNames lists the JSON names of the fields of the struct dst points to.
func jsonNames(dst any) []string {
	t := reflect.TypeOf(dst).Elem()
	names := make([]string, 0, t.NumField())
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			name = f.Name
		}
		if name != "-" {
			names = append(names, name)
		}
	}
	return names
}

func decodeProblem(err error) error {
	var (
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
		maxErr    *http.MaxBytesError
	)
	switch {
	case errors.As(err, &maxErr):
		return problem.Field("body", fmt.Sprintf("larger than %d bytes", maxErr.Limit))
	case errors.Is(err, io.EOF):
		return problem.Field("body", "empty; want a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return problem.Field("body", "malformed JSON: ends too early")
	case errors.As(err, &syntaxErr):
		return problem.Field("body", fmt.Sprintf("malformed JSON at byte %d", syntaxErr.Offset))
	case errors.As(err, &typeErr):
		if typeErr.Field == "" {
			return problem.Field("body", "want a JSON object")
		}
		return problem.Field(typeErr.Field, "want a "+jsonKind(typeErr.Type.Kind().String()))
	}
	return problem.Field("body", "malformed JSON")
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "string"
	case "bool":
		return "boolean"
	case "struct", "map":
		return "object"
	case "slice", "array":
		return "array"
	}
	return "number"
}

// WriteJSON sends v with the given status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encode response", http.StatusInternalServerError)
		return
	}
	WriteRaw(w, status, b)
}

// WriteRaw sends an already encoded JSON body; error statuses are sent as
// problem details.
func WriteRaw(w http.ResponseWriter, status int, body []byte) {
	ct := "application/json"
	if status >= 400 {
		ct = problem.ContentType
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// HandlerFunc is an http.HandlerFunc that returns its error instead of
// writing it, so errors are rendered in one place.
type HandlerFunc func(w http.ResponseWriter, r *http.Request) error

// Handle adapts h, rendering any error it returns with problem.Write.
func Handle(log *slog.Logger, h HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			problem.Write(w, r, log, err)
		}
	}
}

// NewRouter returns a router with what every binary's HTTP server shares:
// panic recovery, request logs, problem+json for unknown routes and
// methods, /healthz, and /readyz backed by ping.
func NewRouter(log *slog.Logger, ping func(context.Context) error) chi.Router {
	r := chi.NewRouter()
	r.Use(middleware.Recoverer, LogRequests(log))
	r.NotFound(NotFound)
	r.MethodNotAllowed(MethodNotAllowed)
	r.Get("/healthz", Healthz)
	r.Get("/readyz", Readyz(log, ping))
	return r
}

// NotFound and MethodNotAllowed answer unknown routes with problem details,
// like every other error.
func NotFound(w http.ResponseWriter, r *http.Request) {
	problem.Write(w, r, slog.Default(), &problem.Error{
		Type: problem.TypeNotFound, Title: "Not found", Status: http.StatusNotFound,
		Detail: "no route for " + r.Method + " " + r.URL.Path,
	})
}

// MethodNotAllowed is NotFound's twin for a known path.
func MethodNotAllowed(w http.ResponseWriter, r *http.Request) {
	problem.Write(w, r, slog.Default(), &problem.Error{
		Type: problem.TypeMethodNotAllowed, Title: "Method not allowed", Status: http.StatusMethodNotAllowed,
		Detail: r.Method + " is not supported on " + r.URL.Path,
	})
}

// Healthz answers 200 while the process is up.
func Healthz(w http.ResponseWriter, _ *http.Request) {
	WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// Readyz answers 200 when ping succeeds within two seconds, 503 otherwise.
func Readyz(log *slog.Logger, ping func(context.Context) error) http.HandlerFunc {
	return Handle(log, func(w http.ResponseWriter, r *http.Request) error {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := ping(ctx); err != nil {
			log.WarnContext(ctx, "not ready", slog.String("error", err.Error()))
			return &problem.Error{Type: problem.TypeUnavailable, Title: "Not ready", Status: http.StatusServiceUnavailable,
				Detail: "the database is not reachable"}
		}
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
		return nil
	})
}

// LogRequests logs each request at debug level and each 5xx at error level.
func LogRequests(log *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
			next.ServeHTTP(sw, r)
			level := slog.LevelDebug
			if sw.status >= 500 {
				level = slog.LevelError
			}
			log.Log(r.Context(), level, "http request",
				slog.String("method", r.Method), slog.String("path", r.URL.Path),
				slog.Int("status", sw.status), slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000))
		})
	}
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ListenAndServe listens on addr and serves h until ctx ends (see Serve).
// The timeouts keep a slow or stuck client from holding a connection open.
func ListenAndServe(ctx context.Context, log *slog.Logger, addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	return Serve(ctx, log, srv, ln, 10*time.Second)
}

// Serve runs srv on ln until ctx ends, then shuts down gracefully: the
// listener closes at once and requests in flight get up to grace to finish.
func Serve(ctx context.Context, log *slog.Logger, srv *http.Server, ln net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("listening", slog.String("addr", ln.Addr().String()))
	select {
	case err := <-errc:
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down", slog.String("addr", ln.Addr().String()))
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("shutdown http: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve http: %w", err)
	}
	return nil
}
