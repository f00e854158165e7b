// Package problem owns the one error type that crosses the HTTP boundary and
// its rendering as RFC 9457 problem details (application/problem+json).
// Handlers return errors; Write turns them into responses in one place, so
// every 4xx names what was wrong and no 5xx leaks an internal detail.
package problem

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"
)

// ContentType is the media type of every error body.
const ContentType = "application/problem+json"

// Type URIs, relative references documented in the README. Clients compare
// them as strings; the title is for humans.
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

// Error is a problem a client can act on. Its fields are the RFC 9457 members
// plus "errors", an extension listing the fields at fault.
type Error struct {
	Type   string       `json:"type"`
	Title  string       `json:"title"`
	Status int          `json:"status"`
	Detail string       `json:"detail,omitempty"`
	Errors []FieldError `json:"errors,omitempty"`

	// RetryAfter, when set, is sent as the Retry-After header.
	RetryAfter time.Duration `json:"-"`
}

func (e *Error) Error() string {
	if e.Detail != "" {
		return e.Title + ": " + e.Detail
	}
	return e.Title
}

// Validation is a 400 naming every field at fault.
func Validation(fields ...FieldError) *Error {
	detail := "the request is not valid"
	if len(fields) == 1 {
		detail = fields[0].Field + ": " + fields[0].Detail
	}
	return &Error{Type: TypeValidation, Title: "Invalid request", Status: http.StatusBadRequest, Detail: detail, Errors: fields}
}

// Field is Validation for a single field.
func Field(field, detail string) *Error {
	return Validation(FieldError{Field: field, Detail: detail})
}

// DocumentTaken is the 409 of the one-per-document-number rule; detail
// says whose rule it is.
func DocumentTaken(detail string) *Error {
	return &Error{
		Type: TypeDocumentTaken, Title: "Document number already in use", Status: http.StatusConflict,
		Detail: detail, Errors: []FieldError{{Field: "document_number", Detail: "already in use"}},
	}
}

// NotFound is a 404 for the named resource.
func NotFound(what string) *Error {
	return &Error{Type: TypeNotFound, Title: "Not found", Status: http.StatusNotFound, Detail: what + " does not exist"}
}

// Body renders the problem as JSON. Characters such as & and < are sent as
// they are: the body is JSON for API clients, not HTML.
func (e *Error) Body() []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(e); err != nil {
		panic("problem: marshal: " + err.Error()) // only strings and ints: cannot fail
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// Write renders err. A *Error is sent as it is; anything else is logged with
// its detail and answered with a bare 500, because internal errors may carry
// SQL, hostnames or data that a client must not see.
func Write(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	var p *Error
	if !errors.As(err, &p) {
		log.ErrorContext(r.Context(), "request failed",
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("error", err.Error()))
		p = &Error{Type: TypeInternal, Title: "Internal server error", Status: http.StatusInternalServerError}
	} else if p.Status >= 500 {
		log.ErrorContext(r.Context(), "request failed",
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("error", p.Error()))
	}
	if p.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((p.RetryAfter+time.Second-1)/time.Second)))
	}
	w.Header().Set("Content-Type", ContentType)
	w.WriteHeader(p.Status)
	_, _ = w.Write(p.Body())
}
