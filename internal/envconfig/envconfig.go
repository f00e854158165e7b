// Package envconfig reads a binary's configuration from environment
// variables. Every variable has a documented default; a malformed or out of
// range value is an error naming the variable, and all such errors are
// reported together so one start-up attempt shows every mistake.
package envconfig

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"time"
)

// Reader collects values and errors. Names records every variable read, so a
// test can check that a deployment file sets only variables a binary knows.
type Reader struct {
	getenv func(string) string
	names  []string
	errs   []error
}

// New reads through getenv (os.Getenv in production, a map in tests).
func New(getenv func(string) string) *Reader {
	return &Reader{getenv: getenv}
}

func (r *Reader) lookup(name string) (string, bool) {
	r.names = append(r.names, name)
	v := r.getenv(name)
	return v, v != ""
}

func (r *Reader) fail(name, value, why string) {
	r.errs = append(r.errs, fmt.Errorf("%s=%q: %s", name, value, why))
}

// String returns the variable or def when it is unset or empty.
func (r *Reader) String(name, def string) string {
	if v, ok := r.lookup(name); ok {
		return v
	}
	return def
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
	v := r.String(name, def)
	u, err := url.Parse(v)
	if err != nil || u.Host == "" && u.Path == "" || !slices.Contains(schemes, u.Scheme) {
		r.fail(name, v, fmt.Sprintf("want an absolute URL with scheme %v", schemes))
	}
	return v
}

// Int returns the variable as an integer within [lo, hi].
func (r *Reader) Int(name string, def, lo, hi int) int {
	v, ok := r.lookup(name)
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
	v, ok := r.lookup(name)
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
func (r *Reader) Names() []string { return slices.Clone(r.names) }

// Err joins every problem found, or nil.
func (r *Reader) Err() error {
	if len(r.errs) == 0 {
		return nil
	}
	return fmt.Errorf("invalid configuration: %w", errors.Join(r.errs...))
}
