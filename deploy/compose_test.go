package deploy

// This file checks docker-compose.yml and the Dockerfile against the code,
// without Docker: the compose file is read by the same library Docker Compose
// uses, and every Go service's environment is fed to that binary's own
// LoadConfig. A misspelt variable, a port that nothing listens on or a
// migration that does not run first would otherwise only show up when
// somebody runs `docker compose up`.
//
// TestCompose runs every check (deployment_test.go lists them) on the real
// file, and TestComposeCheckerCatchesMistakes proves each one can fail. The
// checks themselves are in files by concern: services_test.go (the binaries
// and the image that builds them), environment_test.go, databases_test.go,
// calls_test.go, startorder_test.go, cdc_test.go, observability_test.go,
// grafana_test.go and dockerfile_test.go.
//
// It carries no build tag on purpose, so that plain `go test ./...` runs it.

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
)

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
			`SENDER_USERS_INBOX_RETENTION=168h0m0s ("outbox-sender") must not be longer than USERS_INBOX_RETENTION=24h0m0s ("users")`,
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
			`"lab": LAB_SENDER_ADMIN_TOKEN is not set: the page's redrive button would be refused (401)`,
			`"lab": LAB_STUDENT_TOKEN is not set: Student would refuse the page's students (401)`,
		},
		"admin ports answer their callers' names": {
			`"lab": LAB_USERS_ADMIN_URL=http://users:8091 calls "users" by a name its USERS_ADMIN_ALLOWED_HOSTS does not list`,
			`"prometheus": job "users" scrapes users:8091 by a name its USERS_ADMIN_ALLOWED_HOSTS does not list`,
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
		"prometheus loads the alert rules": {
			`"prometheus": loads rule file /etc/prometheus/alerts.yml, where nothing is mounted`,
			`"prometheus": does not load deploy/observability/alerts.yml`,
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
