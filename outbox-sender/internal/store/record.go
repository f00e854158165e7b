package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

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
// BEGIN rides with the first statement and COMMIT with the history
// (database.Tx). A batch of deliveries alone, the common case, is one
// round trip: the links, the history and COMMIT go out together, and the
// links' answer is read after the commit. Nothing sent in it depends on
// that answer: LinkStudents dead-letters a conflict itself, and
// RecordEvents writes a refused delivery's event as the conflict. A batch
// with anything else costs a round trip more, since which retries and
// dead letters were written (the lease's fence) decides the history.
//
// ErrLinksUnread (wrapped) says the transaction committed but the links'
// answer could not be read: rec then holds all but what the links did.
func (s *Store) Record(ctx context.Context, l Lease, batch []Result) (Recorded, error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	rec, err := s.record(ctx, l, batch)
	if err != nil {
		return rec, database.Classify(err)
	}
	return rec, nil
}

// ErrLinksUnread: a recording committed, but which rows its links settled
// and which were conflicts is unknown. Recording the batch again would add
// to the rows' histories and settle nothing.
var ErrLinksUnread = errors.New("recorded, but the links' answer could not be read")

func (s *Store) record(ctx context.Context, l Lease, batch []Result) (Recorded, error) {
	first := &pgx.Batch{}
	first.Queue(genericPlans)
	tx, err := database.Begin(ctx, s.pool, first)
	defer tx.End(ctx)
	if err != nil {
		return Recorded{}, err
	}
	rec := Recorded{Applied: map[int64]bool{}, Conflicts: map[int64]uuid.UUID{}}
	w := sortResults(batch)
	if w.brokered {
		// One more round trip, only with the broker, where replies are
		// applied beside recordings (LockRowsForRecord).
		ids := make([]int64, len(batch))
		for i, r := range batch {
			ids[i] = r.Row.ID
		}
		if _, err := s.q.LockRowsForRecord(ctx, tx, ids); err != nil {
			return Recorded{}, fmt.Errorf("lock the recorded rows: %w", err)
		}
	}
	var (
		links   []outboxdb.LinkStudentsRow
		linkErr error
	)
	link := func(db database.DBTX) { links, linkErr = s.q.LinkStudents(ctx, db, w.link) }
	// The scenario that freezes the network inside this transaction
	// (PAUSE_POINT) needs a moment between the links and the commit.
	atCommit := w.deliveriesOnly() && !crashpoint.Pausing(crashpoint.SenderInRecord)
	switch {
	case len(w.link.OutboxIds) == 0:
	case atCommit:
		tx.RunAtCommit(link)
	default:
		if link(tx); linkErr != nil {
			return Recorded{}, fmt.Errorf("link students: %w", linkErr)
		}
		rec.linked(links, w.link)
	}
	w.retries.MaxAge = l.MaxAge
	if len(w.retries.Ids) > 0 {
		ids, err := s.q.ScheduleRetries(ctx, tx, w.retries)
		if err != nil {
			return Recorded{}, fmt.Errorf("schedule retries: %w", err)
		}
		rec.apply(ids)
	}
	if len(w.deaths.Ids) > 0 {
		ids, err := s.q.MarkDead(ctx, tx, w.deaths)
		if err != nil {
			return Recorded{}, fmt.Errorf("dead-letter rows: %w", err)
		}
		rec.apply(ids)
	}
	if len(w.published.Ids) > 0 {
		w.published.MaxAge = l.MaxAge
		ids, err := s.q.RecordPublished(ctx, tx, w.published)
		if err != nil {
			return Recorded{}, fmt.Errorf("record publishes: %w", err)
		}
		rec.apply(ids)
	}
	if len(w.releases.Ids) > 0 {
		n, err := s.q.Release(ctx, tx, w.releases)
		if err != nil {
			return Recorded{}, fmt.Errorf("release rows: %w", err)
		}
		rec.Released = n
	}
	crashpoint.Pause(crashpoint.SenderInRecord)
	history := &database.Later{}
	s.recordHistory(ctx, history, l.Holder, batch, rec)
	if err := tx.Commit(ctx, &history.Batch); err != nil {
		return Recorded{}, fmt.Errorf("record history and commit: %w", err)
	}
	if atCommit && len(w.link.OutboxIds) > 0 {
		if linkErr != nil {
			return rec, fmt.Errorf("%w: %w", ErrLinksUnread, linkErr)
		}
		rec.linked(links, w.link)
	}
	return rec, nil
}

// genericPlans has the recording transaction's statements run on generic
// plans. LinkStudents and RecordEvents are built of CTEs over arrays
// whose length the planner cannot know, so it judged a plan made for each
// call's values cheaper and planned them afresh at every call: planning
// them cost more than running them (docs/performance.md). Their generic
// plans are the same index lookups. SET LOCAL's effect, in the statement
// that rides with BEGIN: the setting ends with the transaction.
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
}

// deliveriesOnly: the batch holds nothing but deliveries.
func (w *writes) deliveriesOnly() bool {
	return !w.brokered && len(w.retries.Ids)+len(w.deaths.Ids)+len(w.published.Ids)+len(w.releases.Ids) == 0
}

func sortResults(batch []Result) *writes {
	w := &writes{}
	for _, r := range batch {
		switch r.Outcome {
		case outbox.OutcomeDelivered:
			w.link.OutboxIds = append(w.link.OutboxIds, r.Row.ID)
			w.link.StudentIds = append(w.link.StudentIds, r.Row.StudentID)
			w.link.UserIds = append(w.link.UserIds, r.UserID)
			w.link.ConflictErrors = append(w.link.ConflictErrors, cleanError(ConflictError(r.UserID)))
		case outbox.OutcomeRetry:
			// A failed publish the broker may have taken after all.
			w.brokered = w.brokered || r.Class == outbox.ReasonBrokerUnreachable || r.Class == outbox.ReasonBrokerFull
			w.retries.Ids = append(w.retries.Ids, r.Row.ID)
			w.retries.LeaseTokens = append(w.retries.LeaseTokens, r.Row.LeaseToken)
			w.retries.Delays = append(w.retries.Delays, r.Delay)
			w.retries.Errors = append(w.retries.Errors, cleanError(r.Error))
			w.retries.ReasonClasses = append(w.retries.ReasonClasses, r.Class)
		case outbox.OutcomeDead:
			w.dead(r.Row.ID, r.Row.LeaseToken, r.Error, r.Class)
		case outbox.OutcomePublished:
			w.brokered = true
			w.published.Ids = append(w.published.Ids, r.Row.ID)
			w.published.LeaseTokens = append(w.published.LeaseTokens, r.Row.LeaseToken)
			w.published.Seqs = append(w.published.Seqs, int64(r.Seq)) //nolint:gosec // a stream's sequence stays far below 2^63
			w.published.Waits = append(w.published.Waits, r.Delay)
			w.published.Unread = append(w.published.Unread, false)
		case outbox.OutcomeUnread:
			w.brokered = true
			w.published.Ids = append(w.published.Ids, r.Row.ID)
			w.published.LeaseTokens = append(w.published.LeaseTokens, r.Row.LeaseToken)
			w.published.Seqs = append(w.published.Seqs, 0) // the row keeps its last publish's
			w.published.Waits = append(w.published.Waits, r.Delay)
			w.published.Unread = append(w.published.Unread, true)
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

// recordHistory queues in history an event per attempt of the batch for
// the rows' histories, trimming each to its newest HistoryKeep events (one
// statement, RecordEvents), to be sent with the commit. Rows handed back
// were not attempted, and a retry or dead-letter that was not applied
// (another sender took the lease over) is that sender's to tell. A
// delivery's event carries the error for a conflict: RecordEvents writes
// it if the link was refused.
func (s *Store) recordHistory(ctx context.Context, history *database.Later, actor string, batch []Result, rec Recorded) {
	ev := outboxdb.RecordEventsParams{Kind: "attempt", Actor: actor, Keep: HistoryKeep}
	for _, r := range batch {
		// An unread row was not sent: nothing happened to tell.
		if r.Outcome == outbox.OutcomeReleased || r.Outcome == outbox.OutcomeUnread || (r.Outcome == outbox.OutcomeRetry || r.Outcome == outbox.OutcomeDead || r.Outcome == outbox.OutcomePublished) && !rec.Applied[r.Row.ID] {
			continue
		}
		why := r.Error
		if r.Outcome == outbox.OutcomeDelivered {
			why = ConflictError(r.UserID)
		}
		ev.OutboxIds = append(ev.OutboxIds, r.Row.ID)
		ev.Attempts = append(ev.Attempts, int32(r.Row.Attempts)) //nolint:gosec // attempts are an integer column
		ev.Outcomes = append(ev.Outcomes, r.Outcome)
		ev.ReasonClasses = append(ev.ReasonClasses, r.Class)
		ev.Errors = append(ev.Errors, cleanError(why))
		ev.IdempotencyKeys = append(ev.IdempotencyKeys, r.Row.IdempotencyKey)
	}
	if len(ev.OutboxIds) > 0 {
		_ = s.q.RecordEvents(ctx, history, ev) // queued: it cannot fail now
	}
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
