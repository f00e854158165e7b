// Package store is Student's store boundary: the only code in Student that
// talks to Student's database. It returns its own errors (ErrNotFound,
// ErrDocumentTaken), never pgx's, so the handlers above it know nothing of
// PostgreSQL.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/internal/outboxwake"
	"github.com/outboxref/outboxref/internal/person"
	"github.com/outboxref/outboxref/internal/telemetry"
	"github.com/outboxref/outboxref/services/student/internal/studentdb"
)

var (
	// ErrNotFound: no student has that id.
	ErrNotFound = errors.New("student not found")
	// ErrDocumentTaken: Student's own rule, one student per document
	// number, refuses the new student.
	ErrDocumentTaken = errors.New("a student with this document number already exists")
)

// Student is a student with where its create-user operation stands.
type Student struct {
	ID             uuid.UUID
	Name           string
	Email          string
	DocumentNumber string
	UserID         uuid.NullUUID // recorded by the outbox sender once Users answered
	CreatedAt      time.Time
	// The create-user outbox row: state is pending, delivered or dead.
	OutboxState string
	Attempts    int
	// ReasonClass is the sender's word for why the last attempt failed or
	// why the row is dead ("" when none). The full error (last_error) is
	// not read: it names hosts and addresses, and is for operators only.
	ReasonClass string
	Redrives    int
	RedrivenAt  *time.Time
}

// Position is where a page of students starts: after this (created_at, id).
type Position struct {
	CreatedAt time.Time
	ID        uuid.UUID
}

// Store reads and writes Student's database.
type Store struct {
	pool    *pgxpool.Pool
	timeout time.Duration // the deadline of each read (the inbox bounds the writes)
	q       *studentdb.Queries
	// Inbox remembers the answers to clients' idempotency keys; its purge
	// loop runs beside the server.
	Inbox *inbox.Inbox
	// Wake tells the outbox sender, after each commit that wrote an
	// outbox row, that the row is due; its loop runs beside the server.
	Wake *outboxwake.Notifier
}

// New returns a Store on pool's database. keyWait bounds how long a request
// waits for another one holding the same key or document number; timeout is
// the deadline of every transaction and read, and must be longer.
func New(pool *pgxpool.Pool, keyWait, timeout time.Duration) *Store {
	ib := inbox.New(pool)
	ib.LockTimeout = keyWait
	ib.Timeout = timeout
	return &Store{pool: pool, timeout: timeout, q: studentdb.New(), Inbox: ib, Wake: outboxwake.NewNotifier(pool, timeout)}
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }

// AnswerFunc turns what creating a student produced (the student, or
// ErrDocumentTaken) into the answer for the client, stored under the
// client's key when it sent one. Without a key it runs after the commit,
// so its error no longer undoes the student.
type AnswerFunc func(Student, error) (inbox.Outcome, error)

// CreateStudent writes the student and its create-user outbox row in one
// transaction. With a client key (non-empty) it runs at most once per key,
// and a repeat gets the stored answer with replayed set; without one, each
// call is a new operation. Once a new row is committed, the sender is woken
// for it.
func (s *Store) CreateStudent(ctx context.Context, caller, key string, p person.Person, answer AnswerFunc) (out inbox.Outcome, replayed bool, err error) {
	// The request's trace context, read here: inside the inbox the
	// context also carries the inbox transaction's span, and the
	// deliveries belong under the request, keyed or not.
	row, err := newStudentRow(p, telemetry.TraceParent(ctx))
	if err != nil {
		return inbox.Outcome{}, false, err
	}
	if key == "" {
		out, err = s.createOnce(ctx, row, answer)
		return out, false, err
	}
	// Set by the transaction that wrote the outbox row; rode: its commit
	// carries the sender's wake-up (outboxwake.Notifier.Ride).
	wrote, rode := false, false
	op := func(ctx context.Context, tx *database.Tx) (inbox.Outcome, error) {
		st, err := studentOf(s.q.InsertStudentWithOutbox(ctx, tx, row))
		if err != nil && !errors.Is(err, ErrDocumentTaken) {
			return inbox.Outcome{}, err
		}
		wrote = err == nil
		if wrote {
			rode = s.ride(tx)
		}
		return answer(st, err)
	}
	// Keys are scoped to their caller, as in Users.
	out, replayed, err = s.Inbox.Do(ctx, inbox.Key{Caller: caller, Value: key}, p.Fields(), op)
	if err == nil && wrote && !rode {
		s.Wake.Kick()
	}
	return out, replayed, err
}

// createOnce is CreateStudent without a key: each call a new operation,
// whose answer nothing stores. Its one statement rides with COMMIT
// (database.Tx.RunAtCommit), so the request costs one round trip, not
// two: nothing the transaction sends depends on the statement's answer.
// The wake-up rides too, decided before the answer is known: a document
// number already taken costs the sender a claim that finds nothing.
func (s *Store) createOnce(ctx context.Context, row studentdb.InsertStudentWithOutboxParams, answer AnswerFunc) (inbox.Outcome, error) {
	var (
		inserted  studentdb.InsertStudentWithOutboxRow
		insertErr error
		rode      bool
	)
	_, err := s.Inbox.Once(ctx, func(ctx context.Context, tx *database.Tx) (inbox.Outcome, error) {
		tx.RunAtCommit(func(db database.DBTX) { inserted, insertErr = s.q.InsertStudentWithOutbox(ctx, db, row) })
		rode = s.ride(tx)
		return inbox.Outcome{}, nil
	})
	if err != nil {
		return inbox.Outcome{}, err
	}
	st, err := studentOf(inserted, insertErr)
	if err != nil && !errors.Is(err, ErrDocumentTaken) {
		// Committed, but the answer could not be read: the client may
		// try again, and the document number then answers it.
		return inbox.Outcome{}, err
	}
	if err == nil && !rode {
		s.Wake.Kick()
	}
	return answer(st, err)
}

// ride has tx's commit carry the sender's wake-up when it may
// (outboxwake.Notifier.Ride); a wake-up that fails is sent apart.
func (s *Store) ride(tx *database.Tx) bool {
	wake, ok := s.Wake.Ride()
	if ok {
		tx.AfterCommit(wake, func(error) { s.Wake.Kick() })
	}
	return ok
}

// newStudentRow is the outbox half of the pattern: the student and the
// outbox row that asks Users for its user are written in the caller's
// transaction, in one statement, so both commit or neither does. The row
// gets a fresh idempotency key that stays with the operation for every
// delivery, and a payload fixed now, so every delivery sends the same
// request; it also keeps the request's trace context, so that one trace
// follows the operation through all its deliveries.
func newStudentRow(p person.Person, traceParent string) (studentdb.InsertStudentWithOutboxParams, error) {
	payload, err := json.Marshal(p)
	if err != nil {
		return studentdb.InsertStudentWithOutboxParams{}, fmt.Errorf("encode outbox payload: %w", err)
	}
	return studentdb.InsertStudentWithOutboxParams{
		ID: uuid.Must(uuid.NewV7()), Name: p.Name, Email: p.Email, DocumentNumber: p.DocumentNumber,
		IdempotencyKey: uuid.New(), Operation: outbox.OperationCreateUser, Payload: payload,
		// The sender continues this request's trace on every delivery.
		TraceParent: traceParent,
	}, nil
}

// studentOf is what InsertStudentWithOutbox answered, as a Student or
// ErrDocumentTaken.
func studentOf(st studentdb.InsertStudentWithOutboxRow, err error) (Student, error) {
	if errors.Is(err, pgx.ErrNoRows) { // ON CONFLICT DO NOTHING: neither row was written
		return Student{}, ErrDocumentTaken
	}
	if err != nil {
		return Student{}, fmt.Errorf("insert student and outbox row: %w", err)
	}
	return Student{
		ID: st.ID, Name: st.Name, Email: st.Email, DocumentNumber: st.DocumentNumber,
		CreatedAt: st.CreatedAt, OutboxState: outbox.StatePending,
	}, nil
}

// Student returns the student with id, or ErrNotFound.
func (s *Store) Student(ctx context.Context, id uuid.UUID) (Student, error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	row, err := s.q.GetStudent(ctx, s.pool, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Student{}, ErrNotFound
	}
	if err != nil {
		return Student{}, database.Classify(fmt.Errorf("get student: %w", err))
	}
	return fromRow(studentdb.ListStudentsRow(row)), nil
}

// Students returns up to limit students after the position, oldest first.
func (s *Store) Students(ctx context.Context, after Position, limit int) ([]Student, error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	rows, err := s.q.ListStudents(ctx, s.pool, studentdb.ListStudentsParams{
		AfterCreatedAt: after.CreatedAt, AfterID: after.ID, PageSize: int32(limit), //nolint:gosec // limit is at most MaxPageSize+1
	})
	if err != nil {
		return nil, database.Classify(fmt.Errorf("list students: %w", err))
	}
	out := make([]Student, len(rows))
	for i, row := range rows {
		out[i] = fromRow(row)
	}
	return out, nil
}

func fromRow(row studentdb.ListStudentsRow) Student {
	st := Student{
		ID: row.ID, Name: row.Name, Email: row.Email, DocumentNumber: row.DocumentNumber,
		UserID: row.UserID, CreatedAt: row.CreatedAt,
		OutboxState: row.OutboxState.String, Attempts: int(row.Attempts.Int32),
		ReasonClass: row.ReasonClass.String,
	}
	st.Redrives = int(row.Redrives.Int32)
	if row.RedrivenAt.Valid {
		at := row.RedrivenAt.Time.UTC()
		st.RedrivenAt = &at
	}
	return st
}
