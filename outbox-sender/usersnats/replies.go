package usersnats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/outbox-sender/answer"
	"github.com/outboxref/outboxref/outbox-sender/internal/store"
	"github.com/outboxref/outboxref/outbox-sender/relay"
)

// The reply side of the transport: Users' answers, read from the sender's
// durable consumer and recorded in batches.

// Replies reads Users' answers from the sender's durable consumer until
// ctx ends, and records each (rec), acknowledging it only once that
// committed: a reply read but not recorded is delivered again, and one
// recorded twice changes nothing the second time.
//
// A reader whose consumer went away (deleted, or re-created by a new
// provisioning) stops delivering; Replies then looks the consumer up again
// rather than leave the rows waiting as published with nobody reading
// their answers.
//
// A reader that could not start is started again too: while nobody reads
// the replies, Users goes on creating users whose rows the sender would
// end up dead-lettering as expired.
func (t *Transport) Replies(ctx context.Context, rec Recorder) error {
	for ctx.Err() == nil {
		err := t.readReplies(ctx, rec)
		if ctx.Err() == nil {
			if err != nil {
				t.warn("read replies; starting the reader again", err)
			} else {
				t.log.Warn("the reply consumer stopped delivering (deleted or re-created?); looking it up again",
					slog.String("consumer", natsbus.SenderConsumer), slog.String("stream", natsbus.ReplyStream))
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

// readReplies reads from the consumer until ctx ends or the consumer
// stops delivering.
//
// The consumer's handler hands each reply to the recording workers and
// waits while they are busy: the client holds what the broker sends
// meanwhile in the subscription's own buffer. (An iterator over a channel
// of one batch's size, as this was, dropped replies when the channel was
// full, and the broker delivered them again only after their ack wait.)
func (t *Transport) readReplies(ctx context.Context, rec Recorder) error {
	cons, ok := t.consumer(ctx)
	if !ok {
		return nil // ctx ended while the broker was away
	}
	// msgs is never closed: the client may call the handler until the
	// consumption has stopped. quit ends the workers once it has, after
	// they have recorded what was handed to them.
	msgs, quit := make(chan jetstream.Msg, ReplyBatch), make(chan struct{})
	var workers sync.WaitGroup
	for range t.cfg.Workers {
		workers.Go(func() {
			for {
				select {
				case m := <-msgs:
					t.handle(ctx, rec, gather(m, msgs))
				case <-quit:
					for {
						select {
						case m := <-msgs:
							t.handle(ctx, rec, gather(m, msgs))
						default:
							return
						}
					}
				}
			}
		})
	}
	defer func() {
		close(quit)
		workers.Wait()
	}()
	// A batch's worth fetched ahead, no more: a reply waiting to be
	// recorded is not kept in progress, and must be recorded well within
	// the ack wait.
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-quit: // stopping: delivered again after its ack wait
		}
	},
		append(natsbus.PullOptions(ReplyBatch), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if !errors.Is(err, jetstream.ErrConsumerDeleted) {
				t.warn("read replies", err)
			}
		}))...)
	if err != nil {
		return fmt.Errorf("read replies: %w", err)
	}
	select {
	case <-ctx.Done():
		// Hand what is fetched to the workers, then stop; a broker that
		// is gone cannot confirm the drain, and what was not recorded is
		// delivered again after its ack wait.
		cc.Drain()
		select {
		case <-cc.Closed():
		case <-time.After(t.cfg.Timeout):
			cc.Stop()
		}
	case <-cc.Closed():
		// The consumer deleted, or re-created, under the reader: Replies
		// looks it up again.
	}
	return nil
}

// gather makes a batch of first and whatever else has been read already,
// up to ReplyBatch: no waiting for more, so a lone reply is recorded at
// once, and replies that come in numbers share a transaction.
func gather(first jetstream.Msg, msgs <-chan jetstream.Msg) []jetstream.Msg {
	batch := []jetstream.Msg{first}
	for len(batch) < ReplyBatch {
		select {
		case m := <-msgs:
			batch = append(batch, m)
		default:
			return batch
		}
	}
	return batch
}

// consumer finds the sender's durable consumer, waiting for the broker
// as long as it takes.
func (t *Transport) consumer(ctx context.Context) (jetstream.Consumer, bool) {
	cons, err := natsbus.WaitConsumer(ctx, t.js, natsbus.ReplyStream, natsbus.SenderConsumer, t.cfg.Timeout, func(err error) {
		t.warn(fmt.Sprintf("find the reply consumer %s on %s (provisioned?)", natsbus.SenderConsumer, natsbus.ReplyStream), err)
	})
	return cons, err == nil
}

// ReplyBatch is how many replies at most one transaction records.
const ReplyBatch = 64

// handle records a batch of replies read together, in one transaction,
// and acknowledges each once it committed. A reply whose ack is lost is
// delivered again, as a repeat, which the sender's inbox of replies
// catches. A reply the sender cannot read is handed back, or parked,
// alone.
func (t *Transport) handle(ctx context.Context, rec Recorder, batch []jetstream.Msg) {
	replies := make([]relay.Reply, 0, len(batch))
	read := make([]jetstream.Msg, 0, len(batch))
	for _, m := range batch {
		meta, err := m.Metadata()
		if err != nil {
			t.warn("read a reply's metadata", err)
			continue
		}
		reply, id, err := decode(m)
		if err != nil {
			t.unreadable(ctx, rec, m, meta, err)
			continue
		}
		// A reply carries Users' status and body, not a content type: a
		// refusal's body is a problem document, as over HTTP.
		replies = append(replies, relay.Reply{MessageID: id, Key: reply.IdempotencyKey,
			Answer: answer.Judge(reply.Status, reply.Status >= 400, reply.Body)})
		read = append(read, m)
	}
	if len(replies) == 0 {
		return
	}
	// Recorded whatever ctx does: replies read are better recorded now.
	// SENDER_DATABASE_TIMEOUT may exceed the ack wait.
	stop := natsbus.KeepInProgress(natsbus.AckWait/3, read...)
	_, err := rec.RecordReplies(context.WithoutCancel(ctx), replies)
	stop()
	if err != nil {
		t.warn("record replies; they are read again", err)
		for _, m := range read {
			_ = m.NakWithDelay(time.Second)
		}
		return
	}
	for _, m := range read {
		_ = m.Ack()
	}
}

// unreadable hands back a reply the sender cannot decode, or parks it
// after MaxReplyDeliveries.
func (t *Transport) unreadable(ctx context.Context, rec Recorder, m jetstream.Msg, meta *jetstream.MsgMetadata, err error) {
	if meta.NumDelivered < MaxReplyDeliveries {
		_ = m.NakWithDelay(time.Second)
		return
	}
	why := err.Error()
	// The store keeps what natsbus describes, field for field.
	parked := store.ParkedReply(natsbus.ParkedOf(m, meta, why))
	if err := rec.ParkReply(context.WithoutCancel(ctx), parked); err != nil {
		t.warn("park a reply the sender cannot read; it is read again", err)
		_ = m.NakWithDelay(time.Second)
		return
	}
	t.undecodable.Inc()
	t.log.Error("parked a reply the sender cannot read in parked_replies",
		slog.String("stream", natsbus.ReplyStream), slog.Uint64("stream_seq", meta.Sequence.Stream),
		slog.Uint64("deliveries", meta.NumDelivered), slog.String("error", why))
	if err := m.TermWithReason("parked"); err != nil {
		t.log.Warn("terminate a parked reply; its next delivery is parked again, once", slog.String("error", err.Error()))
	}
}

func decode(m jetstream.Msg) (natsbus.Reply, uuid.UUID, error) {
	id, err := uuid.Parse(m.Headers().Get(jetstream.MsgIDHeader))
	if err != nil {
		return natsbus.Reply{}, uuid.Nil, fmt.Errorf("reply id (%s): %w", jetstream.MsgIDHeader, err)
	}
	r, err := natsbus.DecodeReply(m.Data())
	return r, id, err
}

// warnEvery is how often, at most, the transport logs the same trouble
// with the broker.
const warnEvery = 10 * time.Second
