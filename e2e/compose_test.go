package e2e

// This file checks docker-compose.yml and the Dockerfile against the code,
// without Docker: the compose file is read by the same library Docker Compose
// uses, and every Go service's environment is fed to that binary's own
// LoadConfig. A misspelt variable, a port that nothing listens on or a
// migration that does not run first would otherwise only show up when
// somebody runs `docker compose up`.
//
// It carries no build tag on purpose, so that plain `go test ./...` runs it;
// the fault-injection suite in this folder is the part behind `-tags e2e`.

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
}

// binary is what the checks need to know about one of the three binaries.
type binary struct {
	pkg     string // the package the Dockerfile must build
	addrVar string // the variable holding its listen address
	// adminVar holds the address of its admin listener (/metrics,
	// /healthz, /readyz); for the sender it is its only listener.
	adminVar string
	dbVar    string // the variable holding its database URL
	// role is the database role the binary runs as, whose password comes
	// from passwordVar (or its _FILE form).
	role, passwordVar string
	// more are the binary's other connections, each as its own role: the
	// sender's replication connection. Each must reach the same database
	// as dbVar, and its password comes from a secret as role's does.
	more []connection
	// migrateVar holds "migrate"'s administrator URL ("" for a binary
	// without migrations), and logins are the runtime roles that
	// "migrate" gives a password.
	migrateVar string
	logins     []login
	load       func(getenv func(string) string) (appConfig, error)
}

// connection is a database connection a binary opens as role, to the URL in
// dbVar with the password from passwordVar (or its _FILE form).
// replication says it streams changes from a replication slot, which
// needs the database to run with wal_level=logical.
type connection struct {
	role, dbVar, passwordVar string
	replication              bool
}

// login is a runtime role "migrate" sets the password of: from
// passwordVar, which must be the secret the binary running as the role
// logs in with.
type login struct{ role, passwordVar, binary string }

// appConfig is the part of a binary's Config the checks compare across
// services.
type appConfig struct {
	names      []string // every variable the binary reads
	addr       string
	adminAddr  string
	dbURL      string
	migrateURL string // "" for a binary without migrations
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
		logins: []login{
			{migrations.StudentApp, "STUDENT_DATABASE_PASSWORD", "student"},
			{migrations.OutboxSender, "SENDER_DATABASE_PASSWORD", "outbox-sender"},
			{migrations.OutboxCDC, "SENDER_CDC_DATABASE_PASSWORD", "outbox-sender"},
		},
		load: func(getenv func(string) string) (appConfig, error) {
			c, r, err := studentsvc.LoadConfig(getenv)
			return appConfig{names: r.Names(), defaults: defaults(r), addr: c.HTTPAddr, adminAddr: c.AdminAddr, dbURL: c.DatabaseURL, migrateURL: c.MigrateDatabaseURL}, err
		},
	},
	"users": {
		pkg: "./services/users", addrVar: "USERS_HTTP_ADDR", adminVar: "USERS_ADMIN_ADDR", dbVar: "USERS_DATABASE_URL",
		role: migrations.UsersApp, passwordVar: "USERS_DATABASE_PASSWORD", migrateVar: "USERS_MIGRATE_DATABASE_URL",
		logins: []login{{migrations.UsersApp, "USERS_DATABASE_PASSWORD", "users"}},
		load: func(getenv func(string) string) (appConfig, error) {
			c, r, err := usersvc.LoadConfig(getenv)
			return appConfig{names: r.Names(), defaults: defaults(r), addr: c.HTTPAddr, adminAddr: c.AdminAddr, dbURL: c.DatabaseURL, migrateURL: c.MigrateDatabaseURL}, err
		},
	},
	"outbox-sender": {
		pkg: "./outbox-sender", addrVar: "SENDER_ADMIN_ADDR", adminVar: "SENDER_ADMIN_ADDR", dbVar: "SENDER_DATABASE_URL",
		role: migrations.OutboxSender, passwordVar: "SENDER_DATABASE_PASSWORD",
		// SENDER_SOURCE=cdc streams the outbox's inserts from the WAL over a
		// replication connection. The compose file sets it up even while
		// the sender polls, so that the switch is one variable.
		more: []connection{{migrations.OutboxCDC, "SENDER_CDC_DATABASE_URL", "SENDER_CDC_DATABASE_PASSWORD", true}},
		load: func(getenv func(string) string) (appConfig, error) {
			c, r, err := sender.LoadConfig(getenv)
			return appConfig{names: r.Names(), defaults: defaults(r), addr: c.AdminAddr, adminAddr: c.AdminAddr, dbURL: c.DatabaseURL}, err
		},
	},
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
	{"users URL", checkUsersURL},
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
    secrets: [outbox_cdc_password]
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
		},
		"ports": {
			`"student": publishes container port 9090, but nothing listens there: STUDENT_HTTP_ADDR=":8080" listens on 8080, STUDENT_ADMIN_ADDR=":9190" listens on 9190`,
			`"users": container port 9091 is not in the Dockerfile's EXPOSE`,
			`"users": publishes its admin port 8091 (USERS_ADMIN_ADDR) on every interface`,
		},
		"database URLs": {
			`"student-migrate": STUDENT_MIGRATE_DATABASE_URL names database "students", but student-db's POSTGRES_DB is "student"`,
			`"student-migrate": STUDENT_MIGRATE_DATABASE_URL has the wrong password for student-db's administrator`,
			`"student": STUDENT_DATABASE_URL logs in as "postgres", but student runs as its own role, "student_app"`,
			`"users": USERS_DATABASE_URL points at "users-db", which is not a service`,
			`"outbox-sender": SENDER_DATABASE_URL points at users-db/users, but the sender works on Student's database, student-db/student`,
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
		},
		"users URL": {
			`SENDER_USERS_URL=http://users:8081 uses port 8081, but "users" listens on 9091`,
		},
		"start order": {
			`"student-db": has no healthcheck`,
			`"student-migrate": must depend on "student-db" with condition service_healthy, not service_started`,
			`"student": must depend on a migration of student-db/student with condition service_completed_successfully`,
			`"outbox-sender": must depend on a migration of users-db/users with condition service_completed_successfully`,
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
		name, _, ok := binaryOf(s)
		if !ok {
			continue // checkBuild reports it
		}
		cfg, err := config(s)
		for _, v := range slices.Sorted(maps.Keys(s.Environment)) {
			// The OpenTelemetry SDK reads its own variables; a misspelt
			// one would silently do nothing too.
			if strings.HasPrefix(v, "OTEL_") {
				if !otelVars[v] {
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
// on, and is in the image's EXPOSE. An admin port (metrics, and the
// sender's redrive) has no authentication, so it is published on the
// loopback interface only.
func checkPorts(d *deployment) []string {
	var problems []string
	for _, s := range d.goServices() {
		_, b, ok := binaryOf(s)
		if !ok || len(s.Ports) == 0 {
			continue
		}
		cfg, _ := config(s)
		listens := map[uint32]string{} // port → the variable that sets it
		var desc []string
		bad := false
		addrs := map[string]string{b.addrVar: cfg.addr, b.adminVar: cfg.adminAddr}
		for _, v := range slices.Compact([]string{b.addrVar, b.adminVar}) {
			port, err := portOf(addrs[v])
			if err != nil {
				problems = append(problems, fmt.Sprintf("%q: %s=%q: %v", s.Name, v, addrs[v], err))
				bad = true
				continue
			}
			listens[port] = v
			desc = append(desc, fmt.Sprintf("%s=%q listens on %d", v, addrs[v], port))
		}
		if bad {
			continue
		}
		var img image
		if s.Build != nil {
			img = d.images[dockerfilePath(s.Build)]
		}
		for _, p := range s.Ports {
			v, ok := listens[p.Target]
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("%q: publishes container port %d, but nothing listens there: %s", s.Name, p.Target, strings.Join(desc, ", ")))
			case v == b.adminVar && !loopback(p.HostIP):
				problems = append(problems, fmt.Sprintf("%q: publishes its admin port %d (%s) on every interface, but it has no authentication: publish it as \"127.0.0.1:%s:%d\"", s.Name, p.Target, v, cmp.Or(p.Published, strconv.Itoa(int(p.Target))), p.Target))
			}
			// An image that failed to load is checkBuild's to report.
			if img.installed != nil && !slices.Contains(img.expose, p.Target) {
				problems = append(problems, fmt.Sprintf("%q: container port %d is not in the Dockerfile's EXPOSE %v", s.Name, p.Target, img.expose))
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
	db := database{host: u.Hostname(), name: strings.TrimPrefix(u.Path, "/")}
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

// connectionsOf checks a runtime service's other connections (binary.more)
// and returns their URLs as the binary sees them, by variable. Each must
// log in as its own role to the database the service's main connection
// uses (main): the sender's replication slot and publication are in
// Student's database, next to the outbox.
func (d *deployment) connectionsOf(s types.ServiceConfig, main database) (map[string]*url.URL, []string) {
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
		if db != main {
			problems = append(problems, fmt.Sprintf("%q: %s points at %s, but %s points at %s: both must reach the same database", s.Name, c.dbVar, db, b.dbVar, main))
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
// roles: outbox_sender, and outbox_cdc for its replication connection): a
// container that could read another role's password could use that
// role's grants. A migration gets the administrator's and those of the
// runtime roles it sets, and must give each role the very secret the
// role's service logs in with, or the service is locked out after the
// first migration.
func checkRoleSecrets(d *deployment) []string {
	var problems []string
	loginSecret := map[string]map[string]string{} // role → secret → a service logging in with it
	for _, s := range d.goServices() {
		name, b, ok := binaryOf(s)
		if !ok || isMigration(s) {
			continue
		}
		cfg, _ := config(s)
		if u, err := url.Parse(cfg.dbURL); err == nil {
			if _, inURL := u.User.Password(); inURL && d.secretVars[s.Name][b.passwordVar+"_FILE"] == "" {
				problems = append(problems, fmt.Sprintf("%q: the password of %s is in %s: it must come from a secret, %s_FILE", s.Name, b.role, b.dbVar, b.passwordVar))
			}
		}
		if _, inline := s.Environment[b.passwordVar]; inline {
			problems = append(problems, fmt.Sprintf("%q: %s is set inline: the password of %s must come from a secret, %s_FILE", s.Name, b.passwordVar, b.role, b.passwordVar))
		}
		// Its other connections' passwords come from secrets too, whether
		// or not the binary opens them with this environment: the sender's
		// replication connection is set up while it polls, so that
		// SENDER_SOURCE=cdc is all it takes to switch.
		roles := []string{b.role}
		cons := []connection{{role: b.role, dbVar: b.dbVar, passwordVar: b.passwordVar}}
		for _, c := range b.more {
			roles = append(roles, c.role)
			cons = append(cons, c)
			if u, err := url.Parse(cfg.value(s.Environment, c.dbVar)); err == nil {
				if _, inURL := u.User.Password(); inURL && d.secretVars[s.Name][c.passwordVar+"_FILE"] == "" {
					problems = append(problems, fmt.Sprintf("%q: the password of %s is in %s: it must come from a secret, %s_FILE", s.Name, c.role, c.dbVar, c.passwordVar))
				}
			}
			if _, inline := s.Environment[c.passwordVar]; inline {
				problems = append(problems, fmt.Sprintf("%q: %s is set inline: the password of %s must come from a secret, %s_FILE", s.Name, c.passwordVar, c.role, c.passwordVar))
			}
		}
		mine := map[string]bool{}
		for _, c := range cons {
			own := d.secretVars[s.Name][c.passwordVar+"_FILE"]
			if own == "" {
				problems = append(problems, fmt.Sprintf("%q: %s_FILE does not name a secret mounted in the container: %s logs in as %s with its password from one", s.Name, c.passwordVar, name, c.role))
				continue
			}
			if loginSecret[c.role] == nil {
				loginSecret[c.role] = map[string]string{}
			}
			loginSecret[c.role][own] = s.Name
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
			switch {
			case secret == "":
				problems = append(problems, fmt.Sprintf("%q: %s_FILE does not name a secret mounted in the container: migrate sets the password of %s from it", s.Name, l.passwordVar, l.role))
			case len(loginSecret[l.role]) > 0 && loginSecret[l.role][secret] == "":
				problems = append(problems, fmt.Sprintf("%q: gives %s the password in secret %q, but %s logs in with %v", s.Name, l.role, secret, l.binary, slices.Sorted(maps.Keys(loginSecret[l.role]))))
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
	serving := map[string]database{} // the database of the binary's long-running service
	for _, s := range d.goServices() {
		name, _, ok := binaryOf(s)
		if !ok {
			continue
		}
		db, p := d.databaseOf(s)
		problems = append(problems, p...)
		_, p = d.connectionsOf(s, db)
		problems = append(problems, p...)
		if byBinary[name] == nil {
			byBinary[name] = map[database][]string{}
		}
		byBinary[name][db] = append(byBinary[name][db], s.Name)
		if !isMigration(s) {
			serving[name] = db
		}
	}
	for _, name := range slices.Sorted(maps.Keys(byBinary)) {
		if dbs := byBinary[name]; len(dbs) > 1 {
			problems = append(problems, fmt.Sprintf("the services running %s disagree on its database: %v", name, dbs))
		}
	}
	studentDB, okS := serving["student"]
	usersDB, okU := serving["users"]
	if okS && okU && studentDB == usersDB {
		problems = append(problems, fmt.Sprintf("Student and Users share database %s; each must own its own", studentDB))
	}
	// The sender owns no database: it claims rows from Student's outbox and
	// records the answers on Student's rows.
	if okS {
		for db, svcs := range byBinary["outbox-sender"] {
			if db != studentDB {
				problems = append(problems, fmt.Sprintf("%q: SENDER_DATABASE_URL points at %s, but the sender works on Student's database, %s", svcs[0], db, studentDB))
			}
		}
	}
	return problems
}

func checkUsersURL(d *deployment) []string {
	var problems []string
	for _, s := range d.goServices() {
		if name, _, _ := binaryOf(s); name != "outbox-sender" {
			continue
		}
		c, _, _ := sender.LoadConfig(getenvOf(s.Environment))
		u, err := url.Parse(c.UsersURL)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%q: SENDER_USERS_URL: %v", s.Name, err))
			continue
		}
		target, ok := d.project.Services[u.Hostname()]
		if name, _, _ := binaryOf(target); !ok || name != "users" || isMigration(target) {
			problems = append(problems, fmt.Sprintf("%q: SENDER_USERS_URL=%s: %q is not a service running Users", s.Name, c.UsersURL, u.Hostname()))
			continue
		}
		cfg, _ := config(target)
		want, err := portOf(cfg.addr)
		if err != nil {
			continue // checkPorts reports it
		}
		got := u.Port()
		if got == "" {
			got = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		if got != strconv.Itoa(int(want)) {
			problems = append(problems, fmt.Sprintf("%q: SENDER_USERS_URL=%s uses port %s, but %q listens on %d", s.Name, c.UsersURL, got, target.Name, want))
		}
	}
	return problems
}

func checkStartOrder(d *deployment) []string {
	var problems []string
	dbs := map[string]database{}
	healthchecked := map[string]bool{}
	for _, s := range d.goServices() {
		db, _ := d.databaseOf(s)
		dbs[s.Name] = db
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
	for _, s := range d.goServices() {
		if _, _, ok := binaryOf(s); !ok {
			continue
		}
		db := dbs[s.Name]
		if isMigration(s) {
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
		// queries; the migration must have finished, not merely started.
		migrated := false
		for dep, cond := range s.DependsOn {
			m, ok := d.project.Services[dep]
			if ok && isMigration(m) && dbs[dep] == db && cond.Condition == types.ServiceConditionCompletedSuccessfully {
				migrated = true
			}
		}
		if !migrated {
			problems = append(problems, fmt.Sprintf("%q: must depend on a migration of %s with condition %s", s.Name, db, types.ServiceConditionCompletedSuccessfully))
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
		u, err := url.Parse(sc.UsersURL)
		if err != nil {
			continue // checkUsersURL reports it
		}
		// The token must be one the Users the sender calls accepts, not
		// merely some Users of the project.
		switch users, ok := accepted[string(sc.UsersToken)]; {
		case sc.UsersToken == "":
			problems = append(problems, fmt.Sprintf("%q: SENDER_USERS_TOKEN is not set: the sender refuses to start without it", s.Name))
		case !ok || users != u.Hostname():
			problems = append(problems, fmt.Sprintf("%q: SENDER_USERS_TOKEN is not among the tokens %q accepts (USERS_API_TOKENS): Users would refuse every delivery", s.Name, u.Hostname()))
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
		urls, _ := d.connectionsOf(s, main)
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

// checkTracing: every serving Go service exports its spans to the
// profile's Jaeger, over OTLP/HTTP (the exporter the binaries have), and
// services running different binaries have different names, so that one
// trace shows the three processes apart. Without the profile the exports
// fail, which the services log and otherwise ignore.
func checkTracing(d *deployment) []string {
	var problems []string
	named := map[string]string{} // OTEL_SERVICE_NAME → the binary using it
	for _, s := range d.servingGoServices() {
		bin, _, _ := binaryOf(s)
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
// serving Go services, at the ports their own config loaders say. A target
// missing is a binary whose metrics no one sees; one too many is a target
// down for ever, usually a port changed on one side only.
func checkScrapes(d *deployment) []string {
	var problems []string
	want := map[string]string{} // "service:port" → the variable making it listen there
	for _, s := range d.servingGoServices() {
		_, b, _ := binaryOf(s)
		cfg, _ := config(s)
		port, err := portOf(cfg.adminAddr)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%q: %s=%q: %v", s.Name, b.adminVar, cfg.adminAddr, err))
			continue
		}
		want[net.JoinHostPort(s.Name, strconv.Itoa(int(port)))] = fmt.Sprintf("%s=%q", b.adminVar, cfg.adminAddr)
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
			if _, ok := want[target]; !ok {
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
