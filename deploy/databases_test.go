package deploy

// This file checks the database URLs against the database services, and
// that every role's password comes from a secret the service logging in and
// the migration setting it agree on.

import (
	"cmp"
	"fmt"
	"maps"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/compose-spec/compose-go/v2/types"

	"github.com/outboxref/outboxref/db/migrations"
)

// database identifies a database inside the compose project.
type database struct{ host, name string }

func (db database) String() string { return db.host + "/" + db.name }

// databaseOf checks a service's database URL against the database service it
// names and returns that database.
func (d *deployment) databaseOf(s types.ServiceConfig) (database, []string) {
	binName, b, ok := binaryOf(s)
	if !ok {
		return database{}, nil
	}
	// A migration logs in as the database's administrator; every other
	// service as its binary's own role, never as the administrator.
	cfg, _ := config(s)
	dbURL, dbVar := cfg.dbURL, b.dbVar
	if isMigration(s) {
		dbURL, dbVar = cfg.migrateURL, b.migrateVar
	}
	u, db, problems := d.target(s, dbVar, dbURL)
	if u == nil {
		return db, problems
	}
	env := getenvOf(d.project.Services[db.host].Environment)
	user := adminOf(d.project.Services[db.host])
	switch {
	case !isMigration(s) && u.User.Username() != b.role:
		problems = append(problems, fmt.Sprintf("%q: %s logs in as %q, but %s runs as its own role, %q", s.Name, dbVar, u.User.Username(), binName, b.role))
	case !isMigration(s):
	case u.User.Username() != user:
		problems = append(problems, fmt.Sprintf("%q: %s logs in as %q, but %s's administrator is %q", s.Name, dbVar, u.User.Username(), db.host, user))
	default:
		// The image reads POSTGRES_PASSWORD_FILE as $(< file): trailing
		// newlines go, as the binaries drop one.
		want := env("POSTGRES_PASSWORD")
		if f := env("POSTGRES_PASSWORD_FILE"); f != "" {
			b, _ := os.ReadFile(f)
			want = strings.TrimRight(string(b), "\n")
		}
		if pw, _ := u.User.Password(); pw != want {
			problems = append(problems, fmt.Sprintf("%q: %s has the wrong password for %s's administrator", s.Name, dbVar, db.host))
		}
	}
	return db, problems
}

// target checks a database URL against the database service it names, and
// returns it parsed and the database; the URL is nil when it does not parse
// or names no service.
func (d *deployment) target(s types.ServiceConfig, dbVar, dbURL string) (*url.URL, database, []string) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return nil, database{}, []string{fmt.Sprintf("%q: %s: %v", s.Name, dbVar, err)}
	}
	db := databaseOfURL(u)
	dbSvc, ok := d.project.Services[db.host]
	if !ok {
		return nil, db, []string{fmt.Sprintf("%q: %s points at %q, which is not a service", s.Name, dbVar, db.host)}
	}
	var problems []string
	// The postgres image's default database, from its documentation.
	if name := cmp.Or(getenvOf(dbSvc.Environment)("POSTGRES_DB"), adminOf(dbSvc)); db.name != name {
		problems = append(problems, fmt.Sprintf("%q: %s names database %q, but %s's POSTGRES_DB is %q", s.Name, dbVar, db.name, db.host, name))
	}
	if p := u.Port(); p != "" && p != "5432" {
		problems = append(problems, fmt.Sprintf("%q: %s uses port %s, but PostgreSQL in %s listens on 5432", s.Name, dbVar, p, db.host))
	}
	return u, db, problems
}

// adminOf is the bootstrap superuser of a service running the postgres
// image (its default, from the image's documentation, is postgres).
func adminOf(dbSvc types.ServiceConfig) string {
	return cmp.Or(getenvOf(dbSvc.Environment)("POSTGRES_USER"), "postgres")
}

// databaseOfURL is the database a parsed database URL names.
func databaseOfURL(u *url.URL) database {
	return database{host: u.Hostname(), name: strings.TrimPrefix(u.Path, "/")}
}

// servingDatabases maps each binary to the databases its serving services'
// main connections name, whether or not those are services: what a
// connection meant to reach that binary's database must reach.
func (d *deployment) servingDatabases() map[string]map[database]bool {
	out := map[string]map[database]bool{}
	for _, s := range d.servingGoServices() {
		name, _, _ := binaryOf(s)
		db, _ := d.databaseOf(s)
		if out[name] == nil {
			out[name] = map[database]bool{}
		}
		out[name][db] = true
	}
	return out
}

// wrongDatabase says what is wrong when a connection (in dbVar, to db) of
// a binary whose connection must reach the database of binary dbOf does
// not; "" when it does, or when no service runs dbOf (nothing to compare).
func wrongDatabase(s types.ServiceConfig, dbVar string, db database, dbOf string, serving map[string]map[database]bool) string {
	want := serving[dbOf]
	if len(want) == 0 || want[db] {
		return ""
	}
	var names []string
	for w := range want {
		names = append(names, w.String())
	}
	slices.Sort(names)
	name, _, _ := binaryOf(s)
	return fmt.Sprintf("%q: %s points at %s, but %s works on the database of %s, %s", s.Name, dbVar, db, name, dbOf, strings.Join(names, " or "))
}

// connectionsOf checks a runtime service's other connections (binary.more)
// and returns their URLs as the binary sees them, by variable. Each must
// log in as its own role to the database its dbOf names: the database the
// service's main connection uses (main), as the sender's replication
// connection does (its slot and publication are in Student's database,
// next to the outbox), or another binary's, as the lab's reading of Users'
// database does. serving is servingDatabases().
func (d *deployment) connectionsOf(s types.ServiceConfig, main database, serving map[string]map[database]bool) (map[string]*url.URL, []string) {
	_, b, ok := binaryOf(s)
	if !ok || isMigration(s) {
		return nil, nil
	}
	cfg, _ := config(s)
	var problems []string
	urls := map[string]*url.URL{}
	for _, c := range b.more {
		u, db, p := d.target(s, c.dbVar, cfg.value(s.Environment, c.dbVar))
		problems = append(problems, p...)
		if u == nil {
			continue
		}
		urls[c.dbVar] = u
		if c.dbOf == "" && db != main {
			problems = append(problems, fmt.Sprintf("%q: %s points at %s, but %s points at %s: both must reach the same database", s.Name, c.dbVar, db, b.dbVar, main))
		}
		if c.dbOf != "" {
			if p := wrongDatabase(s, c.dbVar, db, c.dbOf, serving); p != "" {
				problems = append(problems, p)
			}
		}
		if u.User.Username() != c.role {
			problems = append(problems, fmt.Sprintf("%q: %s logs in as %q, but this connection runs as its own role, %q", s.Name, c.dbVar, u.User.Username(), c.role))
		}
	}
	return urls, problems
}

// checkRoleSecrets: each service's database password comes from a Docker
// secret, and each container gets only the secrets it needs. A runtime
// service gets its own roles' passwords and no other (the sender has two
// roles: outbox_sender, and outbox_cdc for its replication connection;
// the lab one role, lab_reader, on two databases, with a password on
// each): a container that could read another role's password could use
// that role's grants. A migration gets the administrator's and those of
// the runtime roles it sets, and must give each role the very secret the
// role's service logs in with to that database, or the service is locked
// out after the first migration. A login the migration may leave without
// a password (migrations.Optional: lab_reader) needs one only when a
// service logs in with it.
func checkRoleSecrets(d *deployment) []string {
	var problems []string
	// binary and password variable → secret → a service logging in with
	// it. Keyed by the variable rather than the role: lab_reader logs in
	// to two databases, each with its own password.
	loginSecret := map[string]map[string]string{}
	running := map[string]bool{} // binaries some serving service runs
	for _, s := range d.goServices() {
		name, b, ok := binaryOf(s)
		if !ok || isMigration(s) {
			continue
		}
		running[name] = true
		cfg, _ := config(s)
		// Every connection's password comes from a secret, whether or
		// not the binary opens it with this environment: the sender's
		// replication connection is set up while it polls, so that
		// SENDER_SOURCE=cdc is all it takes to switch.
		var roles []string
		mine := map[string]bool{}
		for _, c := range b.connections() {
			if !slices.Contains(roles, c.role) {
				roles = append(roles, c.role)
			}
			if u, err := url.Parse(cfg.value(s.Environment, c.dbVar)); err == nil {
				if _, inURL := u.User.Password(); inURL && d.secretVars[s.Name][c.passwordVar+"_FILE"] == "" {
					problems = append(problems, fmt.Sprintf("%q: the password of %s is in %s: it must come from a secret, %s_FILE", s.Name, c.role, c.dbVar, c.passwordVar))
				}
			}
			if _, inline := s.Environment[c.passwordVar]; inline {
				problems = append(problems, fmt.Sprintf("%q: %s is set inline: the password of %s must come from a secret, %s_FILE", s.Name, c.passwordVar, c.role, c.passwordVar))
			}
			own := d.secretVars[s.Name][c.passwordVar+"_FILE"]
			if own == "" {
				problems = append(problems, fmt.Sprintf("%q: %s_FILE does not name a secret mounted in the container: %s logs in as %s with its password from one", s.Name, c.passwordVar, name, c.role))
				continue
			}
			key := name + " " + c.passwordVar
			if loginSecret[key] == nil {
				loginSecret[key] = map[string]string{}
			}
			loginSecret[key][own] = s.Name
			mine[own] = true
		}
		// Its other secrets are those its own variables name, such as
		// Users' API tokens: never another role's password.
		for _, secret := range d.secretVars[s.Name] {
			mine[secret] = true
		}
		for _, ref := range s.Secrets {
			if !mine[ref.Source] {
				problems = append(problems, fmt.Sprintf("%q: gets secret %q, which is not its own: each service gets only the passwords of its roles, %s", s.Name, ref.Source, strings.Join(roles, " and ")))
			}
		}
	}
	for _, s := range d.goServices() {
		_, b, ok := binaryOf(s)
		if !ok || !isMigration(s) {
			continue
		}
		for _, l := range b.logins {
			secret := d.secretVars[s.Name][l.passwordVar+"_FILE"]
			logsIn := loginSecret[l.binary+" "+l.passwordVar]
			switch {
			case secret == "" && migrations.Optional(l.role) && !running[l.binary]:
				// No service logs in as the role: it may stay without a password.
			case secret == "" && migrations.Optional(l.role):
				problems = append(problems, fmt.Sprintf("%q: %s_FILE does not name a secret mounted in the container: without it migrate leaves %s without a password, and %s cannot log in", s.Name, l.passwordVar, l.role, l.binary))
			case secret == "":
				problems = append(problems, fmt.Sprintf("%q: %s_FILE does not name a secret mounted in the container: migrate sets the password of %s from it", s.Name, l.passwordVar, l.role))
			case len(logsIn) > 0 && logsIn[secret] == "":
				problems = append(problems, fmt.Sprintf("%q: gives %s the password in secret %q, but %s logs in with %v (%s_FILE)", s.Name, l.role, secret, l.binary, slices.Sorted(maps.Keys(logsIn)), l.passwordVar))
			}
		}
	}
	// A migration, or a service not running our code (PostgreSQL), gets
	// only the secrets its own variables name: a password nothing in the
	// container reads is only one more place for it to leak from.
	for _, name := range slices.Sorted(maps.Keys(d.project.Services)) {
		s := d.project.Services[name]
		if _, _, ok := binaryOf(s); ok && !isMigration(s) {
			continue // checked above
		}
		named := map[string]bool{}
		for _, secret := range d.secretVars[name] {
			named[secret] = true
		}
		// A config file of ours mounted in the container may name one
		// (the NATS nodes include their passwords).
		for _, secret := range secretsIncludedBy(s) {
			named[secret] = true
		}
		for _, ref := range s.Secrets {
			if !named[ref.Source] {
				problems = append(problems, fmt.Sprintf("%q: gets secret %q, which none of its variables names", name, ref.Source))
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(d.project.Secrets)) {
		if cfg := d.project.Secrets[name]; cfg.File != "" {
			if b, err := os.ReadFile(cfg.File); err != nil || strings.TrimSpace(string(b)) == "" {
				problems = append(problems, fmt.Sprintf("secret %q: file %s is missing or empty", name, cfg.File))
			}
		}
	}
	return problems
}

func checkDatabases(d *deployment) []string {
	var problems []string
	// Every service running a binary must use the same database as the
	// others running it: a migration of another database than the one the
	// service reads would leave the service without its tables.
	byBinary := map[string]map[database][]string{}
	serving := d.servingDatabases()
	for _, s := range d.goServices() {
		name, b, ok := binaryOf(s)
		if !ok {
			continue
		}
		db, p := d.databaseOf(s)
		problems = append(problems, p...)
		_, p = d.connectionsOf(s, db, serving)
		problems = append(problems, p...)
		if byBinary[name] == nil {
			byBinary[name] = map[database][]string{}
		}
		byBinary[name][db] = append(byBinary[name][db], s.Name)
		// A binary without a database of its own (the sender, the lab)
		// works on another's: its main connection must reach that one.
		if !isMigration(s) && b.dbOf != "" {
			if p := wrongDatabase(s, b.dbVar, db, b.dbOf, serving); p != "" {
				problems = append(problems, p)
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(byBinary)) {
		if dbs := byBinary[name]; len(dbs) > 1 {
			problems = append(problems, fmt.Sprintf("the services running %s disagree on its database: %v", name, dbs))
		}
	}
	for db := range serving["student"] {
		if serving["users"][db] {
			problems = append(problems, fmt.Sprintf("Student and Users share database %s; each must own its own", db))
		}
	}
	return problems
}
