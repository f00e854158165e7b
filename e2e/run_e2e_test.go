//go:build e2e

package e2e

// TestMakeRun runs the system the way the README's first screen says,
// `make run`, on ports of its own, and does with it what a newcomer does:
// the README's curl session, the contract's rows and the runbook's poison
// row, as the docs print them. The fault lab's page data must then show nothing lost,
// duplicated, mislinked or unexpected, and one user for each student, the
// operator's own user counted apart. Ctrl-C must stop everything.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/freeport"
)

// runPorts is how many ports make run opens above RUN_PORT_BASE, the
// throwaway PostgreSQL's included.
const runPorts = 8

func TestMakeRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	base, err := freeport.Block(runPorts)
	require.NoError(t, err)

	cmd := exec.Command("make", "run")
	cmd.Dir = suite.root
	cmd.Env = append(os.Environ(), "RUN_PORT_BASE="+strconv.Itoa(base), "PGCLUSTER_BIN_DIR="+suite.pgBin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	printed := &apitest.Logs{} // safe to read while make run writes
	cmd.Stdout, cmd.Stderr = printed, printed
	require.NoError(t, cmd.Start())
	exited := make(chan struct{}) // closed once make run has exited, with waitErr
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	stopped := false
	t.Cleanup(func() {
		if !stopped { // a failure midway: Ctrl-C, then kill what is left
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
			select {
			case <-exited:
			case <-time.After(90 * time.Second):
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			}
		}
		if t.Failed() {
			t.Logf("make run printed:\n%s", printed.String())
		}
	})

	// The block make run prints once everything is ready.
	vars, udb := waitForRun(t, ctx, printed, exited, &waitErr)
	require.Contains(t, vars, fmt.Sprintf("S=localhost:%d U=localhost:%d A=localhost:%d T=", base, base+1, base+2))

	// The README's curl session, as printed there.
	session := shell(t, ctx, vars, docBlock(t, "README.md", "## A curl session", 1))
	require.Contains(t, session, "HTTP/1.1 201 Created")
	require.Contains(t, session, `"state":"linked"`, "the student is linked a moment later")
	require.Contains(t, session, `"name":"Ada Lovelace","email":"ada@example.com"`, "Users shows the user, to the operator's token")
	// The pages, as the session's comments show them: Ada with a cursor,
	// then Grace on the last page. (A student holds no list: no "]"
	// before the page's own.)
	require.Regexp(t, `\{"items":\[\{"id":"[^"]+","name":"Ada Lovelace",[^\]]*\],"next_cursor":"[^"]+"\}`, session)
	require.Regexp(t, `\{"items":\[\{"id":"[^"]+","name":"Grace Hopper",[^\]]*\],"next_cursor":null\}`, session)

	// The contract's rows against Users, as docs/contract.md prints them.
	contract := shell(t, ctx, vars+"\nUDB="+udb,
		docBlock(t, "docs/contract.md", "Try each row with curl", 0)+docBlock(t, "docs/contract.md", "The in-progress row", 0))
	for _, want := range []string{
		`Bearer realm="users"`, `error="invalid_token"`, "HTTP/1.1 201 Created", "Idempotent-Replayed: true",
		"HTTP/1.1 422", "HTTP/1.1 409", "HTTP/1.1 400", "Retry-After: 1",
	} {
		require.Contains(t, contract, want, "docs/contract.md's curl rows")
	}

	// The runbook's poison row, through both modes, as printed there.
	runbook := shell(t, ctx, vars+"\nUDB="+udb, docBlock(t, "docs/runbook.md", "**A poison row through both modes.**", 0))
	require.Contains(t, runbook, `"class":"refused"`)
	require.Contains(t, runbook, `outbox_sender_dead_letters_total{reason_class="refused"} 1`)
	require.Contains(t, runbook, `"redrives":2`)
	require.Contains(t, runbook, "outbox-row-not-dead")
	require.Contains(t, runbook, `"actor":"operator"`, "a redrive is recorded under the operator's name")
	require.Contains(t, runbook, "/problems/unauthorized", "the operator's routes refuse a request without a token")

	// The runbook's dead letters from the command line, as make run
	// prints the command: the row is delivered by now.
	sdb, dead := printedLine(t, printed.String(), "SDB="), printedLine(t, printed.String(), "SENDER_DATABASE_URL=$SDB ")
	listed := shell(t, ctx, "SDB="+sdb, "SENDER_DATABASE_URL=$SDB "+dead+" --state delivered")
	require.Contains(t, listed, "delivered", "outbox-sender dead list, as make run prints it")

	// What the lab's page shows: the checker agrees with the runbook.
	var st struct {
		Counts struct {
			Students struct{ Total, Linked int }
			OwnUsers int `json:"own_users"`
			Foreign  int `json:"foreign_users"`
		}
		Checker []struct {
			Name  string
			Count int
		}
	}
	require.Eventually(t, func() bool {
		resp, err := http.Get(fmt.Sprintf("http://localhost:%d/api/state", base+4))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return json.NewDecoder(resp.Body).Decode(&st) == nil && st.Counts.Students.Linked == 3
	}, 30*time.Second, 100*time.Millisecond, "the lab shows the three students linked")
	require.Len(t, st.Checker, 4)
	for _, c := range st.Checker {
		require.Zero(t, c.Count, "the lab's checker: %s", c.Name)
	}
	require.Equal(t, 3, st.Counts.Students.Total)
	require.Equal(t, 3, st.Counts.OwnUsers, "one user each")
	require.Equal(t, 2, st.Counts.Foreign, "the operator's users (the contract's and the runbook's), apart")

	// Ctrl-C stops everything, and removes the throwaway cluster.
	logs := printedValue(printed.String(), "logs")
	require.NoError(t, syscall.Kill(-cmd.Process.Pid, syscall.SIGINT))
	select {
	case <-exited:
	case <-time.After(90 * time.Second):
		t.Fatal("make run did not stop within 90s of Ctrl-C")
	}
	stopped = true
	require.Eventually(t, func() bool { return strings.Contains(printed.String(), "\nstopped\n") }, 30*time.Second, 50*time.Millisecond)
	for port := base; port < base+runPorts; port++ {
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		require.NoError(t, err, "port %d is still taken after make run stopped", port)
		require.NoError(t, ln.Close())
	}
	require.NoDirExists(t, filepath.Dir(logs), "make run's working folder is removed")
}

// waitForRun waits for make run's block and returns its variables line and
// Users' database URL.
func waitForRun(t *testing.T, ctx context.Context, printed *apitest.Logs, exited <-chan struct{}, waitErr *error) (vars, udb string) {
	t.Helper()
	for {
		text := printed.String()
		if strings.Contains(text, "Create a student:") {
			for line := range strings.SplitSeq(text, "\n") {
				line = strings.TrimSpace(line)
				switch {
				case strings.HasPrefix(line, "S="):
					vars = line
				case strings.HasPrefix(line, "UDB="):
					udb = strings.TrimPrefix(line, "UDB=")
				}
			}
			require.NotEmpty(t, vars)
			require.NotEmpty(t, udb)
			return vars, udb
		}
		select {
		case <-exited:
			t.Fatalf("make run exited before it was running: %v", *waitErr)
		case <-ctx.Done():
			t.Fatal("make run was not running within the test's time")
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// printedLine is the rest of the line of make run's block that starts with
// prefix, such as "SDB=".
func printedLine(t *testing.T, text, prefix string) string {
	t.Helper()
	for line := range strings.SplitSeq(text, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			return rest
		}
	}
	t.Fatalf("make run printed no line starting with %q", prefix)
	return ""
}

// printedValue is the value after a label in make run's block, such as
// "  logs   /tmp/…".
func printedValue(text, label string) string {
	for line := range strings.SplitSeq(text, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == label {
			return f[1]
		}
	}
	return ""
}

// docBlock is the nth ```sh block after marker in a file of the docs.
func docBlock(t *testing.T, file, marker string, nth int) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(suite.root, file))
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(b), marker)
	require.True(t, ok, "%s has no %q", file, marker)
	for i := 0; ; i++ {
		_, after, ok := strings.Cut(rest, "```sh\n")
		require.True(t, ok, "%s: no shell block %d after %q", file, nth, marker)
		block, tail, _ := strings.Cut(after, "```")
		if i == nth {
			return block
		}
		rest = tail
	}
}

// shell runs a block of the docs in bash, after vars, with PostgreSQL's
// client on PATH, and returns what it printed.
func shell(t *testing.T, ctx context.Context, vars, block string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", vars+"\n"+block)
	cmd.Env = append(os.Environ(), "PATH="+suite.pgBin+":"+os.Getenv("PATH"))
	cmd.WaitDelay = 5 * time.Second
	outb, err := cmd.CombinedOutput()
	require.NoError(t, err, "the docs' commands failed:\n%s\n--- they printed:\n%s", block, outb)
	return string(outb)
}
