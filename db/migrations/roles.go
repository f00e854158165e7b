package migrations

import (
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/text/secure/precis"
)

// The roles, by fixed name: the SQL migrations grant to them by name
// (student/00003_roles.sql, users/00002_roles.sql), so a reader sees who may
// do what without running anything. Each database has an owner, which owns
// every table and runs the migrations but cannot log in, and one login role
// per process that uses the database at run time.
const (
	StudentOwner = "student_owner" // owns Student's tables; NOLOGIN
	StudentApp   = "student_app"   // Student at run time
	OutboxSender = "outbox_sender" // the outbox sender, on Student's database
	// OutboxCDC is the sender's replication connection when it reads the
	// outbox from the write-ahead log (SENDER_SOURCE=cdc). It has the
	// REPLICATION attribute and no grant on any table: a replication
	// connection reads changes through the slot, never the tables.
	OutboxCDC  = "outbox_cdc"
	UsersOwner = "users_owner" // owns Users' tables; NOLOGIN
	UsersApp   = "users_app"   // Users at run time
	// LabReader is the fault lab's login on both databases (lab/): it may
	// read the columns the invariant checker reads and change nothing. It
	// logs in once a migrate step was given a password for it (either
	// set's: the role is the server's, so both must be given the same one);
	// a deployment without the lab has the role but no way in.
	LabReader = "lab_reader"
	// Reconciler is the reconciler's login on both databases
	// (reconciler/): it may read the columns its checks read and change
	// nothing. Like LabReader it logs in once a migrate step was given a
	// password for it, the same on both sets where they share a server;
	// without one the role exists and cannot log in.
	Reconciler = "reconciler"
)

// Owner is the role that owns the set's tables and applies its migrations.
func (s Set) Owner() string {
	if s == Users {
		return UsersOwner
	}
	return StudentOwner
}

// Logins are the roles that log in to the set's database at run time; only
// they may connect to it.
func (s Set) Logins() []string {
	if s == Users {
		return []string{UsersApp, LabReader, Reconciler}
	}
	return []string{StudentApp, OutboxSender, OutboxCDC, LabReader, Reconciler}
}

// Optional says whether role may be left without a password, and so
// without a login: the lab's reader, which only a lab uses, and the
// reconciler's, which a deployment that does not run it need not set.
func Optional(role string) bool { return role == LabReader || role == Reconciler }

// readers are the roles that only read: their sessions are read-only by
// default.
var readers = []string{LabReader, Reconciler}

// replicates says whether role streams changes from a replication slot,
// for which it needs the REPLICATION attribute.
func replicates(role string) bool { return role == OutboxCDC }

// prepareRoles readies what the SQL migrations cannot do as the owner: the
// roles themselves (cluster-wide, so an administrator's job), who may
// connect to this database, and the owner's right to create in schema
// public. It runs as the administrator, in one transaction.
//
// Roles are shared by every database of the cluster, so other migrators,
// of other databases (the tests build several templates at once), may be
// creating or altering the same roles right now. PostgreSQL reports such a
// race as an error rather than waiting (a duplicate role, or "tuple
// concurrently updated"), so the transaction is retried: the loser finds
// the winner's roles and carries on.
func prepareRoles(ctx context.Context, conn *pgx.Conn, set Set, passwords map[string]string, lockWait time.Duration) error {
	var err error
	for attempt := 1; ; attempt++ {
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			// Every lock wait below is bounded: the advisory lock, and the
			// catalog locks of the grants.
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = "+literal(strconv.FormatInt(lockWait.Milliseconds(), 10)+"ms")); err != nil {
				return err
			}
			return prepare(ctx, tx, set, passwords)
		})
		if err == nil || attempt == 10 || !lostRace(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(time.Duration(attempt*25) * time.Millisecond):
		}
	}
}

// lostRace says whether err is another migrator's concurrent change to the
// same catalog rows, which a retry gets past.
func lostRace(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "23505", // unique_violation: a role created at the same moment
		"42710", // duplicate_object: likewise, seen after it committed
		"40001", // serialization_failure
		"40P01": // deadlock_detected
		return true
	case "XX000":
		return strings.Contains(pgErr.Message, "concurrently")
	}
	return false
}

func prepare(ctx context.Context, tx pgx.Tx, set Set, passwords map[string]string) error {
	// Migrators of this same database queue here; those of other databases
	// (advisory locks are per database) are what the retry is for.
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('outboxref roles'))"); err != nil {
		return err
	}
	var superuser, replicator bool
	if err := tx.QueryRow(ctx, "SELECT rolsuper, rolreplication FROM pg_roles WHERE rolname = current_user").Scan(&superuser, &replicator); err != nil {
		return err
	}
	canReplicate := superuser || (replicator && serverVersion(ctx, tx) >= 160000)
	owner := set.Owner()
	if err := ensureRole(ctx, tx, owner, false, false, false); err != nil {
		return err
	}
	for _, role := range set.Logins() {
		if Optional(role) && passwords[role] == "" {
			// Created without a login where it is new. Where it exists, its
			// login stays as it is: roles are cluster-wide, and the migrate
			// of the other database on this server may have given it one.
			var login bool
			if err := tx.QueryRow(ctx, "SELECT coalesce((SELECT rolcanlogin FROM pg_roles WHERE rolname = $1), false)", role).Scan(&login); err != nil {
				return fmt.Errorf("role %s: %w", role, err)
			}
			if err := ensureRole(ctx, tx, role, login, false, false); err != nil {
				return err
			}
			continue
		}
		if err := ensureRole(ctx, tx, role, true, replicates(role), canReplicate); err != nil {
			return err
		}
		// A SCRAM verifier, not the password: the statement may be logged
		// (log_statement = 'ddl'), and a verifier in a log gives no login.
		verifier, err := scramVerifier(passwords[role])
		if err != nil {
			return fmt.Errorf("password of %s: %w", role, err)
		}
		if _, err := tx.Exec(ctx, "ALTER ROLE "+ident(role)+" PASSWORD "+literal(verifier)); err != nil {
			return fmt.Errorf("set the password of %s: %w", role, err)
		}
	}
	// The readers' grants (student/00007 and 00012, users/00004 and 00006)
	// allow SELECT only; read-only transactions as their default say so
	// again, so that a grant added by mistake later still changes nothing.
	// Roles are cluster-wide, so this holds on every database the role may
	// connect to.
	for _, role := range readers {
		if _, err := tx.Exec(ctx, "ALTER ROLE "+ident(role)+" SET default_transaction_read_only = on"); err != nil {
			return fmt.Errorf("make %s read-only: %w", role, err)
		}
	}
	// A superuser may SET ROLE to anyone; an administrator with CREATEROLE
	// must be a member of the owner to act as it. (Creating a role made it
	// one only with ADMIN OPTION since PostgreSQL 16, which is not enough to
	// SET ROLE; granting again when already a member is harmless.)
	if !superuser {
		if _, err := tx.Exec(ctx, "GRANT "+ident(owner)+" TO CURRENT_USER"); err != nil {
			return fmt.Errorf("grant %s to the administrator: %w", owner, err)
		}
	}
	if err := adoptTables(ctx, tx, owner); err != nil {
		return err
	}
	logins := identList(set.Logins())
	for _, stmt := range []string{
		// PostgreSQL 14 and older let everyone create in schema public; no
		// runtime role may create anything.
		"REVOKE CREATE ON SCHEMA public FROM PUBLIC",
		"GRANT USAGE, CREATE ON SCHEMA public TO " + ident(owner),
		"GRANT USAGE ON SCHEMA public TO " + logins,
	} {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("schema public: %w", err)
		}
	}
	if superuser {
		if err := closeBuiltins(ctx, tx, set); err != nil {
			return err
		}
	}
	if set == Student {
		// The outbox's publication (student/00006) is the owner's to
		// create, and creating a publication takes CREATE on the database.
		if _, err := tx.Exec(ctx, "GRANT CREATE ON DATABASE "+ident(dbName(ctx, tx))+" TO "+ident(owner)); err != nil {
			return fmt.Errorf("let %s create the outbox's publication: %w", owner, err)
		}
	}
	return restrictConnect(ctx, tx, set)
}

// closeBuiltins takes from PUBLIC, in this database, the built-in
// functions every role may call by default and no runtime role here
// needs, each of which lets a role that can connect create or interfere:
//
//   - large objects (lo_creat, lo_create, lo_from_bytea, lo_import): any
//     role could store data, a megabyte a call, that outlives its session
//     and that no table shows;
//   - advisory locks: any role could take the lock migrate takes and hold
//     it, stopping every deployment (migrate's waits are bounded too); the
//     owner keeps the three goose and migrate use;
//   - pg_notify: any role could wake the sender; Student and the sender,
//     which announce committed rows, keep it. The NOTIFY command itself
//     takes no privilege and cannot be taken away: a role that can connect
//     can still wake the sender, which then runs one claim that finds
//     nothing.
//
// The functions belong to the bootstrap superuser, so only a superuser
// may change who calls them; an administrator without superuser leaves
// them as they are, and docs/operating.md says what that leaves open.
func closeBuiltins(ctx context.Context, tx pgx.Tx, set Set) error {
	stmts := []string{
		"REVOKE EXECUTE ON FUNCTION lo_creat(integer), lo_create(oid), lo_from_bytea(oid, bytea), lo_import(text), lo_import(text, oid) FROM PUBLIC",
		"REVOKE EXECUTE ON FUNCTION " + strings.Join(advisoryLocks, ", ") + " FROM PUBLIC",
		"GRANT EXECUTE ON FUNCTION pg_try_advisory_lock(bigint), pg_advisory_unlock(bigint), pg_advisory_xact_lock(bigint) TO " + ident(set.Owner()),
		"REVOKE EXECUTE ON FUNCTION pg_notify(text, text) FROM PUBLIC",
	}
	if set == Student {
		stmts = append(stmts, "GRANT EXECUTE ON FUNCTION pg_notify(text, text) TO "+identList([]string{StudentApp, OutboxSender}))
	}
	for _, stmt := range stmts {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("built-in functions: %w", err)
		}
	}
	return nil
}

// advisoryLocks are the functions that take an advisory lock.
var advisoryLocks = func() []string {
	var fns []string
	for _, name := range []string{"pg_advisory_lock", "pg_advisory_lock_shared", "pg_advisory_xact_lock", "pg_advisory_xact_lock_shared",
		"pg_try_advisory_lock", "pg_try_advisory_lock_shared", "pg_try_advisory_xact_lock", "pg_try_advisory_xact_lock_shared"} {
		fns = append(fns, name+"(bigint)", name+"(integer, integer)")
	}
	return fns
}()

// dbName is the current database's name ("" if it cannot be read, which
// the statement using it then reports).
func dbName(ctx context.Context, q querier) string {
	var db string
	_ = q.QueryRow(ctx, "SELECT current_database()").Scan(&db)
	return db
}

// ensureRole creates role if it does not exist, and takes away any power
// beyond logging in (or not) that an existing one may have been given by
// hand: a runtime role that is a superuser would make every grant moot.
// A role that replicates gets REPLICATION and nothing more, when the
// administrator may give it (canReplicate): in PostgreSQL 15 only a
// superuser may, from 16 on also a CREATEROLE administrator that has it
// itself. Without it the role is made all the same, and the sender in cdc
// mode says what a superuser must run.
func ensureRole(ctx context.Context, tx pgx.Tx, role string, login, replication, canReplicate bool) error {
	var super, createRole, createDB, hasReplication, bypassRLS, canLogin bool
	err := tx.QueryRow(ctx, `SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls, rolcanlogin
		FROM pg_roles WHERE rolname = $1`, role).Scan(&super, &createRole, &createDB, &hasReplication, &bypassRLS, &canLogin)
	if errors.Is(err, pgx.ErrNoRows) {
		// The defaults are NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION
		// NOBYPASSRLS: exactly what a role here should have, but for the
		// REPLICATION of a role that replicates.
		attrs := loginWord(login)
		if replication && canReplicate {
			attrs += " REPLICATION"
		}
		if _, err := tx.Exec(ctx, "CREATE ROLE "+ident(role)+" "+attrs); err != nil {
			return fmt.Errorf("create role %s: %w", role, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("role %s: %w", role, err)
	}
	var fix []string
	for _, a := range []struct {
		wrong bool
		word  string
	}{
		{super, "NOSUPERUSER"}, {createRole, "NOCREATEROLE"}, {createDB, "NOCREATEDB"},
		{hasReplication && !replication, "NOREPLICATION"}, {!hasReplication && replication && canReplicate, "REPLICATION"},
		{bypassRLS, "NOBYPASSRLS"}, {canLogin != login, loginWord(login)},
	} {
		if a.wrong {
			fix = append(fix, a.word)
		}
	}
	if len(fix) > 0 {
		if _, err := tx.Exec(ctx, "ALTER ROLE "+ident(role)+" "+strings.Join(fix, " ")); err != nil {
			return fmt.Errorf("alter role %s %s: %w", role, strings.Join(fix, " "), err)
		}
	}
	return nil
}

// serverVersion is server_version_num, or 0 if it cannot be read.
func serverVersion(ctx context.Context, tx pgx.Tx) int {
	var v int
	if err := tx.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&v); err != nil {
		return 0
	}
	return v
}

func loginWord(login bool) string {
	if login {
		return "LOGIN"
	}
	return "NOLOGIN"
}

// adoptTables hands the owner the tables the administrator owns in schema
// public: those an earlier version of the migrate step created as the
// administrator, before the owner existed. Without this an upgraded
// database would refuse the owner its own goose_db_version table.
func adoptTables(ctx context.Context, tx pgx.Tx, owner string) error {
	rows, err := tx.Query(ctx, `SELECT c.relname FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
		  AND c.relowner = (SELECT oid FROM pg_roles WHERE rolname = current_user)
		ORDER BY c.relname`)
	if err != nil {
		return fmt.Errorf("find tables to adopt: %w", err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("find tables to adopt: %w", err)
	}
	for _, table := range tables {
		// Sequences of identity and serial columns follow their table.
		if _, err := tx.Exec(ctx, "ALTER TABLE public."+ident(table)+" OWNER TO "+ident(owner)); err != nil {
			return fmt.Errorf("hand table %s to %s: %w", table, owner, err)
		}
	}
	return nil
}

// restrictConnect lets only the set's login roles (and the database's
// owner and superusers) connect to the current database, and nobody create
// temporary tables in it. Connecting is granted per database, not per
// cluster: without this, outbox_sender could connect to Users' database
// whenever the two share a cluster.
func restrictConnect(ctx context.Context, q querier, set Set) error {
	var db string
	if err := q.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		return err
	}
	for _, stmt := range []string{
		"REVOKE CONNECT, TEMPORARY ON DATABASE " + ident(db) + " FROM PUBLIC",
		"GRANT CONNECT ON DATABASE " + ident(db) + " TO " + identList(set.Logins()),
	} {
		if _, err := q.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("database %s: %w", db, err)
		}
	}
	return nil
}

type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// RestrictConnect applies the set's database-level grants to the database
// conn is on. The migrate step does this itself; it is exported for a
// database cloned from a migrated template (CREATE DATABASE ... TEMPLATE
// copies the schema and its grants, but not who may connect), as the
// tests' databases are.
func RestrictConnect(ctx context.Context, conn *pgx.Conn, set Set) error {
	return restrictConnect(ctx, conn, set)
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

func identList(names []string) string {
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = ident(n)
	}
	return strings.Join(quoted, ", ")
}

// literal quotes s as an SQL string literal. Only verifiers reach it
// (base64 and a few separators), but quoting keeps it safe regardless.
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// scramVerifier returns what PostgreSQL stores for password under
// SCRAM-SHA-256 (RFC 5802, RFC 7677), in the form ALTER ROLE ... PASSWORD
// accepts as already hashed. The password is normalised as pgx and libpq
// normalise it when logging in (SASLprep; a password it rejects is used
// as it is).
func scramVerifier(password string) (string, error) {
	if password == "" {
		return "", errors.New("empty")
	}
	if p, err := precis.OpaqueString.String(password); err == nil {
		password = p
	}
	const iterations = 4096 // PostgreSQL's default scram_iterations
	salt := make([]byte, 16)
	_, _ = crand.Read(salt) // never fails (crypto/rand since Go 1.24)
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		return "", err
	}
	clientKey := hmacSHA256(salted, "Client Key")
	storedKey := sha256.Sum256(clientKey)
	serverKey := hmacSHA256(salted, "Server Key")
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iterations, b64(salt), b64(storedKey[:]), b64(serverKey)), nil
}

func hmacSHA256(key []byte, msg string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(msg))
	return h.Sum(nil)
}

// missingPasswords names the set's login roles without a password.
func missingPasswords(set Set, passwords map[string]string) []string {
	var missing []string
	for _, role := range set.Logins() {
		if passwords[role] == "" && !Optional(role) {
			missing = append(missing, role)
		}
	}
	return slices.Clip(missing)
}
