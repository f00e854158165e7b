// Command withpostgres runs a command with TEST_DATABASE_URL pointing at a
// PostgreSQL server, starting a throwaway one when none is configured:
//
//	go run ./testkit/withpostgres -- go test ./...
//
// An existing TEST_DATABASE_URL is passed through untouched, so the same
// command works on a machine with its own server. Otherwise the child also
// gets PGCLUSTER_BIN_DIR, the directory of the server binaries, for suites
// that start clusters of their own. The throwaway server checks every role's
// password, and its TEST_DATABASE_URL carries the administrator's. It is
// removed when the command ends, and withpostgres exits with the command's
// exit code.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/outboxref/outboxref/testkit/pgcluster"
)

func main() {
	os.Exit(run(context.Background(), os.Args, os.Getenv, os.Stdin, os.Stdout, os.Stderr))
}

// run returns the exit code: the child's own, 2 for a usage problem or
// missing server binaries, 1 for any other failure of ours.
func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	command := args[1:]
	if len(command) > 0 && command[0] == "--" {
		command = command[1:]
	}
	if len(command) == 0 {
		fmt.Fprintln(stderr, "usage: withpostgres -- command [args...]")
		return 2
	}

	// Catch signals before starting anything: a Ctrl-C while the cluster
	// starts must still lead to Cleanup, not leave a server behind.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fwd := newForwarder(cancel)
	defer fwd.stop()

	if getenv("TEST_DATABASE_URL") != "" {
		return runChild(ctx, fwd, command, nil, stdin, stdout, stderr)
	}

	binDir, err := pgcluster.FindBinDir()
	if err != nil {
		fmt.Fprintln(stderr, "withpostgres:", err)
		return 2
	}
	cluster, err := pgcluster.Start(ctx, pgcluster.Options{BinDir: binDir})
	if err != nil {
		if ctx.Err() != nil {
			// Start has already removed what it made; the details of
			// what the interrupt cut short are only noise.
			fmt.Fprintln(stderr, "withpostgres: interrupted while starting PostgreSQL")
			return 130
		}
		fmt.Fprintln(stderr, "withpostgres: start PostgreSQL:", err)
		return 1
	}
	fmt.Fprintf(stderr, "withpostgres: started throwaway PostgreSQL at 127.0.0.1:%d (bin %s)\n", cluster.Port(), binDir)

	code := runChild(ctx, fwd, command, []string{
		"TEST_DATABASE_URL=" + cluster.URL(),
		"PGCLUSTER_BIN_DIR=" + binDir,
	}, stdin, stdout, stderr)

	// ctx may be cancelled by now, and the server must go regardless.
	cleanupCtx, cancelCleanup := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancelCleanup()
	if err := cluster.Cleanup(cleanupCtx); err != nil {
		fmt.Fprintln(stderr, "withpostgres: stop PostgreSQL:", err)
		if code == 0 {
			code = 1
		}
	} else {
		fmt.Fprintf(stderr, "withpostgres: stopped throwaway PostgreSQL at 127.0.0.1:%d\n", cluster.Port())
	}
	return code
}

// runChild runs the command with extraEnv added to our environment and
// returns its exit code, shell-style (128+signal when it was killed).
func runChild(ctx context.Context, fwd *forwarder, command, extraEnv []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if ctx.Err() != nil {
		return 130 // interrupted before the command could start
	}
	cmd := exec.Command(command[0], command[1:]...)
	// Later entries win in os/exec, which is what lets extraEnv override
	// an inherited value.
	cmd.Env = append(os.Environ(), extraEnv...)
	cmd.Stdin = stdin
	cmd.Stdout = stdout
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "withpostgres:", err)
		if errors.Is(err, exec.ErrNotFound) {
			return 127
		}
		return 126
	}
	fwd.setChild(cmd.Process)
	if ctx.Err() != nil {
		// A signal landed between Start and setChild and only cancelled
		// ctx; pass it on so the child does not run on regardless.
		_ = cmd.Process.Signal(os.Interrupt)
	}
	err := cmd.Wait()
	fwd.setChild(nil)

	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exitErr):
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return exitErr.ExitCode()
	default:
		fmt.Fprintln(stderr, "withpostgres:", err)
		return 1
	}
}

// forwarder passes SIGINT and SIGTERM on to the child so that it can shut
// down in its own way, while we stay alive to remove the cluster afterwards.
// With no child running, a signal cancels the start-up instead.
type forwarder struct {
	sigs chan os.Signal
	done chan struct{}

	mu    sync.Mutex
	child *os.Process
}

func newForwarder(cancel context.CancelFunc) *forwarder {
	f := &forwarder{sigs: make(chan os.Signal, 4), done: make(chan struct{})}
	signal.Notify(f.sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		for {
			select {
			case sig := <-f.sigs:
				f.mu.Lock()
				if f.child != nil {
					_ = f.child.Signal(sig)
				} else {
					cancel()
				}
				f.mu.Unlock()
			case <-f.done:
				return
			}
		}
	}()
	return f
}

func (f *forwarder) setChild(p *os.Process) {
	f.mu.Lock()
	f.child = p
	f.mu.Unlock()
}

func (f *forwarder) stop() {
	signal.Stop(f.sigs)
	close(f.done)
}
