package relay

import (
	"context"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/outbox-sender/internal/store"
)

// RecordReply records an answer that came apart from its delivery (a
// broker transport's reply stream), judged by the transport as Deliver's
// answers are: Delivered links the student, Permanent dead-letters the
// row, anything else settles nothing (the row is published again when its
// wait ends). messageID is the reply's own id, key the operation's. It
// returns what the reply did (store.ReplyOutcomes); an error means nothing
// was recorded and the reply should be read again later.
func (e *Engine) RecordReply(ctx context.Context, messageID, key uuid.UUID, a Answer) (string, error) {
	r := store.Reply{MessageID: messageID, Key: key, UserID: a.UserID, Class: a.Class, Error: a.Error}
	switch a.Verdict {
	case Delivered:
		r.Outcome = delivered
	case Permanent:
		r.Outcome = dead
	}
	applied, err := e.store.ApplyReply(ctx, e.cfg.Lease.Holder, r)
	if err != nil {
		return "", err
	}
	e.metrics.replies.WithLabelValues(applied.Outcome).Inc()
	// A reply that settled its row is a settlement like a recorded
	// delivery: the results, lag and attempts metrics count it alike.
	row := store.Row{ID: applied.OutboxID, Attempts: applied.Attempts, CreatedAt: applied.CreatedAt}
	switch applied.Outcome {
	case store.ReplyLinked:
		e.metrics.settled(delivered, "", row, time.Now())
	case store.ReplyRefused:
		e.metrics.settled(dead, a.Class, row, time.Now())
	case store.ReplyConflict:
		e.metrics.settled(dead, outbox.ReasonConflict, row, time.Now())
	}
	if e.log.Enabled(ctx, slog.LevelDebug) {
		e.log.LogAttrs(ctx, slog.LevelDebug, "reply",
			slog.String("idempotency_key", key.String()), slog.Int64("outbox_id", applied.OutboxID),
			slog.String("reply_id", messageID.String()), slog.String("outcome", applied.Outcome))
	}
	return applied.Outcome, nil
}

// ParkReply keeps a reply the transport could not read, for an operator
// (parked_replies in Student's database).
func (e *Engine) ParkReply(ctx context.Context, p natsbus.Parked) error {
	return e.store.ParkReply(ctx, p)
}
