// Package pgtest gives each test its own PostgreSQL database, cloned from a
// template that has the migrations applied (pgtestdb does the cloning, so a
// fresh database costs a CREATE DATABASE ... TEMPLATE, not a migration run).
//
// The template is migrated by migrations.Migrate, as "migrate" does it: the
// database roles exist, with the passwords in Passwords, and the tables
// belong to the owner role. URL logs in as the server's administrator, for
// a test that sets up, inspects or breaks things; RoleURL logs in as one of
// the runtime roles, for the code under test, so that every test exercises
// the grants the binaries run with.
//
// The server comes from TEST_DATABASE_URL. `make test` sets it, starting a
// throwaway cluster when none is given. Without it a test fails, saying
// what to do: a test that silently skips proves nothing.
package pgtest

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"io/fs"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver pgtestdb opens
	"github.com/peterldowns/pgtestdb"

	"github.com/outboxref/outboxref/db/migrations"
)

// EnvVar names the server tests use.
const EnvVar = "TEST_DATABASE_URL"

// Missing is the failure message when EnvVar is unset.
const Missing = EnvVar + ` is not set. Run the tests with "make test", which starts a throwaway ` +
	`PostgreSQL cluster (it needs the PostgreSQL server binaries: apt-get install postgresql-15, ` +
	`or any initdb/pg_ctl on PATH), or set ` + EnvVar + `=postgres://user@host:port/db to a server ` +
	`where the user is a superuser (the tests create databases and roles).`

// ServerURL returns EnvVar or fails the test.
func ServerURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(EnvVar)
	if u == "" {
		t.Fatal(Missing)
	}
	return u
}

// Passwords are the runtime roles' passwords in the tests' templates.
// Roles belong to the whole cluster, so every test package sets the same
// ones: a package that set others would lock the rest out.
var Passwords = map[string]string{
	migrations.StudentApp:   "test-student-app",
	migrations.OutboxSender: "test-outbox-sender",
	migrations.OutboxCDC:    "test-outbox-cdc",
	migrations.UsersApp:     "test-users-app",
	migrations.LabReader:    "test-lab-reader",
	migrations.Reconciler:   "test-reconciler",
}

// URL creates a fresh, migrated database for the test and returns its URL,
// which logs in as the server's administrator (TEST_DATABASE_URL's user).
// The database is dropped when the test passes and kept for inspection
// when it fails.
func URL(t testing.TB, set migrations.Set) string {
	t.Helper()
	conf := config(t, ServerURL(t))
	dbURL := pgtestdb.Custom(t, conf, migrator{set: set}).URL()
	// A clone does not inherit who may connect to its template.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("connect to test database: %v", err)
	}
	defer conn.Close(context.Background())
	if err := migrations.RestrictConnect(ctx, conn, set); err != nil {
		t.Fatalf("restrict connecting to the test database: %v", err)
	}
	return dbURL
}

// RoleURL returns dbURL logging in as role instead, with its test password.
func RoleURL(t testing.TB, dbURL, role string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("parse database URL: %v", err)
	}
	u.User = url.UserPassword(role, Passwords[role])
	return u.String()
}

// ConnectAs opens a pool on dbURL's database as role, closed at cleanup.
func ConnectAs(t testing.TB, dbURL, role string) *pgxpool.Pool {
	t.Helper()
	return Connect(t, RoleURL(t, dbURL, role))
}

// As opens a pool as role on the database pool is on, closed at cleanup:
// for a test that sets up with the administrator's pool and runs the code
// under test as its runtime role.
func As(t testing.TB, pool *pgxpool.Pool, role string) *pgxpool.Pool {
	t.Helper()
	return ConnectAs(t, pool.Config().ConnString(), role)
}

// EmptyURL creates a fresh database with no schema, for testing migrations.
// It logs in as the server's administrator.
func EmptyURL(t testing.TB) string {
	t.Helper()
	return pgtestdb.Custom(t, config(t, ServerURL(t)), pgtestdb.NoopMigrator{}).URL()
}

// Pool is URL plus a pgx pool closed at cleanup.
func Pool(t testing.TB, set migrations.Set) *pgxpool.Pool {
	t.Helper()
	return Connect(t, URL(t, set))
}

// Connect opens a pool on dbURL, closed at cleanup.
func Connect(t testing.TB, dbURL string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatalf("connect to test database: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func config(t testing.TB, server string) pgtestdb.Config {
	t.Helper()
	u, err := url.Parse(server)
	if err != nil {
		t.Fatalf("%s: %v", EnvVar, err)
	}
	pw, _ := u.User.Password()
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	db := u.Path
	if len(db) > 1 {
		db = db[1:]
	} else {
		db = "postgres"
	}
	opts := u.Query()
	if opts.Get("sslmode") == "" {
		opts.Set("sslmode", "disable")
	}
	return pgtestdb.Config{
		DriverName: "pgx",
		Host:       u.Hostname(),
		Port:       port,
		User:       u.User.Username(),
		Password:   pw,
		Database:   db,
		Options:    opts.Encode(),
		// The server's own administrator builds the templates and owns the
		// databases: migrating creates roles, which pgtestdb's default
		// role, made for tests that need nothing of the kind, may not.
		TestRole: &pgtestdb.Role{Username: u.User.Username(), Password: pw, Capabilities: "SUPERUSER"},
		// A test that fails may leave a pool open; dropping must still work.
		ForceTerminateConnections: true,
	}
}

// migrator migrates pgtestdb's template database as "migrate" does.
type migrator struct{ set migrations.Set }

// Hash identifies the template by the migration files' contents and the
// roles' passwords, so a changed migration gets a new template instead of
// a stale one.
func (m migrator) Hash() (string, error) {
	h := sha256.New()
	h.Write([]byte(m.set))
	for _, role := range m.set.Logins() {
		h.Write([]byte(role + "=" + Passwords[role] + "\n"))
	}
	err := fs.WalkDir(m.set.FS(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(m.set.FS(), path)
		h.Write([]byte(path))
		h.Write(b)
		return err
	})
	return hex.EncodeToString(h.Sum(nil)), err
}

func (m migrator) Migrate(ctx context.Context, _ *sql.DB, conf pgtestdb.Config) error {
	cc, err := pgx.ParseConfig(conf.URL())
	if err != nil {
		return err
	}
	return migrations.Migrate(ctx, cc, m.set, Passwords)
}
