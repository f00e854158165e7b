package httpapi

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/internal/person"
)

// Render is the one place an error becomes an HTTP answer. A *Problem is
// sent as it is; the domain's own errors (a person that fails validation, an
// idempotency key reused or in use, a database that is down or too slow)
// become their problems; anything else is a bare 500, because internal
// errors may carry SQL, hostnames or data a client must not see.
//
// Render does not log. It hands the error to the request's log line (see
// LogRequests), so each failure is logged exactly once, with its request.
func Render(w http.ResponseWriter, r *http.Request, err error) {
	p := asProblem(err)
	if p.Status >= 500 {
		noteError(r, err)
	}
	if p.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((p.RetryAfter+time.Second-1)/time.Second)))
	}
	if p.Status == http.StatusRequestTimeout {
		// The body that timed out is still partly on its way: nothing else
		// can be read on this connection.
		w.Header().Set("Connection", "close")
	}
	w.Header().Set("Content-Type", ProblemContentType)
	w.WriteHeader(p.Status)
	_, _ = w.Write(p.Body())
}

// ProblemOf is the problem Render would send for err: for an answer sent
// another way than HTTP (a reply on the broker) that must be the same, to
// the byte, as the HTTP hop's.
func ProblemOf(err error) *Problem { return asProblem(err) }

func asProblem(err error) *Problem {
	var (
		p        *Problem
		invalid  *person.InvalidError
		mismatch *inbox.MismatchError
	)
	switch {
	case errors.As(err, &p):
		return p
	case errors.As(err, &invalid):
		fields := make([]FieldError, len(invalid.Fields))
		for i, f := range invalid.Fields {
			fields[i] = FieldError{Field: f.Field, Detail: f.Detail}
		}
		return Validation(fields...)
	case errors.As(err, &mismatch):
		p := NewProblem(TypeIdempotencyMismatch,
			"this Idempotency-Key was first used with a request whose fields differ; use a new key for a new request")
		for _, f := range mismatch.Fields {
			p.Errors = append(p.Errors, FieldError{Field: f, Detail: "differs from the first request sent with this key"})
		}
		return p
	case errors.Is(err, inbox.ErrKeyInProgress):
		p := NewProblem(TypeIdempotencyBusy, "another request with this Idempotency-Key is still being processed; retry later")
		p.RetryAfter = time.Second
		return p
	case errors.Is(err, database.ErrUnavailable):
		// The cause (which may name hosts, ports or SQL) stays in the log.
		return Unavailable("the database is unavailable or did not answer in time; retry later", nil)
	case errors.Is(err, inbox.ErrConflictInProgress):
		// Nothing is wrong with the request; it could not be decided in
		// time because a conflicting one still holds a lock.
		return Unavailable("a conflicting request is still being processed; retry later", nil)
	}
	return NewProblem(TypeInternal, "")
}

// HandlerFunc is an http.HandlerFunc that returns its error instead of
// writing it, so every error goes through Render.
type HandlerFunc func(w http.ResponseWriter, r *http.Request) error

// Handle adapts h to http.HandlerFunc.
func Handle(h HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			Render(w, r, err)
		}
	}
}
