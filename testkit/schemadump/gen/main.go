// Command gen writes the schema snapshots, db/schema/student.sql and
// db/schema/users.sql (package schemadump says how they are made), on the
// server TEST_DATABASE_URL names, from the repository's root:
//
//	make schema
//	go run ./testkit/withpostgres -- go run ./testkit/schemadump/gen
//
// withpostgres starts a throwaway server when TEST_DATABASE_URL is unset.
// Each snapshot is made in a database of its own, dropped afterwards; the
// runtime roles get the tests' passwords (pgtest.Passwords), because roles
// belong to the whole server and its tests may be using them.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/outboxref/outboxref/testkit/pgtest"
	"github.com/outboxref/outboxref/testkit/schemadump"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "schemadump:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	server := os.Getenv(pgtest.EnvVar)
	if server == "" {
		return errors.New(pgtest.EnvVar + ` is not set: run "make schema", which starts a throwaway PostgreSQL cluster`)
	}
	if _, err := os.Stat(filepath.Join("db", "migrations")); err != nil {
		return fmt.Errorf("run from the repository's root (no db/migrations here): %w", err)
	}
	// Migrating takes a second or two; a server that does not answer
	// should not hold the command for ever.
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for _, set := range schemadump.Sets {
		snap, err := schemadump.Generate(ctx, server, set, pgtest.Passwords)
		if err != nil {
			return err
		}
		path := filepath.Join(schemadump.Dir, schemadump.File(set))
		if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, snap) {
			fmt.Println("unchanged", path)
			continue
		}
		if err := os.WriteFile(path, snap, 0o644); err != nil {
			return err
		}
		fmt.Println("wrote", path)
	}
	return nil
}
