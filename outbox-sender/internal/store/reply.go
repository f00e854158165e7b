package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/outbox-sender/internal/outboxdb"
)

// Reply is one of Users' answers read from the broker's reply stream
// (SENDER_TRANSPORT=nats), judged as the HTTP hop judges an answer.
type Reply struct {
	// MessageID is the reply's own id (its Nats-Msg-Id): the key of the
	// sender's inbox of replies.
	MessageID uuid.UUID
	// Key is the operation's idempotency key, which finds the row.
	Key uuid.UUID
	// Outcome is outbox.OutcomeDelivered (UserID set) or OutcomeDead
	// (Class and Error say why); anything else settles nothing, and the
	// row is published again when its wait ends.
	Outcome      string
	UserID       uuid.UUID
	Class, Error string
}

// What applying a reply did, as the sender's reply inbox records it and
// its replies metric counts it.
const (
	ReplyLinked    = "linked"          // the student is linked, the row delivered
	ReplyRefused   = "refused"         // Users said no: the row is dead
	ReplyConflict  = "conflict"        // the student has another user: the row is dead
	ReplySettled   = "already-settled" // the row was settled before: nothing changed
	ReplyIgnored   = "ignored"         // an answer that settles nothing: the row is published again later
	ReplyUnmatched = "unmatched"       // no row has the key any more (purged, or redriven under a new key)
	ReplyRepeat    = "repeat"          // the broker delivered this reply again: nothing changed
)

// ReplyOutcomes lists what applying a reply can do.
var ReplyOutcomes = []string{ReplyLinked, ReplyRefused, ReplyConflict, ReplySettled, ReplyIgnored, ReplyUnmatched, ReplyRepeat}

// ReplyApplied is what ApplyReply did, and to which row.
type ReplyApplied struct {
	Outcome   string
	OutboxID  int64
	Attempts  int
	CreatedAt time.Time
}

// ApplyReply applies one of Users' answers, at most once per reply: in one
// transaction it enters the reply in the sender's inbox of replies and, if
// it was not there, settles the row the key names. Like a delivery over
// HTTP, a user id wins over any state but delivered (a dead-letter for age
// written while the answer was on its way included), and is never linked
// over another user: that is a conflict, dead-lettered. A refusal settles
// only a row still waiting. A repeat of the reply changes nothing.
func (s *Store) ApplyReply(ctx context.Context, actor string, r Reply) (ReplyApplied, error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	applied, err := s.applyReply(ctx, actor, r)
	if err != nil {
		return ReplyApplied{}, database.Classify(err)
	}
	return applied, nil
}

func (s *Store) applyReply(ctx context.Context, actor string, r Reply) (ReplyApplied, error) {
	tx, err := database.Begin(ctx, s.pool, nil)
	defer tx.End(ctx)
	if err != nil {
		return ReplyApplied{}, err
	}
	var a ReplyApplied
	row, err := s.q.LockRowForReply(ctx, tx, r.Key)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		a.Outcome = ReplyUnmatched
	case err != nil:
		return ReplyApplied{}, fmt.Errorf("lock the answered row: %w", err)
	default:
		a = ReplyApplied{Outcome: judgeReply(row, r), OutboxID: row.ID, Attempts: int(row.Attempts), CreatedAt: row.CreatedAt}
	}
	in := outboxdb.ReceiveReplyParams{MessageID: r.MessageID, IdempotencyKey: r.Key, Outcome: a.Outcome}
	if a.OutboxID != 0 {
		in.OutboxID = pgtype.Int8{Int64: a.OutboxID, Valid: true}
	}
	if _, err := s.q.ReceiveReply(ctx, tx, in); errors.Is(err, pgx.ErrNoRows) {
		return ReplyApplied{Outcome: ReplyRepeat, OutboxID: a.OutboxID}, nil
	} else if err != nil {
		return ReplyApplied{}, fmt.Errorf("receive reply: %w", err)
	}
	event := outboxdb.RecordEventsParams{Kind: "reply", Actor: actor, Keep: HistoryKeep}
	switch a.Outcome {
	case ReplyLinked:
		linked, err := s.q.LinkStudents(ctx, tx, outboxdb.LinkStudentsParams{
			OutboxIds: []int64{row.ID}, StudentIds: []uuid.UUID{row.StudentID}, UserIds: []uuid.UUID{r.UserID},
		})
		if err != nil {
			return ReplyApplied{}, fmt.Errorf("link student: %w", err)
		}
		if len(linked) == 1 {
			addEvent(&event, row, r.Key, outbox.OutcomeDelivered, "", "")
			break
		}
		// Linked to another user between the lock and the link.
		a.Outcome = ReplyConflict
		fallthrough
	case ReplyConflict:
		why := ConflictError(r.UserID)
		if err := s.markDead(ctx, tx, row.ID, outbox.ReasonConflict, why); err != nil {
			return ReplyApplied{}, err
		}
		addEvent(&event, row, r.Key, outbox.OutcomeDead, outbox.ReasonConflict, why)
	case ReplyRefused:
		if err := s.markDead(ctx, tx, row.ID, r.Class, r.Error); err != nil {
			return ReplyApplied{}, err
		}
		addEvent(&event, row, r.Key, outbox.OutcomeDead, r.Class, r.Error)
	}
	history := &database.Later{}
	if len(event.OutboxIds) > 0 {
		_ = s.q.RecordEvents(ctx, history, event) // queued: it cannot fail now
	}
	if err := tx.Commit(ctx, &history.Batch); err != nil {
		return ReplyApplied{}, fmt.Errorf("record reply and commit: %w", err)
	}
	return a, nil
}

// judgeReply decides what a reply does to its row, locked.
func judgeReply(row outboxdb.LockRowForReplyRow, r Reply) string {
	waiting := row.State == outbox.StatePending || row.State == outbox.StatePublished
	switch {
	case row.State == outbox.StateDelivered:
		return ReplySettled
	case r.Outcome == outbox.OutcomeDelivered && row.StudentUserID.Valid && row.StudentUserID.UUID != r.UserID:
		if !waiting {
			return ReplySettled
		}
		return ReplyConflict
	case r.Outcome == outbox.OutcomeDelivered:
		return ReplyLinked
	case r.Outcome == outbox.OutcomeDead && waiting:
		return ReplyRefused
	case r.Outcome == outbox.OutcomeDead:
		return ReplySettled
	}
	return ReplyIgnored
}

func (s *Store) markDead(ctx context.Context, tx *database.Tx, id int64, class, why string) error {
	if _, err := s.q.MarkDeadByReply(ctx, tx, outboxdb.MarkDeadByReplyParams{
		ID: id, ReasonClass: pgtype.Text{String: class, Valid: true}, Error: pgtype.Text{String: cleanError(why), Valid: true},
	}); err != nil {
		return fmt.Errorf("dead-letter answered row: %w", err)
	}
	return nil
}

func addEvent(ev *outboxdb.RecordEventsParams, row outboxdb.LockRowForReplyRow, key uuid.UUID, outcome, class, why string) {
	ev.OutboxIds = append(ev.OutboxIds, row.ID)
	ev.Attempts = append(ev.Attempts, row.Attempts)
	ev.Outcomes = append(ev.Outcomes, outcome)
	ev.ReasonClasses = append(ev.ReasonClasses, class)
	ev.Errors = append(ev.Errors, cleanError(why))
	ev.IdempotencyKeys = append(ev.IdempotencyKeys, key)
}

// PurgeReplies forgets replies received more than retention ago, batch
// at a time, and returns how many it forgot.
func (s *Store) PurgeReplies(ctx context.Context, retention time.Duration, batch int32) (int64, error) {
	return database.DeleteInBatches(ctx, s.timeout, batch, "purge replies", func(ctx context.Context) (int64, error) {
		return s.q.PurgeReplies(ctx, s.pool, outboxdb.PurgeRepliesParams{Retention: retention, BatchSize: batch})
	})
}

// ParkReply keeps a reply the sender could not read, for an operator.
// Parking the same reply again (the first parking's termination was lost)
// keeps the first row.
func (s *Store) ParkReply(ctx context.Context, p natsbus.Parked) error {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	err := s.q.ParkReply(ctx, s.pool, outboxdb.ParkReplyParams{
		Stream: p.Stream, StreamSequence: int64(p.Sequence), //nolint:gosec // a stream sequence, far below 2^63
		Subject: p.Subject, Headers: p.Headers, Data: p.Data, Reason: p.Reason,
		Deliveries: int32(p.Deliveries), //nolint:gosec // natsbus.ParkedOf bounds it
	})
	if err != nil {
		return database.Classify(fmt.Errorf("park reply: %w", err))
	}
	return nil
}
