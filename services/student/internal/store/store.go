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
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	// The create-user outbox row: its state is one of outbox.States.
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
// client's key when it sent one.
type AnswerFunc func(Student, error) (inbox.Outcome, error)

// CreateStudent writes the student and its create-user outbox row in one
// transaction. With a client key (non-empty) it runs at most once per key,
// and a repeat gets the stored answer with replayed set; without one, each
// call is a new operation. Once a new row is committed, the sender is woken
// for it.
func (s *Store) CreateStudent(ctx context.Context, caller, key string, p person.Person, answer AnswerFunc) (out inbox.Outcome, replayed bool, err error) {
	row, err := newStudentRow(p, telemetry.TraceParent(ctx))
	if err != nil {
		return inbox.Outcome{}, false, err
	}
	st := Student{
		ID: row.ID, Name: row.Name, Email: row.Email, DocumentNumber: row.DocumentNumber,
		CreatedAt: row.CreatedAt, OutboxState: outbox.StatePending,
	}
	if key == "" {
		out, err = s.createOnce(ctx, row, st, answer)
		return out, false, err
	}
	created, err := answer(st, nil)
	if err != nil {
		return inbox.Outcome{}, false, err
	}
	insert := &pgx.Batch{}
	queueInsert(insert, row)
	// Keys are scoped to their caller, as in Users.
	k := inbox.Key{Caller: caller, Value: key}
	out, replayed, err = s.Inbox.Do(ctx, k, p.Fields(), inbox.Op{Outcome: created, Effect: insert})
	if !documentTaken(err) {
		if err == nil && !replayed {
			s.Wake.Kick()
		}
		return out, replayed, err
	}
	// The number is taken: the refusal is the answer, stored under the key.
	refused, err := answer(Student{}, ErrDocumentTaken)
	if err != nil {
		return inbox.Outcome{}, false, err
	}
	return s.Inbox.Do(ctx, k, p.Fields(), inbox.Op{Outcome: refused})
}

// createOnce is CreateStudent without a key: each call a new operation,
// whose answer nothing stores. Its one statement goes out behind the lock
// timeout that bounds a wait for the same document number, as the inbox's
// does: one batch, one implicit transaction.
func (s *Store) createOnce(ctx context.Context, row studentdb.InsertStudentWithOutboxParams, st Student, answer AnswerFunc) (inbox.Outcome, error) {
	ctx, cancel := database.WithDeadline(ctx, s.timeout)
	defer cancel()
	b := &pgx.Batch{}
	b.Queue("SELECT set_config('lock_timeout', $1, true)", strconv.FormatInt(s.Inbox.LockTimeout.Milliseconds(), 10)+"ms")
	queueInsert(b, row)
	err := s.pool.SendBatch(ctx, b).Close()
	switch {
	case documentTaken(err):
		return answer(Student{}, ErrDocumentTaken)
	case lockTimeout(err):
		// Another request is inserting the same document number, and did
		// not finish within the wait.
		return inbox.Outcome{}, fmt.Errorf("%w: %w", inbox.ErrConflictInProgress, err)
	case err != nil:
		return inbox.Outcome{}, database.Classify(fmt.Errorf("insert student and outbox row: %w", err))
	}
	s.Wake.Kick()
	return answer(st, nil)
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
		// PostgreSQL keeps microseconds: the answer shows what is stored.
		CreatedAt:      time.Now().UTC().Truncate(time.Microsecond),
		IdempotencyKey: uuid.New(), Operation: outbox.OperationCreateUser, Payload: payload,
		// The sender continues this request's trace on every delivery.
		TraceParent: traceParent,
	}, nil
}

// queueInsert queues InsertStudentWithOutbox's text into b, with its
// parameters in sqlc's order (InsertStudentWithOutboxParams).
func queueInsert(b *pgx.Batch, row studentdb.InsertStudentWithOutboxParams) {
	b.Queue(studentdb.InsertStudentWithOutbox, row.IdempotencyKey, row.Operation, row.Payload, row.TraceParent,
		row.ID, row.Name, row.Email, row.DocumentNumber, row.CreatedAt)
}

// documentTaken: err is Student's rule, one student per document number,
// refusing the insert.
func documentTaken(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "students_document_number_key"
}

func lockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03" // lock_not_available
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
