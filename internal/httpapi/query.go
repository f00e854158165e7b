package httpapi

import (
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
)

// rejectRepeatedQuery refuses, before any route runs, a query string that
// cannot be parsed or that gives a parameter more than once, naming each
// such parameter. Query().Get takes the first value and drops the rest
// without a word: a client that sent limit=10&limit=500 would get an answer
// to a question it may not have meant. Unknown parameters are each
// handler's business.
func rejectRepeatedQuery(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := checkQuery(r.URL.RawQuery); err != nil {
			Render(w, r, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func checkQuery(raw string) error {
	if raw == "" {
		return nil
	}
	q, err := url.ParseQuery(raw)
	if err != nil {
		return Field("query", "malformed query string")
	}
	var errs []FieldError
	for _, name := range slices.Sorted(maps.Keys(q)) {
		if len(q[name]) > 1 {
			errs = append(errs, FieldError{Field: name, Detail: "given more than once; send each parameter once"})
		}
	}
	if len(errs) > 0 {
		return Validation(errs...)
	}
	return nil
}

// ParseUUID accepts a UUID in its canonical text only: 36 characters,
// lowercase hexadecimal digits in groups of 8-4-4-4-12 joined by dashes,
// the form the APIs write. uuid.Parse also takes upper case, braces,
// "urn:uuid:" and no dashes; accepting those would give one resource many
// URLs, which caches, logs and clients comparing URLs take for different
// resources.
func ParseUUID(s string) (uuid.UUID, bool) {
	if len(s) != 36 {
		return uuid.Nil, false
	}
	for i := range len(s) {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return uuid.Nil, false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return uuid.Nil, false
			}
		}
	}
	u, err := uuid.Parse(s)
	return u, err == nil
}

// PathUUID reads the route parameter name as a canonical UUID (see
// ParseUUID). Anything else is a 400 naming the parameter rather than a
// 404: no resource can have such a name, and saying which part of the URL
// is wrong tells the client to fix how it builds URLs, where a 404 would
// suggest the resource might exist some other time.
func PathUUID(r *http.Request, name string) (uuid.UUID, error) {
	u, ok := ParseUUID(chi.URLParam(r, name))
	if !ok {
		return uuid.Nil, Field(name, "must be a UUID in canonical form: 32 lowercase hex digits as 8-4-4-4-12, such as 01a237d2-c993-7626-8986-e2c90b9557fa")
	}
	return u, nil
}

// ParseCount reads a positive whole number in its canonical form only:
// decimal digits, without sign, leading zeros or spaces, as the API writes
// it. strconv alone would also take "+5" and "05", giving one page or row
// several URLs; "" is not a number either.
func ParseCount(s string) (int64, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 || strconv.FormatInt(n, 10) != s {
		return 0, false
	}
	return n, true
}
