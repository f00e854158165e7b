// Package httpapi is the HTTP layer that Student, Users and the sender's
// admin port share: problem details (RFC 9457) and the one function that
// renders every error, strict JSON decoding that names the field at fault,
// the Idempotency-Key header and the answers stored under it, health
// endpoints, one log line per request, and serving with a graceful stop.
//
// The domain packages (person, inbox) know nothing of HTTP; this package
// turns their errors into answers.
package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"time"
)

// ProblemContentType is the media type of every error body.
const ProblemContentType = "application/problem+json"

// Problem type URIs, relative references documented in the README. Clients
// compare them as strings; the title is for humans.
const (
	TypeValidation           = "/problems/validation"
	TypeNotFound             = "/problems/not-found"
	TypeMethodNotAllowed     = "/problems/method-not-allowed"
	TypeUnsupportedMediaType = "/problems/unsupported-media-type"
	TypeIdempotencyMismatch  = "/problems/idempotency-key-reused"
	TypeIdempotencyBusy      = "/problems/idempotency-key-in-progress"
	TypeDocumentTaken        = "/problems/document-number-taken"
	TypeInternal             = "/problems/internal"
	TypeUnavailable          = "/problems/unavailable"
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
	return &Problem{Type: TypeValidation, Title: "Invalid request", Status: http.StatusBadRequest, Detail: detail, Errors: fields}
}

// Field is Validation for a single field.
func Field(field, detail string) *Problem {
	return Validation(FieldError{Field: field, Detail: detail})
}

// DocumentTaken is the 409 of the one-per-document-number rule; detail
// says whose rule it is.
func DocumentTaken(detail string) *Problem {
	return &Problem{
		Type: TypeDocumentTaken, Title: "Document number already in use", Status: http.StatusConflict,
		Detail: detail, Errors: []FieldError{{Field: "document_number", Detail: "already in use"}},
	}
}

// NotFound is a 404 for the named resource.
func NotFound(what string) *Problem {
	return &Problem{Type: TypeNotFound, Title: "Not found", Status: http.StatusNotFound, Detail: what + " does not exist"}
}

// Unavailable is a 503 with Retry-After: a dependency the answer needs is
// down.
func Unavailable(detail string, cause error) *Problem {
	return &Problem{Type: TypeUnavailable, Title: "Service unavailable", Status: http.StatusServiceUnavailable,
		Detail: detail, Cause: cause, RetryAfter: time.Second}
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
