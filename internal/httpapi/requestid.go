package httpapi

import (
	"context"
	"net/http"

	"github.com/google/uuid"
)

// RequestIDHeader carries a request's id, both ways: a caller may name its
// request (the sender sends "<idempotency key>/<attempt>"), and every answer
// says which id its log line has, so that a client's report can be matched
// with the server's log.
const RequestIDHeader = "X-Request-Id"

// maxRequestIDLen bounds what a caller can make every log line carry.
const maxRequestIDLen = 128

type requestIDKey struct{}

// RequestIDFrom returns the request id AssignRequestID put in ctx, or "".
func RequestIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// AssignRequestID gives every request an id: the caller's X-Request-Id when
// it is a plausible one, else a new random one. The id goes into the
// request's context, for its log line, and into the answer's header.
// A header that is too long or holds other characters is replaced, not
// refused: it is only a label, and it must never put quotes, newlines or
// megabytes into the logs.
func AssignRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(RequestIDHeader)
		if !validRequestID(id) {
			id = uuid.NewString()
		}
		// Set before the handler runs: headers set after it wrote the
		// status would never be sent.
		w.Header().Set(RequestIDHeader, id)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id)))
	})
}

// validRequestID accepts 1 to 128 characters of [A-Za-z0-9._:/-]: enough for
// UUIDs, trace-like ids and the sender's "<key>/<attempt>".
func validRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDLen {
		return false
	}
	for i := range len(id) {
		c := id[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '.', c == '_', c == ':', c == '/', c == '-':
		default:
			return false
		}
	}
	return true
}
