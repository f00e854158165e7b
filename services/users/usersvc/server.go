// Package usersvc is the Users service: HTTP handlers, configuration and the
// process lifecycle. Users owns its database (users and inbox); nothing else
// writes to it.
package usersvc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/internal/crashpoint"
	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/internal/person"
	"github.com/outboxref/outboxref/internal/problem"
	"github.com/outboxref/outboxref/internal/web"
	"github.com/outboxref/outboxref/services/users/internal/usersdb"
)

// Server serves the Users API.
type Server struct {
	log   *slog.Logger
	pool  *pgxpool.Pool
	q     *usersdb.Queries
	inbox *inbox.Inbox
	crash *crashpoint.Set
}

// NewServer returns a Server on pool's database.
func NewServer(log *slog.Logger, pool *pgxpool.Pool, cfg Config) *Server {
	ib := inbox.New(pool)
	ib.LockTimeout = cfg.KeyWait
	return &Server{log: log, pool: pool, q: usersdb.New(), inbox: ib, crash: cfg.Crash}
}

// Routes returns every route Users serves.
func (s *Server) Routes() http.Handler {
	r := web.NewRouter(s.log, s.pool.Ping)
	r.Post("/users", web.Handle(s.log, s.createUser))
	r.Get("/users/{id}", web.Handle(s.log, s.getUser))
	return r
}

// CreatedUser is the body of a 201 from POST /users, and the result stored
// in the inbox under the request's key.
type CreatedUser struct {
	UserID uuid.UUID `json:"userId"`
	Status string    `json:"status"`
}

// User is the representation of a user.
type User struct {
	ID             uuid.UUID `json:"id"`
	Name           string    `json:"name"`
	Email          string    `json:"email"`
	DocumentNumber string    `json:"document_number"`
	Enabled        bool      `json:"enabled"`
	CreatedAt      time.Time `json:"created_at"`
}

func (s *Server) createUser(w http.ResponseWriter, r *http.Request) error {
	key, present, err := inbox.HeaderKey(r.Header)
	if !present {
		err = inbox.ErrNoKey
	}
	if err != nil {
		return problem.Field("Idempotency-Key", err.Error())
	}
	p, err := person.Decode(w, r)
	if err != nil {
		return err
	}
	out, replayed, err := s.inbox.Do(r.Context(), key, p.Request(), func(ctx context.Context, tx pgx.Tx) (inbox.Outcome, error) {
		return s.insertUser(ctx, tx, p)
	})
	if err != nil {
		return err
	}
	s.crash.Hit(CrashAfterCommit)
	out.Write(w, replayed, "/users/")
	return nil
}

// insertUser applies the business rule (one enabled user per document
// number) and returns the outcome to store under the key: a new user, or a
// refusal that a repeat of the key will get again.
func (s *Server) insertUser(ctx context.Context, tx pgx.Tx, p person.Person) (inbox.Outcome, error) {
	u, err := s.q.InsertUser(ctx, tx, usersdb.InsertUserParams{
		ID: uuid.Must(uuid.NewV7()), Name: p.Name, Email: p.Email, DocumentNumber: p.DocumentNumber,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return inbox.Refusal(problem.DocumentTaken("an enabled user already has this document number")), nil
	}
	if err != nil {
		return inbox.Outcome{}, fmt.Errorf("insert user: %w", err)
	}
	body, err := json.Marshal(CreatedUser{UserID: u.ID, Status: "created"})
	if err != nil {
		return inbox.Outcome{}, fmt.Errorf("encode result: %w", err)
	}
	return inbox.Outcome{Status: http.StatusCreated, Body: body, ResourceID: u.ID}, nil
}

func (s *Server) getUser(w http.ResponseWriter, r *http.Request) error {
	id, err := uuid.Parse(chi.URLParam(r, "id"))
	if err != nil {
		return problem.Field("id", "must be a UUID")
	}
	u, err := s.q.GetUser(r.Context(), s.pool, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return problem.NotFound("user " + id.String())
	}
	if err != nil {
		return fmt.Errorf("get user: %w", err)
	}
	web.WriteJSON(w, http.StatusOK, User{
		ID: u.ID, Name: u.Name, Email: u.Email, DocumentNumber: u.DocumentNumber,
		Enabled: u.Enabled, CreatedAt: u.CreatedAt.UTC(),
	})
	return nil
}
