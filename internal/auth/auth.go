// Package auth says who is calling an API. Users serves known callers
// only: an Authenticator names the caller of each request, and the caller
// then scopes what the request touches (its idempotency keys, for one).
//
// Bearer tokens (Tokens) are what the binaries use. Mutual TLS replaces
// them with another Authenticator (Certificates) and a listener that
// verifies client certificates; nothing above this package changes, since
// everything above it sees only the caller's name.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
)

// Authenticator names the caller of a request. It reads only the request's
// headers or its connection, never the body, so it can run before anything
// else does.
type Authenticator interface {
	// Caller returns the caller's name, or a *CredentialsError saying
	// what is missing or wrong.
	Caller(r *http.Request) (string, error)
}

// CredentialsError is a request whose credentials are missing or not
// accepted. Its Detail is safe to send to the client: it never holds the
// credential itself.
type CredentialsError struct {
	// Missing: the request carried no credentials at all (as opposed to
	// malformed or unknown ones).
	Missing bool
	Detail  string
}

func (e *CredentialsError) Error() string { return "auth: " + e.Detail }

// Secret is a string that formats and logs as [redacted], so that a
// configuration printed or logged by mistake does not show it.
type Secret string

func (Secret) String() string   { return "[redacted]" }
func (Secret) GoString() string { return "[redacted]" }

// LogValue keeps the secret out of slog output.
func (Secret) LogValue() slog.Value { return slog.StringValue("[redacted]") }

// MarshalText keeps the secret out of JSON and other encodings.
func (Secret) MarshalText() ([]byte, error) { return []byte("[redacted]"), nil }

type callerKey struct{}

// WithCaller returns ctx carrying the authenticated caller's name.
func WithCaller(ctx context.Context, caller string) context.Context {
	return context.WithValue(ctx, callerKey{}, caller)
}

// CallerFrom returns the caller WithCaller stored; ok is false for a
// request that was never authenticated.
func CallerFrom(ctx context.Context) (caller string, ok bool) {
	caller, ok = ctx.Value(callerKey{}).(string)
	return caller, ok
}

// callerName is a caller's name: short, lowercase, safe in a log line, a
// metric label or a database column.
var callerName = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

// IsCallerName says whether name may name a caller (see ParseTokens).
func IsCallerName(name string) bool { return callerName.MatchString(name) }

// MinTokenLen is the shortest token accepted. A token is a password that
// machines type: 16 random characters are beyond guessing, and the limit
// catches placeholders such as "changeme".
const MinTokenLen = 16

// CheckToken says whether tok can be sent as a bearer token: at least
// MinTokenLen characters of RFC 6750's b64token (letters, digits and
// -._~+/, then optional trailing =). The error never shows the token.
func CheckToken(tok string) error {
	if len(tok) < MinTokenLen {
		return fmt.Errorf("a token must be at least %d characters long", MinTokenLen)
	}
	if !wellFormed(tok) {
		return errors.New("a token may hold letters, digits and -._~+/ only, then optional trailing = signs")
	}
	return nil
}

// wellFormed says whether tok is an RFC 6750 b64token.
func wellFormed(tok string) bool {
	body := strings.TrimRight(tok, "=")
	if body == "" {
		return false
	}
	for i := range len(body) {
		if !isTokenChar(body[i]) {
			return false
		}
	}
	return true
}

func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("-._~+/", c) >= 0
}

// Credential is one caller and the token it authenticates with.
type Credential struct {
	Caller string
	Token  Secret
}

// ParseTokens reads a list of caller:token pairs separated by commas or
// newlines (a file with one pair per line works as it is); blanks around
// entries and empty entries are ignored. A caller is a short lowercase name
// (letters, digits, hyphens). A caller may be listed more than once, with
// a token each, all valid: that is how a caller's token is rotated without
// a moment in which neither works. The same token listed twice is an error
// naming its callers; other mistakes are named by the entry's number.
// Errors never show a token, nor an entry or name that may be one.
func ParseTokens(s string) ([]Credential, error) {
	var (
		creds []Credential
		errs  []error
		owner = map[[sha256.Size]byte]string{}
	)
	entries := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == '\n' })
	n := 0
	for _, entry := range entries {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		n++
		caller, tok, ok := strings.Cut(entry, ":")
		caller, tok = strings.TrimSpace(caller), strings.TrimSpace(tok)
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("entry %d: want caller:token (the entry is not shown: it may be a token)", n))
			continue
		case !callerName.MatchString(caller):
			errs = append(errs, fmt.Errorf("entry %d: the caller must be a lowercase name of letters, digits and hyphens, up to 32 characters (the name is not shown: it may be a token)", n))
			continue
		}
		if err := CheckToken(tok); err != nil {
			// Named by number, not by caller: a pair written the wrong way
			// round (token:caller) has the token in the caller's place.
			errs = append(errs, fmt.Errorf("entry %d: %w", n, err))
			continue
		}
		sum := sha256.Sum256([]byte(tok))
		if other, dup := owner[sum]; dup {
			// For two callers, one token would name only one of them (one
			// match wins); for one caller, it is a line pasted twice.
			errs = append(errs, fmt.Errorf("callers %q and %q have the same token: give each entry its own", other, caller))
			continue
		}
		owner[sum] = caller
		creds = append(creds, Credential{Caller: caller, Token: Secret(tok)})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return creds, nil
}

// Tokens authenticates bearer tokens (RFC 6750) against a fixed list of
// callers.
type Tokens struct {
	callers []string
	sums    [][sha256.Size]byte
}

// NewTokens returns a Tokens accepting each credential's token as its
// caller. With no credentials it refuses every request.
func NewTokens(creds []Credential) *Tokens {
	t := &Tokens{}
	for _, c := range creds {
		t.callers = append(t.callers, c.Caller)
		t.sums = append(t.sums, sha256.Sum256([]byte(c.Token)))
	}
	return t
}

// Caller reads "Authorization: Bearer <token>" and returns the caller the
// token belongs to.
//
// The comparison takes the same time whichever caller matches, or none:
// the presented token is hashed, so every comparison is of 32 bytes
// whatever the token's length, and it is compared with every entry in
// constant time, the match picked without a branch and without stopping
// early. Timing then reveals neither a token's prefix nor its caller.
func (t *Tokens) Caller(r *http.Request) (string, error) {
	tok, err := BearerToken(r)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(tok))
	found := -1
	for i := range t.sums {
		eq := subtle.ConstantTimeCompare(sum[:], t.sums[i][:])
		found = subtle.ConstantTimeSelect(eq, i, found)
	}
	if found < 0 {
		return "", &CredentialsError{Detail: "the bearer token is not valid"}
	}
	return t.callers[found], nil
}

// BearerToken reads the request's one Authorization header, which must be
// "Bearer <token>" (the scheme in any case, RFC 9110 §11.1). The token is
// checked for form only.
func BearerToken(r *http.Request) (string, error) {
	values := r.Header.Values("Authorization")
	switch {
	case len(values) == 0:
		return "", &CredentialsError{Missing: true, Detail: "send Authorization: Bearer <token>"}
	case len(values) > 1:
		return "", &CredentialsError{Detail: fmt.Sprintf("send one Authorization header, not %d", len(values))}
	}
	scheme, tok, _ := strings.Cut(strings.TrimSpace(values[0]), " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", &CredentialsError{Detail: "the Authorization header must use the Bearer scheme: Authorization: Bearer <token>"}
	}
	tok = strings.TrimLeft(tok, " ")
	if !wellFormed(tok) {
		return "", &CredentialsError{Detail: "the bearer token is malformed"}
	}
	return tok, nil
}
