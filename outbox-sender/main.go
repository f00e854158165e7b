// Command outbox-sender delivers Student's outbox rows to Users, retrying
// until Users answers, and records each answer on the student.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/outboxref/outboxref/internal/service"
	"github.com/outboxref/outboxref/outbox-sender/sender"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	service.SetProcs(os.Getenv) // one core unless GOMAXPROCS says otherwise
	if err := sender.Run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "outbox-sender:", err)
		os.Exit(1)
	}
}
