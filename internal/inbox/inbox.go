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

// Op is an operation to run at most once per key: the answer it gives and
// the statements that make it so. The answer is known before the
// statements run (the service makes the new resource's id itself), which
// is what lets the key be stored with its answer ahead of them, in the
// same transaction and the same round trip.
type Op struct {
	Outcome Outcome
	// Effect is the operation's statements, nil for none (a refusal
	// changes nothing but what the key answers). They may not have
	// callbacks: their errors come back from Do.
	Effect *pgx.Batch
}

// Inbox runs operations at most once per key against one database.
type Inbox struct {
	pool *pgxpool.Pool
	q    *inboxdb.Queries

	// LockTimeout bounds how long a request waits for a concurrent request
	// with the same key (ErrKeyInProgress past it) or a conflicting lock
	// (ErrConflictInProgress) to be released.
	LockTimeout time.Duration
	// Timeout is the deadline of each call of Do, and of each batch of a
	// purge (database.DefaultTimeout when not positive). It must be longer
	// than LockTimeout, or a wait for a key would end as "database
	// unavailable" instead of "key in progress".
	Timeout time.Duration
}

// New returns an Inbox on pool's database, which must have the inbox table.
func New(pool *pgxpool.Pool) *Inbox {
	return &Inbox{pool: pool, q: inboxdb.New(), LockTimeout: 5 * time.Second, Timeout: 10 * time.Second}
}

// Do runs op at most once for key (in its caller's scope), in one
// transaction: the key is stored with op's answer, then op's statements
// run, and both commit or neither does.
//
// A repeat of the key finds it stored and runs nothing: with the same
// request (fingerprint) it gets the stored answer back with replayed set;
// with another, a *MismatchError naming the fields that differ. A repeat
// that arrives while the first is still in its transaction waits for it
// (PostgreSQL's primary key does the waiting), then replays its answer, or
// runs op itself if the first rolled back. A wait past LockTimeout is
// ErrKeyInProgress on the key, ErrConflictInProgress on anything else (the
// same document number under another key, say). Any other failure of op's
// statements is returned wrapped, for the caller to tell a business rule's
// refusal (a unique index, say) from a fault; nothing is stored then.
func (ib *Inbox) Do(ctx context.Context, key Key, req Request, op Op) (out Outcome, replayed bool, err error) {
	ctx, span := startSpan(ctx, key)
	defer func() { endSpan(span, out, replayed, err) }()
	ctx, cancel := database.WithDeadline(ctx, ib.Timeout)
	defer cancel()
	switch err := ib.store(ctx, key, req, op); {
	case errors.Is(err, errKeyUsed):
		out, err = ib.replay(ctx, key, req)
		return out, err == nil, err
	case err != nil:
		return Outcome{}, false, err
	}
	return op.Outcome, false, nil
}

// errKeyUsed: the key is already stored, by a transaction that committed.
var errKeyUsed = errors.New("inbox: the key is already used")

// store sends the lock timeout, the key with its answer, and op's
// statements as one pgx batch: one round trip, and one transaction. A
// batch that holds no BEGIN is one implicit transaction, which PostgreSQL
// commits when the batch ends; it runs nothing after a statement that
// fails, and rolls back everything before it. So op's statements run only
// once the key's insert succeeded, and no failure leaves the key without
// the effect or the effect without the key.
func (ib *Inbox) store(ctx context.Context, key Key, req Request, op Op) error {
	b := &pgx.Batch{}
	b.Queue(setLockTimeout, strconv.FormatInt(ib.LockTimeout.Milliseconds(), 10)+"ms")
	// StoreKey's text, with its parameters in sqlc's order (StoreKeyParams).
	b.Queue(inboxdb.StoreKey, key.Caller, key.Value, req.Fingerprint(), req.canonical(),
		pgtype.Int4{Int32: int32(op.Outcome.Status), Valid: true}, //nolint:gosec // an HTTP status, three digits
		pgtype.Text{String: string(op.Outcome.Body), Valid: true},
		uuid.NullUUID{UUID: op.Outcome.ResourceID, Valid: op.Outcome.ResourceID != uuid.Nil})
	const keyAt = 1
	if op.Effect != nil {
		for _, qq := range op.Effect.QueuedQueries {
			if qq.Fn != nil {
				return errors.New("inbox: an operation's statements cannot have callbacks: their errors come back from Do")
			}
		}
		b.QueuedQueries = append(b.QueuedQueries, op.Effect.QueuedQueries...)
	}
	br := ib.pool.SendBatch(ctx, b)
	defer br.Close()
	for i := range b.Len() {
		_, err := br.Exec()
		switch {
		case err == nil:
			continue
		case i == keyAt && isLockTimeout(err):
			return ErrKeyInProgress
		case i == keyAt && keyTaken(err):
			return errKeyUsed
		case i > keyAt && isLockTimeout(err):
			return fmt.Errorf("%w: %w", ErrConflictInProgress, err)
		case i > keyAt:
			return database.Classify(fmt.Errorf("run the operation: %w", err))
		case i == keyAt:
			return database.Classify(fmt.Errorf("store the key: %w", err))
		}
		// The lock timeout's statement: pgx also reports here a statement of
		// the batch it could not prepare or encode.
		return database.Classify(fmt.Errorf("send the batch: %w", err))
	}
	// The batch's end is the commit: an error here is the commit's.
	if err := br.Close(); err != nil {
		return database.Classify(fmt.Errorf("commit: %w", err))
	}
	return nil
}

// setLockTimeout bounds the transaction's lock waits, as SET LOCAL would.
// The value is LockTimeout, from the binary's own configuration, and is
// bound as a parameter, not written into the SQL.
const setLockTimeout = "SELECT set_config('lock_timeout', $1, true)"

// keyTaken: err is the key's insert failing on the inbox's primary key.
func keyTaken(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "inbox_pkey"
}

func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03" // lock_not_available
}

// replay answers a repeat of a key that is stored: its stored answer if
// the request is the same, a *MismatchError if not. It counts the replay.
func (ib *Inbox) replay(ctx context.Context, key Key, req Request) (Outcome, error) {
	row, err := ib.q.GetKey(ctx, ib.pool, inboxdb.GetKeyParams{Caller: key.Caller, IdempotencyKey: key.Value})
	if errors.Is(err, pgx.ErrNoRows) {
		// Purged since its insert failed, a moment ago: a retry runs the
		// operation afresh, as for any key past its retention.
		return Outcome{}, ErrKeyInProgress
	}
	if err != nil {
		return Outcome{}, database.Classify(fmt.Errorf("load idempotency key: %w", err))
	}
	if !bytes.Equal(row.RequestHash, req.Fingerprint()) {
		fields, err := DifferingFields(row.Request, req)
		if err != nil {
			return Outcome{}, err
		}
		return Outcome{}, &MismatchError{Fields: fields}
	}
	if !row.StatusCode.Valid {
		// The key and its answer are written by one statement, so a row
		// without an answer means the schema was changed by hand.
		return Outcome{}, fmt.Errorf("idempotency key %s has no stored outcome", key)
	}
	if err := ib.q.CountReplay(ctx, ib.pool, inboxdb.CountReplayParams{Caller: key.Caller, IdempotencyKey: key.Value}); err != nil {
		return Outcome{}, database.Classify(fmt.Errorf("count replay: %w", err))
	}
	return Outcome{Status: int(row.StatusCode.Int32), Body: []byte(row.ResponseBody.String), ResourceID: row.ResourceID.UUID}, nil
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
