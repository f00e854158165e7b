// Package migrations owns the schema of both databases as goose migrations,
// embedded once so that the services, their tests and the end-to-end suite
// all apply exactly the same files, and the database roles those files
// grant to (roles.go).
package migrations

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"strings"

	"github.com/jackc/pgx/v5"
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

// Migrate readies the set's database and applies every pending migration.
// admin logs in as a superuser, or as a role with CREATEROLE that owns the
// database. First, as admin, it creates the set's roles if they are
// missing and sets each login role's password from passwords (by role
// name; every login role needs one but the optional lab_reader, which
// without one cannot log in); then it applies the migrations as the
// set's owner, so that the owner, not the administrator, owns every table
// and the runtime roles get only what the migrations grant.
//
// Running it again is harmless, and with new passwords it rotates them. A
// Postgres advisory lock serialises migrators of one database, so several
// processes may call it at once.
func Migrate(ctx context.Context, admin *pgx.ConnConfig, set Set, passwords map[string]string) error {
	if missing := missingPasswords(set, passwords); len(missing) > 0 {
		return fmt.Errorf("migrate %s: no password for %s", set, strings.Join(missing, ", "))
	}
	conn, err := pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return fmt.Errorf("migrate %s: connect: %w", set, err)
	}
	err = prepareRoles(ctx, conn, set, passwords)
	if cerr := conn.Close(context.WithoutCancel(ctx)); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("migrate %s: roles: %w", set, err)
	}

	// Every connection goose opens acts as the owner: the tables it
	// creates, and goose's own version table, are the owner's.
	asOwner := stdlib.OptionAfterConnect(func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET ROLE "+ident(set.Owner()))
		return err
	})
	db := stdlib.OpenDB(*admin, asOwner)
	defer db.Close()
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
