package deploy

// This file holds what the checks know of the four binaries (their
// listeners, the services they call, their database connections, their
// config loaders), the services the README's quick start relies on, and
// the check that the image builds what those services run.

import (
	"fmt"
	"maps"
	"os"
	"path"
	"slices"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/envconfig"
	"github.com/outboxref/outboxref/internal/service"
	"github.com/outboxref/outboxref/lab/faultlab"
	"github.com/outboxref/outboxref/outbox-sender/sender"
	"github.com/outboxref/outboxref/reconciler/reconcile"
	"github.com/outboxref/outboxref/services/student/studentsvc"
	"github.com/outboxref/outboxref/services/users/usersvc"
)

// requiredServices are the services the README's quick start relies on, with
// the command each must run. Checking the command too catches, say,
// users-migrate migrating Student's database.
var requiredServices = map[string][]string{
	"student-db":      nil,
	"users-db":        nil,
	"student-migrate": {"student", "migrate"},
	"users-migrate":   {"users", "migrate"},
	"student":         {"student"},
	"users":           {"users"},
	"outbox-sender":   {"outbox-sender"},
	"lab":             {"lab"},
	"reconciler":      {"reconciler", "serve"},
}

// binary is what the checks need to know about one of the four binaries.
type binary struct {
	pkg     string // the package the Dockerfile must build
	addrVar string // the variable holding its listen address
	// adminVar holds the address of its listener without authentication,
	// which may be published on the loopback interface only: the admin
	// listener (/healthz, /readyz, and /metrics where metrics says so);
	// for the sender it is its only listener, and for the lab it is the
	// page, whose controls break the system.
	adminVar string
	// hostsVar lists the host names adminVar's listener answers to,
	// besides loopback: a caller that names it otherwise gets 403.
	hostsVar string
	// metrics says adminVar's listener serves /metrics, which Prometheus
	// must scrape. The lab serves none: its page shows what it knows.
	metrics bool
	// traces says the binary exports spans over OTLP, configured by the
	// OTEL_ variables. The lab exports none: it is on the sender's path
	// as a teaching setup, not as a part of the system to trace.
	traces bool
	// internalVars hold the addresses of its listeners that only other
	// services call, over the compose network, and that are never
	// published: the lab's fault proxy, which the sender calls.
	internalVars []string
	// proxy is a listener that forwards to the service its upstream URL
	// names: the lab's fault proxy, to Users. A call to that service may
	// name the proxy instead (see call).
	proxy proxy
	// calls are the other services the binary calls, each by a URL.
	calls []call
	dbVar string // the variable holding its database URL
	// dbOf is the binary whose database dbVar must reach ("" for the
	// binary's own): the sender and the lab work on Student's.
	dbOf string
	// role is the database role the binary runs as, whose password comes
	// from passwordVar (or its _FILE form).
	role, passwordVar string
	// more are the binary's other connections: the sender's replication
	// connection, the lab's to Users' database. Each must reach the
	// database its dbOf names, and its password comes from a secret as
	// role's does.
	more []connection
	// migrateVar holds "migrate"'s administrator URL ("" for a binary
	// without migrations), and logins are the runtime roles that
	// "migrate" gives a password.
	migrateVar string
	logins     []login
	load       func(getenv func(string) string) (appConfig, error)
}

// listenVars are the variables holding a binary's listen addresses, its
// main listener first.
func (b binary) listenVars() []string {
	return slices.Compact(append([]string{b.addrVar, b.adminVar}, b.internalVars...))
}

// connections are all of a binary's database connections, its main one
// first.
func (b binary) connections() []connection {
	return append([]connection{{role: b.role, dbVar: b.dbVar, passwordVar: b.passwordVar, dbOf: b.dbOf}}, b.more...)
}

// connection is a database connection a binary opens as role, to the URL in
// dbVar with the password from passwordVar (or its _FILE form).
// replication says it streams changes from a replication slot, which
// needs the database to run with wal_level=logical.
type connection struct {
	role, dbVar, passwordVar string
	replication              bool
	// dbOf is the binary whose database the connection must reach; ""
	// for the database of the binary's main connection.
	dbOf string
}

// call is a URL, in urlVar, naming a listener of another binary: the
// listener addrVar sets. viaProxy says a binary's proxy to that binary
// (binary.proxy) may stand in between: the sender's SENDER_USERS_URL may
// name the lab's fault proxy.
type call struct {
	urlVar, binary, addrVar string
	viaProxy                bool
}

// proxy is a listener, set by addrVar, forwarding to the service the URL
// in upstreamVar names (one of the binary's calls).
type proxy struct{ addrVar, upstreamVar string }

// login is a runtime role "migrate" sets the password of: from
// passwordVar, which must be the secret the binary running as the role
// logs in with.
type login struct{ role, passwordVar, binary string }

// appConfig is the part of a binary's Config the checks compare across
// services.
type appConfig struct {
	names []string // every variable the binary reads
	// listens are its listen addresses, and urls the URLs of the
	// services it calls, by variable.
	listens, urls map[string]string
	dbURL         string
	// hosts are the names its admin listener answers to (hostsVar).
	hosts      []string
	migrateURL string  // "" for a binary without migrations
	logins     []login // the roles "migrate" gives a password (binary left "")
	// defaults are the loader's defaults, by variable: what the binary
	// uses for a variable the service leaves unset.
	defaults map[string]any
}

// binaries is keyed by binary name: `go build -o dir/ ./services/student`
// names the binary after the package folder, "student".
var binaries = map[string]binary{
	"student": {
		pkg: "./services/student", addrVar: "STUDENT_HTTP_ADDR", adminVar: "STUDENT_ADMIN_ADDR", hostsVar: "STUDENT_ADMIN_ALLOWED_HOSTS", dbVar: "STUDENT_DATABASE_URL",
		role: migrations.StudentApp, passwordVar: "STUDENT_DATABASE_PASSWORD", migrateVar: "STUDENT_MIGRATE_DATABASE_URL",
		metrics: true, traces: true,
		logins: []login{
			{migrations.StudentApp, "STUDENT_DATABASE_PASSWORD", "student"},
			{migrations.OutboxSender, "SENDER_DATABASE_PASSWORD", "outbox-sender"},
			{migrations.OutboxCDC, "SENDER_CDC_DATABASE_PASSWORD", "outbox-sender"},
			{migrations.LabReader, "LAB_STUDENT_DATABASE_PASSWORD", "lab"},
			{migrations.Reconciler, "RECONCILER_STUDENT_DATABASE_PASSWORD", "reconciler"},
		},
		load: func(getenv func(string) string) (appConfig, error) {
			c, r, err := studentsvc.LoadConfig(getenv)
			return appConfig{
				names: r.Names(), defaults: defaults(r),
				listens: map[string]string{"STUDENT_HTTP_ADDR": c.HTTPAddr, "STUDENT_ADMIN_ADDR": c.AdminAddr}, hosts: c.AdminAllowedHosts,
				dbURL: c.DatabaseURL, migrateURL: c.MigrateDatabaseURL, logins: loginsOf(c.Logins),
			}, err
		},
	},
	"users": {
		pkg: "./services/users", addrVar: "USERS_HTTP_ADDR", adminVar: "USERS_ADMIN_ADDR", hostsVar: "USERS_ADMIN_ALLOWED_HOSTS", dbVar: "USERS_DATABASE_URL",
		role: migrations.UsersApp, passwordVar: "USERS_DATABASE_PASSWORD", migrateVar: "USERS_MIGRATE_DATABASE_URL",
		metrics: true, traces: true,
		logins: []login{
			{migrations.UsersApp, "USERS_DATABASE_PASSWORD", "users"},
			{migrations.LabReader, "LAB_USERS_DATABASE_PASSWORD", "lab"},
			{migrations.Reconciler, "RECONCILER_USERS_DATABASE_PASSWORD", "reconciler"},
		},
		load: func(getenv func(string) string) (appConfig, error) {
			c, r, err := usersvc.LoadConfig(getenv)
			return appConfig{
				names: r.Names(), defaults: defaults(r),
				listens: map[string]string{"USERS_HTTP_ADDR": c.HTTPAddr, "USERS_ADMIN_ADDR": c.AdminAddr}, hosts: c.AdminAllowedHosts,
				dbURL: c.DatabaseURL, migrateURL: c.MigrateDatabaseURL, logins: loginsOf(c.Logins),
			}, err
		},
	},
	"outbox-sender": {
		pkg: "./outbox-sender", addrVar: "SENDER_ADMIN_ADDR", adminVar: "SENDER_ADMIN_ADDR", hostsVar: "SENDER_ADMIN_ALLOWED_HOSTS",
		metrics: true, traces: true,
		// Users, or the lab's fault proxy in front of it.
		calls: []call{{"SENDER_USERS_URL", "users", "USERS_HTTP_ADDR", true}},
		// The sender owns no database: it claims rows from Student's
		// outbox and records the answers on Student's rows.
		dbVar: "SENDER_DATABASE_URL", dbOf: "student",
		role: migrations.OutboxSender, passwordVar: "SENDER_DATABASE_PASSWORD",
		// SENDER_SOURCE=cdc streams the outbox's inserts from the WAL over a
		// replication connection. The compose file sets it up even while
		// the sender polls, so that the switch is one variable. The slot
		// and the publication are in Student's database, next to the outbox.
		more: []connection{{role: migrations.OutboxCDC, dbVar: "SENDER_CDC_DATABASE_URL", passwordVar: "SENDER_CDC_DATABASE_PASSWORD", replication: true}},
		load: func(getenv func(string) string) (appConfig, error) {
			c, r, err := sender.LoadConfig(getenv)
			return appConfig{
				names: r.Names(), defaults: defaults(r),
				listens: map[string]string{"SENDER_ADMIN_ADDR": c.AdminAddr}, hosts: c.AdminAllowedHosts,
				urls:  map[string]string{"SENDER_USERS_URL": c.UsersURL},
				dbURL: c.DatabaseURL,
			}, err
		},
	},
	// The fault lab: its page on LAB_HTTP_ADDR has no authentication, like
	// an admin port; its fault proxy on LAB_PROXY_ADDR forwards to Users.
	// It has no migrations: each database's migration gives its login,
	// lab_reader, a password.
	"lab": {
		pkg: "./lab", addrVar: "LAB_HTTP_ADDR", adminVar: "LAB_HTTP_ADDR", hostsVar: "LAB_ALLOWED_HOSTS",
		internalVars: []string{"LAB_PROXY_ADDR"},
		proxy:        proxy{addrVar: "LAB_PROXY_ADDR", upstreamVar: "LAB_USERS_URL"},
		calls: []call{
			{"LAB_USERS_URL", "users", "USERS_HTTP_ADDR", false},
			{"LAB_STUDENT_URL", "student", "STUDENT_HTTP_ADDR", false},
			{"LAB_STUDENT_ADMIN_URL", "student", "STUDENT_ADMIN_ADDR", false},
			{"LAB_USERS_ADMIN_URL", "users", "USERS_ADMIN_ADDR", false},
			{"LAB_SENDER_ADMIN_URL", "outbox-sender", "SENDER_ADMIN_ADDR", false},
		},
		// It reads both sides, as the same read-only role on each.
		dbVar: "LAB_STUDENT_DATABASE_URL", dbOf: "student",
		role: migrations.LabReader, passwordVar: "LAB_STUDENT_DATABASE_PASSWORD",
		more: []connection{{role: migrations.LabReader, dbVar: "LAB_USERS_DATABASE_URL", passwordVar: "LAB_USERS_DATABASE_PASSWORD", dbOf: "users"}},
		load: func(getenv func(string) string) (appConfig, error) {
			c, r, err := faultlab.LoadConfig(getenv)
			return appConfig{
				names: r.Names(), defaults: defaults(r),
				listens: map[string]string{"LAB_HTTP_ADDR": c.HTTPAddr, "LAB_PROXY_ADDR": c.ProxyAddr}, hosts: c.AllowedHosts,
				urls: map[string]string{
					"LAB_USERS_URL": c.UsersURL, "LAB_STUDENT_URL": c.StudentURL, "LAB_STUDENT_ADMIN_URL": c.StudentAdminURL,
					"LAB_USERS_ADMIN_URL": c.UsersAdminURL, "LAB_SENDER_ADMIN_URL": c.SenderAdminURL,
				},
				dbURL: c.StudentDatabaseURL,
			}, err
		},
	},
	// The reconciler: its admin port serves /metrics and the health
	// checks without a token, and /report with one (RECONCILER_ADMIN_TOKENS).
	// It reads both databases as the read-only role reconciler, which
	// each database's migration gives a password, and calls no service.
	"reconciler": {
		pkg: "./reconciler", addrVar: "RECONCILER_ADMIN_ADDR", adminVar: "RECONCILER_ADMIN_ADDR", hostsVar: "RECONCILER_ADMIN_ALLOWED_HOSTS",
		metrics: true,
		dbVar:   "RECONCILER_STUDENT_DATABASE_URL", dbOf: "student",
		role: migrations.Reconciler, passwordVar: "RECONCILER_STUDENT_DATABASE_PASSWORD",
		more: []connection{{role: migrations.Reconciler, dbVar: "RECONCILER_USERS_DATABASE_URL", passwordVar: "RECONCILER_USERS_DATABASE_PASSWORD", dbOf: "users"}},
		load: func(getenv func(string) string) (appConfig, error) {
			c, r, err := reconcile.LoadConfig(getenv)
			return appConfig{
				names: r.Names(), defaults: defaults(r),
				listens: map[string]string{"RECONCILER_ADMIN_ADDR": c.AdminAddr}, hosts: c.AdminAllowedHosts,
				dbURL: c.StudentDatabaseURL,
			}, err
		},
	},
}

// loginsOf reads a migration's logins as the checks list them.
func loginsOf(ls []service.Login) []login {
	var out []login
	for _, l := range ls {
		out = append(out, login{role: l.Role, passwordVar: l.Variable})
	}
	return out
}

// defaults maps each variable a loader read to its default.
func defaults(r *envconfig.Reader) map[string]any {
	m := map[string]any{}
	for _, v := range r.Vars() {
		m[v.Name] = v.Default
	}
	return m
}

// value is what a service's binary sees in a string variable: the
// service's setting, or the loader's default when it sets none.
func (c appConfig) value(env types.MappingWithEquals, name string) string {
	if v := getenvOf(env)(name); v != "" {
		return v
	}
	def, _ := c.defaults[name].(string)
	return def
}

// call is b's call whose URL is in urlVar.
func (b binary) call(urlVar string) call {
	i := slices.IndexFunc(b.calls, func(c call) bool { return c.urlVar == urlVar })
	return b.calls[i]
}

// proxiesTo says whether b's proxy forwards to a service running binary
// name, by b's own table: the lab's fault proxy forwards to Users.
func (b binary) proxiesTo(name string) bool {
	if b.proxy.addrVar == "" {
		return false
	}
	for _, c := range b.calls {
		if c.urlVar == b.proxy.upstreamVar && c.binary == name {
			return true
		}
	}
	return false
}

// TestComposeLoginTables keeps the tables the checks use in step with the
// code: the roles each binary's "migrate" gives a password are those its
// loader lists (Config.Logins), and each is a connection, with the same
// role and password variable, of the binary that logs in with it.
func TestComposeLoginTables(t *testing.T) {
	t.Parallel()
	for _, name := range slices.Sorted(maps.Keys(binaries)) {
		b := binaries[name]
		cfg, _ := b.load(func(string) string { return "" })
		var want []login
		for _, l := range b.logins {
			want = append(want, login{role: l.role, passwordVar: l.passwordVar})
			user, ok := binaries[l.binary]
			require.True(t, ok, "%s: login %v names no binary", name, l)
			require.True(t, slices.ContainsFunc(user.connections(), func(c connection) bool {
				return c.role == l.role && c.passwordVar == l.passwordVar
			}), "%s: login %v is no connection of %s", name, l, l.binary)
		}
		require.Equal(t, want, cfg.logins, "%s: the logins its migrate sets", name)
		require.Equal(t, b.migrateVar != "", cfg.migrateURL != "", "%s: migrateVar and its loader disagree", name)
		for _, v := range b.listenVars() {
			require.Contains(t, cfg.listens, v, "%s: listener %s", name, v)
		}
		for _, c := range b.calls {
			require.Contains(t, cfg.urls, c.urlVar, "%s: call %s", name, c.urlVar)
			require.Contains(t, binaries[c.binary].listenVars(), c.addrVar, "%s: call %s", name, c.urlVar)
		}
		if b.proxy.addrVar != "" {
			require.Contains(t, b.listenVars(), b.proxy.addrVar, name)
			require.True(t, slices.ContainsFunc(b.calls, func(c call) bool { return c.urlVar == b.proxy.upstreamVar }), name)
		}
		for _, c := range b.connections() {
			require.Contains(t, cfg.names, c.dbVar, "%s", name)
			require.Contains(t, cfg.names, c.passwordVar, "%s", name)
		}
	}
}

func checkRequiredServices(d *deployment) []string {
	var problems []string
	for _, name := range slices.Sorted(maps.Keys(requiredServices)) {
		s, ok := d.project.Services[name]
		if !ok {
			problems = append(problems, fmt.Sprintf("service %q is missing", name))
			continue
		}
		want := requiredServices[name]
		if want == nil {
			continue
		}
		got := slices.Clone(s.Command)
		if len(got) > 0 {
			got[0] = path.Base(got[0])
		}
		if !slices.Equal(got, want) {
			problems = append(problems, fmt.Sprintf("service %q runs %q, want %q", name, s.Command, want))
		}
	}
	return problems
}

func checkBuild(d *deployment) []string {
	var problems []string
	for _, s := range d.goServices() {
		if s.Build == nil {
			problems = append(problems, fmt.Sprintf("%q: has no build section, so it would not run this repository's code", s.Name))
			continue
		}
		if fi, err := os.Stat(s.Build.Context); err != nil || !fi.IsDir() {
			problems = append(problems, fmt.Sprintf("%q: build context %s is not a folder", s.Name, s.Build.Context))
			continue
		}
		file := dockerfilePath(s.Build)
		if err := d.errs[file]; err != nil {
			problems = append(problems, fmt.Sprintf("%q: Dockerfile %s: %v", s.Name, file, err))
			continue
		}
		img := d.images[file]
		if img.entrypoint {
			problems = append(problems, fmt.Sprintf("%q: the Dockerfile's final stage has an ENTRYPOINT, so command %q would be its arguments rather than the binary to run", s.Name, s.Command))
		}
		if len(s.Command) == 0 {
			problems = append(problems, fmt.Sprintf("%q: has no command; the image does not choose a binary", s.Name))
			continue
		}
		cmd := s.Command[0]
		pkg, ok := img.lookup(cmd)
		if !ok {
			problems = append(problems, fmt.Sprintf("%q: command %q is not a binary the Dockerfile builds and copies into the final image (it has %v)", s.Name, cmd, img.installedPaths()))
			continue
		}
		if name, b, ok := binaryOf(s); !ok || path.Clean(b.pkg) != pkg {
			problems = append(problems, fmt.Sprintf("%q: command %q runs the binary built from %s, which is not the %s binary", s.Name, cmd, pkg, name))
		}
	}
	return problems
}
