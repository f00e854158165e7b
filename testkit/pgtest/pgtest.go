// Package pgtest gives each test its own PostgreSQL database, cloned from a
// template that has the migrations applied (pgtestdb does the cloning, so a
// fresh database costs a CREATE DATABASE ... TEMPLATE, not a migration run).
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
	`where the user may create databases.`

// ServerURL returns EnvVar or fails the test.
func ServerURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(EnvVar)
	if u == "" {
		t.Fatal(Missing)
	}
	return u
}

// URL creates a fresh, migrated database for the test and returns its URL.
// The database is dropped when the test passes and kept for inspection when
// it fails.
func URL(t testing.TB, set migrations.Set) string {
	t.Helper()
	conf := config(t, ServerURL(t))
	return pgtestdb.Custom(t, conf, migrator{set: set}).URL()
}

// EmptyURL creates a fresh database with no schema, for testing migrations.
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
		// A test that fails may leave a pool open; dropping must still work.
		ForceTerminateConnections: true,
	}
}

// migrator applies one set of the embedded goose migrations to pgtestdb's
// template database.
type migrator struct{ set migrations.Set }

// Hash identifies the template by the migration files' contents, so a
// changed migration gets a new template instead of a stale one.
func (m migrator) Hash() (string, error) {
	h := sha256.New()
	h.Write([]byte(m.set))
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

func (m migrator) Migrate(ctx context.Context, db *sql.DB, _ pgtestdb.Config) error {
	return migrations.UpDB(ctx, db, m.set)
}
