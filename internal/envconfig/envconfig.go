// Package envconfig reads a binary's configuration from environment
// variables. Every variable has a documented default; a malformed or out of
// range value is an error naming the variable, and all such errors are
// reported together so one start-up attempt shows every mistake.
package envconfig

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Reader collects values and errors. It records every variable read with
// its default, so tests can check that a deployment file sets only variables
// a binary knows and that the documented defaults are the code's.
type Reader struct {
	getenv func(string) string
	vars   []Var
	errs   []error
}

// Var is a variable a binary reads, and its default: a string, int or
// time.Duration, or for a default computed at start a string describing it.
type Var struct {
	Name    string
	Default any
}

// New reads through getenv (os.Getenv in production, a map in tests).
func New(getenv func(string) string) *Reader {
	return &Reader{getenv: getenv}
}

func (r *Reader) lookup(name string, def any) (string, bool) {
	r.vars = append(r.vars, Var{Name: name, Default: def})
	v := r.getenv(name)
	return v, v != ""
}

func (r *Reader) fail(name, value, why string) {
	r.errs = append(r.errs, fmt.Errorf("%s=%q: %s", name, value, why))
}

// String returns the variable or def when it is unset or empty.
func (r *Reader) String(name, def string) string {
	if v, ok := r.lookup(name, def); ok {
		return v
	}
	return def
}

// Computed is String with a default computed at start (only when the
// variable is unset); doc describes it, as docs/configuration.md does.
func (r *Reader) Computed(name, doc string, def func() string) string {
	if v, ok := r.lookup(name, doc); ok {
		return v
	}
	return def()
}

// OneOf returns the variable, which must be one of options.
func (r *Reader) OneOf(name, def string, options ...string) string {
	v := r.String(name, def)
	if !slices.Contains(options, v) {
		r.fail(name, v, fmt.Sprintf("want one of %v", options))
	}
	return v
}

// URL returns the variable, which must parse as an absolute URL with one of
// the given schemes.
func (r *Reader) URL(name, def string, schemes ...string) string {
	v, _ := r.url(name, def, schemes)
	return v
}

func (r *Reader) url(name, def string, schemes []string) (string, bool) {
	v := r.String(name, def)
	if why := urlProblem(v, schemes); why != "" {
		// A URL may hold a password: never echo one.
		shown := "(not shown: it does not parse, and may hold a password)"
		if u, err := url.Parse(v); err == nil {
			shown = strconv.Quote(u.Redacted())
		}
		r.errs = append(r.errs, fmt.Errorf("%s=%s: %s", name, shown, why))
		return v, false
	}
	return v, true
}

// urlProblem says what is wrong with v as an absolute URL with one of
// schemes, naming the part at fault (never echoing the userinfo, which
// may hold a password), or "" when nothing is.
func urlProblem(v string, schemes []string) string {
	u, err := url.Parse(v)
	var ue *url.Error
	switch {
	case errors.As(err, &ue) && strings.HasPrefix(ue.Err.Error(), "invalid port"):
		// This reason of net/url's names the port only; others may quote
		// a piece of the userinfo ("invalid URL escape"), so they are not
		// passed on.
		return "not a URL: " + ue.Err.Error()
	case err != nil:
		return "not a URL: it does not parse"
	case !slices.Contains(schemes, u.Scheme):
		return fmt.Sprintf("want an absolute URL with scheme %v, not %q", schemes, u.Scheme)
	case u.Host == "" && u.Path == "":
		return "want an absolute URL, with a host"
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Sprintf("the port %q is not a number from 1 to 65535", p)
		}
	}
	return ""
}

// URLList returns the variable, a comma-separated list of absolute URLs
// with one of the given schemes (a cluster's servers), or "" when it is
// unset and def is "". Like URL, it never echoes a password.
func (r *Reader) URLList(name, def string, schemes ...string) string {
	v := r.String(name, def)
	if v == "" {
		return ""
	}
	for i, u := range strings.Split(v, ",") {
		if why := urlProblem(strings.TrimSpace(u), schemes); why != "" {
			r.errs = append(r.errs, fmt.Errorf("%s: URL %d of the list: %s", name, i+1, why))
		}
	}
	return v
}

// DatabaseURL returns the variable, which must be a PostgreSQL connection
// URL that pgx accepts. The value is never echoed: it may hold a password.
func (r *Reader) DatabaseURL(name, def string) string {
	v := r.String(name, def)
	if why := urlProblem(v, []string{"postgres", "postgresql"}); why != "" {
		r.errs = append(r.errs, fmt.Errorf("%s: %s (the value is not shown: it may hold a password)", name, why))
		return v
	}
	if _, err := pgconn.ParseConfig(v); err != nil {
		r.errs = append(r.errs, fmt.Errorf("%s: not a connection URL pgx accepts (the value is not shown: it may hold a password)", name))
	}
	return v
}

// DatabaseLogin returns the PostgreSQL URL in urlName (checked as
// DatabaseURL checks it) with the password from passwordName, or from the
// file named by passwordName+"_FILE" (see Secret), put into it, so that a
// password can come from a Docker or Kubernetes secret while the rest of
// the URL stays plain configuration. The password may instead be in the
// URL itself; in both is an error. It also returns the password read from
// passwordName, "" if none was.
func (r *Reader) DatabaseLogin(urlName, def, passwordName string) (dbURL, password string) {
	dbURL = r.DatabaseURL(urlName, def)
	password = r.Secret(passwordName)
	if password == "" {
		return dbURL, ""
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		return dbURL, password // DatabaseURL reported it
	}
	if _, inURL := u.User.Password(); inURL {
		r.errs = append(r.errs, fmt.Errorf("%s has a password and %s (or %s_FILE) is set: give it in one place (the values are not shown)",
			urlName, passwordName, passwordName))
		return dbURL, password
	}
	u.User = url.UserPassword(u.User.Username(), password)
	return u.String(), password
}

// Secret returns a secret given either in the variable name or, for Docker
// and Kubernetes secrets, in the file named by name+"_FILE" (one trailing
// newline is dropped). Setting both is an error. The value is never echoed
// in an error. An unset secret is "": the caller decides, with Require,
// whether that is allowed.
func (r *Reader) Secret(name string) string {
	v, inline := r.lookup(name, "")
	path, fromFile := r.lookup(name+"_FILE", "")
	switch {
	case inline && fromFile:
		r.errs = append(r.errs, fmt.Errorf("%s and %s_FILE are both set: set one (the values are not shown)", name, name))
		return ""
	case fromFile:
		b, err := os.ReadFile(path)
		if err != nil {
			// The path is not secret; the error from os names the path only.
			r.errs = append(r.errs, fmt.Errorf("%s_FILE=%q: %w", name, path, errors.Unwrap(err)))
			return ""
		}
		v = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		if v == "" {
			r.errs = append(r.errs, fmt.Errorf("%s_FILE=%q: the file is empty", name, path))
		}
		return v
	}
	return v
}

// Require records an error naming name when v is empty: for a variable
// (or its _FILE form) that has no default.
func (r *Reader) Require(name, v, why string) {
	if v == "" {
		r.errs = append(r.errs, fmt.Errorf("%s (or %s_FILE) is required: %s", name, name, why))
	}
}

// Hosts returns a comma-separated list of host names (no scheme, no
// port), lower-cased; "" is none.
func (r *Reader) Hosts(name string) []string {
	v := r.String(name, "")
	var hosts []string
	for h := range strings.SplitSeq(v, ",") {
		h = strings.ToLower(strings.TrimSpace(h))
		switch {
		case h == "":
		case strings.ContainsAny(h, "/:@ ") && net.ParseIP(h) == nil:
			r.fail(name, v, fmt.Sprintf("%q is not a host name; list names without scheme or port, such as metrics.example.internal", h))
		default:
			hosts = append(hosts, h)
		}
	}
	return hosts
}

// Int returns the variable as an integer within [lo, hi].
func (r *Reader) Int(name string, def, lo, hi int) int {
	v, ok := r.lookup(name, def)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		r.fail(name, v, fmt.Sprintf("want a whole number from %d to %d", lo, hi))
		return def
	}
	return n
}

// Duration returns the variable as a Go duration ("500ms", "30s", "168h")
// within [lo, hi].
func (r *Reader) Duration(name string, def, lo, hi time.Duration) time.Duration {
	v, ok := r.lookup(name, def)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < lo || d > hi {
		r.fail(name, v, fmt.Sprintf("want a duration from %s to %s, such as 30s", lo, hi))
		return def
	}
	return d
}

// Check records a rule that ties variables together.
func (r *Reader) Check(ok bool, format string, args ...any) {
	if !ok {
		r.errs = append(r.errs, fmt.Errorf(format, args...))
	}
}

// Names lists the variables read so far.
func (r *Reader) Names() []string {
	names := make([]string, len(r.vars))
	for i, v := range r.vars {
		names[i] = v.Name
	}
	return names
}

// Vars lists the variables read so far with their defaults.
func (r *Reader) Vars() []Var { return slices.Clone(r.vars) }

// Err joins every problem found, or nil.
func (r *Reader) Err() error {
	if len(r.errs) == 0 {
		return nil
	}
	return fmt.Errorf("invalid configuration: %w", errors.Join(r.errs...))
}
