package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/testkit/natsserver"
	"github.com/outboxref/outboxref/testkit/pgcluster"
)

// system is what make run started.
type system struct {
	cfg     config
	work    string             // binaries and logs, removed at the end
	cluster *pgcluster.Cluster // nil with RUN_DATABASE_URL
	server  *url.URL           // the PostgreSQL server, as its superuser
	procs   []*proc            // in start order
	nats    *natsserver.Server // nil unless SENDER_TRANSPORT=nats
	sec     secrets
}

// secrets are this run's passwords and tokens, made up at start. migrate
// sets each role's password from them, so a kept database takes the new
// ones at the next run.
type secrets struct {
	studentApp, usersApp, sender, cdc, lab string
	senderToken, operatorToken, labToken   string
}

// start builds the binaries, gets a database server, migrates both
// databases and starts the four processes, each once the one it calls is
// ready. On an error, what it started is returned to be stopped.
func start(ctx context.Context, cfg config, stdout io.Writer) (*system, error) {
	if _, err := os.Stat("go.work"); err != nil {
		return nil, errors.New("run it from the repository's root (make run)")
	}
	if err := cfg.checkPorts(cfg.databaseURL == ""); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "outboxref-run-")
	if err != nil {
		return nil, err
	}
	s := &system{cfg: cfg, work: work}
	for _, dir := range []string{"bin", "logs"} {
		if err := os.Mkdir(filepath.Join(work, dir), 0o755); err != nil {
			return s, err
		}
	}
	fmt.Fprintln(stdout, "building the binaries…")
	if err := build(ctx, filepath.Join(work, "bin")); err != nil {
		return s, err
	}
	if err := s.database(ctx, stdout); err != nil {
		return s, err
	}
	sec := secretsForRun()
	s.sec = sec
	if cfg.transport == "nats" {
		fmt.Fprintln(stdout, "starting a NATS server with JetStream…")
		s.nats, err = natsserver.Start(ctx, natsserver.Options{Dir: filepath.Join(work, "nats"), Port: cfg.port(portNATS)})
		if err != nil {
			return s, err
		}
	}
	fmt.Fprintln(stdout, "migrating Student's and Users' databases…")
	if err := s.migrate(ctx, sec); err != nil {
		return s, err
	}
	for _, p := range s.plan(sec) {
		proc, err := startProc(p.name, filepath.Join(work, "bin", p.bin), nil, p.env, filepath.Join(work, "logs"))
		if err != nil {
			return s, err
		}
		s.procs = append(s.procs, proc)
		if err := proc.waitReady(ctx, p.ready+"/readyz", 30*time.Second); err != nil {
			return s, err
		}
	}
	return s, nil
}

// build builds the four binaries into dir, as make build does.
func build(ctx context.Context, dir string) error {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = "/usr/local/go/bin/go"
	}
	cmd := exec.CommandContext(ctx, goCmd, "build", "-o", dir+"/", "./services/student", "./services/users", "./outbox-sender", "./lab")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	return nil
}

// database starts the throwaway cluster, or takes RUN_DATABASE_URL's
// server, and makes sure both databases exist.
func (s *system) database(ctx context.Context, stdout io.Writer) error {
	raw := s.cfg.databaseURL
	if raw == "" {
		fmt.Fprintln(stdout, "starting PostgreSQL…")
		c, err := pgcluster.Start(ctx, pgcluster.Options{Port: s.cfg.port(portPostgres), Home: s.cfg.dataDir, Durable: s.cfg.dataDir != ""})
		if err != nil {
			return fmt.Errorf("start a PostgreSQL from its server binaries (or name one in RUN_DATABASE_URL): %w", err)
		}
		s.cluster, raw = c, c.URL()
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("RUN_DATABASE_URL: %w", err)
	}
	s.server = u
	conn, err := pgx.Connect(ctx, raw)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL as its superuser: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if s.cfg.source == "cdc" {
		var level string
		if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
			return err
		}
		if level != "logical" {
			return fmt.Errorf("SENDER_SOURCE=cdc needs wal_level=logical, and this server has %s: set it and restart the server, or leave RUN_DATABASE_URL unset", level)
		}
	}
	for _, name := range []string{"student", "users"} {
		var exists bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
				return fmt.Errorf("create database %s: %w", name, err)
			}
		}
	}
	return nil
}

// dbURL is a database of the server, logged in as role (without a
// password: the binaries get theirs in *_DATABASE_PASSWORD).
func (s *system) dbURL(role, database string) string {
	u := *s.server
	u.User = url.User(role)
	u.Path = "/" + database
	if role == s.server.User.Username() {
		u.User = s.server.User // the superuser, as given
	}
	return u.String()
}

func (s *system) superuser() string { return s.server.User.Username() }

// printableURL is the superuser's URL of a database, for a person's psql:
// with the throwaway cluster's password, which make run made up, but
// without the one RUN_DATABASE_URL may hold.
func (s *system) printableURL(database string) string {
	u := *s.server
	if s.cluster == nil {
		u.User = url.User(s.superuser())
	}
	u.Path = "/" + database
	return u.String()
}

// senderURL is Student's database as the sender logs in to it, password
// included: what "outbox-sender dead" needs in SENDER_DATABASE_URL.
func (s *system) senderURL() string {
	u := *s.server
	u.User = url.UserPassword(migrations.OutboxSender, s.sec.sender)
	u.Path = "/student"
	return u.String()
}

// migrate runs both binaries' migrate, which create the roles and set
// their passwords.
func (s *system) migrate(ctx context.Context, sec secrets) error {
	bin, logs, base := filepath.Join(s.work, "bin"), filepath.Join(s.work, "logs"), s.baseEnv()
	student := append(slices.Clone(base),
		"STUDENT_MIGRATE_DATABASE_URL="+s.dbURL(s.superuser(), "student"),
		"STUDENT_DATABASE_PASSWORD="+sec.studentApp, "SENDER_DATABASE_PASSWORD="+sec.sender,
		"SENDER_CDC_DATABASE_PASSWORD="+sec.cdc, "LAB_STUDENT_DATABASE_PASSWORD="+sec.lab)
	users := append(slices.Clone(base),
		"USERS_MIGRATE_DATABASE_URL="+s.dbURL(s.superuser(), "users"),
		"USERS_DATABASE_PASSWORD="+sec.usersApp, "LAB_USERS_DATABASE_PASSWORD="+sec.lab)
	if err := runOnce(ctx, "student-migrate", filepath.Join(bin, "student"), []string{"migrate"}, student, logs); err != nil {
		return err
	}
	return runOnce(ctx, "users-migrate", filepath.Join(bin, "users"), []string{"migrate"}, users, logs)
}

// baseEnv is what every process gets from make run's own environment: a
// clean one, so that a variable set for something else does not leak in.
func (s *system) baseEnv() []string {
	env := []string{"LOG_LEVEL=" + s.cfg.logLevel}
	for _, name := range []string{"PATH", "HOME", "TMPDIR", "TZ"} {
		if v, ok := os.LookupEnv(name); ok {
			env = append(env, name+"="+v)
		}
	}
	return env
}

// step is one process to start: which binary, its environment, and the
// admin address whose /readyz says it is ready.
type step struct {
	name, bin string
	env       []string
	ready     string
}

// plan is the four processes in the order they start: each after what it
// calls. The sender calls Users through the lab's proxy, as in compose.
func (s *system) plan(sec secrets) []step {
	c := s.cfg
	with := func(kv ...string) []string { return append(slices.Clone(s.baseEnv()), kv...) }
	var usersBroker, senderBroker []string
	if s.nats != nil {
		usersBroker = []string{"USERS_NATS_URL=" + s.nats.URL, "USERS_NATS_PASSWORD=" + string(s.nats.Passwords[natsbus.UsersUser])}
		senderBroker = []string{"SENDER_TRANSPORT=nats", "SENDER_NATS_URL=" + s.nats.URL,
			"SENDER_NATS_PASSWORD=" + string(s.nats.Passwords[natsbus.SenderUser])}
	}
	return []step{
		{name: "users", bin: "users", ready: c.url(portUsersAdmin), env: with(append(usersBroker,
			"USERS_DATABASE_URL="+s.dbURL(migrations.UsersApp, "users"), "USERS_DATABASE_PASSWORD="+sec.usersApp,
			"USERS_API_TOKENS=outbox-sender:"+sec.senderToken+",operator:"+sec.operatorToken,
			"USERS_HTTP_ADDR="+c.addr(portUsers), "USERS_ADMIN_ADDR="+c.addr(portUsersAdmin))...)},
		{name: "student", bin: "student", ready: c.url(portStudentAdmin), env: with(
			"STUDENT_DATABASE_URL="+s.dbURL(migrations.StudentApp, "student"), "STUDENT_DATABASE_PASSWORD="+sec.studentApp,
			"STUDENT_API_TOKENS=operator:"+sec.operatorToken+",lab:"+sec.labToken,
			"STUDENT_HTTP_ADDR="+c.addr(portStudent), "STUDENT_ADMIN_ADDR="+c.addr(portStudentAdmin))},
		{name: "lab", bin: "lab", ready: c.url(portLabPage), env: with(
			"LAB_HTTP_ADDR="+c.addr(portLabPage), "LAB_PROXY_ADDR="+c.addr(portLabProxy),
			"LAB_USERS_URL="+c.url(portUsers), "LAB_STUDENT_URL="+c.url(portStudent),
			"LAB_STUDENT_ADMIN_URL="+c.url(portStudentAdmin), "LAB_USERS_ADMIN_URL="+c.url(portUsersAdmin),
			"LAB_SENDER_ADMIN_URL="+c.url(portSenderAdmin), "LAB_SENDER_ADMIN_TOKEN="+sec.labToken, "LAB_STUDENT_TOKEN="+sec.labToken,
			"LAB_STUDENT_DATABASE_URL="+s.dbURL(migrations.LabReader, "student"), "LAB_STUDENT_DATABASE_PASSWORD="+sec.lab,
			"LAB_USERS_DATABASE_URL="+s.dbURL(migrations.LabReader, "users"), "LAB_USERS_DATABASE_PASSWORD="+sec.lab)},
		{name: "outbox-sender", bin: "outbox-sender", ready: c.url(portSenderAdmin), env: with(append(senderBroker,
			"SENDER_DATABASE_URL="+s.dbURL(migrations.OutboxSender, "student"), "SENDER_DATABASE_PASSWORD="+sec.sender,
			"SENDER_USERS_URL="+c.url(portLabProxy), "SENDER_USERS_TOKEN="+sec.senderToken,
			"SENDER_ADMIN_ADDR="+c.addr(portSenderAdmin), "SENDER_SOURCE="+c.source,
			"SENDER_ADMIN_TOKENS=operator:"+sec.operatorToken+",lab:"+sec.labToken,
			"SENDER_CDC_DATABASE_URL="+s.dbURL(migrations.OutboxCDC, "student"), "SENDER_CDC_DATABASE_PASSWORD="+sec.cdc)...)},
	}
}

// wait returns when ctx ends (Ctrl-C), or with an error when a process
// stops by itself.
func (s *system) wait(ctx context.Context) error {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := exitedEarly(s.procs); err != nil {
				return err
			}
		}
	}
}

// stop stops the processes, the sender first (it hands back what it
// claimed), then the cluster, which it removes unless RUN_DATA_DIR keeps it.
func (s *system) stop(stdout io.Writer) {
	fmt.Fprintln(stdout, "\nstopping…")
	for _, p := range slices.Backward(s.procs) {
		p.stop()
	}
	if s.nats != nil {
		s.nats.Stop()
	}
	if s.cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.cluster.Cleanup(ctx); err != nil {
			fmt.Fprintln(stdout, "stopping PostgreSQL:", err)
		}
		if s.cfg.dataDir != "" {
			fmt.Fprintln(stdout, "the database is kept in", s.cfg.dataDir)
		}
	}
	_ = os.RemoveAll(s.work)
	fmt.Fprintln(stdout, "stopped")
}

// printBlock says where everything is, the operator's token and how to
// create a student: the one block a person needs.
func (s *system) printBlock(w io.Writer) {
	c := s.cfg
	database := "PostgreSQL " + net.JoinHostPort(s.server.Hostname(), s.server.Port())
	switch {
	case s.cluster != nil && c.dataDir == "":
		database += " (throwaway: removed when you stop)"
	case s.cluster != nil:
		database += " (kept in " + c.dataDir + ")"
	}
	if s.cluster != nil {
		// Every role logs in with its password, the administrator too.
		database += fmt.Sprintf("\n  its administrator postgres, password %s (kept in %s)", s.cluster.Password(), s.cluster.PasswordFile())
	}
	// The lab's faults act on the HTTP hop; with the broker the sender
	// never crosses it, and the block says where the commands go instead.
	proxy := "(the sender reaches Users through it)"
	if s.nats != nil {
		proxy = "(idle: the sender reaches Users through NATS at " + s.nats.URL + ")"
	}
	fmt.Fprintf(w, `
outboxref is running (SENDER_SOURCE=%s, SENDER_TRANSPORT=%s). Ctrl-C stops everything.

  Student's API     %s   (a bearer token per caller)
  Users' API        %s   (a bearer token per caller)
  sender's admin    %s   (/outbox with the operator's token, /metrics)
  fault lab's page  %s   (open it in a browser)
  fault lab's proxy %s   %s
  Student's admin   %s/metrics
  Users' admin      %s/metrics
  %s
  operator's token  %s   (both APIs, the sender's /outbox)
  logs              %s

For the curl session in the README, and the runbook:
  S=localhost:%d U=localhost:%d A=localhost:%d T=%s
  UDB=%s
  SDB=%s
The runbook's dead letters from the command line:
  SENDER_DATABASE_URL=$SDB %s dead list
Create a student:
  curl -si --oauth2-bearer $T --json '{"name":"Ada Lovelace","email":"ada@example.com","document_number":"123.456-7"}' $S/students
`, c.source, c.transport, c.url(portStudent), c.url(portUsers), c.url(portSenderAdmin), c.url(portLabPage), c.url(portLabProxy), proxy,
		c.url(portStudentAdmin), c.url(portUsersAdmin), database, s.sec.operatorToken, filepath.Join(s.work, "logs"),
		c.port(portStudent), c.port(portUsers), c.port(portSenderAdmin), s.sec.operatorToken, s.printableURL("users"),
		s.senderURL(), filepath.Join(s.work, "bin", "outbox-sender"))
}

// secretsForRun makes up this run's passwords and tokens: 32 hex digits
// each, which every role password and Users' token rules accept.
func secretsForRun() secrets {
	one := func() string {
		b := make([]byte, 16)
		_, _ = rand.Read(b) // crypto/rand never fails on Linux
		return hex.EncodeToString(b)
	}
	return secrets{
		studentApp: one(), usersApp: one(), sender: one(), cdc: one(), lab: one(),
		senderToken: one(), operatorToken: one(), labToken: one(),
	}
}
