package relay

import (
	"context"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/outbox-sender/internal/store"
)

// A Reply is an answer that came apart from its delivery (a broker
// transport's reply stream), judged by the transport as Deliver's answers
// are: Delivered links the student, Permanent dead-letters the row,
// anything else settles nothing (the row is published again when its wait
// ends). MessageID is the reply's own id, Key the operation's.
type Reply struct {
	MessageID, Key uuid.UUID
	Answer         Answer
}

// RecordReplies records a batch of replies in one transaction and returns
// what each did (store.ReplyOutcomes), in the batch's order; an error
// means none was recorded, and the replies should be read again later.
func (e *Engine) RecordReplies(ctx context.Context, replies []Reply) ([]string, error) {
	batch := make([]store.Reply, len(replies))
	for i, rp := range replies {
		a := rp.Answer
		r := store.Reply{MessageID: rp.MessageID, Key: rp.Key, UserID: a.UserID, Class: a.Class, Error: a.Error}
		switch a.Verdict {
		case Delivered:
			r.Outcome = delivered
		case Permanent:
			r.Outcome = dead
		}
		batch[i] = r
	}
	applied, err := e.store.ApplyReplies(ctx, e.cfg.Lease.Holder, batch)
	if err != nil {
		return nil, err
	}
	at := time.Now()
	outcomes := make([]string, len(applied))
	for i, a := range applied {
		outcomes[i] = a.Outcome
		e.metrics.replies.WithLabelValues(a.Outcome).Inc()
		// A reply that settled its row is a settlement like a recorded
		// delivery: the results, lag and attempts metrics count it alike.
		row := store.Row{ID: a.OutboxID, Attempts: a.Attempts, CreatedAt: a.CreatedAt}
		switch a.Outcome {
		case store.ReplyLinked:
			e.metrics.settled(delivered, "", row, at)
		case store.ReplyRefused:
			e.metrics.settled(dead, replies[i].Answer.Class, row, at)
		case store.ReplyConflict:
			e.metrics.settled(dead, outbox.ReasonConflict, row, at)
		}
		if e.log.Enabled(ctx, slog.LevelDebug) {
			e.log.LogAttrs(ctx, slog.LevelDebug, "reply",
				slog.String("idempotency_key", replies[i].Key.String()), slog.Int64("outbox_id", a.OutboxID),
				slog.String("reply_id", replies[i].MessageID.String()), slog.String("outcome", a.Outcome))
		}
	}
	return outcomes, nil
}

// ParkReply keeps a reply the transport could not read, for an operator
// (parked_replies in Student's database).
func (e *Engine) ParkReply(ctx context.Context, p store.ParkedReply) error {
	return e.store.ParkReply(ctx, p)
}
