//go:build crashpoints

package crashpoint

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Compiled reports whether crash points are compiled in.
const Compiled = true

// The crash point this process was started with: CRASH_POINT is "NAME"
// (crash on the first hit) or "NAME@N" (on the Nth hit); empty disables it.
var (
	point string
	nth   int64
	count atomic.Int64
)

// The pause point: PAUSE_POINT is "NAME" or "NAME@N" like CRASH_POINT, and
// PAUSE_FOR how long to hold still there (a Go duration, 2s by default).
var (
	pausePoint string
	pauseNth   int64
	pauseFor   = 2 * time.Second
	pauseCount atomic.Int64
)

func init() {
	point, nth = parse("CRASH_POINT", UsersAfterCommit, SenderAfterResponse, SenderBeforeConfirm, UsersCommandAfterCommit)
	pausePoint, pauseNth = parse("PAUSE_POINT", SenderBeforeRecord, SenderBeforeClaim, UsersBeforeInbox)
	if v := os.Getenv("PAUSE_FOR"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > time.Minute {
			fail("PAUSE_FOR=%q: want a duration between 0 and 1m", v)
		}
		pauseFor = d
	}
}

// parse reads "NAME" or "NAME@N" from the variable; NAME must be one of
// names. An empty variable gives "".
func parse(variable string, names ...string) (string, int64) {
	spec := os.Getenv(variable)
	if spec == "" {
		return "", 0
	}
	name, n, found := strings.Cut(spec, "@")
	var at int64 = 1
	if found {
		v, err := strconv.ParseInt(n, 10, 64)
		if err != nil || v < 1 {
			fail("%s=%q: want NAME or NAME@N with N >= 1", variable, spec)
		}
		at = v
	}
	if !slices.Contains(names, name) {
		fail("%s=%q: want one of %s", variable, spec, strings.Join(names, ", "))
	}
	return name, at
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(2)
}

func hit(name string) {
	if point == "" || point != name {
		return
	}
	if count.Add(1) == nth {
		fmt.Fprintf(os.Stderr, "crashpoint: %s hit, killing process %d\n", name, os.Getpid())
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL is not instant; never run the step after the point
	}
}

func pause(name string) {
	if pausePoint == "" || pausePoint != name {
		return
	}
	if pauseCount.Add(1) == pauseNth {
		fmt.Fprintf(os.Stderr, "pausepoint: %s reached (hit %d), holding process %d still for %s\n", name, pauseNth, os.Getpid(), pauseFor)
		time.Sleep(pauseFor)
		fmt.Fprintf(os.Stderr, "pausepoint: %s released\n", name)
	}
}
