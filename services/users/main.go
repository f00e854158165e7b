// Command users runs the Users service: it creates users, at most once per
// Idempotency-Key, and remembers each key's outcome in its inbox.
// "users migrate" applies Users' migrations and exits.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/outboxref/outboxref/internal/service"
	"github.com/outboxref/outboxref/services/users/usersvc"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	service.SetProcs(os.Getenv) // one core unless GOMAXPROCS says otherwise
	if err := usersvc.Run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "users:", err)
		os.Exit(1)
	}
}
