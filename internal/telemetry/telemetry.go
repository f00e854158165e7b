// Package telemetry turns on OpenTelemetry tracing for the three processes
// when the standard OTEL_* variables ask for it, and carries the W3C trace
// context across the places an operation leaves a process: HTTP requests
// (Middleware, Inject) and the outbox row (TraceParent, FromTraceParent),
// so that one trace shows one student's whole life, from POST /students
// through every delivery attempt to Users' inbox transaction.
//
// With tracing off, the global OpenTelemetry providers stay the no-op ones:
// spans cost next to nothing, nothing is exported and no goroutine runs.
package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// instrumentation names the spans' origin; one name for the project, since
// the service name already tells the processes apart.
const instrumentation = "github.com/outboxref/outboxref"

// errorLogEvery bounds how often export errors are logged: with the
// collector down, every batch fails, and the log must stay readable.
const errorLogEvery = time.Minute

// Enabled reports whether the variables ask for tracing: an OTLP endpoint
// is set and the SDK is not disabled.
func Enabled(getenv func(string) string) bool {
	if getenv("OTEL_SDK_DISABLED") == "true" {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup turns tracing on when Enabled: spans are batched and exported over
// OTLP/HTTP, the exporter reading the standard OTEL_EXPORTER_OTLP_* (and
// the batcher OTEL_BSP_*) variables itself. service is the service.name
// unless OTEL_SERVICE_NAME overrides it. Export errors go to log, at most
// once a minute. shutdown flushes the spans still queued; it is a no-op
// when tracing is off.
func Setup(ctx context.Context, log *slog.Logger, service string, getenv func(string) string) (shutdown func(context.Context) error, err error) {
	if !Enabled(getenv) {
		return func(context.Context) error { return nil }, nil
	}
	if name := getenv("OTEL_SERVICE_NAME"); name != "" {
		service = name
	}
	exporter, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx, resource.WithTelemetrySDK(), resource.WithSchemaURL(semconv.SchemaURL),
		resource.WithAttributes(semconv.ServiceName(service)))
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	otel.SetErrorHandler(&pacedErrors{log: log, every: errorLogEvery})
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	log.Info("tracing on", slog.String("service_name", service))
	return func(ctx context.Context) error {
		if err := tp.Shutdown(ctx); err != nil {
			return fmt.Errorf("tracing: flush: %w", err)
		}
		return nil
	}, nil
}

// pacedErrors logs OpenTelemetry's errors (failed exports, mostly) at most
// once per interval, with how many were left unlogged since: a missing
// collector must not flood the log.
type pacedErrors struct {
	log        *slog.Logger
	every      time.Duration
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (p *pacedErrors) Handle(err error) {
	p.mu.Lock()
	now := time.Now()
	if !p.last.IsZero() && now.Sub(p.last) < p.every {
		p.suppressed++
		p.mu.Unlock()
		return
	}
	suppressed := p.suppressed
	p.last, p.suppressed = now, 0
	p.mu.Unlock()
	p.log.Warn("tracing: export failed; spans are dropped until the collector answers",
		slog.String("error", err.Error()), slog.Int("unlogged_since_last", suppressed))
}

// Tracer is the project's tracer, from the global provider: a no-op one
// while tracing is off.
func Tracer() trace.Tracer { return otel.Tracer(instrumentation) }

// TraceParent is the W3C traceparent of ctx's span, to store with work that
// continues later (the outbox row), or "" when ctx holds no valid span
// (tracing off, or the span was not sampled: then nothing would continue
// it).
func TraceParent(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || !sc.IsSampled() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return carrier.Get("traceparent")
}

// FromTraceParent returns ctx with the remote span context traceparent
// names, so that a span started from it continues that trace; ctx as it is
// when traceparent is empty or malformed, and a span started from it is
// then a new trace's root.
func FromTraceParent(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent})
}

// Inject writes ctx's trace context into h (traceparent), for the next
// process to continue; nothing while tracing is off.
func Inject(ctx context.Context, h http.Header) {
	otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(h))
}
