package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxref/outboxref/internal/crashpoint"
	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/outbox-sender/internal/outboxdb"
)

// Result is what came of one claimed row, to be recorded.
type Result struct {
	Row     Row
	Outcome string    // outbox.OutcomeDelivered, OutcomeRetry, OutcomeDead, OutcomeReleased, OutcomePublished or OutcomeUnread
	UserID  uuid.UUID // the user Users answered with (delivered)
	Class   string    // why it failed (retry, dead): one of outbox.ReasonClasses
	Error   string
	// Delay is the wait until the next attempt (retry), or until the row
	// is published again if no answer comes (published, unread).
	Delay time.Duration
	// Seq is the command's sequence in the broker's stream (published).
	Seq uint64
	// Lapsed: released because the lease ran out before the send, not
	// because the sender is stopping.
	Lapsed bool
	// Unsent (retry): nothing left for Users; the claim is not counted
	// as an attempt.
	Unsent bool
	// Repeat (published): the broker already held this publish; the
	// claim is not counted as an attempt.
	Repeat bool
}

// Recorded is what a recording transaction did.
type Recorded struct {
	// Applied holds the rows whose settlement this transaction wrote: a
	// delivery it marked, a retry or dead-letter it wrote. A retry or
	// dead-letter whose lease another sender took over was not written; nor
	// was a delivery another sender had recorded first.
	Applied map[int64]bool
	// Conflicts maps the rows whose student was already linked to a
	// different user, dead-lettered as conflicts, to the user Users
	// answered with.
	Conflicts map[int64]uuid.UUID
	// Released is how many rows were handed back.
	Released int64
}

// HistoryKeep is how many events each row's history keeps.
const HistoryKeep = 20

// Record writes a batch of results in one transaction, the whole of their
// bookkeeping: students linked and their rows marked delivered, retries
// scheduled (never past l.MaxAge) and dead letters written, each only by
// the holder of the row's lease, rows handed back, and an event per attempt
// in each row's history, naming l.Holder.
//
// The statements go out as one pgx batch: one implicit transaction, which
// PostgreSQL commits when the batch ends, in one round trip. That works
// because no statement needs another's answer: LinkStudents dead-letters a
// conflict itself; ScheduleRetries, MarkDead and RecordPublished each
// write the events of the rows they did write (a row whose lease another
// sender took over is that sender's to tell); RecordEvents writes a
// delivery's event as LinkStudents left the row, trimming those rows'
// histories; and TrimHistories, last, trims the others'. A statement that fails stops the rest and
// rolls back the whole batch. And the sender never holds a transaction
// open while it waits for the network: the server has all of it at once.
func (s *Store) Record(ctx context.Context, l Lease, batch []Result) (Recorded, error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	rec, err := s.record(ctx, l, batch)
	if err != nil {
		return Recorded{}, database.Classify(err)
	}
	return rec, nil
}

func (s *Store) record(ctx context.Context, l Lease, batch []Result) (Recorded, error) {
	w := sortResults(batch)
	w.retries.MaxAge, w.published.MaxAge = l.MaxAge, l.MaxAge
	w.retries.Actor, w.deaths.Actor, w.published.Actor = l.Holder, l.Holder, l.Holder
	rec := Recorded{Applied: map[int64]bool{}, Conflicts: map[int64]uuid.UUID{}}
	// applied notes the rows a statement wrote, from its RETURNING.
	applied := func(rows pgx.Rows) error {
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		rec.apply(ids)
		return err
	}
	// Each statement's text, with its parameters in sqlc's order (its
	// Params struct's), and what its answer does to rec: pgx reads the
	// answers in order when the batch is closed.
	b := &pgx.Batch{}
	b.Queue(genericPlans)
	if w.brokered {
		// Only with the broker, where replies are applied beside
		// recordings (LockRowsForRecord).
		b.Queue(outboxdb.LockRowsForRecord, w.ids)
	}
	if k := w.link; len(k.OutboxIds) > 0 {
		b.Queue(outboxdb.LinkStudents, k.OutboxIds, k.StudentIds, k.UserIds, k.ConflictErrors).Query(func(rows pgx.Rows) error {
			links, err := pgx.CollectRows(rows, pgx.RowToStructByPos[outboxdb.LinkStudentsRow])
			rec.linked(links, k)
			return err
		})
	}
	if r := w.retries; len(r.Ids) > 0 {
		b.Queue(outboxdb.ScheduleRetries, r.Ids, r.LeaseTokens, r.Delays, r.Errors, r.ReasonClasses, r.Unsent, r.MaxAge, r.Actor).Query(applied)
	}
	if d := w.deaths; len(d.Ids) > 0 {
		b.Queue(outboxdb.MarkDead, d.Ids, d.LeaseTokens, d.Errors, d.ReasonClasses, d.Actor).Query(applied)
	}
	if p := w.published; len(p.Ids) > 0 {
		b.Queue(outboxdb.RecordPublished, p.Ids, p.LeaseTokens, p.Seqs, p.Waits, p.Unread, p.Repeats, p.MaxAge, p.Actor).Query(applied)
	}
	if r := w.releases; len(r.Ids) > 0 {
		b.Queue(outboxdb.Release, r.Ids, r.LeaseTokens).Exec(func(tag pgconn.CommandTag) error {
			rec.Released = tag.RowsAffected()
			return nil
		})
	}
	if e := deliveryEvents(l.Holder, batch); len(e.OutboxIds) > 0 {
		b.Queue(outboxdb.RecordEvents, e.Kind, e.Actor, e.OutboxIds, e.Attempts, e.Outcomes, e.ReasonClasses, e.Errors, e.IdempotencyKeys, e.Keep)
	}
	if len(w.told) > 0 {
		// RecordEvents trims the deliveries' histories itself.
		b.Queue(outboxdb.TrimHistories, w.told, int32(HistoryKeep))
	}

	crashpoint.Pause(crashpoint.SenderBeforeRecord)
	// Close reads every answer, and the batch's end is the commit: its
	// error is the first statement's that failed, or the commit's.
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return Recorded{}, fmt.Errorf("record %d results: %w", len(batch), err)
	}
	return rec, nil
}

// genericPlans has the recording transaction's statements run on generic
// plans. LinkStudents and RecordEvents are built of CTEs over arrays
// whose length the planner cannot know, so it judged a plan made for each
// call's values cheaper and planned them afresh at every call: planning
// them cost more than running them (docs/performance.md). Their generic
// plans are the same index lookups. set_config(…, true) lasts until the
// batch's transaction ends.
const genericPlans = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true)"

// linked notes what LinkStudents did with the answers of link: the rows it
// settled, and the conflicts.
func (r *Recorded) linked(links []outboxdb.LinkStudentsRow, link outboxdb.LinkStudentsParams) {
	for _, l := range links {
		if l.Settled {
			r.Applied[l.OutboxID] = true
		}
		if !l.Linked {
			i := slices.Index(link.OutboxIds, l.OutboxID)
			r.Conflicts[l.OutboxID] = link.UserIds[i]
		}
	}
}

func (r *Recorded) apply(ids []int64) {
	for _, id := range ids {
		r.Applied[id] = true
	}
}

// writes are a batch's results sorted by what they do, as the statements'
// parameters.
type writes struct {
	link     outboxdb.LinkStudentsParams
	retries  outboxdb.ScheduleRetriesParams
	deaths   outboxdb.MarkDeadParams
	releases outboxdb.ReleaseParams
	// published are the rows whose commands the broker acknowledged.
	published outboxdb.RecordPublishedParams
	// brokered: the batch came through the broker transport (a publish,
	// or a publish that failed).
	brokered bool
	// ids are every row of the batch; told, those whose events the
	// statements that write them add (retries, dead letters, publishes).
	ids, told []int64
}

func sortResults(batch []Result) *writes {
	w := &writes{}
	for _, r := range batch {
		w.ids = append(w.ids, r.Row.ID)
		switch r.Outcome {
		case outbox.OutcomeDelivered:
			w.link.OutboxIds = append(w.link.OutboxIds, r.Row.ID)
			w.link.StudentIds = append(w.link.StudentIds, r.Row.StudentID)
			w.link.UserIds = append(w.link.UserIds, r.UserID)
			w.link.ConflictErrors = append(w.link.ConflictErrors, cleanError(ConflictError(r.UserID)))
		case outbox.OutcomeRetry:
			w.told = append(w.told, r.Row.ID)
			// A failed publish the broker may have taken after all.
			w.brokered = w.brokered || r.Class == outbox.ReasonBrokerUnreachable || r.Class == outbox.ReasonBrokerFull
			w.retries.Ids = append(w.retries.Ids, r.Row.ID)
			w.retries.LeaseTokens = append(w.retries.LeaseTokens, r.Row.LeaseToken)
			w.retries.Delays = append(w.retries.Delays, r.Delay)
			w.retries.Errors = append(w.retries.Errors, cleanError(r.Error))
			w.retries.ReasonClasses = append(w.retries.ReasonClasses, r.Class)
			w.retries.Unsent = append(w.retries.Unsent, r.Unsent)
		case outbox.OutcomeDead:
			w.told = append(w.told, r.Row.ID)
			w.dead(r.Row.ID, r.Row.LeaseToken, r.Error, r.Class)
		case outbox.OutcomePublished:
			w.told = append(w.told, r.Row.ID)
			w.brokered = true
			w.published.Ids = append(w.published.Ids, r.Row.ID)
			w.published.LeaseTokens = append(w.published.LeaseTokens, r.Row.LeaseToken)
			w.published.Seqs = append(w.published.Seqs, int64(r.Seq)) //nolint:gosec // a stream's sequence stays far below 2^63
			w.published.Waits = append(w.published.Waits, r.Delay)
			w.published.Unread = append(w.published.Unread, false)
			w.published.Repeats = append(w.published.Repeats, r.Repeat)
		case outbox.OutcomeUnread:
			w.brokered = true
			w.published.Ids = append(w.published.Ids, r.Row.ID)
			w.published.LeaseTokens = append(w.published.LeaseTokens, r.Row.LeaseToken)
			w.published.Seqs = append(w.published.Seqs, 0) // the row keeps its last publish's
			w.published.Waits = append(w.published.Waits, r.Delay)
			w.published.Unread = append(w.published.Unread, true)
			w.published.Repeats = append(w.published.Repeats, false)
		case outbox.OutcomeReleased:
			w.releases.Ids = append(w.releases.Ids, r.Row.ID)
			w.releases.LeaseTokens = append(w.releases.LeaseTokens, r.Row.LeaseToken)
		}
	}
	return w
}

func (w *writes) dead(id int64, lease uuid.UUID, msg, class string) {
	w.deaths.Ids = append(w.deaths.Ids, id)
	w.deaths.LeaseTokens = append(w.deaths.LeaseTokens, lease)
	w.deaths.Errors = append(w.deaths.Errors, cleanError(msg))
	w.deaths.ReasonClasses = append(w.deaths.ReasonClasses, class)
}

// ConflictError is the error recorded for a row whose student is linked to
// another user than the one Users answered with.
func ConflictError(answered uuid.UUID) string {
	return fmt.Sprintf("student is already linked to a different user; Users answered %s", answered)
}

// deliveryEvents are the events of the batch's deliveries, for
// RecordEvents: it writes each as LinkStudents left its row, delivered or
// dead-lettered as a conflict, with the error given for a conflict. The
// other attempts' events are written by the statements that record them.
func deliveryEvents(actor string, batch []Result) outboxdb.RecordEventsParams {
	ev := outboxdb.RecordEventsParams{Kind: "attempt", Actor: actor, Keep: HistoryKeep}
	for _, r := range batch {
		if r.Outcome != outbox.OutcomeDelivered {
			continue
		}
		ev.OutboxIds = append(ev.OutboxIds, r.Row.ID)
		ev.Attempts = append(ev.Attempts, int32(r.Row.Attempts)) //nolint:gosec // attempts are an integer column
		ev.Outcomes = append(ev.Outcomes, r.Outcome)
		ev.ReasonClasses = append(ev.ReasonClasses, r.Class)
		ev.Errors = append(ev.Errors, cleanError(ConflictError(r.UserID)))
		ev.IdempotencyKeys = append(ev.IdempotencyKeys, r.Row.IdempotencyKey)
	}
	return ev
}

// cleanError makes an error message storable: PostgreSQL text holds no NUL
// and must be valid UTF-8, and a message from a remote server is bounded, so
// that one odd answer can never make a whole batch unrecordable.
func cleanError(msg string) string {
	msg = strings.ToValidUTF8(strings.ReplaceAll(msg, "\x00", ""), "\uFFFD")
	if len(msg) > 1000 {
		msg = strings.ToValidUTF8(msg[:1000], "") + "…"
	}
	return msg
}
