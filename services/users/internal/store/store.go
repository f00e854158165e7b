// Package store is Users' store boundary: the only code that talks to
// Users' database (users, the inbox and, for the broker transport, the
// answers its relay publishes and the commands it parked). It returns its
// own errors (ErrNotFound, ErrDocumentTaken), never pgx's, so the handlers
// above it know nothing of PostgreSQL.
package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/internal/crashpoint"
	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/internal/person"
	"github.com/outboxref/outboxref/services/users/internal/usersdb"
)

var (
	// ErrNotFound: no user has that id.
	ErrNotFound = errors.New("user not found")
	// ErrDocumentTaken: the business rule, one enabled user per document
	// number, refuses the new user.
	ErrDocumentTaken = errors.New("an enabled user already has this document number")
)

// User is a user as Users stores it.
type User struct {
	ID             uuid.UUID
	Name           string
	Email          string
	DocumentNumber string
	Enabled        bool
	CreatedAt      time.Time
}

// Store reads and writes Users' database.
type Store struct {
	pool    *pgxpool.Pool
	timeout time.Duration // the deadline of each read (the inbox bounds the writes)
	q       *usersdb.Queries
	// Inbox remembers each idempotency key's answer; its purge loop runs
	// beside the server.
	Inbox *inbox.Inbox
}

// New returns a Store on pool's database. keyWait bounds how long a request
// waits for another one holding the same key or document number; timeout is
// the deadline of every transaction and read, and must be longer.
func New(pool *pgxpool.Pool, keyWait, timeout time.Duration) *Store {
	ib := inbox.New(pool)
	ib.LockTimeout = keyWait
	ib.Timeout = timeout
	return &Store{pool: pool, timeout: timeout, q: usersdb.New(), Inbox: ib}
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

// AnswerFunc turns what creating a user produced (the new user's id, or
// ErrDocumentTaken) into the answer stored under the operation's key.
type AnswerFunc func(userID uuid.UUID, err error) (inbox.Outcome, error)

// CreateUser is the create-user operation, at most once per key in its
// caller's scope: the user (or the refusal) and the answer stored under key
// commit in one transaction. A repeat of key from the same caller gets the
// stored answer, with replayed set.
func (s *Store) CreateUser(ctx context.Context, key inbox.Key, p person.Person, answer AnswerFunc) (out inbox.Outcome, replayed bool, err error) {
	return s.create(ctx, key, p, answer, nil)
}

// create runs the create-user operation under key, first expecting the
// key to be new and the document number free, as they nearly always are.
// Then the answer is known before anything runs (the new user's id is made
// here), and the key with its answer, the user and COMMIT go out together:
// one round trip (Inbox.DoKnown). Otherwise that first try changes
// nothing, and the operation goes on in the inbox's own transactions
// (Do): a key already used is replayed, and a document number taken is
// refused, with that refusal stored under the key. reply (nil for none) is
// the answer row for a broker command, written in the same transaction.
func (s *Store) create(ctx context.Context, key inbox.Key, p person.Person, answer AnswerFunc, reply *Reply) (inbox.Outcome, bool, error) {
	if crashpoint.Pausing(crashpoint.UsersInInboxTx) {
		// The fault suite holds Users inside the transaction, after the
		// key's claim: the steps go apart so that there is such a moment.
		return s.createInSteps(ctx, key, p, answer, reply)
	}
	out, effect, err := s.newUser(ctx, p, answer, reply)
	if err != nil {
		return inbox.Outcome{}, false, err
	}
	switch err := s.Inbox.DoKnown(ctx, key, p.Fields(), out, effect.QueuedQueries); {
	case err == nil:
		return out, false, nil
	case documentTaken(err):
		return s.refuse(ctx, key, p, answer, reply)
	case !errors.Is(err, inbox.ErrKeyUsed):
		return inbox.Outcome{}, false, err
	}
	return s.createInSteps(ctx, key, p, answer, reply)
}

// createInSteps runs the create-user operation in the inbox's transaction:
// the key's claim first, then, if the key was new, the user, the stored
// answer and COMMIT together (two round trips), or else the stored answer
// replayed. It is what create falls back on when the key is already used.
// If the document number is taken, the insert fails and nothing of that
// transaction stays, the key's claim included, and refuse stores the
// refusal in a transaction of its own.
func (s *Store) createInSteps(ctx context.Context, key inbox.Key, p person.Person, answer AnswerFunc, reply *Reply) (inbox.Outcome, bool, error) {
	out, replayed, err := s.Inbox.Do(ctx, key, p.Fields(), func(ctx context.Context, tx *database.Tx) (inbox.Outcome, error) {
		crashpoint.Pause(crashpoint.UsersInInboxTx)
		out, later, err := s.newUser(ctx, p, answer, reply)
		if err != nil {
			return inbox.Outcome{}, err
		}
		tx.WithCommit(&later.Batch)
		return out, nil
	})
	if !documentTaken(err) {
		return out, replayed, err
	}
	return s.refuse(ctx, key, p, answer, reply)
}

// refuse runs the create-user operation for a document number that a
// first try found taken, in a transaction whose statements wait for their
// answers: the key's claim, the insert that the business rule refuses (or,
// if the number came free meanwhile, the user), and the answer stored with
// COMMIT. Between the first try and this one the key is free: a repeat of
// it that commits there is replayed here, and one with other fields takes
// the key, so this request gets the mismatch although it came first (as it
// would had it come second).
func (s *Store) refuse(ctx context.Context, key inbox.Key, p person.Person, answer AnswerFunc, reply *Reply) (inbox.Outcome, bool, error) {
	return s.Inbox.Do(ctx, key, p.Fields(), func(ctx context.Context, tx *database.Tx) (inbox.Outcome, error) {
		u, err := s.insertUser(ctx, tx, p)
		if err != nil && !errors.Is(err, ErrDocumentTaken) {
			return inbox.Outcome{}, err
		}
		out, err := answer(u.ID, err)
		if err != nil {
			return inbox.Outcome{}, err
		}
		later := &database.Later{}
		if err := s.queueReply(ctx, later, reply, out); err != nil {
			return inbox.Outcome{}, err
		}
		tx.WithCommit(&later.Batch)
		return out, nil
	})
}

// newUser is a first try's work, which expects the document number free:
// the new user's id, made here, so that its answer is known before the
// insert runs, and the statements that write it, queued (the user
// without ON CONFLICT, and reply's answer row). Their errors come with
// the batch they go out in.
func (s *Store) newUser(ctx context.Context, p person.Person, answer AnswerFunc, reply *Reply) (inbox.Outcome, *database.Later, error) {
	id := uuid.Must(uuid.NewV7())
	out, err := answer(id, nil)
	if err != nil {
		return inbox.Outcome{}, nil, err
	}
	later := &database.Later{}
	_ = s.q.InsertNewUser(ctx, later, usersdb.InsertNewUserParams{
		ID: id, Name: p.Name, Email: p.Email, DocumentNumber: p.DocumentNumber,
	})
	if err := s.queueReply(ctx, later, reply, out); err != nil {
		return inbox.Outcome{}, nil, err
	}
	return out, later, nil
}

// documentTaken: err is InsertNewUser's refusal by the business rule.
func documentTaken(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "users_one_enabled_per_document"
}

// insertUser applies the business rule in the database: the partial unique
// index on enabled users' document numbers.
func (s *Store) insertUser(ctx context.Context, tx *database.Tx, p person.Person) (User, error) {
	u, err := s.q.InsertUser(ctx, tx, usersdb.InsertUserParams{
		ID: uuid.Must(uuid.NewV7()), Name: p.Name, Email: p.Email, DocumentNumber: p.DocumentNumber,
	})
	if errors.Is(err, pgx.ErrNoRows) { // ON CONFLICT DO NOTHING returned no row
		return User{}, ErrDocumentTaken
	}
	if err != nil {
		return User{}, fmt.Errorf("insert user: %w", err)
	}
	return User(u), nil
}

// User returns the user with id, or ErrNotFound.
func (s *Store) User(ctx context.Context, id uuid.UUID) (User, error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	u, err := s.q.GetUser(ctx, s.pool, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return User{}, ErrNotFound
	}
	if err != nil {
		return User{}, database.Classify(fmt.Errorf("get user: %w", err))
	}
	return User(u), nil
}
