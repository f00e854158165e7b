// Package person owns the fields both services accept for a person (name,
// email, document number): decoding, the validation rules, and the canonical
// form used to fingerprint a request. Student and Users apply the same rules
// so that anything Student accepts, Users accepts too: a row the sender could
// never deliver would otherwise sit in the outbox until it dead-letters.
package person

import (
	"net/http"
	"net/mail"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/outboxref/outboxref/internal/inbox"
	"github.com/outboxref/outboxref/internal/problem"
	"github.com/outboxref/outboxref/internal/web"
)

// Limits on each field, in characters.
const (
	MaxName     = 200
	MaxEmail    = 254 // RFC 5321's limit on a forward path
	MinDocument = 3
	MaxDocument = 32
)

// Person is a validated set of fields.
type Person struct {
	Name           string `json:"name"`
	Email          string `json:"email"`
	DocumentNumber string `json:"document_number"`
}

// input distinguishes a missing field (nil) from an empty one.
type input struct {
	Name           *string `json:"name"`
	Email          *string `json:"email"`
	DocumentNumber *string `json:"document_number"`
}

// Decode reads and validates a Person from the request body. Every field at
// fault is named in one 400 problem.
func Decode(w http.ResponseWriter, r *http.Request) (Person, error) {
	var in input
	if err := web.DecodeJSON(w, r, &in); err != nil {
		return Person{}, err
	}
	return in.validate()
}

func (in input) validate() (Person, error) {
	var (
		p    Person
		errs []problem.FieldError
	)
	field := func(name string, v *string, check func(string) string) string {
		if v == nil {
			errs = append(errs, problem.FieldError{Field: name, Detail: "required"})
			return ""
		}
		s := strings.TrimSpace(*v)
		if s == "" {
			errs = append(errs, problem.FieldError{Field: name, Detail: "must not be empty"})
			return ""
		}
		if why := check(s); why != "" {
			errs = append(errs, problem.FieldError{Field: name, Detail: why})
		}
		return s
	}
	p.Name = field("name", in.Name, checkName)
	p.Email = field("email", in.Email, checkEmail)
	p.DocumentNumber = field("document_number", in.DocumentNumber, checkDocument)
	if len(errs) > 0 {
		return Person{}, problem.Validation(errs...)
	}
	return p, nil
}

func checkName(s string) string {
	if utf8.RuneCountInString(s) > MaxName {
		return "must be at most 200 characters"
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return "must not contain control characters"
		}
	}
	return ""
}

func checkEmail(s string) string {
	if len(s) > MaxEmail {
		return "must be at most 254 characters"
	}
	a, err := mail.ParseAddress(s)
	if err != nil || a.Address != s || a.Name != "" {
		return "must be a plain address such as ada@example.com"
	}
	return ""
}

func checkDocument(s string) string {
	if len(s) < MinDocument || len(s) > MaxDocument {
		return "must be 3 to 32 characters"
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c == '.' || c == '-' || c == '/') {
			return "may hold only letters, digits, '.', '-' and '/'"
		}
	}
	return ""
}

// Request is the canonical form fingerprinted under an idempotency key.
func (p Person) Request() inbox.Request {
	return inbox.Request{"name": p.Name, "email": p.Email, "document_number": p.DocumentNumber}
}
