package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Delivery is one attempt at delivering an outbox row.
type Delivery struct {
	Operation      string // "create-user": names the span
	OutboxID       int64
	StudentID      string
	IdempotencyKey string
	Attempt        int
	// TraceParent is the trace context stored with the row; "" starts a
	// new trace.
	TraceParent string
}

// StartDelivery starts the span of one delivery attempt, "deliver
// <operation>", as a child of the row's stored trace context: every
// attempt, however long after the row was written, joins the trace of the
// request that wrote it. end records the verdict and ends the span; a
// failure (retry or dead) marks it as an error with its reason.
func StartDelivery(ctx context.Context, d Delivery) (_ context.Context, end func(verdict, reasonClass, failure string)) {
	ctx, span := Tracer().Start(FromTraceParent(ctx, d.TraceParent), "deliver "+d.Operation,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.Int64("outbox.id", d.OutboxID),
			attribute.String("student.id", d.StudentID),
			attribute.String("idempotency_key", d.IdempotencyKey),
			attribute.Int("attempt", d.Attempt),
		))
	return ctx, func(verdict, reasonClass, failure string) {
		if reasonClass == "" {
			reasonClass = "none"
		}
		span.SetAttributes(attribute.String("verdict", verdict), attribute.String("reason_class", reasonClass))
		if failure != "" {
			span.SetStatus(codes.Error, failure)
		}
		span.End()
	}
}
