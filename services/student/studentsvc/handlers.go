// Package studentsvc is the Student service: its HTTP handlers,
// configuration and Run. Student owns its database (students, outbox and the
// inbox of client idempotency keys, behind internal/store); the outbox
// sender is the only other process that writes to it, and only to record
// delivery.
package studentsvc

import (
	"encoding/base64"
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
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/internal/person"
	"github.com/outboxref/outboxref/services/student/internal/store"
)

// Page sizes for GET /students.
const (
	DefaultPageSize = 50
	MaxPageSize     = 200
)

// Server serves the Student API.
type Server struct {
	log   *slog.Logger
	store *store.Store
	// auth names the caller of each API request (cfg.Callers).
	auth    auth.Authenticator
	metrics *metrics
	// registry is what the admin listener's /metrics serves; observe
	// records each API request's duration in it.
	registry *prometheus.Registry
	observe  func(http.Handler) http.Handler
	// adminHosts are the host names the admin listener answers to.
	adminHosts []string
}

// Challenge is the WWW-Authenticate header of Student's 401 answers.
const Challenge = `Bearer realm="student"`

// Routes returns every route Student serves. Its API is the one open to
// the internet, so its requests start traces of their own; it answers
// authenticated callers only (it shows every student's email and document
// number), refusing anyone else before reading a byte of the body. The
// health routes stay open, for the orchestrator.
func (s *Server) Routes() http.Handler {
	r := httpapi.NewPublicRouter(s.log, s.store.Ping)
	r.Group(func(r chi.Router) {
		r.Use(httpapi.Authenticate(s.auth, Challenge))
		r.Post("/students", httpapi.Handle(s.createStudent))
		r.Get("/students", httpapi.Handle(s.listStudents))
		r.Get("/students/{id}", httpapi.Handle(s.getStudent))
	})
	return s.observe(r)
}

// AdminRoutes returns the admin listener's routes: /healthz, /readyz and
// /metrics. /metrics reads no database, so it answers while it is down.
func (s *Server) AdminRoutes() http.Handler {
	r := httpapi.NewAdminRouter(s.log, s.store.Ping, "STUDENT_ADMIN_ALLOWED_HOSTS", s.adminHosts)
	httpapi.MetricsRoute(r, s.log, s.registry)
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
	// recorded) or failed (dead-lettered; Reason says why).
	State    string `json:"state"`
	Attempts int    `json:"attempts"`
	// Reason classifies why the last attempt failed or why the operation
	// was given up on; nil when nothing failed. The full error is not
	// shown: it names internal hosts and addresses, and stays in the logs
	// and the sender's admin API.
	Reason *Reason `json:"reason"`
	// Redrives counts how often an operator brought the failed operation
	// back (the sender's admin port has the whole history).
	Redrives   int        `json:"redrives"`
	RedrivenAt *time.Time `json:"redriven_at"`
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

// createStudent takes the client's optional Idempotency-Key; the store
// writes the student and its outbox row together.
func (s *Server) createStudent(w http.ResponseWriter, r *http.Request) error {
	key, _, err := httpapi.IdempotencyKey(r)
	if err != nil {
		return err
	}
	var in person.Input
	if err := httpapi.DecodeJSON(w, r, &in); err != nil {
		return err
	}
	p, err := in.Validate()
	if err != nil {
		return err
	}
	// Each caller's keys are its own: one caller's key can neither replay
	// another's answer nor tell, by a 422, which fields it guessed right.
	caller, ok := auth.CallerFrom(r.Context())
	if !ok {
		return errors.New("create student: no authenticated caller") // Routes always authenticates first
	}
	out, replayed, err := s.store.CreateStudent(r.Context(), caller, key, p, answerCreateStudent)
	s.metrics.countCreate(key != "", out, replayed, err)
	if err != nil {
		return err
	}
	httpapi.WriteOutcome(w, out, replayed, "/students/")
	return nil
}

// answerCreateStudent is the client's answer, stored under its key: the new
// student, still pending, or the refusal of a taken document number.
func answerCreateStudent(st store.Student, err error) (inbox.Outcome, error) {
	if errors.Is(err, store.ErrDocumentTaken) {
		return httpapi.Refusal(httpapi.DocumentTaken("a student with this document number already exists")), nil
	}
	return httpapi.Answer(http.StatusCreated, representation(st), st.ID)
}

func (s *Server) getStudent(w http.ResponseWriter, r *http.Request) error {
	id, err := httpapi.PathUUID(r, "id")
	if err != nil {
		return err
	}
	st, err := s.store.Student(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		return httpapi.NotFound("student " + id.String())
	}
	if err != nil {
		return err
	}
	return httpapi.WriteJSON(w, http.StatusOK, representation(st))
}

func (s *Server) listStudents(w http.ResponseWriter, r *http.Request) error {
	query, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return httpapi.Field("query", "malformed query string")
	}
	for name := range query {
		if name != "limit" && name != "cursor" {
			return httpapi.Field(name, "unknown parameter; want limit or cursor")
		}
	}
	limit := DefaultPageSize
	if v, ok := query["limit"]; ok {
		n, ok := httpapi.ParseCount(v[0])
		if !ok || n > MaxPageSize {
			return httpapi.Field("limit", fmt.Sprintf("must be a whole number from 1 to %d, written without sign or leading zeros", MaxPageSize))
		}
		limit = int(n)
	}
	after := cursor{}
	if v := query.Get("cursor"); v != "" {
		c, err := parseCursor(v)
		if err != nil {
			return httpapi.Field("cursor", "not a cursor returned by this API")
		}
		after = c
	}
	// One extra row tells whether another page exists.
	rows, err := s.store.Students(r.Context(), store.Position(after), limit+1)
	if err != nil {
		return err
	}
	page := Page{Items: make([]Student, 0, min(len(rows), limit))}
	for i, st := range rows {
		if i == limit {
			next := cursor{CreatedAt: rows[i-1].CreatedAt, ID: rows[i-1].ID}.String()
			page.NextCursor = &next
			break
		}
		page.Items = append(page.Items, representation(st))
	}
	return httpapi.WriteJSON(w, http.StatusOK, page)
}

// representation is a student as the API shows it: where its user stands is
// read from the user id and the outbox row together.
func representation(st store.Student) Student {
	out := Student{
		ID: st.ID, Name: st.Name, Email: st.Email, DocumentNumber: st.DocumentNumber,
		CreatedAt: st.CreatedAt.UTC(),
		Provisioning: Provisioning{
			State: StatePending, Attempts: st.Attempts, Reason: reasonFor(st.ReasonClass),
			Redrives: st.Redrives, RedrivenAt: st.RedrivenAt,
		},
	}
	switch {
	case st.UserID.Valid:
		out.UserID = &st.UserID.UUID
		out.Provisioning.State = StateLinked
	case st.OutboxState == outbox.StateDead:
		out.Provisioning.State = StateFailed
	}
	return out
}

// cursor is the position after which the next page starts. It travels as
// opaque base64 so clients do not come to depend on its form.
type cursor store.Position

func (c cursor) String() string {
	raw := strconv.FormatInt(c.CreatedAt.UnixMicro(), 10) + "," + c.ID.String()
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
	u, ok := httpapi.ParseUUID(id)
	if !ok {
		return cursor{}, errors.New("bad id")
	}
	return cursor{CreatedAt: time.UnixMicro(micros), ID: u}, nil
}
