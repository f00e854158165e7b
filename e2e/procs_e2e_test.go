//go:build e2e

package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBadGOMAXPROCSStopsEachBinary: the three binaries run Go code on one
// core unless GOMAXPROCS says otherwise (service.SetProcs, from main). A
// value Go's runtime would quietly ignore, running on every core instead,
// stops each binary at start with exit status 1 and the one message that
// names every bad variable, another one's too; a good one lets it run
// (here "healthcheck", which needs no database and fails only because
// nothing listens).
func TestBadGOMAXPROCSStopsEachBinary(t *testing.T) {
	t.Parallel()
	for name, bin := range map[string]string{"student": suite.good.student, "users": suite.good.users, "outbox-sender": suite.good.sender} {
		run := func(procs string, more ...string) (string, int) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "healthcheck")
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "GOMAXPROCS=" + procs}, more...)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if err != nil && !errors.As(err, &exit) {
				require.NoError(t, err, "%s: run", name)
			}
			return string(out), cmd.ProcessState.ExitCode()
		}
		out, code := run("0", "LOG_LEVEL=loud")
		require.Equal(t, 1, code, "%s with GOMAXPROCS=0: %s", name, out)
		require.Contains(t, out, name+`: invalid configuration: `)
		require.Contains(t, out, `GOMAXPROCS="0": want a whole number of cores`)
		require.Contains(t, out, `LOG_LEVEL="loud"`, "%s: one message for every bad variable", name)

		out, _ = run("2")
		require.NotContains(t, out, "GOMAXPROCS", "%s with GOMAXPROCS=2", name)
	}
}
