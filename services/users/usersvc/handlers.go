// Package usersvc is the Users service: its HTTP handlers, configuration
// and Run. Users owns its database (users and inbox, behind
// internal/store); nothing else writes to it.
package usersvc

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/crashpoint"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/internal/person"
	"github.com/outboxref/outboxref/services/users/internal/store"
)

// Server serves the Users API.
type Server struct {
	log   *slog.Logger
	store *store.Store
	// auth names the caller of each API request: bearer tokens here; an
	// authenticator of client certificates would do for mutual TLS.
	auth    auth.Authenticator
	metrics *metrics
	// registry is what the admin listener's /metrics serves; observe
	// records each API request's duration in it.
	registry *prometheus.Registry
	observe  func(http.Handler) http.Handler
	// adminHosts are the host names the admin listener answers to.
	adminHosts []string
	// broker is the connection of Users' broker side (USERS_NATS_URL),
	// once it has one: readiness asks it whether the broker refuses
	// Users' login.
	broker atomic.Pointer[natsbus.Conn]
}

// ready is /readyz's probe: the database answers, and the broker, if
// Users reads commands from one, does not refuse its login. A broker that
// is merely down is not a reason: its commands wait in the stream.
func (s *Server) ready(ctx context.Context) error {
	if err := s.store.Ping(ctx); err != nil {
		return err
	}
	if nc := s.broker.Load(); nc != nil {
		if err := nc.LoginRefused(); err != nil {
			return &httpapi.NotReadyError{Dependency: "broker",
				Says: "the broker refuses Users' NATS login (user " + natsbus.UsersUser + "): check USERS_NATS_PASSWORD", Err: err}
		}
	}
	return nil
}

// Challenge is the WWW-Authenticate header of Users' 401 answers.
const Challenge = `Bearer realm="users"`

// Routes returns every route Users serves. The API answers authenticated
// callers only, and refuses anyone else before reading a byte of the body;
// the health routes stay open, for the orchestrator.
func (s *Server) Routes() http.Handler {
	r := httpapi.NewRouter(s.log, s.ready)
	r.Group(func(r chi.Router) {
		r.Use(httpapi.Authenticate(s.auth, Challenge))
		r.Post("/users", httpapi.Handle(s.createUser))
		r.Get("/users/{id}", httpapi.Handle(s.getUser))
	})
	return s.observe(r)
}

// AdminRoutes returns the admin listener's routes: /healthz, /readyz and
// /metrics, open like the health routes (the listener is for the
// orchestrator and the scraper, not the API's callers). /metrics reads no
// database, so it answers while it is down.
func (s *Server) AdminRoutes() http.Handler {
	r := httpapi.NewAdminRouter(s.log, s.ready, "USERS_ADMIN_ALLOWED_HOSTS", s.adminHosts)
	httpapi.MetricsRoute(r, s.log, s.registry)
	return r
}

// CreatedUser is the body of a 201 from POST /users, and the answer stored
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

// createUser is the receiving end of the outbox: the key is required, and
// the store runs the operation at most once per key of the caller.
func (s *Server) createUser(w http.ResponseWriter, r *http.Request) error {
	caller, ok := auth.CallerFrom(r.Context())
	if !ok {
		// Routes puts every API route behind Authenticate: a bug, not a
		// request to serve in some shared scope.
		return errors.New("create user: no authenticated caller")
	}
	key, err := httpapi.RequiredKey(r)
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
	out, replayed, err := s.store.CreateUser(r.Context(), inbox.Key{Caller: caller, Value: key}, p, answerCreateUser)
	s.metrics.countCreate(out, replayed, err)
	if err != nil {
		return err
	}
	crashpoint.Hit(crashpoint.UsersAfterCommit)
	httpapi.WriteOutcome(w, out, replayed, "/users/")
	return nil
}

// answerCreateUser is the answer stored under the key: the new user's id,
// or the business rule's refusal, which a repeat of the key gets again.
func answerCreateUser(userID uuid.UUID, err error) (inbox.Outcome, error) {
	if errors.Is(err, store.ErrDocumentTaken) {
		return httpapi.Refusal(httpapi.DocumentTaken("an enabled user already has this document number")), nil
	}
	return httpapi.Answer(http.StatusCreated, CreatedUser{UserID: userID, Status: "created"}, userID)
}

func (s *Server) getUser(w http.ResponseWriter, r *http.Request) error {
	id, err := httpapi.PathUUID(r, "id")
	if err != nil {
		return err
	}
	u, err := s.store.User(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		return httpapi.NotFound("user " + id.String())
	}
	if err != nil {
		return err
	}
	return httpapi.WriteJSON(w, http.StatusOK, User{
		ID: u.ID, Name: u.Name, Email: u.Email, DocumentNumber: u.DocumentNumber,
		Enabled: u.Enabled, CreatedAt: u.CreatedAt.UTC(),
	})
}
