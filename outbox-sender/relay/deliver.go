package relay

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/internal/telemetry"
	"github.com/outboxref/outboxref/outbox-sender/internal/store"
)

// attempt delivers one row, in a span of its own, and logs the attempt at
// debug level: the sender's line about each delivery, next to Users'
// request line with the same X-Request-Id.
func (e *Engine) attempt(ctx context.Context, row store.Row) store.Result {
	start := time.Now()
	// One span per attempt, continuing the trace stored with the row, so
	// that retries hours apart land in the trace of the request that wrote
	// it.
	ctx, endSpan := telemetry.StartDelivery(ctx, telemetry.Delivery{
		Operation: row.Operation, OutboxID: row.ID, StudentID: row.StudentID.String(),
		IdempotencyKey: row.IdempotencyKey.String(), Attempt: row.Attempts, TraceParent: row.TraceParent,
	})
	r, status := e.deliver(ctx, row)
	endSpan(r.Outcome, r.Class, r.Error)
	e.note(ctx, r)
	if !e.log.Enabled(ctx, slog.LevelDebug) {
		return r
	}
	attrs := append(RowAttrs(row), slog.String("verdict", r.Outcome))
	if status != 0 { // 0: no answer (or never sent, for an expired row)
		attrs = append(attrs, slog.Int("status", status))
	}
	attrs = append(attrs, slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000))
	if r.Class != "" {
		attrs = append(attrs, slog.String("reason_class", r.Class), slog.String("error", r.Error))
	}
	e.log.LogAttrs(ctx, slog.LevelDebug, "delivery", attrs...)
	return r
}

// deliver sends one row through the transport and turns the answer into
// the result to record. A row past its max age is dead-lettered unsent.
//
// A row whose lease has run out is handed back unsent. Another sender may
// hold it by now, and, more to the point, a sender that stalled (a paused
// process, a swapped-out machine) for longer than Users keeps keys
// (USERS_INBOX_RETENTION) would otherwise send a key Users has forgotten,
// and make a second user. The model checker found that run
// (docs/model.md); the check bounds every send to its claim's lease.
func (e *Engine) deliver(ctx context.Context, row store.Row) (store.Result, int) {
	if row.Expired {
		return store.Result{Row: row, Outcome: dead, Class: outbox.ReasonExpired,
			Error: fmt.Sprintf("gave up: the operation is older than SENDER_MAX_AGE=%s", e.cfg.Lease.MaxAge)}, 0
	}
	if lapsed(row.LeaseEnds, time.Now()) {
		e.log.LogAttrs(ctx, slog.LevelWarn, "lease ran out before the send: handed back unsent",
			append(RowAttrs(row), slog.Time("lease_ended", row.LeaseEnds))...)
		return store.Result{Row: row, Outcome: released, Lapsed: true}, 0
	}
	a := e.transport.Deliver(ctx, row)
	switch a.Verdict {
	case Delivered:
		return store.Result{Row: row, Outcome: delivered, UserID: a.UserID}, a.Status
	case Permanent:
		return store.Result{Row: row, Outcome: dead, Class: a.Class, Error: a.Error}, a.Status
	case Published:
		// The wait for the answer grows with the attempts, as a retry's
		// backoff does: a Users down for an hour is not sent the same
		// command every few seconds.
		return store.Result{Row: row, Outcome: published, Seq: a.Seq, Repeat: a.Repeat, Delay: max(e.backoff(row.Attempts), a.RetryAfter)}, a.Status
	case Unread:
		// Users is not reading (down, or far behind). Its answer comes
		// whenever it reads the command, whatever the row does meanwhile;
		// the row only needs to look again now and then, in case the
		// command is read and its answer lost. The wait doubles with the
		// time the command has waited unread, up to SENDER_BACKOFF_MAX.
		wait := max(min(row.PublishedAgo, e.cfg.BackoffMax), e.backoff(row.Attempts), a.RetryAfter)
		return store.Result{Row: row, Outcome: unread, Delay: wait}, 0
	}
	if a.Unsent {
		// Users cannot have seen it, so the cap on attempts does not
		// apply, and the attempt is not counted. The backoff, which
		// grows with the attempts, grows with the row's age instead, as
		// an unread command's wait does: a broker down for an hour is not
		// asked every second for every row.
		wait := max(e.jitter(min(max(ageOf(row, e.cfg.Lease.MaxAge), e.cfg.BackoffMin), e.cfg.BackoffMax)), min(max(a.RetryAfter, 0), e.cfg.BackoffMax))
		return store.Result{Row: row, Outcome: retry, Class: a.Class, Error: a.Error, Delay: wait, Unsent: true}, a.Status
	}
	// The other side cannot push a row past the sender's own limits.
	return e.retryOrDie(row, a.Class, a.Error, min(max(a.RetryAfter, 0), e.cfg.BackoffMax)), a.Status
}

// ageOf is how long the row's operation has run: since its creation or
// last redrive (its expiry less SENDER_MAX_AGE, by the database's clock),
// or since its creation when the claim did not say.
func ageOf(row store.Row, maxAge time.Duration) time.Duration {
	if row.ExpiresAt.IsZero() {
		return time.Since(row.CreatedAt)
	}
	return maxAge - time.Until(row.ExpiresAt)
}

// retryOrDie schedules another attempt with exponential backoff and jitter,
// or dead-letters the row once its attempts are used up. Refused
// credentials never use them up: the cap is a safety net for a row that
// keeps failing, and under a wrong token every row fails alike, so the cap
// would dead-letter the whole outbox over one configuration mistake.
// SENDER_MAX_AGE still applies to them (ScheduleRetries never schedules a
// retry past it): a refusal proves this attempt did nothing, not that no
// earlier one did, and Users remembers a key for USERS_INBOX_RETENTION only.
func (e *Engine) retryOrDie(row store.Row, class, why string, atLeast time.Duration) store.Result {
	if row.Attempts >= e.cfg.MaxAttempts && class != outbox.ReasonUsersAuthRefused {
		return store.Result{Row: row, Outcome: dead, Class: outbox.ReasonAttemptsExhausted,
			Error: fmt.Sprintf("gave up after %d attempts; last error (%s): %s", row.Attempts, class, why)}
	}
	return store.Result{Row: row, Outcome: retry, Class: class, Error: why, Delay: max(e.backoff(row.Attempts), atLeast)}
}

// backoff doubles from BackoffMin with each attempt up to BackoffMax, then
// keeps a random half of it ("equal jitter"): senders that failed together
// spread out instead of retrying in lockstep.
func (e *Engine) backoff(attempt int) time.Duration {
	d := e.cfg.BackoffMax
	// Shift only while it cannot overflow: past that the cap applies anyway.
	if shift := max(attempt-1, 0); shift < 62 && e.cfg.BackoffMin <= e.cfg.BackoffMax>>shift {
		d = e.cfg.BackoffMin << shift
	}
	return e.jitter(d)
}

// jitter keeps a random half of d.
func (e *Engine) jitter(d time.Duration) time.Duration { return d/2 + rand.N(d/2+1) }

// RowAttrs name one delivery attempt in every log line about it. The
// idempotency key follows the operation into Users' logs; the outbox id and
// student id find the row and the student in Student's database.
func RowAttrs(row store.Row) []slog.Attr {
	return []slog.Attr{
		slog.String("idempotency_key", row.IdempotencyKey.String()),
		slog.Int64("outbox_id", row.ID),
		slog.String("student_id", row.StudentID.String()),
		slog.Int("attempt", row.Attempts),
	}
}

// lapsed says whether a lease ending at ends has run out at now. Both
// clocks are asked: the monotonic one (which a wall clock set back cannot
// fool) and the wall clock (which, unlike the monotonic one on Linux, goes
// on while the machine is suspended). A zero ends is no lease known.
func lapsed(ends, now time.Time) bool {
	if ends.IsZero() {
		return false
	}
	return !now.Before(ends) || !now.Round(0).Before(ends.Round(0))
}
