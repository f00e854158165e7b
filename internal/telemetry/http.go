package telemetry

import (
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// untraced are the paths probes and scrapers ask every few seconds: a
// trace each would bury the operations' traces.
var untraced = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true}

// Middleware makes a server span of each request, continuing the caller's
// trace when the request carries a traceparent, and puts it in the
// request's context for the handlers (and the request log line) below. It
// must run first, before routing: the span is named "<METHOD> <route
// pattern>" once chi has matched the route, and just "<METHOD>" when none
// matched, so that names stay few.
func Middleware(next http.Handler) http.Handler { return serverSpans(next, false) }

// PublicMiddleware is Middleware for an API open to the internet: each
// request starts a trace of its own, and a traceparent it carries is only
// linked. A stranger must not choose our trace ids, hang our spans into
// someone else's trace, or turn sampling on.
func PublicMiddleware(next http.Handler) http.Handler { return serverSpans(next, true) }

func serverSpans(next http.Handler, public bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if untraced[r.URL.Path] {
			next.ServeHTTP(w, r)
			return
		}
		method := Method(r.Method)
		opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(semconv.HTTPRequestMethodKey.String(method), semconv.URLPath(r.URL.Path))}
		ctx := otel.GetTextMapPropagator().Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		if public {
			// The caller's context stays out of ctx altogether: even a
			// tracer that records nothing would hand it on, into the
			// outbox row.
			if caller := trace.SpanContextFromContext(ctx); caller.IsValid() {
				opts = append(opts, trace.WithLinks(trace.Link{SpanContext: caller}))
			}
			ctx = r.Context()
		}
		ctx, span := Tracer().Start(ctx, method, opts...)
		defer span.End()
		if !span.IsRecording() { // tracing off, or not sampled: skip the bookkeeping
			next.ServeHTTP(w, r.WithContext(ctx))
			return
		}
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		next.ServeHTTP(ww, r.WithContext(ctx))
		status := ww.Status()
		if status == 0 { // nothing written: net/http answers 200
			status = http.StatusOK
		}
		if rc := chi.RouteContext(ctx); rc != nil {
			if route := rc.RoutePattern(); route != "" {
				span.SetName(method + " " + route)
				span.SetAttributes(semconv.HTTPRoute(route))
			}
		}
		span.SetAttributes(semconv.HTTPResponseStatusCode(status))
		if status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(status))
		}
	})
}

// Method is the request's method, or "_OTHER" (OpenTelemetry's name for
// it) when a client made it up: span names and metric labels stay few, so
// a client cannot add series at will.
func Method(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return m
	}
	return "_OTHER"
}
