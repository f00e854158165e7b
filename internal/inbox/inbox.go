// Package inbox runs an operation at most once per idempotency key: the
// operation's effect and the answer it produced are stored in one local
// transaction, and a repeat of the key gets the stored answer back instead of
// running again. Both services use it: Users for the sender's create-user
// deliveries, Student for clients' POST /students. A key lives in its
// caller's scope (Key): Users' callers authenticate, and the same key from
// two of them is two operations.
//
// It knows keys, fingerprints and the inbox table, and nothing of HTTP: the
// answer it stores is data (a status and a body), and its refusals are
// errors that the HTTP layer renders.
package inbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/internal/inbox/inboxdb"
)

var (
	// ErrKeyInProgress: another request with the same key is still in its
	// transaction, and did not finish within the wait. Retry later.
	ErrKeyInProgress = errors.New("inbox: another request with this key is still in progress")
	// ErrConflictInProgress: the operation waited too long for a lock held
	// by a different, conflicting request (the same document number under
	// another key, say). Nothing is stored; retry later.
	ErrConflictInProgress = errors.New("inbox: a conflicting request is still in progress")
	// ErrKeyUsed: DoKnown found its key already stored, and ran nothing.
	// Do replays the stored answer (or names the fields that differ).
	ErrKeyUsed = errors.New("inbox: the key is already used")
)

// MismatchError is a key reused with a request whose fields differ from the
// first request sent with it. Only the names of the fields are kept: the
// first request may hold data the second sender should not see.
type MismatchError struct{ Fields []string }

func (e *MismatchError) Error() string {
	return fmt.Sprintf("inbox: key reused with a different request (fields %v differ)", e.Fields)
}

// Request is the canonical form of a request body: field name to value,
// after decoding and validation, so that key order, whitespace in the JSON
// and other encodings of the same values do not make a repeat look different.
type Request map[string]string

func (r Request) canonical() []byte {
	b, err := json.Marshal(map[string]string(r)) // encoding/json sorts map keys
	if err != nil {
		panic("inbox: marshal request: " + err.Error()) // strings only: cannot fail
	}
	return b
}

// Fingerprint is the SHA-256 of the canonical form.
func (r Request) Fingerprint() []byte {
	sum := sha256.Sum256(r.canonical())
	return sum[:]
}

// DifferingFields names the fields whose values differ between a stored
// canonical request and r, sorted. Values are never reported: the key's
// first request may hold data the second sender should not see.
func DifferingFields(stored []byte, r Request) ([]string, error) {
	var old map[string]string
	if err := json.Unmarshal(stored, &old); err != nil {
		return nil, fmt.Errorf("decode stored request: %w", err)
	}
	var names []string
	for k, v := range r {
		if ov, ok := old[k]; !ok || ov != v {
			names = append(names, k)
		}
	}
	for k := range old {
		if _, ok := r[k]; !ok {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	return names, nil
}

// Key is an idempotency key in its caller's scope. A key is its client's
// own name for an operation, and two clients may well choose the same one:
// the same key from two callers is two operations, and neither can replay,
// wait on or probe (through a 422's list of differing fields) the other's.
type Key struct {
	// Caller is who sent the key: the request's authenticated caller.
	Caller string
	// Value is the key itself, as ParseKey returns it.
	Value string
}

func (k Key) String() string {
	return strconv.Quote(k.Value) + " of caller " + strconv.Quote(k.Caller)
}

// Outcome is the answer an operation produced: the status and body to send,
// and the id of what it created, if anything. It is stored with the key.
type Outcome struct {
	Status     int
	Body       []byte
	ResourceID uuid.UUID // uuid.Nil when nothing was created
}

// Op performs a request's effect inside the inbox transaction. It returns an
// Outcome for every answer that must be the same on a repeat (a creation, a
// business-rule refusal) and an error only for failures a retry may cure,
// which roll everything back and store nothing.
type Op func(ctx context.Context, tx *database.Tx) (Outcome, error)

// Inbox runs operations at most once per key against one database.
type Inbox struct {
	pool *pgxpool.Pool
	q    *inboxdb.Queries

	// LockTimeout bounds how long a request waits for a concurrent request
	// with the same key (ErrKeyInProgress past it) or a conflicting lock
	// (ErrConflictInProgress) to be released.
	LockTimeout time.Duration
	// Timeout is the deadline of each transaction, and of each batch of a
	// purge (database.DefaultTimeout when not positive). It must be longer
	// than LockTimeout, or a wait for a key would end as "database
	// unavailable" instead of "key in progress".
	Timeout time.Duration
}

// New returns an Inbox on pool's database, which must have the inbox table.
func New(pool *pgxpool.Pool) *Inbox {
	return &Inbox{pool: pool, q: inboxdb.New(), LockTimeout: 5 * time.Second, Timeout: 10 * time.Second}
}

// Do runs op once for key (in its caller's scope). The first request for a key claims it, runs op
// and stores the outcome in one transaction. A repeat with the same
// fingerprint gets the stored outcome back with replayed set and runs
// nothing. A repeat with a different fingerprint is a *MismatchError naming
// the fields that differ. A request arriving while another with the same key
// is still in its transaction waits for that transaction (PostgreSQL's
// unique index does the waiting) and then replays its outcome; if the wait
// exceeds LockTimeout the error is ErrKeyInProgress.
func (ib *Inbox) Do(ctx context.Context, key Key, req Request, op Op) (out Outcome, replayed bool, err error) {
	ctx, span := startSpan(ctx, key)
	defer func() { endSpan(span, out, replayed, err) }()
	claim := &inboxdb.ClaimKeyParams{
		Caller: key.Caller, IdempotencyKey: key.Value, RequestHash: req.Fingerprint(), Request: req.canonical(),
	}
	err = ib.tx(ctx, claim, func(ctx context.Context, tx *database.Tx, claimed bool) (*pgx.Batch, error) {
		if !claimed {
			var last *pgx.Batch
			out, last, err = ib.replay(ctx, tx, key, req)
			replayed = err == nil
			return last, err
		}
		if out, err = op(ctx, tx); err != nil {
			return nil, err
		}
		// The answer is stored in the commit's round trip. Later only
		// queues: the statement's error, if any, comes from the commit.
		last := &database.Later{}
		_ = ib.q.SaveOutcome(ctx, last, inboxdb.SaveOutcomeParams{
			Caller:         key.Caller,
			IdempotencyKey: key.Value,
			StatusCode:     pgtype.Int4{Int32: int32(out.Status), Valid: true}, //nolint:gosec // an HTTP status, three digits
			ResponseBody:   pgtype.Text{String: string(out.Body), Valid: true},
			ResourceID:     uuid.NullUUID{UUID: out.ResourceID, Valid: out.ResourceID != uuid.Nil},
		})
		return &last.Batch, nil
	})
	// A replay that failed to commit (its count) is a failure, not a replay.
	return out, replayed && err == nil, err
}

// DoKnown is Do's one-round-trip form, for an operation whose answer is
// known before it runs and whose key is expected to be new, as nearly
// every key is: the key with out, its answer, and effect's statements go
// out in one batch, one implicit transaction, with nothing to wait for
// between them. effect's statements run only after the key's insert
// succeeded, for the server runs nothing after a statement that failed.
//
// A key already stored (or claimed by a transaction that commits while
// this one waits for it) is ErrKeyUsed, and nothing ran: Do then replays
// the key's answer. A failure of one of effect's statements rolls back
// the key too and is returned as it came (with ErrConflictInProgress for
// a lock wait that timed out), for the caller to decide what that
// failure's answer is, in Do. A wait for the key past LockTimeout is
// ErrKeyInProgress, as in Do. effect's statements may not have callbacks
// or read rows: nothing is read back before the commit.
func (ib *Inbox) DoKnown(ctx context.Context, key Key, req Request, out Outcome, effect []*pgx.QueuedQuery) (err error) {
	ctx, span := startSpan(ctx, key)
	defer func() { endKnownSpan(span, out, err) }()
	ctx, cancel := database.WithDeadline(ctx, ib.Timeout)
	defer cancel()
	first := &database.Later{}
	ib.queueLockTimeout(&first.Batch)
	_ = ib.q.StoreKeyAnswered(ctx, first, inboxdb.StoreKeyAnsweredParams{ // queued: its error comes from ExecAll
		Caller: key.Caller, IdempotencyKey: key.Value, RequestHash: req.Fingerprint(), Request: req.canonical(),
		StatusCode:   pgtype.Int4{Int32: int32(out.Status), Valid: true}, //nolint:gosec // an HTTP status, three digits
		ResponseBody: pgtype.Text{String: string(out.Body), Valid: true},
		ResourceID:   uuid.NullUUID{UUID: out.ResourceID, Valid: out.ResourceID != uuid.Nil},
	})
	const keyAt = 1 // the key's insert, after the lock timeout
	failed, err := database.ExecAll(ctx, ib.pool, append(first.QueuedQueries, effect...))
	switch {
	case err == nil:
		return nil
	case failed == keyAt && isLockTimeout(err):
		return ErrKeyInProgress
	case failed == keyAt && keyTaken(err):
		return ErrKeyUsed
	case failed > keyAt && isLockTimeout(err):
		return fmt.Errorf("%w: %w", ErrConflictInProgress, err)
	}
	what := "store key with its answer"
	if failed > keyAt {
		what = "run the operation's statements"
	}
	return database.Classify(fmt.Errorf("%s: %w", what, err))
}

// Once runs op in a transaction without a key: each call is a new
// operation. Lock waits are bounded as in Do. BEGIN and the lock timeout
// go out with op's first statement, and COMMIT on its own: an operation of
// one statement costs two round trips, or one if op queues its statement
// at COMMIT (database.Tx.RunAtCommit) and reads its answer after.
func (ib *Inbox) Once(ctx context.Context, op Op) (out Outcome, err error) {
	err = ib.tx(ctx, nil, func(ctx context.Context, tx *database.Tx, _ bool) (*pgx.Batch, error) {
		out, err = op(ctx, tx)
		return nil, err
	})
	return out, err
}

// txFunc is the body of an inbox transaction; claimed says whether the
// transaction holds its key (always false without one). It returns the
// statements to send with COMMIT, in its round trip (nil for none).
type txFunc func(ctx context.Context, tx *database.Tx, claimed bool) (*pgx.Batch, error)

// tx runs fn in a transaction that ends by Timeout, and whose lock waits
// end after LockTimeout. With a claim, the transaction first claims the
// key (ClaimKey). A wait that times out anywhere but on the key (another
// request inserting the same document number, say) is
// ErrConflictInProgress: nothing is wrong with the request, it just could
// not be decided in time. A database that is down or does not answer by the
// deadline is database.ErrUnavailable.
func (ib *Inbox) tx(ctx context.Context, claim *inboxdb.ClaimKeyParams, fn txFunc) error {
	// fn gets the bounded ctx, so the deadline covers every statement of the
	// transaction, not only BEGIN and COMMIT.
	ctx, cancel := database.WithDeadline(ctx, ib.Timeout)
	defer cancel()
	err := ib.run(ctx, claim, fn)
	if isLockTimeout(err) {
		return fmt.Errorf("%w: %w", ErrConflictInProgress, err)
	}
	return database.Classify(err)
}

// run begins the transaction, runs fn and commits (database.Tx: BEGIN
// rides with the first statements, COMMIT with fn's last ones). Whatever
// happens, the transaction is rolled back unless committed, and the
// connection goes back to the pool.
func (ib *Inbox) run(ctx context.Context, claim *inboxdb.ClaimKeyParams, fn txFunc) error {
	first := &pgx.Batch{}
	ib.queueLockTimeout(first)
	tx, err := database.Begin(ctx, ib.pool, first)
	defer tx.End(ctx)
	if err != nil {
		return err
	}
	claimed := false
	if claim != nil {
		if claimed, err = ib.claim(ctx, tx, claim); err != nil {
			return err
		}
	}
	last, err := fn(ctx, tx, claimed)
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx, last); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// setLockTimeout bounds the transaction's lock waits, as SET LOCAL would.
// The value is LockTimeout, from the binary's own configuration, and is
// bound as a parameter, not written into the SQL.
const setLockTimeout = "SELECT set_config('lock_timeout', $1, true)"

// queueLockTimeout queues setLockTimeout, to go ahead of a transaction's
// first statement.
func (ib *Inbox) queueLockTimeout(b *pgx.Batch) {
	b.Queue(setLockTimeout, strconv.FormatInt(ib.LockTimeout.Milliseconds(), 10)+"ms")
}

// claim claims the key, in one round trip with BEGIN and the lock timeout
// (database.Tx). It is safe because nothing about the protocol changes,
// only the waiting between statements. PostgreSQL runs a pipeline's
// statements in order, in the transaction BEGIN opened, and runs none
// after one that failed; so the claim is still the transaction's first
// statement, bounded by the lock timeout set just before it. A concurrent
// request for the same key still waits on the key's primary key until this
// transaction ends (then replays its answer, or claims the key if it
// rolled back), or gives up at its own lock timeout. And the operation is
// still sent only afterwards, once the answer says the claim inserted the
// key (see Do).
//
// claimed is true when the claim inserted the key: the transaction holds it
// until it ends. A claim that waited past the lock timeout for another
// transaction holding the same key is ErrKeyInProgress.
func (ib *Inbox) claim(ctx context.Context, tx *database.Tx, claim *inboxdb.ClaimKeyParams) (claimed bool, err error) {
	b := &pgx.Batch{}
	// ClaimKey's text and its parameters in sqlc's order ($1…$4, as in
	// ClaimKeyParams): sqlc's method reads its answer at once, alone.
	b.Queue(inboxdb.ClaimKey, claim.Caller, claim.IdempotencyKey, claim.RequestHash, claim.Request).
		Exec(func(tag pgconn.CommandTag) error {
			claimed = tag.RowsAffected() == 1
			return nil
		})
	switch err := tx.Send(ctx, b); {
	case isLockTimeout(err):
		// Only the claim waits for a lock here: another request holds the key.
		return false, ErrKeyInProgress
	case err != nil:
		return false, fmt.Errorf("begin and claim key: %w", err)
	}
	return claimed, nil
}

// keyTaken: err is the key's insert failing on the inbox's primary key.
func keyTaken(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "inbox_pkey"
}

func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03" // lock_not_available
}

// replay loads the key's stored answer; the replay is counted in the
// commit's round trip (last).
func (ib *Inbox) replay(ctx context.Context, tx *database.Tx, key Key, req Request) (out Outcome, last *pgx.Batch, err error) {
	row, err := ib.q.GetKey(ctx, tx, inboxdb.GetKeyParams{Caller: key.Caller, IdempotencyKey: key.Value})
	if err != nil {
		return Outcome{}, nil, fmt.Errorf("load idempotency key: %w", err)
	}
	if !bytes.Equal(row.RequestHash, req.Fingerprint()) {
		fields, err := DifferingFields(row.Request, req)
		if err != nil {
			return Outcome{}, nil, err
		}
		return Outcome{}, nil, &MismatchError{Fields: fields}
	}
	if !row.StatusCode.Valid {
		// The claim and the outcome are written in one transaction, so a
		// visible row without an outcome means the schema was changed by hand.
		return Outcome{}, nil, fmt.Errorf("idempotency key %s has no stored outcome", key)
	}
	// Queued for the commit's round trip; its error comes from the commit.
	later := &database.Later{}
	_ = ib.q.CountReplay(ctx, later, inboxdb.CountReplayParams{Caller: key.Caller, IdempotencyKey: key.Value})
	return Outcome{Status: int(row.StatusCode.Int32), Body: []byte(row.ResponseBody.String), ResourceID: row.ResourceID.UUID}, &later.Batch, nil
}

// Purge deletes inbox rows older than retention, batch rows per statement,
// and returns how many it deleted.
func (ib *Inbox) Purge(ctx context.Context, retention time.Duration, batch int32) (int64, error) {
	return database.DeleteInBatches(ctx, ib.Timeout, batch, "purge inbox", func(ctx context.Context) (int64, error) {
		return ib.q.PurgeOlderThan(ctx, ib.pool, inboxdb.PurgeOlderThanParams{Retention: retention, BatchSize: batch})
	})
}

// PurgeLoop purges rows older than retention every interval until ctx ends.
func (ib *Inbox) PurgeLoop(ctx context.Context, log *slog.Logger, retention, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		n, err := ib.Purge(ctx, retention, 1000)
		switch {
		case err != nil && ctx.Err() == nil:
			log.Error("inbox purge failed", slog.String("error", err.Error()))
		case n > 0:
			log.Info("inbox purged", slog.Int64("rows", n), slog.Duration("retention", retention))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
