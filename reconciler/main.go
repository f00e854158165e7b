// Command reconciler checks that every student ends with exactly one user:
// `reconciler once [--json]` reports on both databases and exits 0, 1 on
// drift or 2 when it could not check; `reconciler serve` checks on a
// cadence for Prometheus.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/outboxref/outboxref/internal/service"
	"github.com/outboxref/outboxref/reconciler/reconcile"
)

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	service.SetProcs(os.Getenv) // one core unless GOMAXPROCS says otherwise
	err := reconcile.Run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	if code := reconcile.ExitCode(err); code != 2 {
		return code // the report says what drift it found
	}
	fmt.Fprintln(os.Stderr, "reconciler:", err)
	return 2
}
