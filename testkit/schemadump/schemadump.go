// Package schemadump makes the schema snapshots in db/schema/: each
// database's whole schema after every migration, as pg_dump prints it, so
// that a reader sees a table in one place instead of assembling it from
// the CREATE TABLE and the ALTERs of later migrations.
//
// A snapshot is made by applying the migrations to an empty database
// exactly as the migrate step does (migrations.Migrate), running
//
//	pg_dump --schema-only --no-owner --no-privileges
//
// on it, and dropping what varies between runs and pg_dump versions (see
// Normalise). The command in gen/ writes the files (make schema);
// db/schema/schema_test.go makes them again and fails when a committed
// one is stale.
package schemadump

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/testkit/pgcluster"
)

// Sets are the databases that have a snapshot, in the order they are made.
var Sets = []migrations.Set{migrations.Student, migrations.Users}

// Dir is the snapshots' folder, relative to the repository's root.
const Dir = "db/schema"

// File is the name of set's snapshot in Dir.
func File(set migrations.Set) string { return string(set) + ".sql" }

// Command is what regenerates the snapshots, as the header names it.
const Command = "make schema"

// Header is what a snapshot starts with: that it is generated, from what,
// and how to make it again.
func Header(set migrations.Set) string {
	return fmt.Sprintf(`-- %[1]s/%[2]s: the %[3]s database's schema after every migration in
-- db/migrations/%[3]s/, in one place for reading. Generated: do not edit.
--
-- Made by '%[4]s' (go run ./testkit/withpostgres -- go run
-- ./testkit/schemadump/gen): the migrations applied to a throwaway database
-- as the migrate step applies them, then
--   pg_dump --schema-only --no-owner --no-privileges
-- without goose's version table and without pg_dump's SET preamble and
-- version lines. db/schema/schema_test.go fails when this file is stale.
-- The grants and the reasons are in the migrations themselves: pg_dump
-- leaves out the first (--no-privileges), and SQL comments never reach the
-- database.

`, Dir, File(set), set, Command)
}

// Snapshot migrates the empty database dbURL names (logging in as an
// administrator, as migrations.Migrate requires) and returns set's
// snapshot: Header followed by the normalised pg_dump output. passwords
// are the runtime roles' passwords, which migrating sets: roles belong to
// the whole server, so on a shared one they must be those its tests use.
func Snapshot(ctx context.Context, dbURL string, set migrations.Set, passwords map[string]string) ([]byte, error) {
	cc, err := pgx.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", set, err)
	}
	if err := migrations.Migrate(ctx, cc, set, passwords); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", set, err)
	}
	dump, err := PgDump(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", set, err)
	}
	return append([]byte(Header(set)), Normalise(dump)...), nil
}

// Generate makes set's snapshot on the server serverURL names (as an
// administrator), in a database of its own that it drops again.
func Generate(ctx context.Context, serverURL string, set migrations.Set, passwords map[string]string) (_ []byte, err error) {
	u, err := url.Parse(serverURL)
	if err != nil {
		return nil, fmt.Errorf("server URL: %w", err)
	}
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", u.Redacted(), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	name := fmt.Sprintf("schemadump_%s_%d_%d", set, os.Getpid(), time.Now().UnixNano())
	db := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		return nil, fmt.Errorf("create database %s: %w", name, err)
	}
	defer func() {
		// Even when ctx ran out: the database must not be left behind.
		dropCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, derr := conn.Exec(dropCtx, "DROP DATABASE "+db+" WITH (FORCE)"); derr != nil && err == nil {
			err = fmt.Errorf("drop database %s: %w", name, derr)
		}
	}()
	u.Path = "/" + name
	return Snapshot(ctx, u.String(), set, passwords)
}

// PgDump runs pg_dump (PgDumpPath) --schema-only --no-owner
// --no-privileges on the database dbURL names, leaving out goose's version
// table, and returns its output.
func PgDump(ctx context.Context, dbURL string) ([]byte, error) {
	bin, err := PgDumpPath()
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	// The password goes in the environment, not on a command line any
	// process may read; and no inherited PG* variable may steer pg_dump
	// elsewhere or change what it prints.
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	if pw, ok := u.User.Password(); ok {
		env = append(env, "PGPASSWORD="+pw)
		u.User = url.User(u.User.Username())
	}
	table := goose.DefaultTablename
	cmd := exec.CommandContext(ctx, bin, "--schema-only", "--no-owner", "--no-privileges",
		// goose's bookkeeping, and the sequence of its identity column
		// (serial, in older gooses).
		"--exclude-table=public."+table, "--exclude-table=public."+table+"_id_seq",
		"--dbname="+u.String())
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %w\n%s", bin, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// PgDumpPath finds pg_dump as the project finds the server binaries: in
// PGCLUSTER_BIN_DIR (which withpostgres sets), then beside the initdb that
// pgcluster.FindBinDir picks (Debian and Ubuntu keep the versioned
// binaries in /usr/lib/postgresql/*/bin, off PATH), then on PATH. The first
// two are the throwaway server's own version, which pg_dump needs at least.
func PgDumpPath() (string, error) {
	var dirs []string
	if dir := os.Getenv("PGCLUSTER_BIN_DIR"); dir != "" {
		dirs = append(dirs, dir)
	}
	if dir, err := pgcluster.FindBinDir(); err == nil {
		dirs = append(dirs, dir)
	}
	for _, dir := range dirs {
		p := filepath.Join(dir, "pg_dump")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	if p, err := exec.LookPath("pg_dump"); err == nil {
		return p, nil
	}
	return "", errors.New("pg_dump not found (looked in PGCLUSTER_BIN_DIR, beside initdb in /usr/lib/postgresql/*/bin, and on PATH): " +
		"install PostgreSQL's binaries (Debian/Ubuntu: apt-get install postgresql-15)")
}

// sessionSetting matches a line of pg_dump's preamble: a setting of the
// restoring session (pg_dump 15 to 17 print these), not of the schema. It
// names them, rather than dropping every line that starts with SET, so
// that a function's body keeps its lines.
var sessionSetting = regexp.MustCompile(`^(SET (statement_timeout|lock_timeout|idle_in_transaction_session_timeout|transaction_timeout|` +
	`client_encoding|standard_conforming_strings|check_function_bodies|xmloption|client_min_messages|row_security|` +
	`default_tablespace|default_table_access_method|default_with_oids) = .*;|SELECT pg_catalog\.set_config\('search_path', '', false\);)$`)

// Normalise turns pg_dump's plain output into the snapshot's body: it
// drops the dump's title and closing comments, the lines that name
// pg_dump's and the server's versions, the SET and set_config preamble
// (session settings for a restore, not schema), and the \restrict and
// \unrestrict lines newer pg_dumps wrap the dump in (their key is random
// on every run); and it collapses runs of blank lines into one.
func Normalise(dump []byte) []byte {
	lines := strings.Split(strings.ReplaceAll(string(dump), "\r\n", "\n"), "\n")
	var kept []string
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		// "--\n-- PostgreSQL database dump[ complete]\n--": the title block.
		if line == "--" && i+2 < len(lines) && lines[i+2] == "--" && strings.HasPrefix(lines[i+1], "-- PostgreSQL database dump") {
			i += 2
			continue
		}
		switch {
		case strings.HasPrefix(line, "-- Dumped from database version"),
			strings.HasPrefix(line, "-- Dumped by pg_dump version"),
			sessionSetting.MatchString(line),
			strings.HasPrefix(line, `\restrict `), strings.HasPrefix(line, `\unrestrict `):
			continue
		}
		if line == "" && (len(kept) == 0 || kept[len(kept)-1] == "") {
			continue
		}
		kept = append(kept, line)
	}
	for len(kept) > 0 && kept[len(kept)-1] == "" {
		kept = kept[:len(kept)-1]
	}
	return []byte(strings.Join(kept, "\n") + "\n")
}
