package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/outbox-sender/internal/outboxdb"
)

// Reply is one of Users' answers read from the broker's reply stream
// (SENDER_TRANSPORT=nats), judged as the HTTP hop's answers are
// (answer.Judge).
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

// ReplyApplied is what applying a reply did, and to which row.
type ReplyApplied struct {
	Outcome   string
	OutboxID  int64
	Attempts  int
	CreatedAt time.Time
}

// ApplyReplies applies a batch of Users' answers, each at most once, in one
// transaction: it enters each reply in the sender's inbox of replies and,
// if it was not there, settles the row its key names. Like a delivery over
// HTTP, a user id wins over any state but delivered (a dead-letter for age
// written while the answer was on its way included), and is never linked
// over another user: that is a conflict, dead-lettered. A refusal settles
// only a row still waiting. A repeat of a reply changes nothing. It
// returns what each reply did, in the batch's order.
//
// One transaction for many replies is what makes the broker's reply path
// cheap when replies come in numbers: a few round trips and one commit for
// the batch, refusals and conflicts included, not four and a commit per
// reply.
func (s *Store) ApplyReplies(ctx context.Context, actor string, rs []Reply) ([]ReplyApplied, error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	applied, err := s.applyReplies(ctx, actor, rs)
	if err != nil {
		return nil, database.Classify(err)
	}
	return applied, nil
}

func (s *Store) applyReplies(ctx context.Context, actor string, rs []Reply) ([]ReplyApplied, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit it does nothing; a failed one ends the connection
	keys, ids := make([]uuid.UUID, 0, len(rs)), make([]uuid.UUID, 0, len(rs))
	for _, r := range rs {
		keys, ids = append(keys, r.Key), append(ids, r.MessageID)
	}
	// The rows first: a batch holding a repeat of a reply another batch
	// is applying waits here for that one's commit, and then sees its
	// reply in the inbox below. The two reads go out together, after the
	// setting that has the transaction's statements run on generic plans
	// (genericPlans, as the recording's): one round trip, not three.
	var (
		locked []outboxdb.LockRowsForRepliesRow
		had    []uuid.UUID
	)
	reads := &pgx.Batch{}
	reads.Queue(genericPlans)
	// LockRowsForReplies' and RepliesReceived's texts, with their
	// parameters in sqlc's order.
	reads.Queue(outboxdb.LockRowsForReplies, keys).Query(func(rows pgx.Rows) (err error) {
		locked, err = pgx.CollectRows(rows, pgx.RowToStructByPos[outboxdb.LockRowsForRepliesRow])
		return err
	})
	reads.Queue(outboxdb.RepliesReceived, ids).Query(func(rows pgx.Rows) (err error) {
		had, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		return err
	})
	if err := tx.SendBatch(ctx, reads).Close(); err != nil {
		return nil, fmt.Errorf("lock the answered rows: %w", err)
	}
	rows := make(map[uuid.UUID]*outboxdb.LockRowsForRepliesRow, len(locked))
	for i := range locked {
		rows[locked[i].IdempotencyKey] = &locked[i]
	}
	seen := make(map[uuid.UUID]bool, len(rs))
	for _, id := range had {
		seen[id] = true
	}

	out := make([]ReplyApplied, len(rs))
	var link outboxdb.LinkStudentsParams
	var linking []int // the replies link tries, by index in rs
	refusedByLink := map[int]bool{}
	for i, r := range rs {
		row := rows[r.Key]
		if row != nil {
			out[i] = ReplyApplied{OutboxID: row.ID, Attempts: int(row.Attempts), CreatedAt: row.CreatedAt}
		}
		switch {
		case seen[r.MessageID]:
			out[i].Outcome = ReplyRepeat
			continue
		case row == nil:
			out[i].Outcome = ReplyUnmatched
		default:
			out[i].Outcome = judgeReply(*row, r)
		}
		seen[r.MessageID] = true // the same reply twice in this batch
		switch out[i].Outcome {
		case ReplyLinked:
			link.OutboxIds = append(link.OutboxIds, row.ID)
			link.StudentIds = append(link.StudentIds, row.StudentID)
			link.UserIds = append(link.UserIds, r.UserID)
			link.ConflictErrors = append(link.ConflictErrors, cleanError(ConflictError(r.UserID)))
			linking = append(linking, i)
			// A later reply in the batch for the same row sees it settled.
			row.State, row.StudentUserID = outbox.StateDelivered, uuid.NullUUID{UUID: r.UserID, Valid: true}
		case ReplyRefused, ReplyConflict:
			row.State = outbox.StateDead
		}
	}
	if len(linking) > 0 {
		linked, err := s.q.LinkStudents(ctx, tx, link)
		if err != nil {
			return nil, fmt.Errorf("link students: %w", err)
		}
		done := make(map[int64]bool, len(linked))
		for _, l := range linked {
			done[l.OutboxID] = l.Linked
		}
		for _, i := range linking {
			if !done[out[i].OutboxID] {
				// Linked to another user since the lock: LinkStudents
				// has dead-lettered the row.
				out[i].Outcome = ReplyConflict
				refusedByLink[i] = true
			}
		}
	}

	in := outboxdb.ReceiveRepliesParams{}
	event := outboxdb.RecordEventsParams{Kind: "reply", Actor: actor, Keep: HistoryKeep}
	var dead outboxdb.MarkDeadByRepliesParams
	for i, r := range rs {
		if out[i].Outcome == ReplyRepeat {
			continue
		}
		in.MessageIds = append(in.MessageIds, r.MessageID)
		in.IdempotencyKeys = append(in.IdempotencyKeys, r.Key)
		in.OutboxIds = append(in.OutboxIds, out[i].OutboxID)
		in.Outcomes = append(in.Outcomes, out[i].Outcome)
		row := rows[r.Key]
		switch out[i].Outcome {
		case ReplyLinked:
			addEvent(&event, row, r.Key, outbox.OutcomeDelivered, "", "")
		case ReplyConflict:
			why := ConflictError(r.UserID)
			if !refusedByLink[i] {
				addDead(&dead, row.ID, outbox.ReasonConflict, why)
			}
			addEvent(&event, row, r.Key, outbox.OutcomeDead, outbox.ReasonConflict, why)
		case ReplyRefused:
			addDead(&dead, row.ID, r.Class, r.Error)
			addEvent(&event, row, r.Key, outbox.OutcomeDead, r.Class, r.Error)
		}
	}
	if len(in.MessageIds) > 0 {
		entered, err := s.q.ReceiveReplies(ctx, tx, in)
		if err != nil {
			return nil, fmt.Errorf("receive replies: %w", err)
		}
		if len(entered) != len(in.MessageIds) {
			// Another transaction entered one of them meanwhile: only a
			// reply that matched no row can get past the locks above, but
			// whichever it was, this batch starts again and finds it.
			return nil, errors.New("receive replies: another transaction received some of them meanwhile")
		}
	}
	// The rows are locked, so their states are still the ones judged; a
	// link above has made a row delivered, and the dead-letter then leaves
	// it so.
	if len(dead.Ids) > 0 {
		if err := s.q.MarkDeadByReplies(ctx, tx, dead); err != nil {
			return nil, fmt.Errorf("dead-letter refused rows: %w", err)
		}
	}
	if len(event.OutboxIds) > 0 {
		if err := s.q.RecordEvents(ctx, tx, event); err != nil {
			return nil, fmt.Errorf("record replies' history: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return out, nil
}

// judgeReply decides what a reply does to its row, locked.
func judgeReply(row outboxdb.LockRowsForRepliesRow, r Reply) string {
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

func addDead(d *outboxdb.MarkDeadByRepliesParams, id int64, class, why string) {
	d.Ids = append(d.Ids, id)
	d.ReasonClasses = append(d.ReasonClasses, class)
	d.Errors = append(d.Errors, cleanError(why))
}

func addEvent(ev *outboxdb.RecordEventsParams, row *outboxdb.LockRowsForRepliesRow, key uuid.UUID, outcome, class, why string) {
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

// PurgeParked forgets parked replies older than retention, batch at a
// time, and returns how many it forgot.
func (s *Store) PurgeParked(ctx context.Context, retention time.Duration, batch int32) (int64, error) {
	return database.DeleteInBatches(ctx, s.timeout, batch, "purge parked replies", func(ctx context.Context) (int64, error) {
		return s.q.PurgeParkedReplies(ctx, s.pool, outboxdb.PurgeParkedRepliesParams{Retention: retention, BatchSize: batch})
	})
}

// ParkedReply is a reply the sender could not read, as parked_replies
// keeps it for an operator: where the broker held it, what it carried, and
// why it was parked. The broker transport fills it in (its fields are
// those of natsbus.Parked); the store knows no broker.
type ParkedReply struct {
	Stream     string
	Sequence   uint64 // in its stream
	Subject    string
	Headers    []byte // JSON
	Data       []byte // its first bytes
	Size       int    // the whole data's size
	Reason     string
	Deliveries int
}

// ParkReply keeps a reply the sender could not read, for an operator.
// Parking the same reply again (the first parking's termination was lost)
// keeps the first row.
func (s *Store) ParkReply(ctx context.Context, p ParkedReply) error {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	err := s.q.ParkReply(ctx, s.pool, outboxdb.ParkReplyParams{
		Stream: p.Stream, StreamSequence: int64(p.Sequence), //nolint:gosec // a stream sequence, far below 2^63
		Subject: p.Subject, Headers: p.Headers, Data: p.Data, Reason: p.Reason,
		Size:       int32(min(p.Size, 1<<31-1)), //nolint:gosec // bounded here
		Deliveries: int32(p.Deliveries),         //nolint:gosec // the transport bounds it (natsbus.ParkedOf)
	})
	if err != nil {
		return database.Classify(fmt.Errorf("park reply: %w", err))
	}
	return nil
}
