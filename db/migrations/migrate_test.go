package migrations_test

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/testkit/pgcluster"
)

// privateCluster starts a cluster of the test's own, where every role must
// give its password (postgres's is in the cluster's URL). Roles
// belong to a whole cluster: rotating a password on the tests' shared
// server would lock out every other test package using the role.
func privateCluster(t *testing.T) *pgcluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	require.NoError(t, err, "this test starts a PostgreSQL cluster of its own (it changes roles' passwords, which would disturb other tests on a shared server)")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, c.Cleanup(ctx))
	})
	return c
}

func createDatabase(t *testing.T, c *pgcluster.Cluster, name string) *pgx.ConnConfig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dbURL, err := c.CreateDatabase(ctx, name)
	require.NoError(t, err)
	cc, err := pgx.ParseConfig(dbURL)
	require.NoError(t, err)
	return cc
}

// login tries role's password on the database cc names.
func login(cc *pgx.ConnConfig, role, password string) error {
	u := url.URL{
		Scheme: "postgres", User: url.UserPassword(role, password),
		Host: fmt.Sprintf("%s:%d", cc.Host, cc.Port), Path: "/" + cc.Database, RawQuery: "sslmode=disable",
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

func canLogin(t *testing.T, admin *pgx.ConnConfig, role string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, admin)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var login bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT rolcanlogin FROM pg_roles WHERE rolname = $1", role).Scan(&login))
	return login
}

// TestMigrate runs the migrate step on a cluster of its own, one case
// after another: each changes roles, which every database of the cluster
// shares.
func TestMigrate(t *testing.T) {
	t.Parallel()
	c := privateCluster(t)
	t.Run("as an administrator with CREATEROLE", func(t *testing.T) { migrateAsCreateRole(t, c) })
	t.Run("idempotent, and rotates passwords", func(t *testing.T) { migrateRotates(t, c) })
	t.Run("strips powers and adopts tables", func(t *testing.T) { migrateStripsAndAdopts(t, c) })
	t.Run("concurrently", func(t *testing.T) { migrateConcurrently(t, c) })
}

// migrateAsCreateRole: the administrator need not be a superuser; a role
// with CREATEROLE that owns the database will do. It runs first, on roles
// it creates itself: from PostgreSQL 16 on, such an administrator may alter
// only the roles it created.
func migrateAsCreateRole(t *testing.T, c *pgcluster.Cluster) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.URL())
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE ROLE db_admin LOGIN CREATEROLE PASSWORD 'admin-pw'")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE DATABASE owned OWNER db_admin")
	require.NoError(t, err)
	admin, err := pgx.ParseConfig(fmt.Sprintf("postgres://db_admin:admin-pw@127.0.0.1:%d/owned?sslmode=disable", c.Port()))
	require.NoError(t, err)

	require.NoError(t, migrations.Migrate(ctx, admin, migrations.Users, map[string]string{migrations.UsersApp: "pw"}))
	require.NoError(t, migrations.Migrate(ctx, admin, migrations.Users, map[string]string{migrations.UsersApp: "pw"}))
	require.NoError(t, login(admin, migrations.UsersApp, "pw"))
	var owners []string
	asPostgres, err := url.Parse(c.URL())
	require.NoError(t, err)
	asPostgres.Path = "/owned"
	require.NoError(t, connect(t, asPostgres.String()).QueryRow(ctx,
		`SELECT array_agg(DISTINCT tableowner::text) FROM pg_tables WHERE schemaname = 'public'`).Scan(&owners))
	require.Equal(t, []string{migrations.UsersOwner}, owners)
}

// migrateRotates: migrating twice changes nothing, and again with a new
// password rotates it: the new one logs in, the old one no longer does.
func migrateRotates(t *testing.T, c *pgcluster.Cluster) {
	admin := createDatabase(t, c, "student")
	ctx := context.Background()
	first := map[string]string{migrations.StudentApp: "first-app", migrations.OutboxSender: "first-sender", migrations.OutboxCDC: "first-cdc"}

	err := migrations.Migrate(ctx, admin, migrations.Student, map[string]string{migrations.StudentApp: "x"})
	require.ErrorContains(t, err, "no password for outbox_sender")

	require.NoError(t, migrations.Migrate(ctx, admin, migrations.Student, first))
	require.NoError(t, migrations.Migrate(ctx, admin, migrations.Student, first), "migrating twice is a no-op")
	require.NoError(t, login(admin, migrations.StudentApp, "first-app"))
	require.NoError(t, login(admin, migrations.OutboxSender, "first-sender"))
	require.Equal(t, "28P01", sqlState(login(admin, migrations.StudentApp, "wrong")))
	// The lab's reader was given no password: it exists, for the grants,
	// but cannot log in.
	require.False(t, canLogin(t, admin, migrations.LabReader), "lab_reader without a password")

	second := map[string]string{migrations.StudentApp: "second-app ünïcode", migrations.OutboxSender: "first-sender", migrations.OutboxCDC: "first-cdc"}
	require.NoError(t, migrations.Migrate(ctx, admin, migrations.Student, second))
	require.NoError(t, login(admin, migrations.StudentApp, "second-app ünïcode"))
	require.Equal(t, "28P01", sqlState(login(admin, migrations.StudentApp, "first-app")), "the old password is gone")
	require.NoError(t, login(admin, migrations.OutboxSender, "first-sender"))

	// Given a password, the reader logs in, read-only by default.
	second[migrations.LabReader] = "lab"
	require.NoError(t, migrations.Migrate(ctx, admin, migrations.Student, second))
	require.NoError(t, login(admin, migrations.LabReader, "lab"))
	require.True(t, canLogin(t, admin, migrations.LabReader))

	// The other set's migrate on the same server, given no password for the
	// reader, leaves the reader's login alone: the role is shared.
	usersAdmin := createDatabase(t, c, "users_beside")
	require.NoError(t, migrations.Migrate(ctx, usersAdmin, migrations.Users, map[string]string{migrations.UsersApp: "users-app"}))
	require.NoError(t, login(admin, migrations.LabReader, "lab"), "a users migrate without the lab's password disabled the reader")

	// A second database of the same set in the cluster shares the roles
	// and gets its own connect grants.
	other := createDatabase(t, c, "student_two")
	require.NoError(t, migrations.Migrate(ctx, other, migrations.Student, second))
	require.NoError(t, login(other, migrations.StudentApp, "second-app ünïcode"))
}

// migrateConcurrently: migrators of several databases at once, as the
// tests' template builds are, all succeed although they create and alter
// the same roles.
func migrateConcurrently(t *testing.T, c *pgcluster.Cluster) {
	passwords := map[string]string{migrations.StudentApp: "a", migrations.OutboxSender: "b", migrations.OutboxCDC: "d", migrations.UsersApp: "c"}
	errs := make(chan error, 8)
	for i := range cap(errs) {
		set := []migrations.Set{migrations.Student, migrations.Users}[i%2]
		admin := createDatabase(t, c, fmt.Sprintf("db%d", i))
		go func() { errs <- migrations.Migrate(context.Background(), admin, set, passwords) }()
	}
	for range cap(errs) {
		require.NoError(t, <-errs)
	}
}

// migrateStripsAndAdopts: a database migrated by an earlier version, as
// the administrator and without roles, is handed to the owner; a runtime
// role given a power by hand loses it.
func migrateStripsAndAdopts(t *testing.T, c *pgcluster.Cluster) {
	admin := createDatabase(t, c, "users")
	ctx := context.Background()

	db := stdlib.OpenDB(*admin)
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.Users.FS())
	require.NoError(t, err)
	_, err = p.UpTo(ctx, 1)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, "ALTER ROLE users_app CREATEDB CREATEROLE")
	require.NoError(t, err)
	require.NoError(t, db.Close())

	require.NoError(t, migrations.Migrate(ctx, admin, migrations.Users, map[string]string{migrations.UsersApp: "pw"}))
	conn, err := pgx.ConnectConfig(ctx, admin)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var owners []string
	require.NoError(t, conn.QueryRow(ctx,
		`SELECT array_agg(DISTINCT tableowner::text) FROM pg_tables WHERE schemaname = 'public'`).Scan(&owners))
	require.Equal(t, []string{migrations.UsersOwner}, owners)
	var createDB, createRole bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = 'users_app'").Scan(&createDB, &createRole))
	require.False(t, createDB)
	require.False(t, createRole)
	require.NoError(t, login(admin, migrations.UsersApp, "pw"))
}
