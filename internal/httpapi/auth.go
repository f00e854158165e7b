package httpapi

import (
	"errors"
	"net/http"

	"github.com/outboxref/outboxref/internal/auth"
)

// Authenticate lets a request through to next only when a names its
// caller, which it puts in the request's context (auth.CallerFrom) and log
// line; the connection is then the caller's (LimitConns). Otherwise it
// answers 401 before next runs, so before any body is read or any database
// touched: a refused request writes nothing, consumes no idempotency key,
// and is not kept waiting for its body (closeUnreadBodies).
//
// challenge is sent as WWW-Authenticate with every 401 (RFC 9110 §11.6.1
// requires one), such as `Bearer realm="users"`; for credentials that were
// sent but refused, RFC 6750's error="invalid_token" is added. An
// authenticator that needs no challenge (client certificates, which the
// TLS handshake asks for) passes "".
func Authenticate(a auth.Authenticator, challenge string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			caller, err := a.Caller(r)
			var refused *auth.CredentialsError
			switch {
			case errors.As(err, &refused):
				if challenge != "" {
					c := challenge
					if !refused.Missing {
						c += `, error="invalid_token"`
					}
					w.Header().Set("WWW-Authenticate", c)
				}
				Render(w, r, Unauthorized(refused.Detail))
				return
			case err != nil: // the authenticator itself failed: a 500, logged
				Render(w, r, err)
				return
			}
			noteCaller(r, caller)
			markAuthorised(r)
			next.ServeHTTP(w, r.WithContext(auth.WithCaller(r.Context(), caller)))
		})
	}
}

// Unauthorized is a 401: the request's credentials are missing or not
// accepted. detail says which, never what was sent.
func Unauthorized(detail string) *Problem {
	return &Problem{Type: TypeUnauthorized, Title: "Unauthorized", Status: http.StatusUnauthorized, Detail: detail}
}
