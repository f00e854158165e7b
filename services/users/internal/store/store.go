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
// caller's scope: the user and the answer stored under key commit in one
// transaction. A repeat of key from the same caller gets the stored answer,
// with replayed set.
func (s *Store) CreateUser(ctx context.Context, key inbox.Key, p person.Person, answer AnswerFunc) (out inbox.Outcome, replayed bool, err error) {
	return s.create(ctx, key, p, answer, nil)
}

// create is the create-user operation from key to commit. The new user's
// id is made here, so the answer is known before the user is inserted, and
// the inbox stores the key with that answer ahead of the insert, in one
// transaction and one round trip (inbox.Do). The business rule, one enabled
// user per document number, is a unique index: when the number is taken,
// the insert fails and nothing of that transaction stays, the key
// included. The refusal is then the answer, stored under the key in a
// transaction of its own, and a repeat of the key gets it back as it
// would the user. reply (nil for none) is the answer row of a broker
// command, written in the same transaction as the answer it carries.
func (s *Store) create(ctx context.Context, key inbox.Key, p person.Person, answer AnswerFunc, reply *Reply) (inbox.Outcome, bool, error) {
	id := uuid.Must(uuid.NewV7())
	created, err := answer(id, nil)
	if err != nil {
		return inbox.Outcome{}, false, err
	}
	insert := &pgx.Batch{}
	// InsertUser's text, with its parameters in sqlc's order (InsertUserParams).
	insert.Queue(usersdb.InsertUser, id, p.Name, p.Email, p.DocumentNumber)
	if err := queueReply(insert, reply, created); err != nil {
		return inbox.Outcome{}, false, err
	}
	crashpoint.Pause(crashpoint.UsersBeforeInbox)
	out, replayed, err := s.Inbox.Do(ctx, key, p.Fields(), inbox.Op{Outcome: created, Effect: insert})
	if !documentTaken(err) {
		return out, replayed, err
	}
	refused, err := answer(uuid.Nil, ErrDocumentTaken)
	if err != nil {
		return inbox.Outcome{}, false, err
	}
	refusal := &pgx.Batch{}
	if err := queueReply(refusal, reply, refused); err != nil {
		return inbox.Outcome{}, false, err
	}
	return s.Inbox.Do(ctx, key, p.Fields(), inbox.Op{Outcome: refused, Effect: refusal})
}

// documentTaken: err is InsertUser's refusal by the business rule.
func documentTaken(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "users_one_enabled_per_document"
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
