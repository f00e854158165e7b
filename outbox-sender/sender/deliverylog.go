package sender

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/outboxref/outboxref/outbox-sender/internal/outboxdb"
)

// deliveryAttrs names one delivery attempt in every log line about it. The
// idempotency key follows the operation into Users' logs (Idempotency-Key,
// and X-Request-Id below); the outbox id and student id find the row and
// the student in Student's database.
func deliveryAttrs(row outboxdb.ClaimDueRow) []slog.Attr {
	return []slog.Attr{
		slog.String("idempotency_key", row.IdempotencyKey.String()),
		slog.Int64("outbox_id", row.ID),
		slog.String("student_id", row.StudentID.String()),
		slog.Int("attempt", int(row.Attempts)),
	}
}

// requestID is the X-Request-Id the sender sends with an attempt: Users'
// request log line carries it, so a grep for the key finds every attempt
// of the operation in Users' logs, and the suffix tells them apart. It
// stays within what Users accepts as a request id (1-128 characters of
// [A-Za-z0-9._:/-]): a UUID, a slash and a number.
func requestID(row outboxdb.ClaimDueRow) string {
	return row.IdempotencyKey.String() + "/" + strconv.Itoa(int(row.Attempts))
}

// attempt delivers one row and logs the attempt at debug level: the
// sender's line about each delivery, next to Users' request line with the
// same X-Request-Id.
func (s *Sender) attempt(ctx context.Context, row outboxdb.ClaimDueRow) result {
	start := time.Now()
	r := s.deliver(ctx, row)
	if !s.log.Enabled(ctx, slog.LevelDebug) {
		return r
	}
	attrs := append(deliveryAttrs(row), slog.String("verdict", r.verdict.String()))
	if r.status != 0 { // 0: no answer (or never sent, for an expired row)
		attrs = append(attrs, slog.Int("status", r.status))
	}
	attrs = append(attrs, slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000))
	if r.class != "" {
		attrs = append(attrs, slog.String("reason_class", r.class), slog.String("error", r.err))
	}
	s.log.LogAttrs(ctx, slog.LevelDebug, "delivery", attrs...)
	return r
}
