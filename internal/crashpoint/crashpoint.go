// Package crashpoint lets the end-to-end suite kill a process at an exact
// step, such as after Users commits but before it answers. Crash points are
// off unless CRASH_POINT names one; a hit kills the process with SIGKILL, so
// nothing deferred runs and no buffer is flushed, as in a real crash.
package crashpoint

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// Set is the crash point a process was started with; the zero value and nil
// are disabled.
type Set struct {
	name  string
	nth   int64 // crash on this hit of name, counting from 1
	count atomic.Int64
}

// Parse reads "NAME" (crash on the first hit) or "NAME@N" (crash on the Nth
// hit). Empty means disabled. NAME must be one of known.
func Parse(spec string, known ...string) (*Set, error) {
	if spec == "" {
		return nil, nil
	}
	name, nth, found := strings.Cut(spec, "@")
	n := int64(1)
	if found {
		v, err := strconv.ParseInt(nth, 10, 64)
		if err != nil || v < 1 {
			return nil, fmt.Errorf("crash point %q: want NAME or NAME@N with N >= 1", spec)
		}
		n = v
	}
	if !slices.Contains(known, name) {
		return nil, fmt.Errorf("crash point %q: want one of %s", name, strings.Join(known, ", "))
	}
	return &Set{name: name, nth: n}, nil
}

// Hit kills the process if name is the configured point and this is the
// configured hit.
func (s *Set) Hit(name string) {
	if s == nil || s.name != name {
		return
	}
	if s.count.Add(1) == s.nth {
		fmt.Fprintf(os.Stderr, "crashpoint: %s hit, killing process %d\n", name, os.Getpid())
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL is not instant; never run the step after the point
	}
}
