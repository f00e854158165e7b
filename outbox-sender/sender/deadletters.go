package sender

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/internal/outboxwake"
	"github.com/outboxref/outboxref/outbox-sender/internal/outboxdb"
)

// This file is the operator's half of the outbox: rows listed, read with
// their history, and dead letters brought back. The admin port (admin.go)
// and the "dead" subcommands (commands.go) both call it.

var (
	// ErrNotFound: no outbox row has that id.
	ErrNotFound = errors.New("outbox row not found")
	// ErrNotDead: only a dead row can be redriven.
	ErrNotDead = errors.New("outbox row is not dead")
	// ErrNewKeyUnsafe: a new key for a row whose old key may already have
	// created the user (its answer was lost, or never judged) could create
	// a second one. Only Users' refusals are safe to ask anew, unless the
	// operator has checked Users and forces it.
	ErrNewKeyUnsafe = errors.New("a new key is safe only after Users refused the old one (refused, invalid-request, key-reused)")
)

// NewKeySafe lists the reason classes after which a new-operation redrive
// cannot create a second user: Users answered, and said no.
var NewKeySafe = []string{ReasonRefused, ReasonInvalid, ReasonKeyReused}

// Redrive modes.
const (
	// ModeRetry keeps the idempotency key. Right when the cause was
	// transient (Users was down past SENDER_MAX_AGE): Users replays the
	// answer it stored for the key, or creates the user once.
	ModeRetry = "retry"
	// ModeNewOperation mints a new key and keeps the old one in
	// previous_keys. Right when the cause of Users' refusal was fixed: the
	// old key's stored refusal would otherwise be replayed for ever.
	ModeNewOperation = "new-operation"
)

// Operator reads and redrives outbox rows.
type Operator struct {
	pool    *pgxpool.Pool
	q       *outboxdb.Queries
	actor   string        // recorded on each redrive: who did it
	timeout time.Duration // the deadline of each call's database work
}

// NewOperator returns an Operator on Student's database. actor names who
// redrives, in the rows' histories; timeout bounds each call's database
// work (SENDER_DATABASE_TIMEOUT).
func NewOperator(pool *pgxpool.Pool, actor string, timeout time.Duration) *Operator {
	return &Operator{pool: pool, q: outboxdb.New(), actor: actor, timeout: timeout}
}

// Row is an outbox row as an operator sees it.
type Row struct {
	ID             int64       `json:"id"`
	State          string      `json:"state"`
	Operation      string      `json:"operation"`
	IdempotencyKey uuid.UUID   `json:"idempotency_key"`
	PreviousKeys   []uuid.UUID `json:"previous_keys,omitempty"`
	Student        RowStudent  `json:"student"`
	Attempts       int         `json:"attempts"`
	ReasonClass    *string     `json:"reason_class"`
	LastError      *string     `json:"last_error"`
	CreatedAt      time.Time   `json:"created_at"`
	DeliveredAt    *time.Time  `json:"delivered_at"`
	DeadAt         *time.Time  `json:"dead_at"`
	Redrives       int         `json:"redrives"`
	RedrivenAt     *time.Time  `json:"redriven_at"`
	// Only in a single row's view (available_at only while pending):
	AvailableAt *time.Time `json:"available_at,omitempty"`
	ClaimedBy   *string    `json:"claimed_by,omitempty"`
	History     []Event    `json:"history,omitempty"`
}

// RowStudent is the student an outbox row works for.
type RowStudent struct {
	ID     uuid.UUID  `json:"id"`
	Name   string     `json:"name,omitempty"`
	UserID *uuid.UUID `json:"user_id,omitempty"`
}

// Event is one entry of a row's history: an attempt or a redrive.
type Event struct {
	At             time.Time `json:"at"`
	Kind           string    `json:"kind"`
	Attempt        int       `json:"attempt"`
	Outcome        string    `json:"outcome"`
	ReasonClass    *string   `json:"reason_class,omitempty"`
	Error          *string   `json:"error,omitempty"`
	Actor          string    `json:"actor"`
	IdempotencyKey uuid.UUID `json:"idempotency_key"`
}

// Filter selects rows to list, newest first.
type Filter struct {
	State       string    // pending, delivered or dead
	ReasonClass string    // "" for any
	Since       time.Time // the state's time (dead_at, delivered_at, created_at) at or after
	Until       time.Time // and before
	Limit       int
	After       Cursor // the zero Cursor for the first page
}

// Cursor is where the next page starts: after this (state time, id).
type Cursor struct {
	At time.Time
	ID int64
}

// List returns up to f.Limit rows and the cursor of the next page (nil on
// the last page).
func (o *Operator) List(ctx context.Context, f Filter) ([]Row, *Cursor, error) {
	ctx, cancel := database.WithDeadline(ctx, o.timeout)
	defer cancel()
	before := f.After
	if before.ID == 0 {
		before = Cursor{At: time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC), ID: 1<<63 - 1}
	}
	until := f.Until
	if until.IsZero() {
		until = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
	}
	rows, err := o.q.ListOutbox(ctx, o.pool, outboxdb.ListOutboxParams{
		State: f.State, ReasonClass: f.ReasonClass, Since: f.Since, Until: until,
		BeforeAt: before.At, BeforeID: before.ID, PageSize: int32(f.Limit + 1), //nolint:gosec // Limit is at most MaxPage
	})
	if err != nil {
		return nil, nil, fmt.Errorf("list outbox: %w", database.Classify(err))
	}
	out := make([]Row, 0, min(len(rows), f.Limit))
	var next *Cursor
	for i, r := range rows {
		if i == f.Limit { // the extra row says another page exists
			next = &Cursor{At: rows[i-1].StateAt, ID: rows[i-1].ID}
			break
		}
		out = append(out, Row{
			ID: r.ID, State: r.State, Operation: r.Operation, IdempotencyKey: r.IdempotencyKey,
			Student: RowStudent{ID: r.StudentID}, Attempts: int(r.Attempts),
			ReasonClass: text(r.ReasonClass), LastError: text(r.LastError), CreatedAt: r.CreatedAt,
			DeliveredAt: timestamp(r.DeliveredAt), DeadAt: timestamp(r.DeadAt),
			Redrives: int(r.Redrives), RedrivenAt: timestamp(r.RedrivenAt),
		})
	}
	return out, next, nil
}

// Get returns one row with its student and history, or ErrNotFound.
func (o *Operator) Get(ctx context.Context, id int64) (Row, error) {
	ctx, cancel := database.WithDeadline(ctx, o.timeout)
	defer cancel()
	var row Row
	err := pgx.BeginTxFunc(ctx, o.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		r, err := o.q.GetOutboxRow(ctx, tx, id)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return fmt.Errorf("get outbox row: %w", err)
		}
		row = Row{
			ID: r.ID, State: r.State, Operation: r.Operation, IdempotencyKey: r.IdempotencyKey, PreviousKeys: r.PreviousKeys,
			Student:  RowStudent{ID: r.StudentID, Name: r.StudentName},
			Attempts: int(r.Attempts), ReasonClass: text(r.ReasonClass), LastError: text(r.LastError),
			CreatedAt: r.CreatedAt, DeliveredAt: timestamp(r.DeliveredAt), DeadAt: timestamp(r.DeadAt),
			Redrives: int(r.Redrives), RedrivenAt: timestamp(r.RedrivenAt),
			ClaimedBy: text(r.ClaimedBy), History: []Event{},
		}
		if r.State == "pending" { // when it is next due; meaningless once settled
			row.AvailableAt = &r.AvailableAt
		}
		if r.StudentUserID.Valid {
			row.Student.UserID = &r.StudentUserID.UUID
		}
		events, err := o.q.ListEvents(ctx, tx, id)
		if err != nil {
			return fmt.Errorf("get outbox history: %w", err)
		}
		for _, e := range events {
			row.History = append(row.History, Event{
				At: e.At, Kind: e.Kind, Attempt: int(e.Attempt), Outcome: e.Outcome,
				ReasonClass: text(e.ReasonClass), Error: text(e.Error), Actor: e.Actor, IdempotencyKey: e.IdempotencyKey,
			})
		}
		return nil
	})
	return row, database.Classify(err)
}

// Redriven is what a redrive did to one row.
type Redriven struct {
	ID             int64     `json:"id"`
	Mode           string    `json:"mode"`
	Changed        bool      `json:"changed"`
	Detail         string    `json:"detail"`
	IdempotencyKey uuid.UUID `json:"idempotency_key"`
}

// Redrive brings one dead row back in the given mode. A row redriven before
// and not attempted since is left as it is (Changed false: a repeated
// redrive changes nothing more); any other row that is not dead is
// ErrNotDead.
func (o *Operator) Redrive(ctx context.Context, id int64, mode string, force bool) (Redriven, error) {
	done, err := o.redrive(ctx, []int64{id}, mode, force)
	if err != nil {
		return Redriven{}, err
	}
	if len(done) == 1 {
		return done[0], nil
	}
	row, err := o.Get(ctx, id)
	if err != nil {
		return Redriven{}, err
	}
	switch {
	case row.State == "dead": // so the new key was refused
		return Redriven{}, fmt.Errorf("%w; this row is dead as %s", ErrNewKeyUnsafe, deref(row.ReasonClass))
	case row.State == "pending" && row.RedrivenAt != nil && row.Attempts == 0:
		last := row.History[len(row.History)-1] // the redrive: nothing was attempted since
		return Redriven{
			ID: id, Mode: last.Outcome, IdempotencyKey: row.IdempotencyKey,
			Detail: fmt.Sprintf("already redriven (%s) at %s and not attempted since; nothing changed",
				last.Outcome, row.RedrivenAt.UTC().Format(time.RFC3339)),
		}, nil
	}
	return Redriven{}, fmt.Errorf("%w (it is %s)", ErrNotDead, row.State)
}

// BulkFilter selects dead rows to redrive together.
type BulkFilter struct {
	Mode        string
	ReasonClass string    // "" for any
	DeadSince   time.Time // dead at or after
	DeadUntil   time.Time // and before; zero for no bound
	Max         int       // at most this many rows, oldest death first
	DryRun      bool      // say what would be redriven, change nothing
	Force       bool      // new-operation also for rows not in NewKeySafe
}

// Bulk is what a bulk redrive did, or would do.
type Bulk struct {
	Mode     string  `json:"mode"`
	DryRun   bool    `json:"dry_run"`
	Matched  int     `json:"matched"`
	Redriven int     `json:"redriven"`
	IDs      []int64 `json:"ids"`
}

// RedriveMatching redrives up to f.Max dead rows that match f.
func (o *Operator) RedriveMatching(ctx context.Context, f BulkFilter) (Bulk, error) {
	until := f.DeadUntil
	if until.IsZero() {
		until = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
	}
	fctx, cancel := database.WithDeadline(ctx, o.timeout)
	defer cancel()
	ids, err := o.q.FindDead(fctx, o.pool, outboxdb.FindDeadParams{
		ReasonClass: f.ReasonClass, Since: f.DeadSince, Until: until, MaxRows: int32(f.Max), //nolint:gosec // Max is at most MaxBulk
		NewKey: f.Mode == ModeNewOperation, Force: f.Force,
	})
	if err != nil {
		return Bulk{}, fmt.Errorf("find dead rows: %w", database.Classify(err))
	}
	out := Bulk{Mode: f.Mode, DryRun: f.DryRun, Matched: len(ids), IDs: ids}
	if f.DryRun || len(ids) == 0 {
		if out.IDs == nil {
			out.IDs = []int64{}
		}
		return out, nil
	}
	done, err := o.redrive(ctx, ids, f.Mode, f.Force)
	if err != nil {
		return Bulk{}, err
	}
	out.Redriven, out.IDs = len(done), make([]int64, len(done))
	for i, d := range done {
		out.IDs[i] = d.ID
	}
	return out, nil
}

// redrive brings the rows of ids that are still dead back, and writes a
// redrive event to each one's history, in one transaction.
func (o *Operator) redrive(ctx context.Context, ids []int64, mode string, force bool) ([]Redriven, error) {
	if mode != ModeRetry && mode != ModeNewOperation {
		return nil, fmt.Errorf("redrive mode %q: want %s or %s", mode, ModeRetry, ModeNewOperation)
	}
	ctx, cancel := database.WithDeadline(ctx, o.timeout)
	defer cancel()
	var done []Redriven
	err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		rows, err := o.q.Redrive(ctx, tx, outboxdb.RedriveParams{NewKey: mode == ModeNewOperation, Force: force, Ids: ids})
		if err != nil {
			return fmt.Errorf("redrive: %w", err)
		}
		ev := outboxdb.RecordEventsParams{Kind: "redrive", Actor: o.actor, Keep: historyKeep}
		done = done[:0]
		for _, r := range rows {
			ev.OutboxIds = append(ev.OutboxIds, r.ID)
			ev.Attempts = append(ev.Attempts, r.AttemptsBefore)
			ev.Outcomes = append(ev.Outcomes, mode)
			ev.ReasonClasses = append(ev.ReasonClasses, "")
			ev.Errors = append(ev.Errors, "")
			ev.IdempotencyKeys = append(ev.IdempotencyKeys, r.IdempotencyKey)
			done = append(done, Redriven{ID: r.ID, Mode: mode, Changed: true, IdempotencyKey: r.IdempotencyKey,
				Detail: "due now; attempts and SENDER_MAX_AGE count afresh"})
		}
		if len(rows) == 0 {
			return nil
		}
		if err := o.q.RecordEvents(ctx, tx, ev); err != nil {
			return fmt.Errorf("record redrive: %w", err)
		}
		return nil
	})
	if err != nil {
		return done, database.Classify(err)
	}
	if len(done) > 0 {
		// The rows are due now: wake the senders rather than leave them to
		// the poll. A failure here delays them by a poll at most.
		_ = outboxwake.Notify(ctx, o.pool)
	}
	return done, nil
}

func text(t pgtype.Text) *string {
	if !t.Valid {
		return nil
	}
	return &t.String
}

func timestamp(t pgtype.Timestamptz) *time.Time {
	if !t.Valid {
		return nil
	}
	return &t.Time
}
