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
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/internal/outboxwake"
	"github.com/outboxref/outboxref/outbox-sender/internal/outboxdb"
)

// This file is the operator's half of the store: rows listed, read with
// their history, and dead letters brought back.

// Entry is an outbox row as an operator sees it. Pointers are nil where the
// column is null.
type Entry struct {
	ID             int64
	State          string
	Operation      string
	IdempotencyKey uuid.UUID
	PreviousKeys   []uuid.UUID
	StudentID      uuid.UUID
	StudentName    string        // Get only
	StudentUserID  uuid.NullUUID // Get only
	Attempts       int           // since the last redrive
	// AttemptsBeforeRedrive is the attempts the row had before its
	// redrives, summed.
	AttemptsBeforeRedrive int
	ReasonClass           *string
	LastError             *string
	CreatedAt             time.Time
	DeliveredAt           *time.Time
	DeadAt                *time.Time
	Redrives              int
	RedrivenAt            *time.Time
	AvailableAt           time.Time     // Get only
	KeyMintedAt           time.Time     // Get only: when the current key was minted
	KeyAge                time.Duration // Get only: how long ago, by the database's clock
	ClaimedBy             *string       // Get only
	History               []Event       // Get only
	// StateAt is when the row reached its state: what List orders by.
	StateAt time.Time
}

// Event is one entry of a row's history: an attempt or a redrive.
type Event struct {
	At             time.Time
	Kind           string // "attempt" or "redrive"
	Attempt        int
	Outcome        string // an attempt's outcome, or a redrive's mode
	ReasonClass    *string
	Error          *string
	Actor          string // the sender, or who redrove
	IdempotencyKey uuid.UUID
}

// Filter selects rows to list, newest first by the time they reached their
// state, after the (time, id) position Before.
type Filter struct {
	State       string
	ReasonClass string    // "" for any
	Since       time.Time // at or after
	Until       time.Time // and before; zero for no bound
	Before      Position  // the zero Position for the first page
	Limit       int
}

// Position is where a page starts: before this (state time, id).
type Position struct {
	At time.Time
	ID int64
}

// farFuture stands for "no bound" in time comparisons.
var farFuture = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// List returns up to f.Limit rows, and one more when another page follows.
func (s *Store) List(ctx context.Context, f Filter) ([]Entry, error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	before := f.Before
	if before.ID == 0 {
		before = Position{At: farFuture, ID: 1<<63 - 1}
	}
	rows, err := s.q.ListOutbox(ctx, s.pool, outboxdb.ListOutboxParams{
		State: f.State, ReasonClass: f.ReasonClass, Since: f.Since, Until: orFarFuture(f.Until),
		BeforeAt: before.At, BeforeID: before.ID, PageSize: int32(f.Limit + 1), //nolint:gosec // Limit is bounded by the admin API
	})
	if err != nil {
		return nil, fmt.Errorf("list outbox rows: %w", database.Classify(err))
	}
	out := make([]Entry, len(rows))
	for i, r := range rows {
		out[i] = Entry{
			ID: r.ID, State: r.State, Operation: r.Operation, IdempotencyKey: r.IdempotencyKey, StudentID: r.StudentID,
			Attempts: int(r.Attempts), AttemptsBeforeRedrive: int(r.AttemptsBeforeRedrive),
			ReasonClass: nullText(r.ReasonClass), LastError: nullText(r.LastError),
			CreatedAt: r.CreatedAt, DeliveredAt: nullTime(r.DeliveredAt), DeadAt: nullTime(r.DeadAt),
			Redrives: int(r.Redrives), RedrivenAt: nullTime(r.RedrivenAt), StateAt: r.StateAt,
		}
	}
	return out, nil
}

// Get returns one row with its student and history, read in one snapshot,
// or ErrNotFound.
func (s *Store) Get(ctx context.Context, id int64) (Entry, error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	var e Entry
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		r, err := s.q.GetOutboxRow(ctx, tx, id)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return fmt.Errorf("get outbox row: %w", err)
		}
		e = Entry{
			ID: r.ID, State: r.State, Operation: r.Operation, IdempotencyKey: r.IdempotencyKey, PreviousKeys: r.PreviousKeys,
			StudentID: r.StudentID, StudentName: r.StudentName, StudentUserID: r.StudentUserID,
			Attempts: int(r.Attempts), AttemptsBeforeRedrive: int(r.AttemptsBeforeRedrive),
			ReasonClass: nullText(r.ReasonClass), LastError: nullText(r.LastError),
			CreatedAt: r.CreatedAt, DeliveredAt: nullTime(r.DeliveredAt), DeadAt: nullTime(r.DeadAt),
			Redrives: int(r.Redrives), RedrivenAt: nullTime(r.RedrivenAt),
			AvailableAt: r.AvailableAt, ClaimedBy: nullText(r.ClaimedBy), KeyMintedAt: r.KeyMintedAt, KeyAge: r.KeyAge, History: []Event{},
		}
		events, err := s.q.ListEvents(ctx, tx, id)
		if err != nil {
			return fmt.Errorf("get outbox history: %w", err)
		}
		for _, ev := range events {
			e.History = append(e.History, Event{
				At: ev.At, Kind: ev.Kind, Attempt: int(ev.Attempt), Outcome: ev.Outcome,
				ReasonClass: nullText(ev.ReasonClass), Error: nullText(ev.Error), Actor: ev.Actor, IdempotencyKey: ev.IdempotencyKey,
			})
		}
		return nil
	})
	return e, database.Classify(err)
}

// DeadFilter selects dead rows to redrive together.
type DeadFilter struct {
	ReasonClass string    // "" for any
	Since       time.Time // dead at or after
	Until       time.Time // and before; zero for no bound
	Max         int       // take at most this many, oldest death first
	// NewKey passes by the rows whose old key may have created a user
	// (outbox.NewKeySafe), unless Force.
	NewKey, Force bool
	// MaxRedrives passes by the rows redriven that many times already.
	MaxRedrives int
	// KeyWindow: a retry passes by the rows whose key was minted longer
	// ago than this, unless Force (see Redrive).
	KeyWindow time.Duration
}

// Found is what FindDead found: the rows it takes, and how many it passed
// by, and why.
type Found struct {
	IDs []int64 // oldest death first
	// Walking the filter's rows oldest death first, up to the last row
	// taken when it took Max (else all of them), each row passed by is
	// counted once, under the first reason that holds.
	RedriveLimit      int // redriven MaxRedrives times
	NewKeyUnsafe      int // NewKey: the old key may have created a user
	KeyMayBeForgotten int // a retry: the key is older than KeyWindow
	Busy              int // another transaction holds the row's lock
}

// FindDead returns the dead rows f takes, and what it passed by. The rows
// are locked only while it reads them: a redrive that follows may find
// some of them changed (RedriveDead does not).
func (s *Store) FindDead(ctx context.Context, f DeadFilter) (Found, error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	found, err := s.findDead(ctx, s.pool, f)
	return found, database.Classify(err)
}

func (s *Store) findDead(ctx context.Context, db outboxdb.DBTX, f DeadFilter) (Found, error) {
	r, err := s.q.FindDead(ctx, db, outboxdb.FindDeadParams{
		ReasonClass: f.ReasonClass, Since: f.Since, Until: orFarFuture(f.Until), MaxRows: int32(f.Max), //nolint:gosec // Max is bounded by the admin API
		NewKey: f.NewKey, Force: f.Force, NewKeySafe: outbox.NewKeySafe, MaxRedrives: int32(f.MaxRedrives), //nolint:gosec // bounded by SENDER_MAX_REDRIVES
		KeyWindow: f.KeyWindow,
	})
	if err != nil {
		return Found{}, fmt.Errorf("find dead rows: %w", err)
	}
	return Found{IDs: r.Ids, RedriveLimit: int(r.RedriveLimit), NewKeyUnsafe: int(r.NewKeyUnsafe),
		KeyMayBeForgotten: int(r.KeyMayBeForgotten), Busy: int(r.Busy)}, nil
}

// Redriven is a row a redrive brought back, with the key it now carries.
type Redriven struct {
	ID             int64
	IdempotencyKey uuid.UUID
}

// RedriveDead finds the dead rows f takes and redrives them, as Redrive
// does, in one transaction: the rows FindDead takes stay locked until they
// are redriven, so each one found is redriven, and what it passed by is
// what the redrive passed by.
func (s *Store) RedriveDead(ctx context.Context, f DeadFilter, actor string) (Found, []Redriven, error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	mode := outbox.RedriveRetry
	if f.NewKey {
		mode = outbox.RedriveNewOperation
	}
	var found Found
	var done []Redriven
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		if found, err = s.findDead(ctx, tx, f); err != nil {
			return err
		}
		done, err = s.redrive(ctx, tx, found.IDs, mode, f.Force, f.MaxRedrives, f.KeyWindow, actor)
		if err == nil && len(done) != len(found.IDs) {
			// The rows are this transaction's: none can have changed. Were
			// one lost all the same, say so rather than leave it uncounted.
			err = fmt.Errorf("redrive: %d of the %d rows found were not redriven", len(found.IDs)-len(done), len(found.IDs))
		}
		return err
	})
	if err != nil {
		return Found{}, nil, database.Classify(err)
	}
	s.wake(ctx, done)
	return found, done, nil
}

// Redrive brings the rows of ids that are still dead back, due now with
// attempts and SENDER_MAX_AGE counted afresh, and writes a redrive event,
// naming actor, to each one's history, in one transaction. In
// outbox.RedriveNewOperation mode each row gets a new key, except where the
// old key may have created a user, unless force. In outbox.RedriveRetry
// mode a row keeps its key, except where the key was minted more than
// keyWindow ago, unless force: Users may forget it before the new attempts
// end. Rows redriven maxRedrives times already, and rows another
// transaction has locked, are left as they are. Then it wakes the senders.
func (s *Store) Redrive(ctx context.Context, ids []int64, mode string, force bool, maxRedrives int, keyWindow time.Duration, actor string) ([]Redriven, error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	var done []Redriven
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		done, err = s.redrive(ctx, tx, ids, mode, force, maxRedrives, keyWindow, actor)
		return err
	})
	if err != nil {
		return nil, database.Classify(err)
	}
	s.wake(ctx, done)
	return done, nil
}

// redrive is Redrive's work in tx.
func (s *Store) redrive(ctx context.Context, tx pgx.Tx, ids []int64, mode string, force bool, maxRedrives int, keyWindow time.Duration, actor string) ([]Redriven, error) {
	rows, err := s.q.Redrive(ctx, tx, outboxdb.RedriveParams{
		NewKey: mode == outbox.RedriveNewOperation, Force: force, Ids: ids, NewKeySafe: outbox.NewKeySafe,
		MaxRedrives: int32(maxRedrives), //nolint:gosec // bounded by SENDER_MAX_REDRIVES
		KeyWindow:   keyWindow,
	})
	if err != nil {
		return nil, fmt.Errorf("redrive: %w", err)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	done := make([]Redriven, 0, len(rows))
	ev := outboxdb.RecordEventsParams{Kind: "redrive", Actor: actor, Keep: HistoryKeep}
	for _, r := range rows {
		ev.OutboxIds = append(ev.OutboxIds, r.ID)
		ev.Attempts = append(ev.Attempts, r.AttemptsBefore)
		ev.Outcomes = append(ev.Outcomes, mode)
		ev.ReasonClasses = append(ev.ReasonClasses, "")
		ev.Errors = append(ev.Errors, "")
		ev.IdempotencyKeys = append(ev.IdempotencyKeys, r.IdempotencyKey)
		done = append(done, Redriven{ID: r.ID, IdempotencyKey: r.IdempotencyKey})
	}
	if err := s.q.RecordEvents(ctx, tx, ev); err != nil {
		return nil, fmt.Errorf("record redrive: %w", err)
	}
	return done, nil
}

// wake tells the senders that the rows redriven are due now, rather than
// leave them to the poll. A failure here delays them by a poll at most.
func (s *Store) wake(ctx context.Context, done []Redriven) {
	if len(done) > 0 {
		_ = outboxwake.Notify(ctx, s.pool)
	}
}

func orFarFuture(t time.Time) time.Time {
	if t.IsZero() {
		return farFuture
	}
	return t
}

func nullText(t pgtype.Text) *string {
	if !t.Valid {
		return nil
	}
	return &t.String
}

func nullTime(t pgtype.Timestamptz) *time.Time {
	if !t.Valid {
		return nil
	}
	return &t.Time
}
