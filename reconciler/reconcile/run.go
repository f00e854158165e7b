// Package reconcile is the reconciler: it reads Student's and Users'
// databases, each as its own read-only role, and finds where the
// pattern's invariant does not hold (internal/drift says what it is), and
// what waits for an operator. It runs once, for a person, cron or CI, or
// on a cadence behind an admin port, for Prometheus.
//
// It reads in keyset pages: a page of students with their outbox rows,
// then Users' answers under just that page's keys and the users they name.
// Each read is one short statement, bounded by the server's
// statement_timeout, in a transaction of its own: nothing it does can hold
// a lock a service's write waits for, or keep a snapshot open across pages.
// A full pass reads everything; an incremental pass reads what changed
// since the last one (pass.go says what that is), and a full sweep comes
// round every RECONCILER_FULL_EVERY.
package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/internal/service"
)

// ErrDrift is what `reconciler once` returns when its pass found drift:
// exit status 1. Any other error means it could not check: exit status 2.
var ErrDrift = errors.New("drift found")

// ExitCode is the exit status for what Run returned: 0 when it found no
// drift (stuck and dead rows are not drift), 1 when it found some, 2 when
// it could not check.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrDrift):
		return 1
	}
	return 2
}

// usage names the subcommands.
const usage = "want once [--json], serve or healthcheck"

// Run carries out args: "once" reads both databases in one full pass and
// writes its report to stdout (as JSON with --json); "serve" runs passes on
// a cadence behind the admin port; "healthcheck" asks a serving
// reconciler's /readyz.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	command, asJSON, err := parseArgs(args)
	if err != nil {
		return err
	}
	cfg, _, err := LoadConfig(getenv)
	if err != nil {
		return err
	}
	switch command {
	case "healthcheck":
		return service.Healthcheck(ctx, cfg.AdminAddr, stdout)
	case "serve":
		return serve(ctx, cfg, stdout)
	}
	return once(ctx, cfg, asJSON, stdout)
}

func parseArgs(args []string) (command string, asJSON bool, err error) {
	switch {
	case len(args) == 1 && (args[0] == "once" || args[0] == "serve" || args[0] == "healthcheck"):
		return args[0], false, nil
	case len(args) == 2 && args[0] == "once" && args[1] == "--json":
		return "once", true, nil
	}
	return "", false, fmt.Errorf("unknown arguments %q: %s", args, usage)
}

// once runs one full pass and writes its report.
func once(ctx context.Context, cfg Config, asJSON bool, stdout io.Writer) error {
	student, users, err := openPools(ctx, cfg)
	if err != nil {
		return err
	}
	defer student.Close()
	defer users.Close()
	p, err := newChecker(cfg, student, users).full(ctx)
	if err != nil {
		return err
	}
	r := p.report(p.found, time.Now())
	if asJSON {
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return fmt.Errorf("encode report: %w", err)
		}
		_, err = stdout.Write(append(b, '\n'))
		if err != nil {
			return fmt.Errorf("write report: %w", err)
		}
	} else if err := r.WriteText(stdout); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if r.Drift {
		return ErrDrift
	}
	return nil
}

// openPools opens a pool on each database. Neither connects yet: the
// first read does, and a database that cannot be reached then fails the
// pass.
func openPools(ctx context.Context, cfg Config) (student, users *pgxpool.Pool, err error) {
	student, err = openPool(ctx, cfg.StudentDatabaseURL, cfg.StatementTimeout)
	if err != nil {
		return nil, nil, fmt.Errorf("RECONCILER_STUDENT_DATABASE_URL: %w", err)
	}
	users, err = openPool(ctx, cfg.UsersDatabaseURL, cfg.StatementTimeout)
	if err != nil {
		student.Close()
		return nil, nil, fmt.Errorf("RECONCILER_USERS_DATABASE_URL: %w", err)
	}
	return student, users, nil
}

// joinWords is for the log: the classes with cases.
func joinWords(words []string) string {
	if len(words) == 0 {
		return "none"
	}
	return strings.Join(words, ", ")
}
