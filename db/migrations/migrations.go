// Package migrations owns the schema of both databases as goose migrations,
// embedded once so that the services, their tests and the end-to-end suite
// all apply exactly the same files, and the database roles those files
// grant to (roles.go).
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
// processes may call it at once. No lock is waited for longer than
// DefaultLockWait.
func Migrate(ctx context.Context, admin *pgx.ConnConfig, set Set, passwords map[string]string) error {
	return MigrateWaiting(ctx, admin, set, passwords, DefaultLockWait)
}

// DefaultLockWait bounds each wait of a migration for a lock: another
// migrator's, or a table's held by a session that does not end. Any role
// that can connect could otherwise stop a deployment for ever by holding
// one; a migration that gives up says so, and can be run again.
const DefaultLockWait = time.Minute

// MigrateWaiting is Migrate with its own bound on each lock wait.
func MigrateWaiting(ctx context.Context, admin *pgx.ConnConfig, set Set, passwords map[string]string, lockWait time.Duration) error {
	if missing := missingPasswords(set, passwords); len(missing) > 0 {
		return fmt.Errorf("migrate %s: no password for %s", set, strings.Join(missing, ", "))
	}
	conn, err := pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return fmt.Errorf("migrate %s: connect: %w", set, err)
	}
	err = prepareRoles(ctx, conn, set, passwords, lockWait)
	if cerr := conn.Close(context.WithoutCancel(ctx)); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("migrate %s: roles: %w", set, explainLockWait(err, lockWait))
	}

	// Every connection goose opens acts as the owner: the tables it
	// creates, and goose's own version table, are the owner's.
	asOwner := stdlib.OptionAfterConnect(func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET ROLE "+ident(set.Owner())+"; SET lock_timeout = "+literal(strconv.FormatInt(lockWait.Milliseconds(), 10)+"ms"))
		return err
	})
	db := stdlib.OpenDB(*admin, asOwner)
	defer db.Close()
	// goose polls for its lock every 5s; as many polls as fit in lockWait.
	polls := max(1, lockWait/(5*time.Second))
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(5, uint64(polls)))
	if err != nil {
		return fmt.Errorf("migrate %s: %w", set, err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, set.FS(), goose.WithSessionLocker(locker))
	if err != nil {
		return fmt.Errorf("migrate %s: %w", set, err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate %s: %w", set, explainLockWait(err, lockWait))
	}
	return nil
}

// explainLockWait says what to do when err is a wait for a lock that ran
// out.
func explainLockWait(err error, lockWait time.Duration) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" || strings.Contains(err.Error(), "failed to acquire lock") {
		return fmt.Errorf("waited %s for a lock another session holds (another migrate, or a session holding a table's or the roles' lock); "+
			"find it in pg_locks and pg_stat_activity, end it, and run migrate again: %w", lockWait, err)
	}
	return err
}
