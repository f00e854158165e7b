package usersvc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxref/outboxref/internal/alarm"
	"github.com/outboxref/outboxref/internal/crashpoint"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/internal/person"
	"github.com/outboxref/outboxref/internal/telemetry"
	"github.com/outboxref/outboxref/services/users/internal/store"
)

// commands reads create-user commands from the broker (the durable
// consumer natsbus.UsersConsumer, which every Users process shares) and
// applies each through the inbox, as POST /users does, with the answer
// written to Users' own outbox in the same transaction. A command is
// acknowledged only after that commit: a Users that dies in between gets
// the command delivered again (here or to another Users), and the inbox
// replays it.
type commands struct {
	log     *slog.Logger
	store   *store.Store
	metrics *metrics
	// caller is the scope of the commands' keys (USERS_NATS_CALLER).
	caller string
	// maxDeliveries is USERS_COMMAND_MAX_DELIVERIES.
	maxDeliveries int
	// concurrency bounds the commands in flight, each a transaction.
	concurrency int
	// retryDelay is how long a command that failed for now (the database
	// unavailable, its key busy) waits before it is delivered again;
	// unreadableDelay, one Users could not read, until it is parked.
	retryDelay, unreadableDelay time.Duration
	// progressEvery is how often a command still being applied is said
	// to be in progress, well within the consumer's ack wait.
	progressEvery time.Duration
	// answered wakes the relay: an answer row was committed.
	answered func()
	// afterCommit, when set, runs between a command's commit and its ack;
	// false leaves the command unacknowledged, as a Users that died there
	// would (tests).
	afterCommit func(jetstream.Msg) bool
}

// commandConcurrency is how many commands one Users handles at once: each
// holds a database connection for its transaction, and HTTP deliveries
// share the pool (USERS_DB_MAX_CONNS, 32 by default).
const commandConcurrency = 16

// ackTimeout bounds the wait for the server to confirm an ack.
const ackTimeout = 5 * time.Second

// run consumes commands until ctx ends, then stops fetching, finishes the
// commands in flight and returns. While the broker is unreachable it
// waits for it; Users serves HTTP meanwhile. If the consumer stops
// delivering (deleted, or re-provisioned), it is looked up again.
func (c *commands) run(ctx context.Context, js jetstream.JetStream) error {
	// A command in flight finishes its transaction and its ack after ctx
	// ends: each is bounded by USERS_DATABASE_TIMEOUT and ackTimeout.
	w := &workers{sem: make(chan struct{}, c.concurrency), work: context.WithoutCancel(ctx)}
	defer w.stop()
	warn := pacedWarn(c.log, 30*time.Second)
	for {
		cons, err := natsbus.WaitConsumer(ctx, js, natsbus.CommandStream, natsbus.UsersConsumer, ackTimeout, func(err error) {
			warn("broker: the command consumer is not reachable yet; Users serves HTTP meanwhile", err)
		})
		if err != nil {
			return nil // ctx ended while waiting for the broker: a stop, not a failure
		}
		// No more fetched than can be worked on: a fetched message waits
		// for a free slot, and one left in the buffer at shutdown waits
		// AckWait to be delivered again.
		cc, err := cons.Consume(func(msg jetstream.Msg) { w.start(msg, c.handle) },
			append(natsbus.PullOptions(c.concurrency), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
				warn("broker: reading commands failed; retrying", err)
			}))...)
		if err != nil {
			return fmt.Errorf("consume commands: %w", err)
		}
		c.log.Info("broker: consuming commands", slog.String("stream", natsbus.CommandStream), slog.String("consumer", natsbus.UsersConsumer))
		select {
		case <-ctx.Done():
			// Drain: fetch nothing more, and hand what is already fetched
			// to the workers. A broker that is gone cannot confirm the
			// drain: stop waiting for it after a while; what was not
			// handled is delivered again after AckWait.
			cc.Drain()
			select {
			case <-cc.Closed():
			case <-time.After(ackTimeout):
				cc.Stop()
			}
			return nil
		case <-cc.Closed():
			// The server ended the consumer under us: deleted, perhaps
			// to be provisioned again.
			c.log.Warn("broker: the command consumer stopped delivering (deleted or re-created?); looking it up again",
				slog.String("consumer", natsbus.UsersConsumer), slog.String("stream", natsbus.CommandStream))
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
			}
		}
	}
}

// workers run the handling of fetched commands, at most cap(sem) at once.
type workers struct {
	sem     chan struct{}
	work    context.Context //nolint:containedctx // the context every handling runs in, outliving the consumer's
	mu      sync.Mutex
	stopped bool
	wg      sync.WaitGroup
}

// start handles msg on a worker of its own once one is free. A message
// fetched after stop is left unacknowledged, delivered again after
// AckWait: the consume callback may still run while run returns.
func (w *workers) start(msg jetstream.Msg, handle func(context.Context, jetstream.Msg)) {
	w.sem <- struct{}{}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		<-w.sem
		return
	}
	w.wg.Go(func() {
		defer func() { <-w.sem }()
		handle(w.work, msg)
	})
}

// stop takes no more messages and waits for those being handled.
func (w *workers) stop() {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	w.wg.Wait()
}

// command is what Users reads from a command message before applying it.
type command struct {
	key     inbox.Key
	keyUUID uuid.UUID // the key, which the reply carries
	data    []byte
	// answer is the id of this message's answer (answerID).
	answer uuid.UUID
	// expires is when the sender gives the operation up (Outbox-Expires);
	// zero when the command does not say.
	expires time.Time
}

// read reads a command's key and checks that its data is JSON. A reason
// says why it cannot be read (and so cannot be answered: an answer needs
// the key); anything else is left to the same decoding and validation as
// POST /users, whose refusals are answers.
func (c *commands) read(msg jetstream.Msg) (command, string) {
	values := msg.Headers().Values(natsbus.HeaderKey)
	switch {
	case len(values) == 0:
		return command{}, "no " + natsbus.HeaderKey + " header"
	case len(values) > 1:
		return command{}, fmt.Sprintf("%d %s headers, want one", len(values), natsbus.HeaderKey)
	}
	key, err := inbox.ParseKey(values[0])
	if err != nil {
		return command{}, natsbus.HeaderKey + ": " + err.Error()
	}
	u, err := uuid.Parse(key)
	if err != nil {
		return command{}, natsbus.HeaderKey + ": not a UUID"
	}
	var expires time.Time
	if v := msg.Headers().Get(natsbus.HeaderExpires); v != "" {
		if expires, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return command{}, natsbus.HeaderExpires + ": not an RFC 3339 time"
		}
	}
	if !json.Valid(msg.Data()) {
		return command{}, "the data is not JSON"
	}
	return command{key: inbox.Key{Caller: c.caller, Value: key}, keyUUID: u, data: msg.Data(), expires: expires}, ""
}

// handle handles one delivery of a command, and acknowledges, hands back
// or terminates it.
func (c *commands) handle(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		// Not a consumer's message: nothing to ack, park or count it by.
		c.log.Error("broker: a command without JetStream metadata", slog.String("error", err.Error()))
		return
	}
	ctx = otel.GetTextMapPropagator().Extract(ctx, propagation.HeaderCarrier(natsbus.HTTPHeader(msg.Headers())))
	ctx, span := telemetry.Tracer().Start(ctx, "process create-user command", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.Int64("messaging.message.delivery_count", int64(meta.NumDelivered)), //nolint:gosec // a delivery count
			attribute.Int64("messaging.stream.sequence", int64(meta.Sequence.Stream)))) //nolint:gosec // a stream sequence
	defer span.End()
	log := c.log.With(slog.Uint64("stream_sequence", meta.Sequence.Stream), slog.Uint64("deliveries", meta.NumDelivered),
		slog.String("attempt", msg.Headers().Get(natsbus.HeaderAttempt)))

	cmd, unreadable := c.read(msg)
	if unreadable != "" {
		span.SetAttributes(attribute.String("outcome", "unreadable"))
		c.unreadable(ctx, log, msg, meta, unreadable)
		return
	}
	cmd.answer = answerID(cmd.key, meta)
	log = log.With(slog.String("idempotency_key", cmd.key.Value))
	span.SetAttributes(attribute.String("idempotency_key", cmd.key.Value))
	if !cmd.expires.IsZero() && time.Now().After(cmd.expires) {
		span.SetAttributes(attribute.String("outcome", CommandExpired))
		c.expired(log, msg, cmd)
		return
	}
	// A command may take up to USERS_DATABASE_TIMEOUT (minutes, if set
	// so), longer than the consumer's ack wait: the broker would hand it
	// to another Users meanwhile, which would wait on the first and then
	// replay. Saying it is in progress keeps it here.
	stop := natsbus.KeepInProgress(c.progressEvery, msg)
	outcome, err := c.apply(ctx, cmd)
	stop()
	span.SetAttributes(attribute.String("outcome", outcome))
	c.metrics.commands.WithLabelValues(outcome).Inc()
	if outcome == CommandRetried {
		log.Warn("broker: command handed back for later", slog.String("error", err.Error()), slog.Duration("delay", c.retryDelay))
		if err := msg.NakWithDelay(c.retryDelay); err != nil {
			log.Warn("broker: nak failed; the command is delivered again after its ack wait", slog.String("error", err.Error()))
		}
		return
	}
	c.answered()
	crashpoint.Hit(crashpoint.UsersCommandAfterCommit)
	if c.afterCommit != nil && !c.afterCommit(msg) {
		return
	}
	ackCtx, cancel := context.WithTimeout(ctx, ackTimeout)
	defer cancel()
	if err := msg.DoubleAck(ackCtx); err != nil {
		// The answer is committed: a delivery after this one replays it.
		log.Warn("broker: ack failed; the command will be delivered again and replayed", slog.String("error", err.Error()))
		return
	}
	log.Debug("broker: command answered", slog.String("outcome", outcome))
}

// apply runs the command as POST /users would, and writes its answer to
// Users' outbox. It returns the command's outcome (users_commands_total),
// and CommandRetried with the error when nothing was answered.
func (c *commands) apply(ctx context.Context, cmd command) (string, error) {
	var in person.Input
	if err := httpapi.DecodeBody(cmd.data, &in); err != nil {
		return c.refuse(ctx, cmd, CommandInvalid, err)
	}
	p, err := in.Validate()
	if err != nil {
		return c.refuse(ctx, cmd, CommandInvalid, err)
	}
	out, replayed, err := c.store.CreateUserReplying(ctx, cmd.key, p, answerCreateUser, c.reply(ctx, cmd))
	var mismatch *inbox.MismatchError
	switch {
	case errors.As(err, &mismatch):
		return c.refuse(ctx, cmd, OutcomeMismatch, err)
	case err != nil:
		return CommandRetried, err
	case replayed:
		return OutcomeReplayed, nil
	case out.ResourceID != uuid.Nil:
		return OutcomeCreated, nil
	}
	return OutcomeRefused, nil
}

// refuse answers a command with the problem the HTTP hop would send for
// err (a 400 or a 422), which the inbox does not store: the answer row is
// written alone.
func (c *commands) refuse(ctx context.Context, cmd command, outcome string, err error) (string, error) {
	out := httpapi.Refusal(httpapi.ProblemOf(err))
	if err := c.store.RecordReply(ctx, c.reply(ctx, cmd), out); err != nil {
		return CommandRetried, err
	}
	return outcome, nil
}

// reply is the answer row of cmd; the reply continues the command's trace
// (ctx's span).
func (c *commands) reply(ctx context.Context, cmd command) store.Reply {
	return store.Reply{
		MessageID: cmd.answer, Subject: natsbus.CreateUserReplySubject, Key: cmd.keyUUID,
		TraceParent: telemetry.TraceParent(ctx), Payload: replyPayload(cmd.keyUUID),
	}
}

// answerSpace is the namespace of answers' message ids.
var answerSpace = uuid.MustParse("6b0f5c1e-2a43-4f7e-9d1b-8f7a1c3e5d20")

// answerID is the message id of the answer to one command message: the
// same for every delivery of that message (its stream sequence and the
// time the stream stored it), so that a redelivery after a commit whose
// ack was lost writes no second answer, and JetStream drops a republish of
// it within its window. A new message with the same key (the sender
// publishing again after the window, or a redrive) is answered again:
// the inbox replays the stored answer, and the sender, which waits for a
// reply to the row, gets one.
func answerID(key inbox.Key, meta *jetstream.MsgMetadata) uuid.UUID {
	name := fmt.Sprintf("%s\x00%s\x00%d\x00%d", key.Caller, key.Value, meta.Sequence.Stream, meta.Timestamp.UnixNano())
	return uuid.NewSHA1(answerSpace, []byte(name))
}

// replyPayload encodes an answer as a natsbus.Reply, its body the stored
// answer's bytes as they are (no HTML escaping: the HTTP hop sends none).
func replyPayload(key uuid.UUID) func(inbox.Outcome) ([]byte, error) {
	return func(out inbox.Outcome) ([]byte, error) {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(natsbus.Reply{IdempotencyKey: key, Status: out.Status, Body: out.Body}); err != nil {
			return nil, err
		}
		return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
	}
}

// unreadable hands a command Users cannot read back for a later delivery
// until it was delivered maxDeliveries times, then parks it and
// terminates it on the stream, so that it blocks nothing behind it.
func (c *commands) unreadable(ctx context.Context, log *slog.Logger, msg jetstream.Msg, meta *jetstream.MsgMetadata, reason string) {
	log = log.With(slog.String("reason", reason))
	if meta.NumDelivered < uint64(c.maxDeliveries) { //nolint:gosec // at most 100 (config.go)
		log.Debug("broker: unreadable command handed back")
		if err := msg.NakWithDelay(c.unreadableDelay); err != nil {
			log.Warn("broker: nak failed; the command is delivered again after its ack wait", slog.String("error", err.Error()))
		}
		return
	}
	if err := c.store.Park(ctx, natsbus.ParkedOf(msg, meta, reason)); err != nil {
		c.metrics.commands.WithLabelValues(CommandRetried).Inc()
		log.Warn("broker: parking an unreadable command failed; it is delivered again", slog.String("error", err.Error()))
		_ = msg.NakWithDelay(c.retryDelay)
		return
	}
	c.metrics.commands.WithLabelValues(CommandParked).Inc()
	log.Error("broker: unreadable command parked in parked_commands", slog.String("subject", msg.Subject()))
	if err := msg.TermWithReason("parked: " + reason); err != nil {
		log.Warn("broker: terminating the parked command failed; its next delivery is parked again, once", slog.String("error", err.Error()))
	}
}

// expired drops a command read after its outbox row expired: over HTTP
// the sender sends nothing after SENDER_MAX_AGE, and a command that waited
// in the stream longer (Users down for days, say) must not create a user
// for a row the sender has dead-lettered, which an operator may since have
// redriven under a new key. It is terminated, not answered: the row is
// dead, or will be when the sender next claims it.
func (c *commands) expired(log *slog.Logger, msg jetstream.Msg, cmd command) {
	c.metrics.commands.WithLabelValues(CommandExpired).Inc()
	log.Warn("broker: command read after its outbox row expired; not acted on",
		slog.Time("expired_at", cmd.expires), slog.Duration("late_by", time.Since(cmd.expires).Round(time.Millisecond)))
	if err := msg.TermWithReason("expired"); err != nil {
		log.Warn("broker: terminating the expired command failed; its next delivery is dropped again", slog.String("error", err.Error()))
	}
}

// pacedWarn logs a failure that repeats (the broker unreachable) at most
// once per every, with how many were left unlogged in between.
func pacedWarn(log *slog.Logger, every time.Duration) func(msg string, err error) {
	var a alarm.Alarm
	return func(msg string, err error) {
		if events, ok := a.Ring(time.Now(), every); ok {
			log.Warn(msg, slog.String("error", err.Error()), slog.Int("unlogged_since_last", events-1))
		}
	}
}
