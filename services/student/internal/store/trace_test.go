package store

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/internal/person"
	"github.com/outboxref/outboxref/internal/telemetry"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// The outbox row keeps the trace context of the request that wrote it, so
// the sender can continue that trace; untraced, it keeps none. With a
// client key the row is written inside the inbox's span, and still keeps
// the request's context, so that keyed and unkeyed operations' deliveries
// hang from the same place in their traces. Not parallel: it sets the
// global tracer provider the inbox's span is started from.
func TestOutboxRowKeepsTraceParent(t *testing.T) {
	admin := pgtest.Pool(t, migrations.Student)
	s := New(pgtest.As(t, admin, migrations.StudentApp), time.Second, 5*time.Second)
	answer := func(st Student, err error) (inbox.Outcome, error) {
		return inbox.Outcome{Status: http.StatusCreated, Body: []byte(`{}`), ResourceID: st.ID}, err
	}
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { require.NoError(t, tp.Shutdown(context.Background())) })
	previous := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(previous) })
	traced, span := tp.Tracer("test").Start(context.Background(), "POST /students")
	defer span.End()

	for _, tc := range []struct {
		ctx  context.Context
		key  string
		doc  string
		want *string
	}{
		{traced, "", "111-1", new(telemetry.TraceParent(traced))},
		{traced, "client-key-1", "333-3", new(telemetry.TraceParent(traced))},
		{context.Background(), "", "222-2", nil},
	} {
		out, _, err := s.CreateStudent(tc.ctx, "client", tc.key, person.Person{Name: "Ada", Email: "ada@example.com", DocumentNumber: tc.doc}, answer)
		require.NoError(t, err)
		var got *string
		require.NoError(t, admin.QueryRow(context.Background(),
			"SELECT trace_parent FROM outbox WHERE student_id = $1", out.ResourceID).Scan(&got))
		require.Equal(t, tc.want, got, "document %s", tc.doc)
	}
	require.NotEmpty(t, telemetry.TraceParent(traced))
}
