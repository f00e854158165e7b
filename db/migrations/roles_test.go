package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// roleCase is what one runtime role may and may not do on its database.
type roleCase struct {
	role string
	set  migrations.Set
	// allowed each succeed, in a transaction of their own that is rolled
	// back afterwards.
	allowed []string
	// denied each fail with insufficient_privilege (42501).
	denied []string
}

// Rows the statements refer to, seeded by the administrator.
const (
	studentID = "00000000-0000-0000-0000-00000000000a"
	userID    = "00000000-0000-0000-0000-00000000000b"
	outboxKey = "00000000-0000-0000-0000-00000000000c"
)

// ddl is what no runtime role may do: change the schema, or create
// anything, even a temporary table.
var ddl = []string{
	`CREATE TABLE t (id int)`,
	`CREATE TEMP TABLE t (id int)`,
	`CREATE SCHEMA s`,
	`CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1'`,
	`ALTER TABLE inbox ADD COLUMN x int`,
	`DROP TABLE inbox`,
	`TRUNCATE inbox`,
	`DELETE FROM goose_db_version`,
	// Large objects outlive the session and show in no table.
	`SELECT lo_from_bytea(0, repeat('x', 1000)::bytea)`,
	`SELECT lo_creat(-1)`,
	`SELECT lo_create(0)`,
	// The lock migrate takes, or any advisory lock: held, it would stop a
	// deployment.
	`SELECT pg_advisory_lock(hashtext('outboxref roles'))`,
	`SELECT pg_try_advisory_lock(4097083626)`,
	`SELECT pg_advisory_xact_lock(1)`,
	`SELECT pg_advisory_lock_shared(1, 2)`,
}

// wake is the sender's wake-up; only the roles that commit rows for it
// may call pg_notify.
const wake = `SELECT pg_notify('outbox_due', '')`

var roleCases = []roleCase{
	{
		role: migrations.StudentApp, set: migrations.Student,
		allowed: []string{
			// InsertStudentWithOutbox (store.newStudentRow), GetStudent and the inbox's statements.
			`INSERT INTO students (id, name, email, document_number) VALUES (gen_random_uuid(), 'B', 'b@example.com', '2')
				ON CONFLICT (document_number) DO NOTHING RETURNING id, name, email, document_number, user_id, created_at, updated_at`,
			`INSERT INTO outbox (idempotency_key, operation, student_id, payload)
				VALUES (gen_random_uuid(), 'create-user', '` + studentID + `', '{}') ON CONFLICT DO NOTHING`,
			// With the request's trace context (00005_outbox_trace_parent.sql).
			`INSERT INTO outbox (idempotency_key, operation, student_id, payload, trace_parent)
				VALUES (gen_random_uuid(), 'create-user', '` + studentID + `', '{}', '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01')
				ON CONFLICT DO NOTHING`,
			`SELECT s.*, o.state, o.attempts, o.reason_class, o.redrives, o.redriven_at
				FROM students s LEFT JOIN outbox o ON o.student_id = s.id AND o.operation = 'create-user'`,
			`INSERT INTO inbox (idempotency_key, request_hash, request) VALUES ('k2', '\x00', '{}')`,
			`UPDATE inbox SET status_code = 201, response_body = '{}', resource_id = gen_random_uuid(), replays = replays + 1
				WHERE idempotency_key = 'k1'`,
			`DELETE FROM inbox WHERE created_at < now() - interval '1 day'`,
			wake,
		},
		denied: append([]string{
			// Linking a student to its user is the sender's.
			`UPDATE students SET user_id = '` + userID + `'`,
			`UPDATE students SET name = 'X'`,
			`DELETE FROM students`,
			// The sender's side of the outbox, and what is for operators.
			`SELECT last_error FROM outbox`,
			`SELECT payload FROM outbox`,
			`SELECT trace_parent FROM outbox`,
			`UPDATE outbox SET state = 'delivered'`,
			`DELETE FROM outbox`,
			`SELECT * FROM outbox_events`,
			// A key's request is never rewritten.
			`UPDATE inbox SET request = '{}'`,
			`SET ROLE student_owner`,
		}, ddl...),
	},
	{
		// The replication login reads the outbox's changes through a slot,
		// never a table: it has nothing to allow here.
		role: migrations.OutboxCDC, set: migrations.Student,
		denied: append([]string{
			`SELECT id FROM outbox`,
			`SELECT * FROM students`,
			`SELECT * FROM inbox`,
			`UPDATE outbox SET state = 'dead'`,
			`INSERT INTO outbox (idempotency_key, operation, student_id, payload) VALUES (gen_random_uuid(), 'create-user', '` + studentID + `', '{}')`,
			`SET ROLE student_owner`,
			`SET ROLE outbox_sender`,
			`CREATE PUBLICATION p FOR TABLE outbox`,
			wake,
		}, ddl...),
	},
	{
		role: migrations.OutboxSender, set: migrations.Student,
		allowed: []string{
			// ClaimDue, LinkStudents, MarkDead, Redrive, the history, the
			// purge and the admin API's reads.
			`UPDATE outbox o SET available_at = now(), lease_token = gen_random_uuid(), claimed_by = 's', attempts = o.attempts + 1
				FROM (SELECT id FROM outbox WHERE state = 'pending' ORDER BY available_at, id FOR UPDATE SKIP LOCKED) due
				WHERE o.id = due.id RETURNING o.*`,
			`UPDATE students s SET user_id = '` + userID + `', updated_at = now()
				WHERE s.id = '` + studentID + `' AND s.user_id IS NULL RETURNING s.id`,
			`UPDATE outbox SET state = 'dead', dead_at = now(), last_error = 'x', reason_class = 'refused', lease_token = NULL`,
			`UPDATE outbox SET state = 'pending', attempts = 0, age_from = now(), redrives = redrives + 1, redriven_at = now(),
				previous_keys = previous_keys || idempotency_key, idempotency_key = gen_random_uuid(), claimed_by = NULL, delivered_at = NULL`,
			`INSERT INTO outbox_events (outbox_id, kind, attempt, outcome, actor, idempotency_key)
				SELECT id, 'attempt', 1, 'retry', 's', idempotency_key FROM outbox`,
			`DELETE FROM outbox_events`,
			`DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE state = 'delivered' FOR UPDATE SKIP LOCKED)`,
			`SELECT o.*, s.name, s.user_id FROM outbox o JOIN students s ON s.id = o.student_id`,
			// The broker's parked replies, and SENDER_PARKED_RETENTION's purge.
			`INSERT INTO parked_replies (stream, stream_sequence, subject, headers, data, size, reason, deliveries)
				VALUES ('S', 1, 's', '{}', '\x00', 1, 'r', 5) ON CONFLICT DO NOTHING`,
			`DELETE FROM parked_replies WHERE parked_at < now() - interval '30 days'`,
			wake, // after a redrive
		},
		denied: append([]string{
			// Of a student, only its link to its user.
			`UPDATE students SET name = 'X'`,
			`UPDATE students SET document_number = 'X'`,
			`SELECT email FROM students`,
			`SELECT * FROM students`,
			`DELETE FROM students`,
			`INSERT INTO students (id, name, email, document_number) VALUES (gen_random_uuid(), 'B', 'b@example.com', '2')`,
			// What an operation is, is Student's.
			`INSERT INTO outbox (idempotency_key, operation, student_id, payload) VALUES (gen_random_uuid(), 'create-user', '` + studentID + `', '{}')`,
			`UPDATE outbox SET payload = '{}'`,
			`UPDATE outbox SET student_id = '` + studentID + `'`,
			// The trace context is the request's, as it was when written.
			`UPDATE outbox SET trace_parent = NULL`,
			// Client keys are Student's.
			`SELECT * FROM inbox`,
			`DELETE FROM inbox`,
			`UPDATE parked_replies SET reason = 'x'`,
			`SET ROLE student_owner`,
		}, ddl...),
	},
	{
		// The fault lab reads what the invariant checker reads, and
		// nothing else: of a student no name or email, of a row no payload.
		role: migrations.LabReader, set: migrations.Student,
		allowed: []string{
			`SELECT id, document_number, user_id FROM students`,
			`SELECT student_id, idempotency_key::text, state, attempts, coalesce(last_error, ''), coalesce(claimed_by, '')
				FROM outbox WHERE operation = 'create-user'`,
		},
		denied: append([]string{
			`SELECT name FROM students`,
			`SELECT email FROM students`,
			`SELECT payload FROM outbox`,
			`SELECT * FROM outbox_events`,
			`SELECT * FROM inbox`,
			`UPDATE students SET user_id = NULL`,
			`UPDATE outbox SET state = 'dead'`,
			`DELETE FROM outbox`,
			`INSERT INTO students (id, name, email, document_number) VALUES (gen_random_uuid(), 'B', 'b@example.com', '2')`,
			`SET ROLE student_owner`,
			wake,
		}, ddl...),
	},
	{
		role: migrations.LabReader, set: migrations.Users,
		allowed: []string{
			`SELECT id, document_number, enabled FROM users`,
			`SELECT caller, idempotency_key, coalesce(status_code, 0), resource_id, replays FROM inbox`,
			`SELECT id, message_id, idempotency_key, subject, created_at, published_at FROM answers`,
			`SELECT stream, stream_sequence, subject, reason, deliveries, parked_at FROM parked_commands`,
		},
		denied: append([]string{
			`SELECT name FROM users`,
			`SELECT request FROM inbox`,
			`SELECT response_body FROM inbox`,
			`SELECT payload FROM answers`,
			`SELECT data FROM parked_commands`,
			`SELECT headers FROM parked_commands`,
			`UPDATE users SET enabled = false`,
			`DELETE FROM inbox`,
			`INSERT INTO users (id, name, email, document_number) VALUES (gen_random_uuid(), 'B', 'b@example.com', '2')`,
			`SET ROLE users_owner`,
			wake,
		}, ddl...),
	},
	{
		role: migrations.UsersApp, set: migrations.Users,
		allowed: []string{
			`INSERT INTO users (id, name, email, document_number) VALUES (gen_random_uuid(), 'B', 'b@example.com', '2')
				ON CONFLICT (document_number) WHERE enabled DO NOTHING RETURNING *`,
			`SELECT * FROM users`,
			`INSERT INTO inbox (idempotency_key, request_hash, request) VALUES ('k2', '\x00', '{}')`,
			`UPDATE inbox SET status_code = 201, response_body = '{}', resource_id = gen_random_uuid(), replays = replays + 1
				WHERE idempotency_key = 'k1'`,
			`DELETE FROM inbox WHERE created_at < now() - interval '7 days'`,
			// The broker's answers and parked commands.
			`INSERT INTO answers (message_id, idempotency_key, subject, payload) VALUES (gen_random_uuid(), gen_random_uuid(), 's', '{}')
				ON CONFLICT (message_id) DO NOTHING`,
			`SELECT id FROM answers WHERE published_at IS NULL ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED`,
			`UPDATE answers SET published_at = now() WHERE id = ANY('{1}'::bigint[])`,
			`DELETE FROM answers WHERE published_at < now() - interval '7 days'`,
			`INSERT INTO parked_commands (stream, stream_sequence, subject, headers, data, size, reason, deliveries)
				VALUES ('S', 1, 's', '{}', '\x00', 1, 'r', 5) ON CONFLICT DO NOTHING`,
			// USERS_PARKED_RETENTION's purge.
			`DELETE FROM parked_commands WHERE parked_at < now() - interval '30 days'`,
		},
		denied: append([]string{
			// Disabling a user is an operator's job.
			`UPDATE users SET enabled = false`,
			`DELETE FROM users`,
			`UPDATE inbox SET request_hash = '\x01'`,
			// An answer, once written, is what was answered.
			`UPDATE answers SET payload = '{}'`,
			// A parked command is kept as it came, until its retention.
			`UPDATE parked_commands SET reason = 'x'`,
			`SET ROLE users_owner`,
			wake,
		}, ddl...),
	},
}

// TestEachRoleHasItsGrantsAndNoMore: for each runtime role, what its
// process does succeeds, and each statement outside its grants fails with
// permission denied.
func TestEachRoleHasItsGrantsAndNoMore(t *testing.T) {
	t.Parallel()
	dbs := map[migrations.Set]string{
		migrations.Student: pgtest.URL(t, migrations.Student),
		migrations.Users:   pgtest.URL(t, migrations.Users),
	}
	seed(t, dbs)
	for _, c := range roleCases {
		t.Run(string(c.set)+"/"+c.role, func(t *testing.T) {
			t.Parallel()
			conn := connect(t, pgtest.RoleURL(t, dbs[c.set], c.role))
			if migrations.Optional(c.role) {
				// Its sessions are read-only by default; the grants must
				// hold without that, since a session may turn it off.
				require.Equal(t, "25006", sqlState(inRolledBackTx(conn, `CREATE TABLE t (x int)`)), "read-only by default")
				_, err := conn.Exec(context.Background(), "SET default_transaction_read_only = off")
				require.NoError(t, err)
			}
			for _, sql := range c.allowed {
				require.NoError(t, inRolledBackTx(conn, sql), "%s may: %s", c.role, sql)
			}
			for _, sql := range c.denied {
				err := inRolledBackTx(conn, sql)
				require.Equal(t, "42501", sqlState(err), "%s must not: %s\ngot: %v", c.role, sql, err)
			}
		})
	}
}

// TestMigrateWaitsBounded: a session holding the lock migrate takes (here
// the administrator's, since no runtime role may take it any more) makes
// migrate give up after its bound, saying why, rather than wait for ever;
// once the session lets go, migrate succeeds.
func TestMigrateWaitsBounded(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.EmptyURL(t)
	holder := connect(t, dbURL)
	ctx := context.Background()
	_, err := holder.Exec(ctx, "SELECT pg_advisory_lock(hashtext('outboxref roles'))")
	require.NoError(t, err)
	cfg, err := pgx.ParseConfig(dbURL)
	require.NoError(t, err)
	// The tests' own passwords: roles belong to the whole server, and
	// others would lock every other test out.
	passwords := pgtest.Passwords
	start := time.Now()
	err = migrations.MigrateWaiting(ctx, cfg, migrations.Student, passwords, time.Second)
	require.ErrorContains(t, err, "waited 1s for a lock another session holds")
	require.Less(t, time.Since(start), 10*time.Second, "the wait is bounded")
	_, err = holder.Exec(ctx, "SELECT pg_advisory_unlock(hashtext('outboxref roles'))")
	require.NoError(t, err)
	// With the default bound: other tests' migrations may hold the shared
	// catalogs' locks for a moment, longer than a second on a loaded
	// machine.
	require.NoError(t, migrations.Migrate(ctx, cfg, migrations.Student, passwords))
}

// TestRolesCannotReachTheOtherDatabase: even in one cluster, no runtime role
// may connect to the other service's database; outbox_sender has nothing
// to do in Users' database.
func TestRolesCannotReachTheOtherDatabase(t *testing.T) {
	t.Parallel()
	studentURL := pgtest.URL(t, migrations.Student)
	usersURL := pgtest.URL(t, migrations.Users)
	for _, c := range []struct{ role, url string }{
		{migrations.OutboxSender, usersURL},
		{migrations.StudentApp, usersURL},
		{migrations.OutboxCDC, usersURL},
		{migrations.UsersApp, studentURL},
	} {
		_, err := tryConnect(pgtest.RoleURL(t, c.url, c.role))
		require.Equal(t, "42501", sqlState(err), "%s must not connect: %v", c.role, err)
	}
	// ... while each connects to its own.
	for _, c := range []struct{ role, url string }{
		{migrations.OutboxSender, studentURL},
		{migrations.StudentApp, studentURL},
		{migrations.OutboxCDC, studentURL},
		{migrations.UsersApp, usersURL},
		// The lab and the reconciler read both.
		{migrations.LabReader, studentURL},
		{migrations.LabReader, usersURL},
		{migrations.Reconciler, studentURL},
		{migrations.Reconciler, usersURL},
	} {
		conn, err := tryConnect(pgtest.RoleURL(t, c.url, c.role))
		require.NoError(t, err, c.role)
		require.NoError(t, conn.Close(context.Background()))
	}
}

// TestRoleAttributes: no runtime role holds a power beyond logging in, the
// owners cannot log in, and the owners own every table.
func TestRoleAttributes(t *testing.T) {
	t.Parallel()
	studentURL := pgtest.URL(t, migrations.Student)
	usersURL := pgtest.URL(t, migrations.Users)
	admin := connect(t, studentURL)
	ctx := context.Background()
	for _, role := range []string{
		migrations.StudentApp, migrations.OutboxSender, migrations.OutboxCDC, migrations.UsersApp, migrations.LabReader,
		migrations.Reconciler, migrations.StudentOwner, migrations.UsersOwner,
	} {
		var powers []string
		var login bool
		err := admin.QueryRow(ctx, `SELECT array_remove(ARRAY[
				CASE WHEN rolsuper THEN 'superuser' END, CASE WHEN rolcreaterole THEN 'createrole' END,
				CASE WHEN rolcreatedb THEN 'createdb' END, CASE WHEN rolreplication THEN 'replication' END,
				CASE WHEN rolbypassrls THEN 'bypassrls' END], NULL), rolcanlogin
			FROM pg_roles WHERE rolname = $1`, role).Scan(&powers, &login)
		require.NoError(t, err, role)
		if role == migrations.OutboxCDC {
			// Streaming from a replication slot takes REPLICATION, and
			// only that (the tests' administrator is a superuser).
			require.Equal(t, []string{"replication"}, powers, role)
		} else {
			require.Empty(t, powers, role)
		}
		owner := role == migrations.StudentOwner || role == migrations.UsersOwner
		require.Equal(t, !owner, login, "%s: rolcanlogin", role)
		if owner {
			// An owner has no password, so a server that checks them
			// refuses it at that (28P01); one that trusts, as a
			// TEST_DATABASE_URL of yours may, says it may not log in.
			_, err := tryConnect(pgtest.RoleURL(t, studentURL, role))
			require.Contains(t, []string{"28P01", "28000"}, sqlState(err), "%s must not log in: %v", role, err)
		}
	}
	for set, dbURL := range map[migrations.Set]string{migrations.Student: studentURL, migrations.Users: usersURL} {
		var owners []string
		err := connect(t, dbURL).QueryRow(ctx,
			`SELECT array_agg(DISTINCT tableowner::text) FROM pg_tables WHERE schemaname = 'public'`).Scan(&owners)
		require.NoError(t, err)
		require.Equal(t, []string{set.Owner()}, owners, "every table of %s, goose's too, is the owner's", set)
	}
}

// seed gives the allowed statements rows to work on.
func seed(t *testing.T, dbs map[migrations.Set]string) {
	t.Helper()
	ctx := context.Background()
	_, err := connect(t, dbs[migrations.Student]).Exec(ctx, `
		INSERT INTO students (id, name, email, document_number) VALUES ('`+studentID+`', 'A', 'a@example.com', '1');
		INSERT INTO outbox (idempotency_key, operation, student_id, payload) VALUES ('`+outboxKey+`', 'create-user', '`+studentID+`', '{}');
		INSERT INTO inbox (idempotency_key, request_hash, request) VALUES ('k1', '\x00', '{}');`)
	require.NoError(t, err)
	_, err = connect(t, dbs[migrations.Users]).Exec(ctx,
		`INSERT INTO inbox (idempotency_key, request_hash, request) VALUES ('k1', '\x00', '{}')`)
	require.NoError(t, err)
}

func connect(t *testing.T, dbURL string) *pgx.Conn {
	t.Helper()
	conn, err := tryConnect(dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func tryConnect(dbURL string) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return pgx.Connect(ctx, dbURL)
}

// inRolledBackTx runs sql in a transaction and rolls it back, so that one
// statement's effects never decide another's outcome.
func inRolledBackTx(conn *pgx.Conn, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, sql)
	return err
}

func sqlState(err error) string {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return pgErr.Code
	}
	return ""
}
