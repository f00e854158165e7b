// Command student runs the Student service: it creates students and, in the
// same transaction, the outbox row that asks Users for their user.
// "student migrate" applies Student's migrations and exits.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/outboxref/outboxref/internal/service"
	"github.com/outboxref/outboxref/services/student/studentsvc"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	service.SetProcs(os.Getenv) // one core unless GOMAXPROCS says otherwise
	if err := studentsvc.Run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "student:", err)
		os.Exit(1)
	}
}
