// Package deadletter is the operator's half of the outbox: rows listed, read
// with their history, and dead letters brought back, through the sender's
// admin port (admin.go) and its "dead" subcommands (commands.go), which
// both call one Operator.
package deadletter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/outbox-sender/internal/store"
)

var (
	// ErrNotFound: no outbox row has that id.
	ErrNotFound = store.ErrNotFound
	// ErrNotDead: only a dead row can be redriven.
	ErrNotDead = errors.New("outbox row is not dead")
	// ErrNewKeyUnsafe: a new key for a row whose old key may already have
	// created the user (its answer was lost, or never judged) could create
	// a second one. Only Users' refusals are safe to ask anew, unless the
	// operator has checked Users and forces it.
	ErrNewKeyUnsafe = errors.New("a new key is safe only after Users refused the old one (refused, invalid-request, key-reused)")
	// ErrRedriveLimit: the row has been redriven MaxRedrives times and
	// stays dead.
	ErrRedriveLimit = errors.New("outbox row has reached its redrive limit")
	// ErrKeyMayBeForgotten: a retry sends the row's key again for another
	// SENDER_MAX_AGE, and the key is too old for Users to be sure to
	// remember it that long (USERS_INBOX_RETENTION). A key Users forgot
	// looks new: if it had created the user, a retry would make a second
	// one. Unless the operator has checked Users and forces it.
	ErrKeyMayBeForgotten = errors.New("the row's key is too old to retry: Users may forget it before the retry ends")
	// ErrRowBusy: another transaction holds the row's lock; the redrive
	// left it alone rather than wait.
	ErrRowBusy = errors.New("outbox row is locked by another transaction")
)

// DefaultMaxRedrives is how many times one row may be redriven
// (SENDER_MAX_REDRIVES). A row that has died ten times has a cause no
// further redrive fixes, and each new-operation redrive leaves one more
// key in Users' inbox and in the row's previous_keys: the limit bounds both.
const DefaultMaxRedrives = 10

// DefaultKeyWindow is KeyWindow under the shipped defaults:
// USERS_INBOX_RETENTION (168h) minus SENDER_MAX_AGE (72h), SENDER_LEASE
// (30s), SENDER_REQUEST_TIMEOUT (5s) and KeyClockSlack (5m).
const DefaultKeyWindow = 96*time.Hour - 30*time.Second - 5*time.Second - KeyClockSlack

// KeyClockSlack is what KeyWindow leaves for the two databases' clocks to
// disagree: the key's age is judged by Student's, Users' purge by its own.
const KeyClockSlack = 5 * time.Minute

// Operator reads and redrives outbox rows.
type Operator struct {
	// MaxRedrives is how many times one row may be redriven; a row at the
	// limit stays dead (ErrRedriveLimit).
	MaxRedrives int
	// KeyWindow is how long after its key was minted a row may be retried
	// (ErrKeyMayBeForgotten past it): USERS_INBOX_RETENTION minus
	// SENDER_MAX_AGE, so that Users remembers the key until the retry's
	// last attempt.
	KeyWindow time.Duration

	store    *store.Store
	actor    string // recorded on each redrive when the context names no caller
	redrives *prometheus.CounterVec
}

// New returns an Operator on pool, Student's database as the sender's
// role. actor names who redrives, in the rows' histories, unless the
// request's context names its authenticated caller (auth.CallerFrom), who
// is named instead; timeout bounds each call's database work
// (SENDER_DATABASE_TIMEOUT).
func New(pool *pgxpool.Pool, actor string, timeout time.Duration) *Operator {
	redrives := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outbox_redrives_total",
		Help: "Outbox rows redriven through this process, by mode (retry or new-operation).",
	}, []string{"mode"})
	for _, mode := range []string{outbox.RedriveRetry, outbox.RedriveNewOperation} {
		redrives.WithLabelValues(mode)
	}
	return &Operator{store: store.New(pool, timeout), actor: actor, MaxRedrives: DefaultMaxRedrives,
		KeyWindow: DefaultKeyWindow, redrives: redrives}
}

// Collectors are the Operator's metrics, for the admin listener's registry.
func (o *Operator) Collectors() []prometheus.Collector {
	return []prometheus.Collector{o.redrives}
}

// actorOf is who a redrive is recorded as: the request's authenticated
// caller, or else the Operator's actor.
func (o *Operator) actorOf(ctx context.Context) string {
	if caller, ok := auth.CallerFrom(ctx); ok {
		return caller
	}
	return o.actor
}

// Row is an outbox row as an operator sees it.
type Row struct {
	ID             int64       `json:"id"`
	State          string      `json:"state"`
	Operation      string      `json:"operation"`
	IdempotencyKey uuid.UUID   `json:"idempotency_key"`
	PreviousKeys   []uuid.UUID `json:"previous_keys,omitempty"`
	Student        RowStudent  `json:"student"`
	Attempts       int         `json:"attempts"` // since the last redrive
	// AttemptsBeforeRedrive is the attempts before the row's redrives.
	AttemptsBeforeRedrive int        `json:"attempts_before_redrive"`
	ReasonClass           *string    `json:"reason_class"`
	LastError             *string    `json:"last_error"`
	CreatedAt             time.Time  `json:"created_at"`
	DeliveredAt           *time.Time `json:"delivered_at"`
	DeadAt                *time.Time `json:"dead_at"`
	Redrives              int        `json:"redrives"`
	RedrivenAt            *time.Time `json:"redriven_at"`
	// Only in a single row's view (available_at only while pending):
	AvailableAt *time.Time `json:"available_at,omitempty"`
	KeyMintedAt *time.Time `json:"key_minted_at,omitempty"` // when the current key was minted
	ClaimedBy   *string    `json:"claimed_by,omitempty"`
	// keyAge is how old the key is by the database's clock, which is
	// the clock Redrive judges by.
	keyAge  time.Duration
	History []Event `json:"history,omitempty"`
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

func rowOf(e store.Entry) Row {
	r := Row{
		ID: e.ID, State: e.State, Operation: e.Operation, IdempotencyKey: e.IdempotencyKey, PreviousKeys: e.PreviousKeys,
		Student:  RowStudent{ID: e.StudentID, Name: e.StudentName},
		Attempts: e.Attempts, AttemptsBeforeRedrive: e.AttemptsBeforeRedrive, ReasonClass: e.ReasonClass, LastError: e.LastError, CreatedAt: e.CreatedAt,
		DeliveredAt: e.DeliveredAt, DeadAt: e.DeadAt, Redrives: e.Redrives, RedrivenAt: e.RedrivenAt, ClaimedBy: e.ClaimedBy,
	}
	if e.StudentUserID.Valid {
		r.Student.UserID = &e.StudentUserID.UUID
	}
	if e.History != nil {
		r.History = make([]Event, len(e.History))
		for i, ev := range e.History {
			r.History[i] = Event(ev)
		}
	}
	return r
}

// Filter selects rows to list, newest first.
type Filter struct {
	State       string    // one of outbox.States
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
	entries, err := o.store.List(ctx, store.Filter{
		State: f.State, ReasonClass: f.ReasonClass, Since: f.Since, Until: f.Until,
		Before: store.Position(f.After), Limit: f.Limit,
	})
	if err != nil {
		return nil, nil, err
	}
	out := make([]Row, 0, min(len(entries), f.Limit))
	var next *Cursor
	for i, e := range entries {
		if i == f.Limit { // the extra row says another page exists
			next = &Cursor{At: entries[i-1].StateAt, ID: entries[i-1].ID}
			break
		}
		out = append(out, rowOf(e))
	}
	return out, next, nil
}

// Get returns one row with its student and history, or ErrNotFound.
func (o *Operator) Get(ctx context.Context, id int64) (Row, error) {
	e, err := o.store.Get(ctx, id)
	if err != nil {
		return Row{}, err
	}
	row := rowOf(e)
	if e.State == outbox.StatePending { // when it is next due; meaningless once settled
		row.AvailableAt = &e.AvailableAt
	}
	row.KeyMintedAt, row.keyAge = &e.KeyMintedAt, e.KeyAge
	return row, nil
}

// Redriven is what a redrive did to one row.
type Redriven struct {
	ID             int64     `json:"id"`
	Mode           string    `json:"mode"`
	Changed        bool      `json:"changed"`
	Detail         string    `json:"detail"`
	IdempotencyKey uuid.UUID `json:"idempotency_key"`
}

// Redrive brings one dead row back in the given mode (outbox.RedriveRetry
// or outbox.RedriveNewOperation). A row redriven before and not attempted
// since is left as it is (Changed false: a repeated redrive changes nothing
// more); any other row that is not dead is ErrNotDead.
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
	case row.State == outbox.StateDead && row.Redrives >= o.MaxRedrives:
		return Redriven{}, fmt.Errorf("%w: redriven %d times, and SENDER_MAX_REDRIVES is %d", ErrRedriveLimit, row.Redrives, o.MaxRedrives)
	case row.State == outbox.StateDead && mode == outbox.RedriveNewOperation && !force &&
		(row.ReasonClass == nil || !slices.Contains(outbox.NewKeySafe, *row.ReasonClass)):
		return Redriven{}, fmt.Errorf("%w; this row is dead as %s", ErrNewKeyUnsafe, deref(row.ReasonClass))
	case row.State == outbox.StateDead && mode == outbox.RedriveRetry && !force && row.keyAge >= o.KeyWindow:
		return Redriven{}, fmt.Errorf("%w: the key was minted at %s, and a retry may start only within %s of that",
			ErrKeyMayBeForgotten, row.KeyMintedAt.UTC().Format(time.RFC3339), o.KeyWindow)
	case row.State == outbox.StateDead: // dead, allowed, yet skipped: locked
		return Redriven{}, ErrRowBusy
	case row.State == outbox.StatePending && row.RedrivenAt != nil && row.Attempts == 0:
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
	Max         int       // take at most this many rows, oldest death first
	DryRun      bool      // say what would be redriven, change nothing
	Force       bool      // new-operation also for rows not in outbox.NewKeySafe; retry also for keys past KeyWindow
}

// Bulk is what a bulk redrive did, or would do. Matched rows are the ones
// it redrives (a dry run: would redrive), listed in IDs. Skipped counts
// the rows it passed by on its way through the filter's dead rows, oldest
// death first: Matched plus the skipped counts are the filter's dead rows
// up to the last one matched when Max were matched, and all of them
// otherwise.
type Bulk struct {
	Mode     string  `json:"mode"`
	DryRun   bool    `json:"dry_run"`
	Matched  int     `json:"matched"`
	Redriven int     `json:"redriven"`
	IDs      []int64 `json:"ids"`
	Skipped  Skipped `json:"skipped"`
}

// Skipped is why a bulk redrive passed rows by, each row counted once,
// under the first reason that holds, in this order. Every count is
// written, 0 when none, so that a script may read any of them.
type Skipped struct {
	// RedriveLimit: redriven SENDER_MAX_REDRIVES times (ErrRedriveLimit).
	RedriveLimit int `json:"redrive-limit"`
	// NewKeyUnsafe: new-operation, not forced, and the old key may have
	// created a user (ErrNewKeyUnsafe).
	NewKeyUnsafe int `json:"new-key-unsafe"`
	// KeyMayBeForgotten: retry, not forced, and the key is older than
	// KeyWindow (ErrKeyMayBeForgotten).
	KeyMayBeForgotten int `json:"key-may-be-forgotten"`
	// Busy: another transaction held the row's lock (ErrRowBusy).
	Busy int `json:"busy"`
}

// RedriveMatching redrives up to f.Max dead rows that match f, and says
// what it passed by and why.
func (o *Operator) RedriveMatching(ctx context.Context, f BulkFilter) (Bulk, error) {
	if err := checkRedriveMode(f.Mode); err != nil {
		return Bulk{}, err
	}
	filter := store.DeadFilter{
		ReasonClass: f.ReasonClass, Since: f.DeadSince, Until: f.DeadUntil, Max: f.Max,
		NewKey: f.Mode == outbox.RedriveNewOperation, Force: f.Force, MaxRedrives: o.MaxRedrives, KeyWindow: o.KeyWindow,
	}
	var found store.Found
	var err error
	out := Bulk{Mode: f.Mode, DryRun: f.DryRun}
	if f.DryRun {
		found, err = o.store.FindDead(ctx, filter)
	} else {
		var done []store.Redriven
		found, done, err = o.store.RedriveDead(ctx, filter, o.actorOf(ctx))
		out.Redriven = len(done)
		o.redrives.WithLabelValues(f.Mode).Add(float64(len(done)))
	}
	if err != nil {
		return Bulk{}, err
	}
	out.Matched, out.IDs = len(found.IDs), found.IDs
	if out.IDs == nil {
		out.IDs = []int64{}
	}
	out.Skipped = Skipped{RedriveLimit: found.RedriveLimit, NewKeyUnsafe: found.NewKeyUnsafe,
		KeyMayBeForgotten: found.KeyMayBeForgotten, Busy: found.Busy}
	return out, nil
}

func checkRedriveMode(mode string) error {
	if mode != outbox.RedriveRetry && mode != outbox.RedriveNewOperation {
		return fmt.Errorf("redrive mode %q: want %s or %s", mode, outbox.RedriveRetry, outbox.RedriveNewOperation)
	}
	return nil
}

// redrive brings the rows of ids that are still dead back.
func (o *Operator) redrive(ctx context.Context, ids []int64, mode string, force bool) ([]Redriven, error) {
	if err := checkRedriveMode(mode); err != nil {
		return nil, err
	}
	rows, err := o.store.Redrive(ctx, ids, mode, force, o.MaxRedrives, o.KeyWindow, o.actorOf(ctx))
	if err != nil {
		return nil, err
	}
	o.redrives.WithLabelValues(mode).Add(float64(len(rows)))
	done := make([]Redriven, len(rows))
	for i, r := range rows {
		done[i] = Redriven{ID: r.ID, Mode: mode, Changed: true, IdempotencyKey: r.IdempotencyKey,
			Detail: "due now; attempts and SENDER_MAX_AGE count afresh"}
	}
	return done, nil
}

func deref(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}
