// Command run runs the whole system on this machine without Docker, for a
// person trying it: a PostgreSQL (a throwaway one from the server binaries
// it finds, or the server RUN_DATABASE_URL names), then Users, Student, the
// fault lab and the outbox sender, which reaches Users through the lab's
// proxy, as in docker-compose.yml. Each process logs in as its own database
// role, with passwords and tokens made up for this run. It prints where
// everything is and how to create a student, and on Ctrl-C stops
// everything and removes the throwaway cluster.
//
//	make run                          Student's API on :8080, the rest above it
//	make run RUN_PORT_BASE=9080       beside another copy, or a busy 8080
//	make run RUN_DATA_DIR=.run/pg     keep the database between runs
//	make run SENDER_SOURCE=cdc        new rows from the write-ahead log
//	make run SENDER_TRANSPORT=nats    through NATS JetStream (an embedded server)
//
// docs/running-without-docker.md says what it does, step by step, for a
// person who wants to do it by hand.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "make run:", err)
		os.Exit(1)
	}
}

// run starts the system, prints where it is, and stops it when ctx ends.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	s, err := start(ctx, cfg, stdout)
	if s != nil {
		defer s.stop(stdout)
	}
	if err != nil {
		return err
	}
	s.printBlock(stdout)
	return s.wait(ctx)
}
