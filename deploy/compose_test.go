package deploy

// This file checks docker-compose.yml and the Dockerfile against the code,
// without Docker: the compose file is read by the same library Docker Compose
// uses, and every Go service's environment is fed to that binary's own
// LoadConfig. A misspelt variable, a port that nothing listens on or a
// migration that does not run first would otherwise only show up when
// somebody runs `docker compose up`.
//
// It carries no build tag on purpose, so that plain `go test ./...` runs it.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/envconfig"
	"github.com/outboxref/outboxref/internal/service"
	"github.com/outboxref/outboxref/lab/faultlab"
	"github.com/outboxref/outboxref/outbox-sender/sender"
	"github.com/outboxref/outboxref/services/student/studentsvc"
	"github.com/outboxref/outboxref/services/users/usersvc"
)

const (
	composeFile = "../docker-compose.yml" // relative to this package's folder, where go test runs
	repoRoot    = ".."
	// The project name is fixed so the result does not depend on the folder
	// the repository was cloned into or on COMPOSE_PROJECT_NAME.
	composeProject = "outboxref"
	// Bounds the loader (the checks themselves are plain computation); it
	// takes milliseconds, so hitting this means something hangs.
	composeTimeout = 30 * time.Second
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
	migrateURL    string  // "" for a binary without migrations
	logins        []login // the roles "migrate" gives a password (binary left "")
	// defaults are the loader's defaults, by variable: what the binary
	// uses for a variable the service leaves unset.
	defaults map[string]any
}

// binaries is keyed by binary name: `go build -o dir/ ./services/student`
// names the binary after the package folder, "student".
var binaries = map[string]binary{
	"student": {
		pkg: "./services/student", addrVar: "STUDENT_HTTP_ADDR", adminVar: "STUDENT_ADMIN_ADDR", dbVar: "STUDENT_DATABASE_URL",
		role: migrations.StudentApp, passwordVar: "STUDENT_DATABASE_PASSWORD", migrateVar: "STUDENT_MIGRATE_DATABASE_URL",
		metrics: true, traces: true,
		logins: []login{
			{migrations.StudentApp, "STUDENT_DATABASE_PASSWORD", "student"},
			{migrations.OutboxSender, "SENDER_DATABASE_PASSWORD", "outbox-sender"},
			{migrations.OutboxCDC, "SENDER_CDC_DATABASE_PASSWORD", "outbox-sender"},
			{migrations.LabReader, "LAB_STUDENT_DATABASE_PASSWORD", "lab"},
		},
		load: func(getenv func(string) string) (appConfig, error) {
			c, r, err := studentsvc.LoadConfig(getenv)
			return appConfig{
				names: r.Names(), defaults: defaults(r),
				listens: map[string]string{"STUDENT_HTTP_ADDR": c.HTTPAddr, "STUDENT_ADMIN_ADDR": c.AdminAddr},
				dbURL:   c.DatabaseURL, migrateURL: c.MigrateDatabaseURL, logins: loginsOf(c.Logins),
			}, err
		},
	},
	"users": {
		pkg: "./services/users", addrVar: "USERS_HTTP_ADDR", adminVar: "USERS_ADMIN_ADDR", dbVar: "USERS_DATABASE_URL",
		role: migrations.UsersApp, passwordVar: "USERS_DATABASE_PASSWORD", migrateVar: "USERS_MIGRATE_DATABASE_URL",
		metrics: true, traces: true,
		logins: []login{
			{migrations.UsersApp, "USERS_DATABASE_PASSWORD", "users"},
			{migrations.LabReader, "LAB_USERS_DATABASE_PASSWORD", "lab"},
		},
		load: func(getenv func(string) string) (appConfig, error) {
			c, r, err := usersvc.LoadConfig(getenv)
			return appConfig{
				names: r.Names(), defaults: defaults(r),
				listens: map[string]string{"USERS_HTTP_ADDR": c.HTTPAddr, "USERS_ADMIN_ADDR": c.AdminAddr},
				dbURL:   c.DatabaseURL, migrateURL: c.MigrateDatabaseURL, logins: loginsOf(c.Logins),
			}, err
		},
	},
	"outbox-sender": {
		pkg: "./outbox-sender", addrVar: "SENDER_ADMIN_ADDR", adminVar: "SENDER_ADMIN_ADDR",
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
				listens: map[string]string{"SENDER_ADMIN_ADDR": c.AdminAddr},
				urls:    map[string]string{"SENDER_USERS_URL": c.UsersURL},
				dbURL:   c.DatabaseURL,
			}, err
		},
	},
	// The fault lab: its page on LAB_HTTP_ADDR has no authentication, like
	// an admin port; its fault proxy on LAB_PROXY_ADDR forwards to Users.
	// It has no migrations: each database's migration gives its login,
	// lab_reader, a password.
	"lab": {
		pkg: "./lab", addrVar: "LAB_HTTP_ADDR", adminVar: "LAB_HTTP_ADDR",
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
				listens: map[string]string{"LAB_HTTP_ADDR": c.HTTPAddr, "LAB_PROXY_ADDR": c.ProxyAddr},
				urls: map[string]string{
					"LAB_USERS_URL": c.UsersURL, "LAB_STUDENT_URL": c.StudentURL, "LAB_STUDENT_ADMIN_URL": c.StudentAdminURL,
					"LAB_USERS_ADMIN_URL": c.UsersAdminURL, "LAB_SENDER_ADMIN_URL": c.SenderAdminURL,
				},
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

// defaultPath is the PATH of distroless images, and the one Docker gives an
// image that sets none; a bare command name is looked up there.
var defaultPath = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// check is one rule; it returns a line per problem found.
type check struct {
	name string
	run  func(d *deployment) []string
}

var checks = []check{
	{"required services", checkRequiredServices},
	{"image builds the binaries", checkBuild},
	{"environment", checkEnvironment},
	{"ports", checkPorts},
	{"database URLs", checkDatabases},
	{"database roles and secrets", checkRoleSecrets},
	{"service URLs", checkServiceURLs},
	{"start order", checkStartOrder},
	{"healthchecks", checkHealthchecks},
	{"depends_on conditions", checkDependsOnConditions},
	{"inbox outlasts sender retries", checkRetention},
	{"users answers before the sender gives up", checkWaitsNest},
	{"callers authenticate", checkCallers},
	{"observability profile", checkObservabilityProfile},
	{"traces reach the collector", checkTracing},
	{"prometheus scrapes the admin ports", checkScrapes},
	{"grafana is provisioned", checkGrafana},
	{"sender source follows the host", checkSenderSource},
	{"database keeps WAL for a slot, within a bound", checkLogicalDecoding},
}

// hostEnvironments are the host environments the compose file is checked
// under: none, as plain `docker compose up` sees it, and the one the header
// of the file gives for the sender's cdc source. Each must be a deployment
// that passes every check.
var hostEnvironments = map[string]types.Mapping{
	"plain":             {},
	"SENDER_SOURCE=cdc": {"SENDER_SOURCE": "cdc"},
}

func TestCompose(t *testing.T) {
	t.Parallel()
	content, err := os.ReadFile(composeFile)
	require.NoError(t, err)
	for name, env := range hostEnvironments {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d := loadDeployment(t, composeFile, content, maps.Clone(env))
			for _, c := range checks {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					problems := c.run(d)
					require.Empty(t, problems, "docker-compose.yml with host environment %v:\n  %s", env, strings.Join(problems, "\n  "))
				})
			}
		})
	}
}

// TestComposeCheckerCatchesMistakes feeds the checks a compose file with one
// or more mistakes per check. A check that reports nothing here would pass
// any file, and TestCompose would prove nothing.
func TestComposeCheckerCatchesMistakes(t *testing.T) {
	t.Parallel()
	const broken = `
services:
  student-db:
    image: postgres:15
    command: ["postgres", "-c", "max_slot_wal_keep_size=-1"]
    environment:
      POSTGRES_DB: student
      POSTGRES_PASSWORD: pw
  student-migrate:
    build: .
    command: ["student", "migrate"]
    environment:
      STUDENT_MIGRATE_DATABASE_URL: postgres://postgres:wrong@student-db:5432/students
      STUDENT_DATABASE_PASSWORD_FILE: /run/secrets/student_app_password
      SENDER_DATABASE_PASSWORD_FILE: /run/secrets/outbox_sender_password
      LAB_STUDENT_DATABASE_PASSWORD_FILE: /run/secrets/lab_student_db_password
    secrets: [student_app_password, outbox_sender_password]
    depends_on: [student-db]
  student:
    build: .
    command: ["student"]
    environment:
      STUDENT_DATABASE_URL: postgres://postgres:wrong@student-db:5432/student
      STUDENT_HTTP_ADDR: ":8080"
      STUDENT_HTTP_PORT: "8080"
      STUDENT_IDEMPOTENCY_WAIT: forever
      STUDENT_ADMIN_ADDR: ":9190"
      OTEL_EXPORTER_OTLP_ENDPIONT: http://jaeger:4318
      OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: http://jaeger:4317/v1/traces
      OTEL_SERVICE_NAME: student
    secrets: [outbox_sender_password]
    ports: ["8080:9090"]
    depends_on: [student-migrate]
    healthcheck:
      test: ["CMD", "users", "healthcheck"]
  users:
    build: .
    command: ["users"]
    environment:
      USERS_DATABASE_URL: postgres://postgres:pw@users-db:5432/users
      USERS_HTTP_ADDR: ":9091"
      USERS_INBOX_RETENTION: 24h
      USERS_IDEMPOTENCY_WAIT: 3s
      USERS_API_TOKENS: outbox-sender:users-knows-this-token-0123
    ports: ["9091:9091", "8091:8091"]
    healthcheck:
      test: curl -f http://localhost:9091/readyz
  outbox-sender:
    build: .
    command: ["outbox-sender"]
    environment:
      SENDER_DATABASE_URL: postgres://postgres@users-db:5432/users
      SENDER_DATABASE_PASSWORD_FILE: /run/secrets/other_sender_password
      SENDER_CDC_DATABASE_URL: postgres://outbox_cdc@student-db:5432/student
      SENDER_USERS_URL: http://users:8081
      SENDER_MAX_AGE: 48h
      SENDER_REQUEST_TIMEOUT: 2s
      SENDER_USERS_TOKEN: the-sender-has-another-token-0123
      OTEL_EXPORTER_OTLP_ENDPOINT: http://tempo:4318
      OTEL_SERVICE_NAME: student
    secrets: [other_sender_password]
    depends_on:
      users:
        condition: service_started
  outbox-sender-2:
    build: .
    command: ["outbox-sender"]
    environment:
      SENDER_DATABASE_URL: postgres://postgres:pw@student-db:5432/student
      SENDER_SOURCE: cdc
      SENDER_CDC_DATABASE_URL: postgres://outbox_sender:pw@student-db:5432/student
      SENDER_USERS_URL: http://lab:8084
  users-2:
    build: .
    command: ["users"]
    depends_on: [grafana]
  users-migrate-2:
    build: .
    command: ["users", "migrate"]
    profiles: [debug]
    environment:
      USERS_API_TOKENS: outbox-sender:users-knows-this-token-0123
      LAB_USERS_DATABASE_PASSWORD_FILE: /run/secrets/lab_student_db_password
    secrets: [outbox_cdc_password, lab_student_db_password]
  lab:
    build: .
    command: ["lab"]
    environment:
      LAB_HTTP_ADDR: ":8084"
      LAB_PROXY_ADDR: ":8083"
      LAB_USERS_URL: http://student:8080
      LAB_STUDENT_URL: http://student:8080
      LAB_STUDENT_ADMIN_URL: http://student:8080
      LAB_USERS_ADMIN_URL: http://users:8091
      LAB_SENDER_ADMIN_URL: http://outbox-sender:8082
      LAB_STUDENT_DATABASE_URL: postgres://lab_reader@student-db:5432/student
      LAB_STUDENT_DATABASE_PASSWORD_FILE: /run/secrets/lab_student_db_password
      LAB_USERS_DATABASE_URL: postgres://lab_reader@users-db:5432/users
      LAB_USERS_DATABASE_PASSWORD_FILE: /run/secrets/lab_users_db_password
      OTEL_SERVICE_NAME: lab
    secrets: [lab_student_db_password, lab_users_db_password]
    ports: ["8084:8084", "8083:8083"]
    depends_on:
      student-migrate:
        condition: service_completed_successfully
    healthcheck:
      test: ["CMD", "lab", "healthcheck"]
  lab-2:
    build: .
    command: ["lab"]
    environment:
      LAB_USERS_URL: http://users:9091
      LAB_USERS_ADMIN_URL: http://users-2:8091
      LAB_USERS_DATABASE_URL: postgres://lab_reader@student-db:5432/student
  worker:
    build: .
    command: ["outbox-worker"]
  jaeger:
    image: jaegertracing/all-in-one:1.65.0
    environment:
      COLLECTOR_OTLP_ENABLED: "false"
    ports: ["16686:16686"]
  prometheus:
    image: prom/prometheus:v3.1.0
    profiles: [observability]
    volumes:
      - ./deploy/observability/prometheus.yml:/etc/prometheus/prometheus.yml:ro
  grafana:
    image: grafana/grafana:11.4.0
    profiles: [observability]
    environment:
      GF_AUTH_ANONYMOUS_ENABLED: "true"
      GF_AUTH_ANONYMOUS_ORG_ROLE: Admin
    volumes:
      - ./deploy/observability/grafana/provisioning:/etc/grafana/provisioning:ro
secrets:
  student_app_password:
    file: deploy/secrets/student_app_password.txt
  outbox_sender_password:
    file: deploy/secrets/outbox_sender_password.txt
  other_sender_password:
    file: deploy/secrets/users_app_password.txt
  outbox_cdc_password:
    file: deploy/secrets/outbox_cdc_password.txt
  lost_password:
    file: deploy/secrets/no-such-file.txt
  lab_student_db_password:
    file: deploy/secrets/lab_student_db_password.txt
  lab_users_db_password:
    file: deploy/secrets/lab_users_db_password.txt
`
	d := loadDeployment(t, filepath.Join(repoRoot, "broken-compose.yml"), []byte(broken), types.Mapping{})
	want := map[string][]string{
		"required services": {
			`"users-db" is missing`,
			`"users-migrate" is missing`,
		},
		"image builds the binaries": {
			`"worker": command "outbox-worker" is not a binary the Dockerfile builds`,
		},
		"environment": {
			`"student": STUDENT_HTTP_PORT is not read by student`,
			`"student": student rejects this environment`,
			`"student": OTEL_EXPORTER_OTLP_ENDPIONT is not a variable the OpenTelemetry SDK reads`,
			`"lab": OTEL_SERVICE_NAME does nothing: lab exports no traces`,
		},
		"ports": {
			`"student": publishes container port 9090, but nothing listens there: STUDENT_HTTP_ADDR=":8080" listens on 8080, STUDENT_ADMIN_ADDR=":9190" listens on 9190`,
			`"users": container port 9091 is not in the Dockerfile's EXPOSE`,
			`"users": publishes its admin port 8091 (USERS_ADMIN_ADDR) on every interface`,
			`"student": listens on 9190 (STUDENT_ADMIN_ADDR), which is not in the Dockerfile's EXPOSE`,
			`"lab": publishes its admin port 8084 (LAB_HTTP_ADDR) on every interface`,
			`"lab": publishes port 8083 (LAB_PROXY_ADDR), which only other services call, over the compose network`,
			`"lab-2": LAB_HTTP_ADDR="127.0.0.1:8084" listens on loopback inside its container, where nothing else can reach it: listen on ":8084"`,
			`"lab-2": LAB_PROXY_ADDR="127.0.0.1:8083" listens on loopback inside its container`,
		},
		"database URLs": {
			`"student-migrate": STUDENT_MIGRATE_DATABASE_URL names database "students", but student-db's POSTGRES_DB is "student"`,
			`"student-migrate": STUDENT_MIGRATE_DATABASE_URL has the wrong password for student-db's administrator`,
			`"student": STUDENT_DATABASE_URL logs in as "postgres", but student runs as its own role, "student_app"`,
			`"users": USERS_DATABASE_URL points at "users-db", which is not a service`,
			`"outbox-sender": SENDER_DATABASE_URL points at users-db/users, but outbox-sender works on the database of student, student-db/student`,
			`"lab-2": LAB_USERS_DATABASE_URL points at student-db/student, but lab works on the database of users, localhost/users or users-db/users`,
			`"outbox-sender": SENDER_CDC_DATABASE_URL points at student-db/student, but SENDER_DATABASE_URL points at users-db/users: both must reach the same database`,
			`"outbox-sender-2": SENDER_CDC_DATABASE_URL logs in as "outbox_sender", but this connection runs as its own role, "outbox_cdc"`,
		},
		"database roles and secrets": {
			`"student": the password of student_app is in STUDENT_DATABASE_URL: it must come from a secret, STUDENT_DATABASE_PASSWORD_FILE`,
			`"student": gets secret "outbox_sender_password", which is not its own`,
			`"student-migrate": gives outbox_sender the password in secret "outbox_sender_password", but outbox-sender logs in with [other_sender_password]`,
			`"outbox-sender-2": SENDER_DATABASE_PASSWORD_FILE does not name a secret mounted in the container`,
			`secret "lost_password": file `,
			`"student-migrate": SENDER_CDC_DATABASE_PASSWORD_FILE does not name a secret mounted in the container: migrate sets the password of outbox_cdc`,
			`"outbox-sender": SENDER_CDC_DATABASE_PASSWORD_FILE does not name a secret mounted in the container`,
			`"outbox-sender-2": the password of outbox_cdc is in SENDER_CDC_DATABASE_URL: it must come from a secret, SENDER_CDC_DATABASE_PASSWORD_FILE`,
			`"users-migrate-2": gets secret "outbox_cdc_password", which none of its variables names`,
			`"student-migrate": LAB_STUDENT_DATABASE_PASSWORD_FILE does not name a secret mounted in the container: without it migrate leaves lab_reader without a password, and lab cannot log in`,
			`"users-migrate-2": gives lab_reader the password in secret "lab_student_db_password", but lab logs in with [lab_users_db_password] (LAB_USERS_DATABASE_PASSWORD_FILE)`,
		},
		"service URLs": {
			`"outbox-sender": SENDER_USERS_URL=http://users:8081 uses port 8081, but "users" listens on 9091 (USERS_HTTP_ADDR)`,
			`"outbox-sender-2": SENDER_USERS_URL=http://lab:8084 uses port 8084, where "lab" serves LAB_HTTP_ADDR, not LAB_PROXY_ADDR (8083)`,
			`"lab": LAB_USERS_URL=http://student:8080: "student" is not a service running users`,
			`"lab": LAB_STUDENT_ADMIN_URL=http://student:8080 uses port 8080, where "student" serves STUDENT_HTTP_ADDR, not STUDENT_ADMIN_ADDR (9190)`,
			`"lab": no service calls its proxy (LAB_PROXY_ADDR)`,
			`"lab-2": its URLs name different services running users, map[users:[LAB_USERS_URL] users-2:[LAB_USERS_ADMIN_URL]]`,
		},
		"start order": {
			`"student-db": has no healthcheck`,
			`"student-migrate": must depend on "student-db" with condition service_healthy, not service_started`,
			`"student": must depend on a migration of student-db/student with condition service_completed_successfully`,
			`"outbox-sender": must depend on a migration of users-db/users with condition service_completed_successfully`,
			`"lab": must depend on a migration of users-db/users with condition service_completed_successfully`,
		},
		"healthchecks": {
			`"student": healthcheck runs "users", the binary built from services/users, but the service runs the one built from services/student`,
			`"users": healthcheck test is CMD-SHELL`,
			`"outbox-sender": has no healthcheck`,
		},
		"depends_on conditions": {
			`"student": must depend on "student-migrate" with condition service_completed_successfully, not service_started`,
			`"outbox-sender": must depend on "users" with condition service_healthy, not service_started`,
		},
		"inbox outlasts sender retries": {
			`USERS_INBOX_RETENTION=24h0m0s ("users") must be longer than SENDER_MAX_AGE=48h0m0s ("outbox-sender")`,
		},
		"users answers before the sender gives up": {
			`USERS_IDEMPOTENCY_WAIT=3s ("users") must be shorter than SENDER_REQUEST_TIMEOUT=2s ("outbox-sender")`,
			`USERS_DATABASE_TIMEOUT=4s ("users") must be shorter than SENDER_REQUEST_TIMEOUT=2s ("outbox-sender")`,
		},
		"callers authenticate": {
			`"outbox-sender": SENDER_USERS_TOKEN is not among the tokens "users" accepts (USERS_API_TOKENS)`,
			`"outbox-sender-2": SENDER_USERS_TOKEN is not set`,
			`"users-2": USERS_API_TOKENS is not set: Users refuses to serve without callers`,
			`"users-migrate-2": USERS_API_TOKENS is set, but a migration serves no one`,
		},
		"observability profile": {
			`"jaeger": has profiles [], want only [observability]`,
			`"jaeger": publishes port 16686 on every interface`,
			`"users-migrate-2": has profiles ["debug"], so plain ` + "`docker compose up`" + ` would leave it out`,
			`"users-2": depends on "grafana", which runs only with profile ["observability"]`,
		},
		"traces reach the collector": {
			`"student": OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://jaeger:4317/v1/traces: port 4317 is OTLP/gRPC`,
			`"jaeger": COLLECTOR_OTLP_ENABLED is false`,
			`"outbox-sender": OTEL_EXPORTER_OTLP_ENDPOINT=http://tempo:4318: "tempo" is not a service running Jaeger`,
			`"users": exports no traces`,
			`"student": OTEL_SERVICE_NAME="student" is also the name of outbox-sender's spans`,
		},
		"prometheus scrapes the admin ports": {
			`"prometheus": does not scrape student:9190, the admin listener there (STUDENT_ADMIN_ADDR=":9190")`,
			`"prometheus": does not scrape outbox-sender-2:8082`,
			`"prometheus": job "student" scrapes student:8090, which is no Go service's admin listener`,
		},
		"grafana is provisioned": {
			`"grafana": GF_AUTH_ANONYMOUS_ORG_ROLE=Admin lets anyone change the dashboard`,
			`"grafana": dashboard provider "outboxref" (outboxref.yml) loads /var/lib/grafana/dashboards, where nothing is mounted`,
		},
		"sender source follows the host": {
			`"outbox-sender": SENDER_SOURCE is not set, so the host's SENDER_SOURCE cannot switch it`,
			`"outbox-sender-2": SENDER_SOURCE is "cdc" when the host sets none, want "poll"`,
		},
		"database keeps WAL for a slot, within a bound": {
			`"student-db": wal_level is replica (the default), but "outbox-sender" streams from it (SENDER_CDC_DATABASE_URL)`,
			`"student-db": max_slot_wal_keep_size is -1, no bound`,
		},
	}
	require.Len(t, want, len(checks), "every check needs a mistake to catch")
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got := strings.Join(c.run(d), "\n")
			require.Contains(t, want, c.name)
			for _, w := range want[c.name] {
				require.Contains(t, got, w)
			}
		})
	}
	// The real file with a SENDER_SOURCE the sender does not know: the
	// host's value must reach the sender and be refused there, not be
	// replaced by the default on the way.
	t.Run("unknown SENDER_SOURCE on the host", func(t *testing.T) {
		t.Parallel()
		content, err := os.ReadFile(composeFile)
		require.NoError(t, err)
		d := loadDeployment(t, composeFile, content, types.Mapping{"SENDER_SOURCE": "stream"})
		got := strings.Join(checkEnvironment(d), "\n")
		require.Contains(t, got, `"outbox-sender": outbox-sender rejects this environment`)
		require.Contains(t, got, `SENDER_SOURCE="stream"`)
	})
	// Prometheus scraping the lab: its page serves no /metrics, and its
	// proxy is not an admin listener at all. Each is reported as such,
	// and the lab is not a target Prometheus must scrape.
	t.Run("a scrape of the lab", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		promFile := filepath.Join(dir, "prometheus.yml")
		require.NoError(t, os.WriteFile(promFile, []byte(`scrape_configs:
  - job_name: lab
    static_configs:
      - targets: ["lab:8084", "lab:8083"]
`), 0o600))
		d := loadDeployment(t, filepath.Join(repoRoot, "scrape-compose.yml"), []byte(`
services:
  lab:
    build: .
    command: ["lab"]
  prometheus:
    image: prom/prometheus:v3.1.0
    volumes:
      - `+promFile+`:/etc/prometheus/prometheus.yml:ro
`), types.Mapping{})
		got := strings.Join(checkScrapes(d), "\n")
		require.Contains(t, got, `"prometheus": job "lab" scrapes lab:8084 (LAB_HTTP_ADDR="127.0.0.1:8084": lab serves no /metrics)`)
		require.Contains(t, got, `"prometheus": job "lab" scrapes lab:8083 (LAB_PROXY_ADDR="127.0.0.1:8083", not its admin listener)`)
		require.NotContains(t, got, "does not scrape")
	})
	// The header of docker-compose.yml says a deployment without the lab
	// points the sender at Users itself. That file passes every check:
	// the lab is optional to the migrations (migrations.Optional), and the
	// sender may name Users directly.
	t.Run("the real file without the lab", func(t *testing.T) {
		t.Parallel()
		content, err := os.ReadFile(composeFile)
		require.NoError(t, err)
		d := loadDeployment(t, composeFile, withoutLab(t, content), types.Mapping{})
		for _, c := range checks {
			problems := c.run(d)
			if c.name == "required services" {
				// This repository's file must run the lab (requiredServices).
				require.Equal(t, []string{`service "lab" is missing`}, problems)
				continue
			}
			require.Empty(t, problems, "%s", c.name)
		}
	})
}

// withoutLab rewrites a compose file as a deployment without the lab
// would have it: no lab service and no lab_reader secrets, and the sender
// calling Users directly.
func withoutLab(t *testing.T, content []byte) []byte {
	t.Helper()
	var doc map[string]any
	require.NoError(t, yaml.Unmarshal(content, &doc))
	services, _ := doc["services"].(map[string]any)
	require.Contains(t, services, "lab")
	delete(services, "lab")
	for name, svc := range services {
		svc, _ := svc.(map[string]any)
		if env, ok := svc["environment"].(map[string]any); ok {
			for v := range env {
				if strings.HasPrefix(v, "LAB_") {
					delete(env, v)
				}
			}
			if name == "outbox-sender" {
				env["SENDER_USERS_URL"] = "http://users:8081"
			}
		}
		if deps, ok := svc["depends_on"].(map[string]any); ok {
			delete(deps, "lab")
		}
		if secrets, ok := svc["secrets"].([]any); ok {
			svc["secrets"] = slices.DeleteFunc(secrets, func(s any) bool { return strings.HasPrefix(fmt.Sprint(s), "lab_") })
		}
	}
	secrets, _ := doc["secrets"].(map[string]any)
	for name := range secrets {
		if strings.HasPrefix(name, "lab_") {
			delete(secrets, name)
		}
	}
	out, err := yaml.Marshal(doc)
	require.NoError(t, err)
	require.NotContains(t, string(out), "lab")
	return out
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

// deployment is a loaded compose project and the Dockerfiles it builds.
type deployment struct {
	project *types.Project
	images  map[string]image // by Dockerfile path
	errs    map[string]error // Dockerfiles that could not be read or parsed
	// secretVars maps, per service, each *_FILE variable that names a
	// secret mounted in the service to that secret.
	secretVars map[string]map[string]string
	// env is the host environment the file was loaded with: what its
	// ${VARIABLE} references were replaced from.
	env types.Mapping
}

// loadDeployment parses a compose file as Docker Compose would, except that
// variables come from env rather than the host environment or a .env
// file: the result must not depend on who runs the test.
func loadDeployment(t *testing.T, filename string, content []byte, env types.Mapping) *deployment {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), composeTimeout)
	defer cancel()
	abs, err := filepath.Abs(filename)
	require.NoError(t, err)
	project, err := loader.LoadWithContext(ctx, types.ConfigDetails{
		WorkingDir:  filepath.Dir(abs),
		ConfigFiles: []types.ConfigFile{{Filename: abs, Content: content}},
		Environment: env,
	}, func(o *loader.Options) {
		o.SetProjectName(composeProject, true)
		o.ResolvePaths = true // build contexts become absolute, so we can stat them
		// Every profile's services are checked: those of "observability"
		// too, and checkObservabilityProfile sees to it that the plain
		// `docker compose up` still gets the whole system.
		o.Profiles = []string{"*"}
	})
	require.NoError(t, err, "loading %s", filename)

	d := &deployment{project: project, env: env, images: map[string]image{}, errs: map[string]error{}}
	d.resolveSecrets()
	for _, s := range project.Services {
		if s.Build == nil {
			continue
		}
		file := dockerfilePath(s.Build)
		if _, done := d.images[file]; done || d.errs[file] != nil {
			continue
		}
		text, err := os.ReadFile(file)
		if err == nil {
			var img image
			if img, err = parseDockerfile(string(text)); err == nil {
				d.images[file] = img
				continue
			}
		}
		d.errs[file] = err
	}
	return d
}

// resolveSecrets points every *_FILE variable that names a secret mounted
// in its service (/run/secrets/<target>) at the secret's file on this
// host, so that the binaries' config loaders, which read those files, see
// what the container would; and it records which secret each names. A
// variable naming a path nothing is mounted at is left alone: the loader
// then fails to read it, and checkEnvironment says so.
func (d *deployment) resolveSecrets() {
	d.secretVars = map[string]map[string]string{}
	for name, s := range d.project.Services {
		d.secretVars[name] = map[string]string{}
		mounted := map[string]string{} // path in the container → secret
		for _, ref := range s.Secrets {
			target := cmp.Or(ref.Target, ref.Source)
			if !path.IsAbs(target) {
				target = path.Join("/run/secrets", target)
			}
			mounted[target] = ref.Source
		}
		for v, val := range s.Environment {
			if !strings.HasSuffix(v, "_FILE") || val == nil {
				continue
			}
			secret, ok := mounted[path.Clean(*val)]
			if !ok {
				continue
			}
			d.secretVars[name][v] = secret
			if cfg, ok := d.project.Secrets[secret]; ok && cfg.File != "" {
				file := cfg.File
				s.Environment[v] = &file
			}
		}
	}
}

func dockerfilePath(b *types.BuildConfig) string {
	f := b.Dockerfile
	if f == "" {
		f = "Dockerfile"
	}
	if !filepath.IsAbs(f) {
		f = filepath.Join(b.Context, f)
	}
	return f
}

// goServices are the services that run one of our binaries: those built
// from source, and the required ones even if they lost their build section.
func (d *deployment) goServices() []types.ServiceConfig {
	var out []types.ServiceConfig
	for _, name := range slices.Sorted(maps.Keys(d.project.Services)) {
		s := d.project.Services[name]
		if s.Build != nil || len(requiredServices[name]) > 0 {
			out = append(out, s)
		}
	}
	return out
}

// binaryOf returns the binary a service runs, judged by its command.
func binaryOf(s types.ServiceConfig) (string, binary, bool) {
	if len(s.Command) == 0 {
		return "", binary{}, false
	}
	name := path.Base(s.Command[0])
	b, ok := binaries[name]
	return name, b, ok
}

func isMigration(s types.ServiceConfig) bool {
	return len(s.Command) == 2 && s.Command[1] == "migrate"
}

// config runs the service's binary's LoadConfig on the service's
// environment.
func config(s types.ServiceConfig) (appConfig, error) {
	_, b, _ := binaryOf(s)
	return b.load(getenvOf(s.Environment))
}

// getenvOf reads a compose environment the way the container will see it.
// A variable listed without a value and absent from the (empty) host
// environment is unset in the container, hence "".
func getenvOf(env types.MappingWithEquals) func(string) string {
	return func(name string) string {
		if v := env[name]; v != nil {
			return *v
		}
		return ""
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

func checkEnvironment(d *deployment) []string {
	var problems []string
	for _, s := range d.goServices() {
		name, b, ok := binaryOf(s)
		if !ok {
			continue // checkBuild reports it
		}
		cfg, err := config(s)
		for _, v := range slices.Sorted(maps.Keys(s.Environment)) {
			// The OpenTelemetry SDK reads its own variables; a misspelt
			// one would silently do nothing too, and so would any in a
			// binary without the SDK.
			if strings.HasPrefix(v, "OTEL_") {
				if !b.traces {
					problems = append(problems, fmt.Sprintf("%q: %s does nothing: %s exports no traces", s.Name, v, name))
				} else if !otelVars[v] {
					problems = append(problems, fmt.Sprintf("%q: %s is not a variable the OpenTelemetry SDK reads, so setting it does nothing", s.Name, v))
				}
				continue
			}
			if !slices.Contains(cfg.names, v) {
				problems = append(problems, fmt.Sprintf("%q: %s is not read by %s, so setting it does nothing (it reads %v)", s.Name, v, name, cfg.names))
			}
		}
		if err != nil {
			problems = append(problems, fmt.Sprintf("%q: %s rejects this environment: %v", s.Name, name, err))
		}
	}
	return problems
}

// checkPorts: every published container port is one the binary listens
// on, no listener is bound to the container's loopback, and every port it
// listens on, published or not, is in the image's
// EXPOSE (the list of what the image serves). An admin port (metrics, the
// sender's redrive, the lab's page) has no authentication, so it is
// published on the loopback interface only; a listener only other
// services call (the lab's fault proxy, which the sender calls) is not
// published at all.
func checkPorts(d *deployment) []string {
	var problems []string
	for _, s := range d.goServices() {
		_, b, ok := binaryOf(s)
		if !ok {
			continue
		}
		if isMigration(s) {
			for _, p := range s.Ports {
				problems = append(problems, fmt.Sprintf("%q: publishes container port %d, but a migration listens on nothing", s.Name, p.Target))
			}
			continue
		}
		cfg, _ := config(s)
		listens := map[uint32]string{} // port → the variable that sets it
		var desc []string
		bad := false
		for _, v := range b.listenVars() {
			addr := cfg.listens[v]
			port, err := portOf(addr)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%q: %s=%q: %v", s.Name, v, addr, err))
				bad = true
				continue
			}
			if other, taken := listens[port]; taken {
				problems = append(problems, fmt.Sprintf("%q: %s=%q and %s=%q both listen on %d", s.Name, other, cfg.listens[other], v, addr, port))
				bad = true
			}
			// Inside a container, loopback is the container's own: neither a
			// published port nor another service reaches it.
			if host, _, _ := net.SplitHostPort(addr); host == "localhost" || net.ParseIP(host).IsLoopback() {
				problems = append(problems, fmt.Sprintf("%q: %s=%q listens on loopback inside its container, where nothing else can reach it: listen on \":%d\"", s.Name, v, addr, port))
			}
			listens[port] = v
			desc = append(desc, fmt.Sprintf("%s=%q listens on %d", v, addr, port))
		}
		if bad {
			continue
		}
		var img image
		if s.Build != nil {
			img = d.images[dockerfilePath(s.Build)]
		}
		published := map[uint32]bool{}
		for _, p := range s.Ports {
			published[p.Target] = true
			v, ok := listens[p.Target]
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("%q: publishes container port %d, but nothing listens there: %s", s.Name, p.Target, strings.Join(desc, ", ")))
			case slices.Contains(b.internalVars, v):
				problems = append(problems, fmt.Sprintf("%q: publishes port %d (%s), which only other services call, over the compose network: do not publish it", s.Name, p.Target, v))
			case v == b.adminVar && !loopback(p.HostIP):
				problems = append(problems, fmt.Sprintf("%q: publishes its admin port %d (%s) on every interface, but it has no authentication: publish it as \"127.0.0.1:%s:%d\"", s.Name, p.Target, v, cmp.Or(p.Published, strconv.Itoa(int(p.Target))), p.Target))
			}
			// An image that failed to load is checkBuild's to report.
			if img.installed != nil && !slices.Contains(img.expose, p.Target) {
				problems = append(problems, fmt.Sprintf("%q: container port %d is not in the Dockerfile's EXPOSE %v", s.Name, p.Target, img.expose))
			}
		}
		for _, port := range slices.Sorted(maps.Keys(listens)) {
			if img.installed != nil && !published[port] && !slices.Contains(img.expose, port) {
				problems = append(problems, fmt.Sprintf("%q: listens on %d (%s), which is not in the Dockerfile's EXPOSE %v", s.Name, port, listens[port], img.expose))
			}
		}
	}
	return problems
}

// loopback says whether a published port's host address is reachable from
// this host only.
func loopback(hostIP string) bool {
	ip := net.ParseIP(hostIP)
	return ip != nil && ip.IsLoopback()
}

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

// resolvedCall is where a call's URL leads: the service it names, the
// listener (by variable) it must reach there, and whether that service
// is a proxy standing in for the binary called.
type resolvedCall struct {
	url     *url.URL
	target  types.ServiceConfig
	addrVar string
	proxied bool
}

// resolveCall reads the URL of s's call c as s's binary sees it, and
// checks that it names a serving service running the binary called (or,
// where c allows, a proxy to it). It returns nil and why when not.
func (d *deployment) resolveCall(s types.ServiceConfig, c call) (*resolvedCall, string) {
	cfg, _ := config(s)
	raw := cfg.urls[c.urlVar]
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Sprintf("%q: %s: %v", s.Name, c.urlVar, err)
	}
	target, ok := d.project.Services[u.Hostname()]
	name, b, isGo := binaryOf(target)
	switch {
	case ok && isGo && !isMigration(target) && name == c.binary:
		return &resolvedCall{url: u, target: target, addrVar: c.addrVar}, ""
	case ok && isGo && !isMigration(target) && c.viaProxy && b.proxiesTo(c.binary):
		return &resolvedCall{url: u, target: target, addrVar: b.proxy.addrVar, proxied: true}, ""
	}
	want := c.binary
	if c.viaProxy {
		var proxies []string
		for _, pname := range slices.Sorted(maps.Keys(binaries)) {
			if binaries[pname].proxiesTo(c.binary) {
				proxies = append(proxies, pname)
			}
		}
		want += fmt.Sprintf(" or a proxy to it (%s)", strings.Join(proxies, ", "))
	}
	return nil, fmt.Sprintf("%q: %s=%s: %q is not a service running %s", s.Name, c.urlVar, raw, u.Hostname(), want)
}

// urlPort is the port a URL reaches, its scheme's when it names none.
func urlPort(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	return map[string]string{"http": "80", "https": "443"}[u.Scheme]
}

// checkServiceURLs: every URL a Go service calls another by names a
// service running that binary, on the port the listener it means listens
// on there (the API, or the admin port). The sender's SENDER_USERS_URL
// may name the lab instead, on its fault proxy's port, not its page's; the
// lab's LAB_USERS_URL then names Users. A proxy must be called through,
// or its faults break nothing and its page shows no delivery. The URLs
// one service uses for another binary (the lab's for Student's API and
// Student's admin port) name the same service, or the page would show one
// Student's readiness and create students in another.
func checkServiceURLs(d *deployment) []string {
	var problems []string
	calledProxies := map[string]bool{} // services whose proxy some service calls, on its port
	for _, s := range d.servingGoServices() {
		_, b, _ := binaryOf(s)
		named := map[string]map[string][]string{} // binary → service named → the variables naming it
		for _, c := range b.calls {
			r, problem := d.resolveCall(s, c)
			if r == nil {
				problems = append(problems, problem)
				continue
			}
			if !r.proxied {
				if named[c.binary] == nil {
					named[c.binary] = map[string][]string{}
				}
				named[c.binary][r.target.Name] = append(named[c.binary][r.target.Name], c.urlVar)
			}
			_, tb, _ := binaryOf(r.target)
			tcfg, _ := config(r.target)
			want, err := portOf(tcfg.listens[r.addrVar])
			if err != nil {
				continue // checkPorts reports it
			}
			got := urlPort(r.url)
			if got == strconv.Itoa(int(want)) {
				if r.proxied {
					calledProxies[r.target.Name] = true
				}
				continue
			}
			other := ""
			for _, v := range tb.listenVars() {
				if p, err := portOf(tcfg.listens[v]); err == nil && strconv.Itoa(int(p)) == got {
					other = v
				}
			}
			if other != "" {
				problems = append(problems, fmt.Sprintf("%q: %s=%s uses port %s, where %q serves %s, not %s (%d)", s.Name, c.urlVar, r.url, got, r.target.Name, other, r.addrVar, want))
			} else {
				problems = append(problems, fmt.Sprintf("%q: %s=%s uses port %s, but %q listens on %d (%s)", s.Name, c.urlVar, r.url, got, r.target.Name, want, r.addrVar))
			}
		}
		for _, bin := range slices.Sorted(maps.Keys(named)) {
			if svcs := named[bin]; len(svcs) > 1 {
				problems = append(problems, fmt.Sprintf("%q: its URLs name different services running %s, %v: they must name one", s.Name, bin, svcs))
			}
		}
	}
	for _, s := range d.servingGoServices() {
		_, b, _ := binaryOf(s)
		if b.proxy.addrVar != "" && !calledProxies[s.Name] {
			problems = append(problems, fmt.Sprintf("%q: no service calls its proxy (%s): its faults would break nothing", s.Name, b.proxy.addrVar))
		}
	}
	return problems
}

// calledService is the service a call reaches in the end: the one its URL
// names, or the one behind a proxy it names. "" when it names none.
func (d *deployment) calledService(s types.ServiceConfig, c call) string {
	r, _ := d.resolveCall(s, c)
	if r == nil {
		return ""
	}
	if !r.proxied {
		return r.target.Name
	}
	_, pb, _ := binaryOf(r.target)
	for _, up := range pb.calls {
		if up.urlVar == pb.proxy.upstreamVar {
			return d.calledService(r.target, up)
		}
	}
	return ""
}

// checkStartOrder: each database a Go service connects to has a
// healthcheck; a migration waits for its database to be healthy and runs
// once; and a serving service waits for a migration of every database it
// connects to (the lab: Student's and Users') to have completed.
func checkStartOrder(d *deployment) []string {
	var problems []string
	dbs := map[string][]database{} // service → the databases it connects to, its main one first
	healthchecked := map[string]bool{}
	for _, s := range d.goServices() {
		db, _ := d.databaseOf(s)
		dbs[s.Name] = []database{db}
		if _, b, ok := binaryOf(s); ok && !isMigration(s) {
			cfg, _ := config(s)
			for _, c := range b.more {
				u, err := url.Parse(cfg.value(s.Environment, c.dbVar))
				if err != nil {
					continue // checkDatabases reports it
				}
				if other := databaseOfURL(u); !slices.Contains(dbs[s.Name], other) {
					dbs[s.Name] = append(dbs[s.Name], other)
				}
			}
		}
		for _, db := range dbs[s.Name] {
			dbSvc, ok := d.project.Services[db.host]
			if !ok || healthchecked[db.host] {
				continue
			}
			healthchecked[db.host] = true
			// Without a healthcheck service_healthy cannot be waited for, and
			// "started" only means the container exists, not that PostgreSQL
			// accepts connections.
			if !hasHealthcheck(dbSvc) {
				problems = append(problems, fmt.Sprintf("%q: has no healthcheck, so nothing can wait for it to accept connections", db.host))
			}
		}
	}
	for _, s := range d.goServices() {
		if _, _, ok := binaryOf(s); !ok {
			continue
		}
		if isMigration(s) {
			db := dbs[s.Name][0]
			if dep, ok := s.DependsOn[db.host]; !ok || dep.Condition != types.ServiceConditionHealthy {
				problems = append(problems, fmt.Sprintf("%q: must depend on %q with condition %s, not %s", s.Name, db.host, types.ServiceConditionHealthy, cmp.Or(dep.Condition, "none")))
			}
			// A migration restarted after success would never count as
			// completed, and the services waiting for it would never start.
			if s.Restart != "" && s.Restart != types.RestartPolicyNo {
				problems = append(problems, fmt.Sprintf("%q: restart %q; a migration must run once", s.Name, s.Restart))
			}
			continue
		}
		// A service started before its schema exists fails its first
		// queries, and one started before its role has a password cannot
		// log in: the migration must have finished, not merely started.
		for _, db := range dbs[s.Name] {
			migrated := false
			for dep, cond := range s.DependsOn {
				m, ok := d.project.Services[dep]
				if ok && isMigration(m) && len(dbs[dep]) > 0 && dbs[dep][0] == db && cond.Condition == types.ServiceConditionCompletedSuccessfully {
					migrated = true
				}
			}
			if !migrated {
				problems = append(problems, fmt.Sprintf("%q: must depend on a migration of %s with condition %s", s.Name, db, types.ServiceConditionCompletedSuccessfully))
			}
		}
	}
	return problems
}

// hasHealthcheck says whether Docker will run a healthcheck for s, so that
// service_healthy can be waited for.
func hasHealthcheck(s types.ServiceConfig) bool {
	hc := s.HealthCheck
	return hc != nil && !hc.Disable && len(hc.Test) > 0 && hc.Test[0] != "NONE"
}

// packageOf resolves a command's first word in s's image, as checkBuild
// does, and returns the package that binary was built from. Without a
// loaded image (checkBuild reports why) it falls back to the binary's name.
func (d *deployment) packageOf(s types.ServiceConfig, cmd string) (string, bool) {
	if s.Build != nil {
		if img, ok := d.images[dockerfilePath(s.Build)]; ok {
			return img.lookup(cmd)
		}
	}
	b, ok := binaries[path.Base(cmd)]
	return path.Clean(b.pkg), ok
}

// checkHealthchecks: every serving Go service must have a healthcheck, or
// nothing can wait for it to be ready, and the healthcheck must be its own
// binary's "healthcheck" subcommand in exec form. The image is distroless:
// CMD-SHELL needs /bin/sh, which it lacks, so a shell-form test always fails
// and the service never becomes healthy. Running another binary's
// subcommand would ask the wrong port's /readyz.
func checkHealthchecks(d *deployment) []string {
	var problems []string
	for _, s := range d.goServices() {
		if _, _, ok := binaryOf(s); !ok || isMigration(s) {
			continue
		}
		if !hasHealthcheck(s) {
			problems = append(problems, fmt.Sprintf("%q: has no healthcheck, so nothing can wait for it to be ready; want test [\"CMD\", %q, \"healthcheck\"]", s.Name, s.Command[0]))
			continue
		}
		test := s.HealthCheck.Test
		if test[0] != "CMD" {
			problems = append(problems, fmt.Sprintf("%q: healthcheck test is %s %q; the image has no shell, so it must be exec form [\"CMD\", %q, \"healthcheck\"]", s.Name, test[0], test[1:], s.Command[0]))
			continue
		}
		args := test[1:]
		if len(args) != 2 || args[1] != "healthcheck" {
			problems = append(problems, fmt.Sprintf("%q: healthcheck runs %q, want [%q \"healthcheck\"]", s.Name, args, s.Command[0]))
			continue
		}
		serves, ok := d.packageOf(s, s.Command[0])
		if !ok {
			continue // checkBuild reports it
		}
		checks, ok := d.packageOf(s, args[0])
		if !ok {
			problems = append(problems, fmt.Sprintf("%q: healthcheck runs %q, which is not a binary the Dockerfile builds and copies into the final image", s.Name, args[0]))
			continue
		}
		if checks != serves {
			problems = append(problems, fmt.Sprintf("%q: healthcheck runs %q, the binary built from %s, but the service runs the one built from %s", s.Name, args[0], strings.TrimPrefix(checks, "./"), strings.TrimPrefix(serves, "./")))
		}
	}
	return problems
}

// checkDependsOnConditions: a service waiting for a Go service must wait for
// the right thing. service_started only means the container exists; a
// migration must have finished, and a server with a healthcheck must answer
// /readyz. A server without a healthcheck is checkHealthchecks' to report.
func checkDependsOnConditions(d *deployment) []string {
	var problems []string
	for _, name := range slices.Sorted(maps.Keys(d.project.Services)) {
		s := d.project.Services[name]
		for _, depName := range slices.Sorted(maps.Keys(s.DependsOn)) {
			dep, ok := d.project.Services[depName]
			if _, _, isGo := binaryOf(dep); !ok || !isGo {
				continue
			}
			var want string
			switch {
			case isMigration(dep):
				want = types.ServiceConditionCompletedSuccessfully
			case hasHealthcheck(dep):
				want = types.ServiceConditionHealthy
			default:
				continue
			}
			if got := s.DependsOn[depName].Condition; got != want {
				problems = append(problems, fmt.Sprintf("%q: must depend on %q with condition %s, not %s", s.Name, depName, want, cmp.Or(got, "none")))
			}
		}
	}
	return problems
}

// checkRetention ties the two sides of the idempotency key together. The
// sender retries an operation with the same Idempotency-Key until
// SENDER_MAX_AGE after the outbox row was written; Users recognises a
// repeated key only while the key's inbox row is younger than
// USERS_INBOX_RETENTION. A retry arriving after the inbox forgot its key is
// treated as new and creates a second user. The inbox row is written after
// the outbox row, so retention equal to max age would almost suffice;
// strictly longer leaves room for the request in flight when max age ran out
// and for the two databases' clocks disagreeing.
func checkRetention(d *deployment) []string {
	var problems []string
	for _, u := range d.goServices() {
		if name, _, _ := binaryOf(u); name != "users" || isMigration(u) {
			continue
		}
		uc, _, _ := usersvc.LoadConfig(getenvOf(u.Environment))
		for _, s := range d.goServices() {
			if name, _, _ := binaryOf(s); name != "outbox-sender" {
				continue
			}
			sc, _, _ := sender.LoadConfig(getenvOf(s.Environment))
			if uc.InboxRetention <= sc.MaxAge {
				problems = append(problems, fmt.Sprintf("USERS_INBOX_RETENTION=%s (%q) must be longer than SENDER_MAX_AGE=%s (%q): a retry after Users forgot its key would create a second user",
					uc.InboxRetention, u.Name, sc.MaxAge, s.Name))
			}
		}
	}
	return problems
}

// checkWaitsNest ties Users' waits to the sender's. A delivery waits at most
// SENDER_REQUEST_TIMEOUT for Users' answer. Users may wait
// USERS_IDEMPOTENCY_WAIT for a key another request holds, then answers 409
// with Retry-After, and ends any request by USERS_DATABASE_TIMEOUT, then
// answers 503. Both must come first: a sender that gives up before Users
// answers never sees the 409 or the Retry-After, and records a timeout for a
// request Users was still working on. Each binary checks its own waits at
// start; only the deployment sees both.
func checkWaitsNest(d *deployment) []string {
	var problems []string
	for _, u := range d.goServices() {
		if name, _, _ := binaryOf(u); name != "users" || isMigration(u) {
			continue
		}
		uc, _, _ := usersvc.LoadConfig(getenvOf(u.Environment))
		for _, s := range d.goServices() {
			if name, _, _ := binaryOf(s); name != "outbox-sender" {
				continue
			}
			sc, _, _ := sender.LoadConfig(getenvOf(s.Environment))
			if uc.KeyWait >= sc.RequestTimeout {
				problems = append(problems, fmt.Sprintf("USERS_IDEMPOTENCY_WAIT=%s (%q) must be shorter than SENDER_REQUEST_TIMEOUT=%s (%q): the sender would give up before Users answers 409 with Retry-After",
					uc.KeyWait, u.Name, sc.RequestTimeout, s.Name))
			}
			if uc.DatabaseTimeout >= sc.RequestTimeout {
				problems = append(problems, fmt.Sprintf("USERS_DATABASE_TIMEOUT=%s (%q) must be shorter than SENDER_REQUEST_TIMEOUT=%s (%q): the sender would give up before Users answers 503 with Retry-After",
					uc.DatabaseTimeout, u.Name, sc.RequestTimeout, s.Name))
			}
		}
	}
	return problems
}

// checkCallers ties the sender's credentials to Users'. Users serves only
// the callers in USERS_API_TOKENS, and the sender authenticates with
// SENDER_USERS_TOKEN: a token Users does not list gets every delivery
// refused (401), which the sender retries for ever and says so, but
// delivers nothing. Each binary checks its own variable at start; only the
// deployment sees both. Migrations serve no one, so they are not handed
// the tokens.
func checkCallers(d *deployment) []string {
	var problems []string
	accepted := map[string]string{} // token → the users service that accepts it
	for _, u := range d.goServices() {
		if name, _, _ := binaryOf(u); name != "users" {
			continue
		}
		uc, _, err := usersvc.LoadConfig(getenvOf(u.Environment))
		if err != nil {
			continue // checkEnvironment reports it
		}
		switch {
		case isMigration(u) && len(uc.Callers) > 0:
			problems = append(problems, fmt.Sprintf("%q: USERS_API_TOKENS is set, but a migration serves no one: keep the tokens out of it", u.Name))
		case !isMigration(u) && len(uc.Callers) == 0:
			problems = append(problems, fmt.Sprintf("%q: USERS_API_TOKENS is not set: Users refuses to serve without callers", u.Name))
		case !isMigration(u):
			for _, c := range uc.Callers {
				accepted[string(c.Token)] = u.Name
			}
		}
	}
	for _, s := range d.goServices() {
		if name, _, _ := binaryOf(s); name != "outbox-sender" {
			continue
		}
		sc, _, err := sender.LoadConfig(getenvOf(s.Environment))
		if err != nil {
			continue // checkEnvironment reports it
		}
		// The token must be one the Users the sender calls accepts, not
		// merely some Users of the project: the one SENDER_USERS_URL
		// names, or the one behind the lab it names (the lab passes the
		// token on).
		_, b, _ := binaryOf(s)
		called := d.calledService(s, b.call("SENDER_USERS_URL"))
		switch users, ok := accepted[string(sc.UsersToken)]; {
		case sc.UsersToken == "":
			problems = append(problems, fmt.Sprintf("%q: SENDER_USERS_TOKEN is not set: the sender refuses to start without it", s.Name))
		case called == "":
			// checkServiceURLs reports it
		case !ok || users != called:
			problems = append(problems, fmt.Sprintf("%q: SENDER_USERS_TOKEN is not among the tokens %q accepts (USERS_API_TOKENS): Users would refuse every delivery", s.Name, called))
		}
	}
	return problems
}

// checkSenderSource: the sender's source is the host's SENDER_SOURCE, poll
// when the host sets none, so that plain `docker compose up` polls (which
// asks nothing of PostgreSQL's configuration) and `SENDER_SOURCE=cdc docker
// compose up` streams without an edit to the file. Whether the sender
// accepts the value is checkEnvironment's to say: it runs the loader.
func checkSenderSource(d *deployment) []string {
	var problems []string
	want, host := "poll", "sets none"
	if v := d.env["SENDER_SOURCE"]; v != "" {
		want, host = v, fmt.Sprintf("sets %q", v)
	}
	for _, s := range d.servingGoServices() {
		if name, _, _ := binaryOf(s); name != "outbox-sender" {
			continue
		}
		switch got := getenvOf(s.Environment)("SENDER_SOURCE"); {
		case got == "":
			problems = append(problems, fmt.Sprintf("%q: SENDER_SOURCE is not set, so the host's SENDER_SOURCE cannot switch it: write ${SENDER_SOURCE:-poll}", s.Name))
		case got != want:
			problems = append(problems, fmt.Sprintf("%q: SENDER_SOURCE is %q when the host %s, want %q: write ${SENDER_SOURCE:-poll}", s.Name, got, host, want))
		}
	}
	return problems
}

// checkLogicalDecoding: the database a sender's replication connection
// reaches runs with wal_level=logical, without which the sender cannot
// create its slot and SENDER_SOURCE=cdc fails at start, and with
// max_slot_wal_keep_size bounding the WAL a slot may hold. Without the
// bound a stuck or abandoned slot keeps WAL until the disk is full and
// PostgreSQL stops; past it PostgreSQL invalidates the slot, and the
// sender falls back to polling and creates the slot again.
func checkLogicalDecoding(d *deployment) []string {
	var problems []string
	seen := map[string]bool{}
	for _, s := range d.servingGoServices() {
		_, b, _ := binaryOf(s)
		main, _ := d.databaseOf(s)
		urls, _ := d.connectionsOf(s, main, nil)
		for _, c := range b.more {
			u := urls[c.dbVar]
			if !c.replication || u == nil || seen[u.Hostname()] {
				continue // checkDatabases reports a URL that reaches no service
			}
			seen[u.Hostname()] = true
			dbSvc := d.project.Services[u.Hostname()]
			settings, ok := postgresSettings(dbSvc.Command)
			if !ok {
				problems = append(problems, fmt.Sprintf("%q: runs %q, so its settings cannot be checked: want [\"postgres\", \"-c\", \"wal_level=logical\", ...]", dbSvc.Name, dbSvc.Command))
				continue
			}
			if v := cmp.Or(settings["wal_level"], "replica (the default)"); v != "logical" {
				problems = append(problems, fmt.Sprintf("%q: wal_level is %s, but %q streams from it (%s): set -c wal_level=logical in its command", dbSvc.Name, v, s.Name, c.dbVar))
			}
			v := cmp.Or(settings["max_slot_wal_keep_size"], "-1")
			switch n, err := walSize(v); {
			case err != nil:
				problems = append(problems, fmt.Sprintf("%q: max_slot_wal_keep_size=%s: %v", dbSvc.Name, v, err))
			case n < 0:
				problems = append(problems, fmt.Sprintf("%q: max_slot_wal_keep_size is %s, no bound: a slot nobody reads would keep WAL until the disk is full; set a bound such as -c max_slot_wal_keep_size=1GB", dbSvc.Name, v))
			case n == 0:
				problems = append(problems, fmt.Sprintf("%q: max_slot_wal_keep_size is 0, so a slot may lose its WAL as soon as its reader falls behind; want a bound such as 1GB", dbSvc.Name))
			}
		}
	}
	return problems
}

// postgresSettings returns the server settings a postgres container's
// command sets (-c name=value, -cname=value or --name=value; a dash in a
// name is an underscore), and false when the command does not run the
// server. The image runs "postgres" with no settings when the command is
// empty, and runs "postgres" with the command as its arguments when the
// command starts with an option.
func postgresSettings(cmd []string) (map[string]string, bool) {
	settings := map[string]string{}
	if len(cmd) == 0 {
		return settings, true
	}
	args := cmd
	switch {
	case strings.HasPrefix(cmd[0], "-"):
	case path.Base(cmd[0]) == "postgres":
		args = cmd[1:]
	default:
		return nil, false
	}
	for i := 0; i < len(args); i++ {
		var kv string
		switch a := args[i]; {
		case a == "-c" && i+1 < len(args):
			kv = args[i+1]
			i++
		case strings.HasPrefix(a, "-c"):
			kv = strings.TrimPrefix(a, "-c")
		case strings.HasPrefix(a, "--"):
			kv = strings.TrimPrefix(a, "--")
		default:
			continue
		}
		if k, v, ok := strings.Cut(kv, "="); ok {
			settings[strings.ReplaceAll(strings.ToLower(k), "-", "_")] = v
		}
	}
	return settings, true
}

// walSize reads a PostgreSQL size setting in bytes: a whole number with
// one of its units (B, kB, MB, GB, TB), megabytes when it has none, as
// max_slot_wal_keep_size has. A negative number stays negative.
func walSize(v string) (int64, error) {
	n, mult := strings.TrimSpace(v), int64(1<<20)
	for _, u := range []struct {
		suffix string
		bytes  int64
	}{{"TB", 1 << 40}, {"GB", 1 << 30}, {"MB", 1 << 20}, {"kB", 1 << 10}, {"B", 1}} {
		if rest, ok := strings.CutSuffix(n, u.suffix); ok {
			n, mult = strings.TrimSpace(rest), u.bytes
			break
		}
	}
	i, err := strconv.ParseInt(n, 10, 64)
	if err != nil {
		return 0, errors.New("want a size such as 1GB (units B, kB, MB, GB, TB)")
	}
	return i * mult, nil
}

// observabilityProfile is the compose profile that adds what watches the
// system; observabilityServices are its services, by the image each runs.
const observabilityProfile = "observability"

var observabilityServices = map[string]string{
	"jaeger":     "jaegertracing/all-in-one",
	"prometheus": "prom/prometheus",
	"grafana":    "grafana/grafana",
}

// The ports the profile's services listen on inside the compose network:
// Jaeger's OTLP/HTTP receiver (4317 is its OTLP/gRPC one) and Prometheus'
// API, which Grafana queries.
const (
	otlpHTTPPort   = "4318"
	otlpGRPCPort   = "4317"
	prometheusPort = "9090"
)

// otelVars are the OpenTelemetry SDK's variables a service may set: the
// specification's general ones, the OTLP exporter's and the batch span
// processor's. They are not the config loaders' to list.
var otelVars = map[string]bool{}

func init() {
	for _, v := range []string{
		"OTEL_SDK_DISABLED", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_PROPAGATORS",
		"OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_TRACES_EXPORTER", "OTEL_LOG_LEVEL",
		"OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_EXPORT_TIMEOUT", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
		"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT",
		"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "OTEL_SPAN_EVENT_COUNT_LIMIT",
		"OTEL_SPAN_LINK_COUNT_LIMIT", "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT",
	} {
		otelVars[v] = true
	}
	for _, signal := range []string{"", "TRACES_"} {
		for _, v := range []string{"ENDPOINT", "HEADERS", "TIMEOUT", "COMPRESSION", "PROTOCOL", "INSECURE",
			"CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY"} {
			otelVars["OTEL_EXPORTER_OTLP_"+signal+v] = true
		}
	}
}

// imageRepo is an image reference without its tag or digest.
func imageRepo(ref string) string {
	ref, _, _ = strings.Cut(ref, "@")
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		ref = ref[:i]
	}
	return ref
}

// servicesOf returns the services that run image repo, in name order.
func (d *deployment) servicesOf(repo string) []types.ServiceConfig {
	var out []types.ServiceConfig
	for _, name := range slices.Sorted(maps.Keys(d.project.Services)) {
		if s := d.project.Services[name]; imageRepo(s.Image) == repo {
			out = append(out, s)
		}
	}
	return out
}

// servingGoServices are the Go services that serve (not the migrations).
func (d *deployment) servingGoServices() []types.ServiceConfig {
	var out []types.ServiceConfig
	for _, s := range d.goServices() {
		if _, _, ok := binaryOf(s); ok && !isMigration(s) {
			out = append(out, s)
		}
	}
	return out
}

// hostPath maps a path inside s's container to the host path the bind
// mount covering it puts there, or "" when no bind mount covers it.
func (d *deployment) hostPath(s types.ServiceConfig, inContainer string) string {
	var target, source string
	for _, v := range s.Volumes {
		if v.Type != types.VolumeTypeBind {
			continue
		}
		t := path.Clean(v.Target)
		if (inContainer == t || strings.HasPrefix(inContainer, t+"/")) && len(t) > len(target) {
			target, source = t, v.Source
		}
	}
	if target == "" {
		return ""
	}
	if !filepath.IsAbs(source) {
		source = filepath.Join(d.project.WorkingDir, source)
	}
	return filepath.Join(source, filepath.FromSlash(strings.TrimPrefix(inContainer, target)))
}

// checkObservabilityProfile: Jaeger, Prometheus and Grafana run with the
// profile only, and everything else without a profile, so that plain
// `docker compose up` is the whole system and no more. Nothing outside the
// profile may wait for a service in it, or plain `up` would fail. Each UI
// is published on the loopback interface only: none has authentication
// set up.
func checkObservabilityProfile(d *deployment) []string {
	var problems []string
	for _, name := range slices.Sorted(maps.Keys(observabilityServices)) {
		s, ok := d.project.Services[name]
		if !ok {
			problems = append(problems, fmt.Sprintf("service %q is missing: the %s profile needs it", name, observabilityProfile))
			continue
		}
		if !slices.Equal(s.Profiles, []string{observabilityProfile}) {
			problems = append(problems, fmt.Sprintf("%q: has profiles %q, want only [%s]: it belongs to the profile, not to plain `docker compose up`", name, s.Profiles, observabilityProfile))
		}
		if want := observabilityServices[name]; imageRepo(s.Image) != want {
			problems = append(problems, fmt.Sprintf("%q: runs image %q, want %s", name, s.Image, want))
		}
		for _, p := range s.Ports {
			if !loopback(p.HostIP) {
				problems = append(problems, fmt.Sprintf("%q: publishes port %d on every interface, and it has no authentication set up: publish it on 127.0.0.1", name, p.Target))
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(d.project.Services)) {
		s := d.project.Services[name]
		if _, ok := observabilityServices[name]; ok {
			continue
		}
		if len(s.Profiles) > 0 {
			problems = append(problems, fmt.Sprintf("%q: has profiles %q, so plain `docker compose up` would leave it out", name, s.Profiles))
			continue
		}
		for _, dep := range slices.Sorted(maps.Keys(s.DependsOn)) {
			if p := d.project.Services[dep].Profiles; len(p) > 0 {
				problems = append(problems, fmt.Sprintf("%q: depends on %q, which runs only with profile %q: plain `docker compose up` would fail", name, dep, p))
			}
		}
	}
	return problems
}

// checkTracing: every serving Go service whose binary exports spans
// (binary.traces) exports them to the profile's Jaeger, over OTLP/HTTP
// (the exporter the binaries have), and services running different
// binaries have different names, so that one trace shows the three
// processes apart. Without the profile the exports fail, which the
// services log and otherwise ignore. The lab exports none; checkEnvironment
// refuses OTEL_ variables there, which would do nothing.
func checkTracing(d *deployment) []string {
	var problems []string
	named := map[string]string{} // OTEL_SERVICE_NAME → the binary using it
	for _, s := range d.servingGoServices() {
		bin, b, _ := binaryOf(s)
		if !b.traces {
			continue
		}
		env := getenvOf(s.Environment)
		endpointVar := "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
		if env(endpointVar) == "" {
			endpointVar = "OTEL_EXPORTER_OTLP_ENDPOINT"
		}
		switch endpoint := env(endpointVar); {
		case endpoint == "" || env("OTEL_SDK_DISABLED") == "true":
			problems = append(problems, fmt.Sprintf("%q: exports no traces: set OTEL_EXPORTER_OTLP_ENDPOINT to Jaeger's OTLP/HTTP receiver, http://jaeger:%s", s.Name, otlpHTTPPort))
		default:
			problems = append(problems, d.checkCollector(s.Name, endpointVar, endpoint)...)
		}
		name := env("OTEL_SERVICE_NAME")
		if other, taken := named[name]; name != "" && taken && other != bin {
			problems = append(problems, fmt.Sprintf("%q: OTEL_SERVICE_NAME=%q is also the name of %s's spans: a trace would not tell the two apart", s.Name, name, other))
		}
		named[name] = bin
	}
	return problems
}

// checkCollector checks that an OTLP endpoint is the OTLP/HTTP receiver
// of a Jaeger service.
func (d *deployment) checkCollector(service, endpointVar, endpoint string) []string {
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" {
		return []string{fmt.Sprintf("%q: %s=%q is not an http:// URL", service, endpointVar, endpoint)}
	}
	jaeger, ok := d.project.Services[u.Hostname()]
	if !ok || imageRepo(jaeger.Image) != observabilityServices["jaeger"] {
		return []string{fmt.Sprintf("%q: %s=%s: %q is not a service running Jaeger", service, endpointVar, endpoint, u.Hostname())}
	}
	var problems []string
	switch u.Port() {
	case otlpHTTPPort:
	case otlpGRPCPort:
		problems = append(problems, fmt.Sprintf("%q: %s=%s: port %s is OTLP/gRPC, but the binaries export OTLP/HTTP, to %s", service, endpointVar, endpoint, otlpGRPCPort, otlpHTTPPort))
	default:
		problems = append(problems, fmt.Sprintf("%q: %s=%s: Jaeger receives OTLP/HTTP on port %s", service, endpointVar, endpoint, otlpHTTPPort))
	}
	if getenvOf(jaeger.Environment)("COLLECTOR_OTLP_ENABLED") == "false" {
		problems = append(problems, fmt.Sprintf("%q: COLLECTOR_OTLP_ENABLED is false, so the spans %q sends are refused", jaeger.Name, service))
	}
	return problems
}

// scrapeConfig is the part of a Prometheus configuration the checks read.
type scrapeConfig struct {
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		MetricsPath   string `yaml:"metrics_path"`
		Scheme        string `yaml:"scheme"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

// prometheusConfigFile is where Prometheus' image reads its configuration
// unless --config.file says otherwise.
const prometheusConfigFile = "/etc/prometheus/prometheus.yml"

// checkScrapes: Prometheus scrapes exactly the admin listeners of the
// serving Go services whose binaries serve /metrics (binary.metrics), at
// the ports their own config loaders say. A target missing is a binary
// whose metrics no one sees; one too many is a target down for ever,
// usually a port changed on one side only, or a listener with no /metrics
// at all: the lab's page.
func checkScrapes(d *deployment) []string {
	var problems []string
	want := map[string]string{}    // "service:port" → the variable making it listen there
	without := map[string]string{} // "service:port" of a listener serving no /metrics → why
	for _, s := range d.servingGoServices() {
		name, b, _ := binaryOf(s)
		cfg, _ := config(s)
		for _, v := range b.listenVars() {
			port, err := portOf(cfg.listens[v])
			if err != nil {
				continue // checkPorts reports it
			}
			target := net.JoinHostPort(s.Name, strconv.Itoa(int(port)))
			switch {
			case v == b.adminVar && b.metrics:
				want[target] = fmt.Sprintf("%s=%q", v, cfg.listens[v])
			case v == b.adminVar:
				without[target] = fmt.Sprintf("%s=%q: %s serves no /metrics", v, cfg.listens[v], name)
			default:
				without[target] = fmt.Sprintf("%s=%q, not its admin listener", v, cfg.listens[v])
			}
		}
	}
	for _, p := range d.servicesOf(observabilityServices["prometheus"]) {
		inContainer := prometheusConfigFile
		for _, arg := range p.Command {
			if v, ok := strings.CutPrefix(arg, "--config.file="); ok {
				inContainer = v
			}
		}
		file := d.hostPath(p, inContainer)
		if file == "" {
			problems = append(problems, fmt.Sprintf("%q: nothing is mounted at %s, its configuration", p.Name, inContainer))
			continue
		}
		var cfg scrapeConfig
		text, err := os.ReadFile(file)
		if err == nil {
			err = yaml.Unmarshal(text, &cfg)
		}
		if err != nil {
			problems = append(problems, fmt.Sprintf("%q: %s: %v", p.Name, file, err))
			continue
		}
		got := map[string]string{} // target → job
		for _, sc := range cfg.ScrapeConfigs {
			if mp := cmp.Or(sc.MetricsPath, "/metrics"); mp != "/metrics" {
				problems = append(problems, fmt.Sprintf("%q: job %q scrapes %s, but the binaries serve /metrics", p.Name, sc.JobName, mp))
			}
			if scheme := cmp.Or(sc.Scheme, "http"); scheme != "http" {
				problems = append(problems, fmt.Sprintf("%q: job %q scrapes over %s, but the admin listeners speak plain http", p.Name, sc.JobName, scheme))
			}
			for _, st := range sc.StaticConfigs {
				for _, target := range st.Targets {
					got[target] = sc.JobName
				}
			}
		}
		for _, target := range slices.Sorted(maps.Keys(want)) {
			if _, ok := got[target]; !ok {
				problems = append(problems, fmt.Sprintf("%q: does not scrape %s, the admin listener there (%s)", p.Name, target, want[target]))
			}
		}
		for _, target := range slices.Sorted(maps.Keys(got)) {
			_, ok := want[target]
			switch why, listening := without[target]; {
			case ok:
			case listening:
				problems = append(problems, fmt.Sprintf("%q: job %q scrapes %s (%s)", p.Name, got[target], target, why))
			default:
				problems = append(problems, fmt.Sprintf("%q: job %q scrapes %s, which is no Go service's admin listener (those are %v)", p.Name, got[target], target, slices.Sorted(maps.Keys(want))))
			}
		}
	}
	return problems
}

// checkGrafana: Grafana starts with a data source for the profile's
// Prometheus and with the dashboard, provisioned from files mounted into
// the container, and lets whoever opens it view them without logging in,
// but not change them.
func checkGrafana(d *deployment) []string {
	var problems []string
	for _, g := range d.servicesOf(observabilityServices["grafana"]) {
		env := getenvOf(g.Environment)
		if env("GF_AUTH_ANONYMOUS_ENABLED") != "true" {
			problems = append(problems, fmt.Sprintf("%q: GF_AUTH_ANONYMOUS_ENABLED is not \"true\": the dashboard would ask for a login", g.Name))
		} else if role := cmp.Or(env("GF_AUTH_ANONYMOUS_ORG_ROLE"), "Viewer"); role != "Viewer" {
			problems = append(problems, fmt.Sprintf("%q: GF_AUTH_ANONYMOUS_ORG_ROLE=%s lets anyone change the dashboard and the data source; want Viewer", g.Name, role))
		}
		provisioning := cmp.Or(env("GF_PATHS_PROVISIONING"), "/etc/grafana/provisioning")
		uids, p := d.grafanaDatasources(g, path.Join(provisioning, "datasources"))
		problems = append(problems, p...)
		problems = append(problems, d.grafanaDashboards(g, path.Join(provisioning, "dashboards"), uids)...)
	}
	return problems
}

// provisioningFiles hands each YAML file Grafana finds in dir, a path in
// its container, to each, with the host path it was read from.
func (d *deployment) provisioningFiles(g types.ServiceConfig, dir string, each func(file string, text []byte) error) error {
	host := d.hostPath(g, dir)
	if host == "" {
		return fmt.Errorf("nothing is mounted at %s", dir)
	}
	entries, err := os.ReadDir(host)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if ext := filepath.Ext(e.Name()); e.IsDir() || ext != ".yml" && ext != ".yaml" {
			continue
		}
		file := filepath.Join(host, e.Name())
		text, err := os.ReadFile(file)
		if err == nil {
			err = each(file, text)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
	}
	return nil
}

// grafanaDatasources checks the provisioned data sources and returns the
// uids of those that reach the profile's Prometheus.
func (d *deployment) grafanaDatasources(g types.ServiceConfig, dir string) (map[string]bool, []string) {
	var problems []string
	uids := map[string]bool{}
	err := d.provisioningFiles(g, dir, func(file string, text []byte) error {
		var f struct {
			Datasources []struct {
				Name string `yaml:"name"`
				UID  string `yaml:"uid"`
				Type string `yaml:"type"`
				URL  string `yaml:"url"`
			} `yaml:"datasources"`
		}
		if err := yaml.Unmarshal(text, &f); err != nil {
			return err
		}
		for _, ds := range f.Datasources {
			if ds.Type != "prometheus" {
				continue
			}
			u, err := url.Parse(ds.URL)
			if err != nil {
				return err
			}
			prom, ok := d.project.Services[u.Hostname()]
			switch {
			case !ok || imageRepo(prom.Image) != observabilityServices["prometheus"]:
				problems = append(problems, fmt.Sprintf("%q: data source %q (%s) points at %q, which is not a service running Prometheus", g.Name, ds.Name, filepath.Base(file), u.Hostname()))
			case u.Port() != prometheusPort:
				problems = append(problems, fmt.Sprintf("%q: data source %q (%s) uses port %q, but Prometheus listens on %s", g.Name, ds.Name, filepath.Base(file), u.Port(), prometheusPort))
			case ds.UID == "":
				problems = append(problems, fmt.Sprintf("%q: data source %q (%s) has no uid, so the dashboard cannot name it", g.Name, ds.Name, filepath.Base(file)))
			default:
				uids[ds.UID] = true
			}
		}
		return nil
	})
	if err != nil {
		problems = append(problems, fmt.Sprintf("%q: data sources: %v", g.Name, err))
	} else if len(uids) == 0 && len(problems) == 0 {
		problems = append(problems, fmt.Sprintf("%q: no Prometheus data source is provisioned in %s", g.Name, dir))
	}
	return uids, problems
}

// grafanaDashboards checks that the dashboard providers load at least one
// dashboard from a mounted folder, and that every data source a dashboard
// names is one provisioned (uids).
func (d *deployment) grafanaDashboards(g types.ServiceConfig, dir string, uids map[string]bool) []string {
	var problems []string
	dashboards := 0
	err := d.provisioningFiles(g, dir, func(file string, text []byte) error {
		var f struct {
			Providers []struct {
				Name    string `yaml:"name"`
				Type    string `yaml:"type"`
				Options struct {
					Path string `yaml:"path"`
				} `yaml:"options"`
			} `yaml:"providers"`
		}
		if err := yaml.Unmarshal(text, &f); err != nil {
			return err
		}
		for _, pr := range f.Providers {
			host := d.hostPath(g, pr.Options.Path)
			if host == "" {
				problems = append(problems, fmt.Sprintf("%q: dashboard provider %q (%s) loads %s, where nothing is mounted", g.Name, pr.Name, filepath.Base(file), pr.Options.Path))
				continue
			}
			files, err := filepath.Glob(filepath.Join(host, "*.json"))
			if err != nil {
				return err
			}
			for _, f := range files {
				dashboards++
				for _, uid := range dashboardDatasources(f) {
					if !uids[uid] {
						problems = append(problems, fmt.Sprintf("%q: dashboard %s names data source %q, which is not a provisioned Prometheus data source %v", g.Name, filepath.Base(f), uid, slices.Sorted(maps.Keys(uids))))
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		problems = append(problems, fmt.Sprintf("%q: dashboards: %v", g.Name, err))
	} else if dashboards == 0 && len(problems) == 0 {
		problems = append(problems, fmt.Sprintf("%q: no dashboard is provisioned (%s)", g.Name, dir))
	}
	return problems
}

// dashboardDatasources returns the uid of every data source a dashboard
// JSON names, in the panels and in their queries; "invalid JSON" when it
// cannot be read.
func dashboardDatasources(file string) []string {
	text, err := os.ReadFile(file)
	var doc any
	if err == nil {
		err = json.Unmarshal(text, &doc)
	}
	if err != nil {
		return []string{"(unreadable: " + err.Error() + ")"}
	}
	seen := map[string]bool{}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if ds, ok := v["datasource"].(map[string]any); ok {
				if uid, ok := ds["uid"].(string); ok {
					seen[uid] = true
				}
			}
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(doc)
	return slices.Sorted(maps.Keys(seen))
}

func portOf(addr string) (uint32, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("want a fixed port, got %q", p)
	}
	return uint32(n), nil
}

// image is what the checks need from a Dockerfile's final stage.
type image struct {
	installed  map[string]string // absolute path in the final image → package built into it
	expose     []uint32
	entrypoint bool
}

// lookup resolves a command's first word the way the container runtime will,
// and returns the package that binary was built from.
func (img image) lookup(cmd string) (string, bool) {
	if strings.Contains(cmd, "/") {
		pkg, ok := img.installed[path.Clean(cmd)]
		return pkg, ok
	}
	for _, dir := range defaultPath {
		if pkg, ok := img.installed[path.Join(dir, cmd)]; ok {
			return pkg, true
		}
	}
	return "", false
}

func (img image) installedPaths() []string {
	return slices.Sorted(maps.Keys(img.installed))
}

// parseDockerfile understands as much of a Dockerfile as the checks need:
// the `go build` commands in RUN, COPY --from of their output into the final
// stage, and the final stage's EXPOSE and ENTRYPOINT. Anything fancier
// (JSON-form COPY, ARG expansion) is not recognised, and the build check
// then fails rather than passing by accident.
func parseDockerfile(text string) (image, error) {
	built := map[string]string{} // path in the build stage → package
	var img image
	stages := 0
	text = strings.ReplaceAll(text, "\\\r\n", " ")
	text = strings.ReplaceAll(text, "\\\n", " ")
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue // a comment may hold an apostrophe, which is no quote
		}
		words, err := shellFields(line)
		if err != nil {
			return image{}, err
		}
		if len(words) == 0 {
			continue
		}
		args := words[1:]
		switch strings.ToUpper(words[0]) {
		case "FROM":
			stages++
			img = image{installed: map[string]string{}}
		case "RUN":
			for i, w := range args {
				if w == "go" && i+1 < len(args) && args[i+1] == "build" {
					recordGoBuild(args[i+2:], built)
				}
			}
		case "COPY":
			var from string
			var paths []string
			for _, a := range args {
				if v, ok := strings.CutPrefix(a, "--from="); ok {
					from = v
				} else if !strings.HasPrefix(a, "--") {
					paths = append(paths, a)
				}
			}
			if from == "" || len(paths) < 2 {
				continue
			}
			dst := paths[len(paths)-1]
			for _, src := range paths[:len(paths)-1] {
				for p, pkg := range built {
					if to, ok := copiedTo(p, src, dst); ok {
						img.installed[to] = pkg
					}
				}
			}
		case "EXPOSE":
			for _, a := range args {
				a, _, _ = strings.Cut(a, "/")
				n, err := strconv.ParseUint(a, 10, 16)
				if err != nil {
					return image{}, fmt.Errorf("EXPOSE %s: %w", a, err)
				}
				img.expose = append(img.expose, uint32(n))
			}
		case "ENTRYPOINT":
			img.entrypoint = true
		}
	}
	if stages == 0 {
		return image{}, errors.New("no FROM")
	}
	if len(built) == 0 {
		return image{}, errors.New("no `go build` command")
	}
	return img, nil
}

// recordGoBuild notes the binaries one `go build` produces. With -o naming a
// folder (trailing slash) each package's binary is named after its last path
// element; otherwise -o names the one binary.
func recordGoBuild(args []string, built map[string]string) {
	var out string
	var pkgs []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "&&" || a == ";" || a == "|" || a == "||":
			i = len(args) // the rest is another command
		case a == "-o" && i+1 < len(args):
			out = args[i+1]
			i++
		case strings.HasPrefix(a, "-o="):
			out = strings.TrimPrefix(a, "-o=")
		case strings.HasPrefix(a, "./") || a == ".":
			pkgs = append(pkgs, a)
		}
	}
	for _, pkg := range pkgs {
		switch {
		case out == "":
			// go build of several packages without -o writes nothing
		case strings.HasSuffix(out, "/"):
			built[path.Join(out, path.Base(pkg))] = path.Clean(pkg)
		case len(pkgs) == 1:
			built[path.Clean(out)] = path.Clean(pkg)
		}
	}
}

// copiedTo says where COPY src dst puts the build-stage file p, if anywhere.
func copiedTo(p, src, dst string) (string, bool) {
	src = path.Clean(src)
	var rel string
	switch {
	case p == src:
		rel = path.Base(p)
		if !strings.HasSuffix(dst, "/") {
			return path.Clean(dst), true
		}
	case strings.HasPrefix(p, src+"/"):
		rel = strings.TrimPrefix(p, src+"/")
	default:
		return "", false
	}
	return path.Join(dst, rel), true
}

// shellFields splits a line into words, honouring single and double quotes,
// so that -ldflags="-s -w" stays one word.
func shellFields(line string) ([]string, error) {
	var words []string
	var word strings.Builder
	inWord := false
	var quote rune
	for _, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				word.WriteRune(r)
			}
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t' || r == '\r':
			if inWord {
				words = append(words, word.String())
				word.Reset()
				inWord = false
			}
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated quote in %q", line)
	}
	if inWord {
		words = append(words, word.String())
	}
	return words, nil
}
