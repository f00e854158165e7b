//go:build crashpoints

package crashpoint

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
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

func init() {
	spec := os.Getenv("CRASH_POINT")
	if spec == "" {
		return
	}
	name, n, found := strings.Cut(spec, "@")
	nth = 1
	if found {
		v, err := strconv.ParseInt(n, 10, 64)
		if err != nil || v < 1 {
			fail("CRASH_POINT=%q: want NAME or NAME@N with N >= 1", spec)
		}
		nth = v
	}
	if name != UsersAfterCommit && name != SenderAfterResponse {
		fail("CRASH_POINT=%q: want %s or %s", spec, UsersAfterCommit, SenderAfterResponse)
	}
	point = name
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
