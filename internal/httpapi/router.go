package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxref/outboxref/internal/alarm"
	"github.com/outboxref/outboxref/internal/telemetry"
)

// NewRouter returns a router with what every HTTP server of the project
// shares: one log line per request, panics answered as 500 problems,
// problem+json for unknown routes and methods, repeated query parameters
// refused, a body nobody reads never waited for (closeUnreadBodies),
// /healthz, /readyz backed by ping, and the page of every problem type
// under /problems.
func NewRouter(log *slog.Logger, ping func(context.Context) error) chi.Router {
	return newRouter(log, ping, telemetry.Middleware)
}

// NewPublicRouter is NewRouter for an API open to the internet, such as
// Student's: its requests start traces of their own rather than continue
// whatever trace a caller claims (telemetry.PublicMiddleware).
func NewPublicRouter(log *slog.Logger, ping func(context.Context) error) chi.Router {
	return newRouter(log, ping, telemetry.PublicMiddleware)
}

// NewAdminRouter is NewRouter for an admin listener: it answers only the
// host names AllowHosts lets through (loopback, and those listed in the
// variable hostsVar).
func NewAdminRouter(log *slog.Logger, ping func(context.Context) error, hostsVar string, hosts []string) chi.Router {
	return newRouter(log, ping, telemetry.Middleware, AllowHosts(hostsVar, hosts))
}

func newRouter(log *slog.Logger, ping func(context.Context) error, traced func(http.Handler) http.Handler, more ...func(http.Handler) http.Handler) chi.Router {
	r := chi.NewRouter()
	// A body nobody reads must not hold the connection; this comes first
	// so that it is given the connection's own ResponseWriter, whose read
	// deadline it sets. The request's span comes next, so that everything
	// below, the log line included, runs inside it.
	r.Use(closeUnreadBodies, traced)
	// HEAD is answered wherever GET is (net/http drops the body).
	// A repeated query parameter is refused before routing, so no handler
	// can quietly take one of its values. The request id is assigned
	// before LogRequests, whose line carries it.
	r.Use(AssignRequestID, LogRequests(log), recoverPanics, middleware.GetHead, rejectRepeatedQuery)
	r.Use(more...)
	r.NotFound(notFound)
	r.MethodNotAllowed(methodNotAllowed(r))
	r.Get("/healthz", Handle(healthz))
	r.Get("/readyz", Handle(readyz(log, ping)))
	problemPages(r)
	return r
}

func notFound(w http.ResponseWriter, r *http.Request) {
	Render(w, r, NewProblem(TypeNotFound, "no route for "+r.Method+" "+r.URL.Path))
}

// methodNotAllowed answers 405 with the Allow header RFC 9110 asks for:
// the methods routes has for the path.
func methodNotAllowed(routes chi.Routes) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// A path that is a route of its own (POST /outbox/redrive) allows
		// that route's methods only, though other methods of it would
		// match a pattern (GET /outbox/{id}): the resource is the static
		// route, and the Allow header must say how to use it.
		static := map[string]bool{}
		_ = chi.Walk(routes, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
			if route == r.URL.Path {
				static[method] = true
			}
			return nil
		})
		var allow []string
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
			switch {
			case len(static) > 0:
				if static[m] || m == http.MethodHead && static[http.MethodGet] {
					allow = append(allow, m)
				}
			case routes.Match(chi.NewRouteContext(), m, r.URL.Path) ||
				m == http.MethodHead && routes.Match(chi.NewRouteContext(), http.MethodGet, r.URL.Path):
				allow = append(allow, m)
			}
		}
		w.Header().Set("Allow", strings.Join(allow, ", "))
		Render(w, r, NewProblem(TypeMethodNotAllowed,
			r.Method+" is not supported on "+r.URL.Path+"; allowed: "+strings.Join(allow, ", ")))
	}
}

// healthz answers 200 while the process is up.
func healthz(w http.ResponseWriter, _ *http.Request) error {
	return WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz answers 200 when ping (the database, the one dependency) succeeds
// within two seconds, and otherwise a 503 naming the dependency that is
// down, so that whoever reads it knows where to look. The cause is logged
// at warn level at most once a minute, with the number of failed probes:
// an orchestrator probes every few seconds, and while the database is down
// each probe fails alike.
// NotReadyError is a readiness probe's failure that names what is not ready,
// other than the database: /readyz says which, in a fixed sentence. Any
// other error from the probe is the database's.
type NotReadyError struct {
	Dependency string // the key in the 503's dependencies: "broker"
	Says       string // what is wrong, fixed text (no error's details)
	Err        error
}

func (e *NotReadyError) Error() string { return e.Dependency + ": " + e.Says + ": " + e.Err.Error() }
func (e *NotReadyError) Unwrap() error { return e.Err }

func readyz(log *slog.Logger, ping func(context.Context) error) HandlerFunc {
	var paced alarm.Alarm
	return func(w http.ResponseWriter, r *http.Request) error {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		err := ping(ctx)
		if nr, ok := errors.AsType[*NotReadyError](err); ok {
			if n, ok := paced.Ring(time.Now(), time.Minute); ok {
				log.LogAttrs(r.Context(), slog.LevelWarn, "not ready: "+nr.Dependency+": "+nr.Says,
					slog.Int("failed_probes", n), slog.String("error", nr.Err.Error()))
			}
			p := Unavailable(nr.Dependency+": "+nr.Says, err)
			p.Dependencies = map[string]string{nr.Dependency: "down"}
			p.Logged = true
			return p
		}
		if err != nil {
			if n, ok := paced.Ring(time.Now(), time.Minute); ok {
				log.LogAttrs(r.Context(), slog.LevelWarn, "not ready: the database is not reachable",
					slog.Int("failed_probes", n), slog.String("error", err.Error()))
			}
			p := Unavailable("database: not reachable", fmt.Errorf("ping database: %w", err))
			p.Dependencies = map[string]string{"database": "down"}
			p.Logged = true
			return p
		}
		return WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	}
}

// WriteJSON sends v with the given (success) status. It encodes before
// writing anything, so an encoding failure can still be answered by Render.
func WriteJSON(w http.ResponseWriter, status int, v any) error {
	body, err := jsonBody(v)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
	return nil
}

func jsonBody(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode answer: %w", err)
	}
	return b, nil
}

// recoverPanics answers a panicking handler with a 500 problem and hands the
// panic to the request's log line. http.ErrAbortHandler is re-raised: it is
// net/http's way to abort a response on purpose.
func recoverPanics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if err, ok := v.(error); ok && errors.Is(err, http.ErrAbortHandler) {
				panic(v)
			}
			Render(w, r, fmt.Errorf("panic: %v\n%s", v, debug.Stack()))
		}()
		next.ServeHTTP(w, r)
	})
}

// requestLog is what a request's log line collects while it runs: the
// error behind a 5xx, and the authenticated caller (see Authenticate).
type requestLog struct {
	err    error
	caller string
}

type requestLogKey struct{}

// noteError attaches err to the request's log line.
func noteError(r *http.Request, err error) {
	if rl, ok := r.Context().Value(requestLogKey{}).(*requestLog); ok {
		rl.err = err
	}
}

// noteCaller attaches the authenticated caller to the request's log line.
func noteCaller(r *http.Request, caller string) {
	if rl, ok := r.Context().Value(requestLogKey{}).(*requestLog); ok {
		rl.caller = caller
	}
}

// LogRequests logs one line per request when it ends: at debug level, or
// at error level with the cause for a 5xx (at info, marked client_gone,
// when the 5xx is the client's own hang-up). It is the only place a failed
// request is logged. The line carries the request id (AssignRequestID) and,
// when the request is traced, the trace id, so that one request can be
// followed into the caller's log and into its trace.
func LogRequests(log *slog.Logger) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			rl := &requestLog{}
			sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
			next.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), requestLogKey{}, rl)))
			level := slog.LevelDebug
			attrs := []slog.Attr{
				slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Int("status", sw.status),
				slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
			}
			if id := RequestIDFrom(r.Context()); id != "" {
				attrs = append(attrs, slog.String("request_id", id))
			}
			// The span is the one the tracing middleware, outside this
			// one, started for the request: its trace id leads from this
			// line to the whole operation's trace.
			if sc := trace.SpanContextFromContext(r.Context()); sc.IsValid() {
				attrs = append(attrs, slog.String("trace_id", sc.TraceID().String()))
			}
			if rl.caller != "" {
				attrs = append(attrs, slog.String("caller", rl.caller))
			}
			if sw.status >= 500 {
				level = slog.LevelError
				var p *Problem
				switch {
				case errors.As(rl.err, &p) && p.Logged:
					level = slog.LevelDebug
				case errors.As(rl.err, &p) && p.Expected:
					level = slog.LevelWarn
				}
				if rl.err != nil {
					attrs = append(attrs, slog.String("error", describe(rl.err)))
				}
				// A client that hung up cancels the request's context, and
				// the work it cut short fails with it. That is the client's
				// choice, not a server fault to alert on; the line still
				// says what was cut short.
				if errors.Is(rl.err, context.Canceled) && errors.Is(r.Context().Err(), context.Canceled) {
					level = slog.LevelInfo
					attrs = append(attrs, slog.Bool("client_gone", true))
				}
			}
			log.LogAttrs(r.Context(), level, "http request", attrs...)
		})
	}
}

// describe is an error's message, with a problem's hidden cause added.
func describe(err error) string {
	var p *Problem
	if errors.As(err, &p) && p.Cause != nil {
		return err.Error() + ": " + p.Cause.Error()
	}
	return err.Error()
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
