package deploy

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// Module is the module path of this repository.
const Module = "github.com/outboxref/outboxref"

// SystemBinaries are the pattern's own binaries: the two services and the
// sender, the system the e2e suite puts under test (and rebuilds with a
// broken variant's code). The fault lab, which watches the system rather
// than being part of it, is not among them.
func SystemBinaries() []string {
	return []string{"./services/student", "./services/users", "./outbox-sender"}
}

// goListTimeout bounds one go list; it takes seconds, so hitting this means
// something hangs.
const goListTimeout = 2 * time.Minute

// GoList runs go list with args in repoRoot, the repository's root, and
// returns its output split into words.
func GoList(repoRoot string, args ...string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), goListTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, GoCommand(), append([]string{"list"}, args...)...)
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	if err != nil {
		if exit, ok := errors.AsType[*exec.ExitError](err); ok {
			return nil, fmt.Errorf("go list %v: %w\n%s", args, err, exit.Stderr)
		}
		return nil, fmt.Errorf("go list %v: %w", args, err)
	}
	return strings.Fields(string(out)), nil
}

// GoCommand is the go command: the one on PATH, as make and CI have it, or
// the one in /usr/local/go, where this machine's Go lives.
func GoCommand() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}
