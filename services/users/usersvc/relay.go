package usersvc

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/services/users/internal/store"
)

// relay publishes Users' outbox (the answers to commands) to the reply
// stream through the sender's publish step (natsbus.Publish), so with its
// discipline: each answer's message id as Nats-Msg-Id, its key as
// Idempotency-Key, marked published only once the broker acknowledged
// it. An answer published but not marked (the process died in between)
// is published again, and JetStream's window or the sender's reply inbox
// filters it.
type relay struct {
	log     *slog.Logger
	store   *store.Store
	metrics *metrics
	js      jetstream.JetStream
	// wake is kicked after each command's commit; poll finds what another
	// Users committed, or what a crash or a broker outage left.
	wake <-chan struct{}
	poll time.Duration
	// batch bounds the answers of one claim, published together.
	batch int32
}

// relayBatch is how many answers one claim publishes at most.
const relayBatch = 100

// relayPoll is how often the relay looks for answers nobody woke it for.
const relayPoll = time.Second

// run relays until ctx ends, then relays once more what the commands
// finished meanwhile left, for a moment.
func (r *relay) run(ctx context.Context) {
	warn := pacedWarn(r.log, 30*time.Second)
	tick := time.NewTicker(r.poll)
	defer tick.Stop()
	backoff := time.Duration(0)
	for ctx.Err() == nil {
		claimed, err := r.once(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			msg := "broker: relaying answers failed; they wait in Users' outbox"
			if natsbus.StreamFull(err) {
				msg = "broker: the reply stream is full; answers wait in Users' outbox until the sender reads replies"
			}
			warn(msg, err)
			backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			continue
		case claimed == int(r.batch):
			backoff = 0
			continue // more may be waiting
		}
		backoff = 0
		select {
		case <-ctx.Done():
		case <-r.wake:
		case <-tick.C:
		}
	}
	last, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
	defer cancel()
	if _, err := r.once(last); err != nil {
		r.log.Warn("broker: relaying answers at shutdown failed; they wait in Users' outbox", slog.String("error", err.Error()))
	}
}

// once relays one batch and returns how many answers it claimed.
func (r *relay) once(ctx context.Context) (int, error) {
	claimed, published, err := r.store.RelayAnswers(ctx, r.batch, r.publish)
	r.metrics.published.Add(float64(published))
	return claimed, err
}

// publish publishes answers at once, the way the sender publishes its
// commands (natsbus.Publish), and waits for the broker's
// acknowledgements (bounded by the relay's transaction); it returns the
// ids of those acknowledged.
func (r *relay) publish(ctx context.Context, answers []store.Answer) ([]int64, error) {
	msgs := make([]natsbus.Message, len(answers))
	for i, a := range answers {
		msgs[i] = natsbus.Message{Subject: a.Subject, ID: a.MessageID.String(), Key: a.Key.String(), Data: a.Payload}
		if a.TraceParent != "" {
			msgs[i].Header = nats.Header{}
			natsbus.HTTPHeader(msgs[i].Header).Set("traceparent", a.TraceParent)
		}
	}
	var ids []int64
	var err error
	for i, ack := range natsbus.Publish(ctx, r.js, natsbus.ReplyStream, msgs) {
		if ack.Err != nil {
			err = errors.Join(err, ack.Err)
			continue
		}
		ids = append(ids, answers[i].ID)
	}
	return ids, err
}

// countUnpublished sets users_answers_unpublished every poll until ctx
// ends: the answers waiting, from every Users process, however the
// broker is doing.
func (r *relay) countUnpublished(ctx context.Context) {
	tick := time.NewTicker(r.poll)
	defer tick.Stop()
	for {
		if n, err := r.store.UnpublishedAnswers(ctx); err == nil {
			r.metrics.unpublished.Set(float64(n))
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
