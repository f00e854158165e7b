package inbox

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxref/outboxref/internal/telemetry"
)

// startSpan starts the span of a call of Do, a child of
// the request's span: in a delivery's trace it shows whether Users ran the
// operation or replayed its stored answer. The inbox knows no operation
// names, only keys, so every inbox span has the same name.
func startSpan(ctx context.Context, key Key) (context.Context, trace.Span) {
	return telemetry.Tracer().Start(ctx, "inbox transaction",
		trace.WithAttributes(attribute.String("idempotency_key", key.Value), attribute.String("inbox.caller", key.Caller)))
}

// endSpan records how Do ended and ends its span.
func endSpan(span trace.Span, out Outcome, replayed bool, err error) {
	outcome := "error"
	if r, ok := ResultOf(replayed, err); ok {
		outcome = string(r)
	}
	span.SetAttributes(attribute.Bool("replayed", replayed), attribute.String("outcome", outcome))
	if err == nil {
		span.SetAttributes(attribute.Int("inbox.status", out.Status))
	}
	if outcome == "error" {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
