// Package studentsvc is the Student service: HTTP handlers, configuration
// and the process lifecycle. Student owns its database (students, outbox and
// the inbox of client idempotency keys); the outbox sender is the only other
// process that writes to it, and only to record delivery.
package studentsvc

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/internal/person"
	"github.com/outboxref/outboxref/internal/problem"
	"github.com/outboxref/outboxref/internal/web"
	"github.com/outboxref/outboxref/services/student/internal/studentdb"
)

// OperationCreateUser is the outbox operation that asks Users for a user.
const OperationCreateUser = "create-user"

// Page sizes for GET /students.
const (
	DefaultPageSize = 50
	MaxPageSize     = 200
)

// Server serves the Student API.
type Server struct {
	log   *slog.Logger
	pool  *pgxpool.Pool
	q     *studentdb.Queries
	inbox *inbox.Inbox
}

// NewServer returns a Server on pool's database.
func NewServer(log *slog.Logger, pool *pgxpool.Pool, cfg Config) *Server {
	ib := inbox.New(pool)
	ib.LockTimeout = cfg.KeyWait
	return &Server{log: log, pool: pool, q: studentdb.New(), inbox: ib}
}

// Routes returns every route Student serves.
func (s *Server) Routes() http.Handler {
	r := web.NewRouter(s.log, s.pool.Ping)
	r.Post("/students", web.Handle(s.log, s.createStudent))
	r.Get("/students", web.Handle(s.log, s.listStudents))
	r.Get("/students/{id}", web.Handle(s.log, s.getStudent))
	return r
}

// Student is the representation of a student.
type Student struct {
	ID             uuid.UUID    `json:"id"`
	Name           string       `json:"name"`
	Email          string       `json:"email"`
	DocumentNumber string       `json:"document_number"`
	UserID         *uuid.UUID   `json:"user_id"`
	CreatedAt      time.Time    `json:"created_at"`
	Provisioning   Provisioning `json:"provisioning"`
}

// Provisioning is where the student's create-user operation stands.
type Provisioning struct {
	// State is pending (not yet answered by Users), linked (user_id is
	// recorded) or failed (dead-lettered; LastError says why).
	State     string  `json:"state"`
	Attempts  int     `json:"attempts"`
	LastError *string `json:"last_error"`
}

// Provisioning states.
const (
	StatePending = "pending"
	StateLinked  = "linked"
	StateFailed  = "failed"
)

// Page is one page of GET /students.
type Page struct {
	Items      []Student `json:"items"`
	NextCursor *string   `json:"next_cursor"`
}

// outboxPayload is what the sender posts to Users. It is fixed when the
// student is created, so every delivery of the operation sends the same
// request under the same key.
type outboxPayload = person.Person

func (s *Server) createStudent(w http.ResponseWriter, r *http.Request) error {
	key, hasKey, err := inbox.HeaderKey(r.Header)
	if err != nil {
		return problem.Field("Idempotency-Key", err.Error())
	}
	p, err := person.Decode(w, r)
	if err != nil {
		return err
	}
	op := func(ctx context.Context, tx pgx.Tx) (inbox.Outcome, error) { return s.insertStudent(ctx, tx, p) }

	var (
		out      inbox.Outcome
		replayed bool
	)
	if hasKey {
		out, replayed, err = s.inbox.Do(r.Context(), key, p.Request(), op)
	} else {
		out, err = s.inbox.Once(r.Context(), op) // without a key each request is a new operation
	}
	if err != nil {
		return err
	}
	out.Write(w, replayed, "/students/")
	return nil
}

// insertStudent writes the student and its create-user outbox row in the
// caller's transaction: both commit or neither does. The outbox row gets a
// fresh idempotency key that stays with the operation for every delivery.
func (s *Server) insertStudent(ctx context.Context, tx pgx.Tx, p person.Person) (inbox.Outcome, error) {
	st, err := s.q.InsertStudent(ctx, tx, studentdb.InsertStudentParams{
		ID: uuid.Must(uuid.NewV7()), Name: p.Name, Email: p.Email, DocumentNumber: p.DocumentNumber,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return inbox.Refusal(problem.DocumentTaken("a student with this document number already exists")), nil
	}
	if err != nil {
		return inbox.Outcome{}, fmt.Errorf("insert student: %w", err)
	}
	payload, err := json.Marshal(outboxPayload(p))
	if err != nil {
		return inbox.Outcome{}, fmt.Errorf("encode outbox payload: %w", err)
	}
	if err := s.q.InsertOutboxRow(ctx, tx, studentdb.InsertOutboxRowParams{
		IdempotencyKey: uuid.New(), Operation: OperationCreateUser, StudentID: st.ID, Payload: payload,
	}); err != nil {
		return inbox.Outcome{}, fmt.Errorf("insert outbox row: %w", err)
	}
	body, err := json.Marshal(Student{
		ID: st.ID, Name: st.Name, Email: st.Email, DocumentNumber: st.DocumentNumber, CreatedAt: st.CreatedAt.UTC(),
		Provisioning: Provisioning{State: StatePending},
	})
	if err != nil {
		return inbox.Outcome{}, fmt.Errorf("encode student: %w", err)
	}
	return inbox.Outcome{Status: http.StatusCreated, Body: body, ResourceID: st.ID}, nil
}

func (s *Server) getStudent(w http.ResponseWriter, r *http.Request) error {
	id, err := uuid.Parse(chi.URLParam(r, "id"))
	if err != nil {
		return problem.Field("id", "must be a UUID")
	}
	row, err := s.q.GetStudent(r.Context(), s.pool, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return problem.NotFound("student " + id.String())
	}
	if err != nil {
		return fmt.Errorf("get student: %w", err)
	}
	web.WriteJSON(w, http.StatusOK, studentFromRow(studentdb.ListStudentsRow(row)))
	return nil
}

func (s *Server) listStudents(w http.ResponseWriter, r *http.Request) error {
	query, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return problem.Field("query", "malformed query string")
	}
	for name := range query {
		if name != "limit" && name != "cursor" {
			return problem.Field(name, "unknown parameter; want limit or cursor")
		}
	}
	limit := DefaultPageSize
	if v := query.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxPageSize {
			return problem.Field("limit", fmt.Sprintf("must be a whole number from 1 to %d", MaxPageSize))
		}
		limit = n
	}
	after := cursor{}
	if v := query.Get("cursor"); v != "" {
		c, err := parseCursor(v)
		if err != nil {
			return problem.Field("cursor", "not a cursor returned by this API")
		}
		after = c
	}
	// One extra row tells whether another page exists.
	rows, err := s.q.ListStudents(r.Context(), s.pool, studentdb.ListStudentsParams{
		AfterCreatedAt: after.createdAt, AfterID: after.id, PageSize: int32(limit + 1),
	})
	if err != nil {
		return fmt.Errorf("list students: %w", err)
	}
	page := Page{Items: make([]Student, 0, min(len(rows), limit))}
	for i, row := range rows {
		if i == limit {
			next := cursor{createdAt: rows[i-1].CreatedAt, id: rows[i-1].ID}.String()
			page.NextCursor = &next
			break
		}
		page.Items = append(page.Items, studentFromRow(row))
	}
	web.WriteJSON(w, http.StatusOK, page)
	return nil
}

func studentFromRow(row studentdb.ListStudentsRow) Student {
	st := Student{
		ID: row.ID, Name: row.Name, Email: row.Email, DocumentNumber: row.DocumentNumber,
		CreatedAt:    row.CreatedAt.UTC(),
		Provisioning: Provisioning{State: StatePending, Attempts: int(row.Attempts.Int32), LastError: textPtr(row.LastError)},
	}
	if row.UserID.Valid {
		st.UserID = &row.UserID.UUID
	}
	switch {
	case row.UserID.Valid:
		st.Provisioning.State = StateLinked
	case row.OutboxState.String == "dead":
		st.Provisioning.State = StateFailed
	}
	return st
}

func textPtr(t pgtype.Text) *string {
	if !t.Valid {
		return nil
	}
	return &t.String
}

// cursor is the position after which the next page starts. It travels as
// opaque base64 so clients do not come to depend on its form.
type cursor struct {
	createdAt time.Time
	id        uuid.UUID
}

func (c cursor) String() string {
	raw := strconv.FormatInt(c.createdAt.UnixMicro(), 10) + "," + c.id.String()
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}

func parseCursor(s string) (cursor, error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return cursor{}, err
	}
	ts, id, ok := strings.Cut(string(raw), ",")
	if !ok {
		return cursor{}, errors.New("no separator")
	}
	micros, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return cursor{}, err
	}
	// Cursors we issue hold times from 1970 to 9999; anything else would
	// only reach the database to fail there as out of range.
	if micros < 0 || micros >= 253402300800000000 {
		return cursor{}, errors.New("time out of range")
	}
	u, err := uuid.Parse(id)
	if err != nil {
		return cursor{}, err
	}
	return cursor{createdAt: time.UnixMicro(micros), id: u}, nil
}
