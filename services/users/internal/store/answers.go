package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/internal/person"
	"github.com/outboxref/outboxref/services/users/internal/usersdb"
)

// Reply is where the answer to a broker command goes: a row of Users' own
// outbox (the answers table), which the relay publishes later.
type Reply struct {
	// MessageID is the answer's own id, its Nats-Msg-Id once published. A
	// row with the same id already there is the same answer written again,
	// and nothing is added.
	MessageID uuid.UUID
	Subject   string
	// Key is the command's idempotency key, which the answer carries.
	Key         uuid.UUID
	TraceParent string
	// Payload is the message body that carries out.
	Payload func(out inbox.Outcome) ([]byte, error)
}

// CreateUserReplying is CreateUser for a command from the broker: the
// answer row joins the user and the inbox's stored answer in the one
// transaction, in the same round trip as the user. A repeat of key (replayed) runs
// nothing and adds no row in that transaction; it writes the answer row
// alone afterwards, which adds nothing when the first delivery wrote it
// (the same MessageID) and answers a key first settled over HTTP.
func (s *Store) CreateUserReplying(ctx context.Context, key inbox.Key, p person.Person, answer AnswerFunc, r Reply) (out inbox.Outcome, replayed bool, err error) {
	out, replayed, err = s.create(ctx, key, p, answer, &r)
	if err != nil || !replayed {
		return out, replayed, err
	}
	return out, replayed, s.RecordReply(ctx, r, out)
}

// queueReply queues the answer row of reply (nil for none), which carries
// out, into b: it is written in the operation's transaction.
func queueReply(b *pgx.Batch, reply *Reply, out inbox.Outcome) error {
	if reply == nil {
		return nil
	}
	row, err := answerRow(*reply, out)
	if err != nil {
		return err
	}
	// InsertAnswer's text, with its parameters in sqlc's order (InsertAnswerParams).
	b.Queue(usersdb.InsertAnswer, row.MessageID, row.IdempotencyKey, row.Subject, row.Payload, row.TraceParent)
	return nil
}

// RecordReply writes an answer row alone, in a statement of its own: for
// an answer the inbox does not store (a command that fails validation, a
// key reused with another request), and for a replay. A row with the same
// MessageID already there is kept as it is.
func (s *Store) RecordReply(ctx context.Context, r Reply, out inbox.Outcome) error {
	row, err := answerRow(r, out)
	if err != nil {
		return err
	}
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	if err := s.q.InsertAnswer(ctx, s.pool, row); err != nil {
		return database.Classify(fmt.Errorf("insert answer: %w", err))
	}
	return nil
}

func answerRow(r Reply, out inbox.Outcome) (usersdb.InsertAnswerParams, error) {
	payload, err := r.Payload(out)
	if err != nil {
		return usersdb.InsertAnswerParams{}, fmt.Errorf("encode answer: %w", err)
	}
	return usersdb.InsertAnswerParams{
		MessageID: r.MessageID, IdempotencyKey: r.Key, Subject: r.Subject, Payload: payload, TraceParent: r.TraceParent,
	}, nil
}

// Answer is an answer row waiting to be published.
type Answer struct {
	ID          int64
	MessageID   uuid.UUID
	Key         uuid.UUID
	Subject     string
	Payload     []byte
	TraceParent string
}

// PublishFunc publishes answers and returns the ids of those the broker
// acknowledged, with an error when it did not acknowledge them all.
type PublishFunc func(ctx context.Context, answers []Answer) (published []int64, err error)

// RelayAnswers claims up to batch unpublished answers, oldest first and
// skipping those another relay holds, publishes them, and marks those
// acknowledged as published, in one transaction. The rows stay locked while they are published, so two
// relays never publish the same row at once; a relay that fails (or dies)
// leaves them unpublished for the next claim. It returns how many answers
// it claimed and how many it marked published. A publish that failed is
// ErrPublish, wrapped; anything else is the database's.
func (s *Store) RelayAnswers(ctx context.Context, batch int32, publish PublishFunc) (claimed, published int, err error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	claimed, published, pubErr, err := s.relay(ctx, batch, publish)
	if err != nil {
		return claimed, 0, database.Classify(err)
	}
	if pubErr != nil {
		return claimed, published, fmt.Errorf("%w: %w", ErrPublish, pubErr)
	}
	return claimed, published, nil
}

// ErrPublish: the broker did not acknowledge every answer the relay
// published.
var ErrPublish = errors.New("publish answers")

func (s *Store) relay(ctx context.Context, batch int32, publish PublishFunc) (claimed, published int, pubErr, err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, 0, nil, fmt.Errorf("relay answers: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit it does nothing; a failed one ends the connection
	rows, err := s.q.ClaimAnswers(ctx, tx, batch)
	if err != nil {
		return 0, 0, nil, fmt.Errorf("claim answers: %w", err)
	}
	if len(rows) == 0 {
		return 0, 0, nil, tx.Commit(ctx)
	}
	answers := make([]Answer, len(rows))
	for i, r := range rows {
		answers[i] = Answer{ID: r.ID, MessageID: r.MessageID, Key: r.IdempotencyKey, Subject: r.Subject, Payload: r.Payload, TraceParent: r.TraceParent}
	}
	// The wait for the broker's acknowledgements gets half of what is
	// left of the transaction's time: a broker slow enough to use it all
	// would otherwise leave none for the commit, and even the answers it
	// did acknowledge would be published again, batch after batch.
	pctx, cancel := publishDeadline(ctx)
	ids, pubErr := publish(pctx, answers)
	cancel()
	if len(ids) == 0 {
		return len(rows), 0, pubErr, nil
	}
	// What was acknowledged is marked even when the rest failed: the
	// broker holds it, and publishing it again would only be filtered.
	if err := s.q.MarkAnswersPublished(ctx, tx, ids); err != nil {
		return len(rows), 0, pubErr, fmt.Errorf("mark answers published: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return len(rows), 0, pubErr, fmt.Errorf("commit: %w", err)
	}
	return len(rows), len(ids), pubErr, nil
}

// publishDeadline bounds a publish to half of ctx's remaining time.
func publishDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	d, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, time.Until(d)/2)
}

// UnpublishedAnswers counts the answers not yet published.
func (s *Store) UnpublishedAnswers(ctx context.Context) (int64, error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	n, err := s.q.CountUnpublishedAnswers(ctx, s.pool)
	if err != nil {
		return 0, database.Classify(fmt.Errorf("count unpublished answers: %w", err))
	}
	return n, nil
}

// PurgeAnswers deletes published answers older than retention, batch rows
// per statement, and returns how many it deleted. Unpublished answers stay
// however old they are: their command is still unanswered.
func (s *Store) PurgeAnswers(ctx context.Context, retention time.Duration, batch int32) (int64, error) {
	return database.DeleteInBatches(ctx, s.timeout, batch, "purge answers", func(ctx context.Context) (int64, error) {
		return s.q.PurgePublishedAnswers(ctx, s.pool, usersdb.PurgePublishedAnswersParams{Retention: retention, BatchSize: batch})
	})
}

// PurgeParked deletes parked commands older than retention, batch rows
// per statement, and returns how many it deleted.
func (s *Store) PurgeParked(ctx context.Context, retention time.Duration, batch int32) (int64, error) {
	return database.DeleteInBatches(ctx, s.timeout, batch, "purge parked commands", func(ctx context.Context) (int64, error) {
		return s.q.PurgeParkedCommands(ctx, s.pool, usersdb.PurgeParkedCommandsParams{Retention: retention, BatchSize: batch})
	})
}

// ParkedCommand is a command Users could not read, kept for an operator.
type ParkedCommand = natsbus.Parked

// Park keeps a command Users gave up on. Parking the same command again
// (the first parking's Term was lost) keeps the first row.
func (s *Store) Park(ctx context.Context, c ParkedCommand) error {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	err := s.q.ParkCommand(ctx, s.pool, usersdb.ParkCommandParams{
		Stream: c.Stream, StreamSequence: int64(c.Sequence), //nolint:gosec // a stream sequence, far below 2^63
		Subject: c.Subject, Headers: c.Headers, Data: c.Data, Reason: c.Reason,
		Size:       int32(min(c.Size, 1<<31-1)), //nolint:gosec // bounded here
		Deliveries: int32(c.Deliveries),         //nolint:gosec // natsbus.ParkedOf bounds it
	})
	if err != nil {
		return database.Classify(fmt.Errorf("park command: %w", err))
	}
	return nil
}
