package telemetry

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine outlives them: tracing
// left off must start none.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestEnabled(t *testing.T) {
	for _, tc := range []struct {
		vars map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://jaeger:4318/v1/traces"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318", "OTEL_SDK_DISABLED": "true"}, false},
		{map[string]string{"OTEL_SERVICE_NAME": "x"}, false},
	} {
		require.Equal(t, tc.want, Enabled(env(tc.vars)), "%v", tc.vars)
	}
}

// Off, Setup touches nothing global and starts nothing (TestMain checks
// the goroutines).
func TestSetupOff(t *testing.T) {
	var logs bytes.Buffer
	shutdown, err := Setup(context.Background(), slog.New(slog.NewJSONHandler(&logs, nil)), "student",
		env(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"}))
	require.NoError(t, err)
	require.NoError(t, shutdown(context.Background()))
	require.Empty(t, logs.String())
	require.Empty(t, TraceParent(context.Background()))
}

// recorder installs a recording provider and the W3C propagator for one
// test, as Setup does, and puts the no-op ones back afterwards.
func recorder(t *testing.T) *tracetest.SpanRecorder {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() {
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
		require.NoError(t, tp.Shutdown(context.Background()))
	})
	return rec
}

func attr(kvs []attribute.KeyValue, key string) attribute.Value {
	for _, kv := range kvs {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// The trace context survives the trip through a stored string: a span
// started from FromTraceParent(TraceParent(ctx)) is ctx's span's child.
func TestTraceParentRoundTrip(t *testing.T) {
	rec := recorder(t)
	ctx, parent := Tracer().Start(context.Background(), "POST /students")
	tp := TraceParent(ctx)
	parent.End()
	require.Regexp(t, `^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`, tp)

	later, end := StartDelivery(context.Background(), Delivery{
		Operation: "create-user", OutboxID: 7, StudentID: "s", IdempotencyKey: "k", Attempt: 2, TraceParent: tp,
	})
	h := http.Header{}
	Inject(later, h)
	end("retry", "users-unreachable", "POST /users: connection reset")

	spans := rec.Ended()
	require.Len(t, spans, 2)
	d := spans[1]
	require.Equal(t, "deliver create-user", d.Name())
	require.Equal(t, parent.SpanContext().TraceID(), d.SpanContext().TraceID())
	require.Equal(t, parent.SpanContext().SpanID(), d.Parent().SpanID())
	require.Equal(t, int64(2), attr(d.Attributes(), "attempt").AsInt64())
	require.Equal(t, int64(7), attr(d.Attributes(), "outbox.id").AsInt64())
	require.Equal(t, "retry", attr(d.Attributes(), "verdict").AsString())
	require.Equal(t, "users-unreachable", attr(d.Attributes(), "reason_class").AsString())
	require.Equal(t, codes.Error, d.Status().Code)
	require.Contains(t, h.Get("traceparent"), d.SpanContext().SpanID().String(), "Users gets the attempt's span as parent")
}

// A row stored without a trace context (tracing was off) starts a trace
// of its own.
func TestStartDeliveryWithoutTraceParent(t *testing.T) {
	rec := recorder(t)
	_, end := StartDelivery(context.Background(), Delivery{Operation: "create-user", Attempt: 1})
	end("delivered", "", "")
	spans := rec.Ended()
	require.Len(t, spans, 1)
	require.False(t, spans[0].Parent().IsValid())
	require.Equal(t, "none", attr(spans[0].Attributes(), "reason_class").AsString())
	require.Equal(t, codes.Unset, spans[0].Status().Code)
}

func TestMiddleware(t *testing.T) {
	rec := recorder(t)
	r := chi.NewRouter()
	r.Use(Middleware)
	r.Post("/users/{id}", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })

	const caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	req := httptest.NewRequest(http.MethodPost, "/users/42", strings.NewReader("{}"))
	req.Header.Set("traceparent", caller)
	r.ServeHTTP(httptest.NewRecorder(), req)
	r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/healthz", http.NoBody))
	r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/nowhere", http.NoBody))

	spans := rec.Ended()
	require.Len(t, spans, 2, "probes are not traced")
	s := spans[0]
	require.Equal(t, "POST /users/{id}", s.Name())
	require.Equal(t, "0af7651916cd43dd8448eb211c80319c", s.SpanContext().TraceID().String(), "the caller's trace continues")
	require.Equal(t, "b7ad6b7169203331", s.Parent().SpanID().String())
	require.Equal(t, int64(503), attr(s.Attributes(), "http.response.status_code").AsInt64())
	require.Equal(t, codes.Error, s.Status().Code)
	require.Equal(t, "GET", spans[1].Name(), "an unmatched route names no pattern")
	require.Equal(t, codes.Unset, spans[1].Status().Code, "a 404 is not the server's fault")
}

// A public API's request starts a trace of its own: the caller's
// traceparent is only linked, and a made-up method does not name a span.
func TestPublicMiddleware(t *testing.T) {
	rec := recorder(t)
	r := chi.NewRouter()
	r.Use(PublicMiddleware)
	var stored string
	r.Post("/students", func(w http.ResponseWriter, r *http.Request) {
		stored = TraceParent(r.Context())
		w.WriteHeader(http.StatusCreated)
	})

	const caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	req := httptest.NewRequest(http.MethodPost, "/students", strings.NewReader("{}"))
	req.Header.Set("traceparent", caller)
	r.ServeHTTP(httptest.NewRecorder(), req)
	odd := httptest.NewRequest("BREW", "/students", http.NoBody)
	r.ServeHTTP(httptest.NewRecorder(), odd)

	spans := rec.Ended()
	require.Len(t, spans, 2)
	s := spans[0]
	require.Equal(t, "POST /students", s.Name())
	require.False(t, s.Parent().IsValid(), "a new root, not the caller's child")
	require.NotEqual(t, "0af7651916cd43dd8448eb211c80319c", s.SpanContext().TraceID().String())
	require.Len(t, s.Links(), 1)
	require.Equal(t, "0af7651916cd43dd8448eb211c80319c", s.Links()[0].SpanContext.TraceID().String())
	require.Contains(t, stored, s.SpanContext().TraceID().String(), "the outbox row would carry our trace, not the caller's")
	require.Equal(t, "_OTHER", spans[1].Name())
}

// A collector that is down fails every export; the log gets one line a
// minute, not one per batch.
func TestPacedErrors(t *testing.T) {
	var logs bytes.Buffer
	p := &pacedErrors{log: slog.New(slog.NewJSONHandler(&logs, nil)), every: time.Hour}
	for range 100 {
		p.Handle(errors.New("connection refused"))
	}
	require.Equal(t, 1, strings.Count(logs.String(), "\n"))
	p.last = time.Now().Add(-2 * time.Hour)
	p.Handle(errors.New("connection refused"))
	require.Contains(t, logs.String(), `"unlogged_since_last":99`)
}
