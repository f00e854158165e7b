// Package httpapi is the HTTP layer that Student, Users and the sender's
// admin port share: problem details (RFC 9457) and the one function that
// renders every error, strict JSON decoding that names the field at fault,
// the Idempotency-Key header and the answers stored under it, health
// endpoints, the pages problem types resolve to, one log line per request,
// and serving with bounded connections, sizes and times and a graceful stop.
//
// The domain packages (person, inbox) know nothing of HTTP; this package
// turns their errors into answers.
package httpapi

import (
	"bytes"
	"encoding/json"
	"time"
)

// ProblemContentType is the media type of every error body.
const ProblemContentType = "application/problem+json"

// Problem type URIs: relative references, which every listener resolves
// to a page explaining the problem (see problemTypes, where each needs an
// entry). Clients compare them as strings; the title is for humans.
const (
	TypeValidation           = "/problems/validation"
	TypeUnauthorized         = "/problems/unauthorized"
	TypeForbidden            = "/problems/forbidden"
	TypeNotFound             = "/problems/not-found"
	TypeMethodNotAllowed     = "/problems/method-not-allowed"
	TypeUnsupportedMediaType = "/problems/unsupported-media-type"
	TypeIdempotencyMismatch  = "/problems/idempotency-key-reused"
	TypeIdempotencyBusy      = "/problems/idempotency-key-in-progress"
	TypeDocumentTaken        = "/problems/document-number-taken"
	TypeInternal             = "/problems/internal"
	TypeUnavailable          = "/problems/unavailable"
	TypeRequestTimeout       = "/problems/request-timeout"
	// The sender's admin routes' own types.
	TypeOutboxRowNotDead  = "/problems/outbox-row-not-dead"
	TypeNewKeyUnsafe      = "/problems/new-key-unsafe"
	TypeRedriveLimit      = "/problems/redrive-limit"
	TypeKeyMayBeForgotten = "/problems/key-may-be-forgotten"
	TypeOutboxRowBusy     = "/problems/outbox-row-busy"
)

// FieldError names one input field and what is wrong with it.
type FieldError struct {
	Field  string `json:"field"`
	Detail string `json:"detail"`
}

// Problem is an error a client can act on. Its fields are the RFC 9457
// members plus two extensions: "errors", listing the fields at fault, and
// "dependencies", the state of each dependency /readyz checks.
type Problem struct {
	Type         string            `json:"type"`
	Title        string            `json:"title"`
	Status       int               `json:"status"`
	Detail       string            `json:"detail,omitempty"`
	Errors       []FieldError      `json:"errors,omitempty"`
	Dependencies map[string]string `json:"dependencies,omitempty"`

	// RetryAfter, when set, is sent as the Retry-After header.
	RetryAfter time.Duration `json:"-"`
	// Cause is what went wrong inside, for the request's log line; it is
	// never sent.
	Cause error `json:"-"`
	// Expected marks a 5xx that is a known state, not a fault to alert on
	// (not ready yet, too many scrapes at once): its request line is
	// logged at warn level, not error. Logged is a 5xx whose cause was
	// already said elsewhere, paced: its line is left at debug level.
	Expected, Logged bool `json:"-"`
}

func (p *Problem) Error() string {
	if p.Detail != "" {
		return p.Title + ": " + p.Detail
	}
	return p.Title
}

func (p *Problem) Unwrap() error { return p.Cause }

// Validation is a 400 naming every field at fault.
func Validation(fields ...FieldError) *Problem {
	detail := "the request is not valid"
	if len(fields) == 1 {
		detail = fields[0].Field + ": " + fields[0].Detail
	}
	p := NewProblem(TypeValidation, detail)
	p.Errors = fields
	return p
}

// Field is Validation for a single field.
func Field(field, detail string) *Problem {
	return Validation(FieldError{Field: field, Detail: detail})
}

// DocumentTaken is the 409 of the one-per-document-number rule; detail
// says whose rule it is.
func DocumentTaken(detail string) *Problem {
	p := NewProblem(TypeDocumentTaken, detail)
	p.Errors = []FieldError{{Field: "document_number", Detail: "already in use"}}
	return p
}

// NotFound is a 404 for the named resource.
func NotFound(what string) *Problem {
	return NewProblem(TypeNotFound, what+" does not exist")
}

// Unavailable is a 503 with Retry-After: a dependency the answer needs is
// down.
func Unavailable(detail string, cause error) *Problem {
	p := NewProblem(TypeUnavailable, detail)
	p.Cause, p.RetryAfter = cause, time.Second
	return p
}

// Body renders the problem as JSON. Characters such as & and < are sent as
// they are: the body is JSON for API clients, not HTML.
func (p *Problem) Body() []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(p); err != nil {
		panic("httpapi: marshal problem: " + err.Error()) // only strings and ints: cannot fail
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}
