// Package migrations owns the schema of both databases as goose migrations,
// embedded once so that the services, their tests and the end-to-end suite
// all apply exactly the same files.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed student/*.sql users/*.sql
var files embed.FS

// Set names one database's migrations.
type Set string

const (
	Student Set = "student"
	Users   Set = "users"
)

// FS returns the migration files of one set.
func (s Set) FS() fs.FS {
	sub, err := fs.Sub(files, string(s))
	if err != nil {
		panic(fmt.Sprintf("migrations: %v", err)) // the embed pattern guarantees the folder
	}
	return sub
}

// Up applies every pending migration of the set. A Postgres advisory lock
// serialises migrators, so several processes may call it at once.
func Up(ctx context.Context, pool *pgxpool.Pool, set Set) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return UpDB(ctx, db, set)
}

// UpDB is Up for a database/sql handle.
func UpDB(ctx context.Context, db *sql.DB, set Set) error {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return fmt.Errorf("migrate %s: %w", set, err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, set.FS(), goose.WithSessionLocker(locker))
	if err != nil {
		return fmt.Errorf("migrate %s: %w", set, err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate %s: %w", set, err)
	}
	return nil
}
