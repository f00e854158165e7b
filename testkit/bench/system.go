package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/testkit/freeport"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// bench is what every measurement shares: the server, the built binaries,
// the statements, and the children and databases to clean up.
type bench struct {
	out    io.Writer
	server *url.URL // a superuser on the server measured on
	// durability says what kind of server that is, for the report.
	durability string
	// commitTimes: the server tracks commit timestamps, so latency can end
	// at the link's commit rather than at its transaction's start.
	commitTimes bool
	dir         string // logs, and the builds' binaries
	// bins is the directory of the binaries measured now: this checkout's,
	// or with -baseline, in turn, the baseline's (compare.go).
	bins string
	// env is more variables for every binary the bench starts to serve
	// (not to migrate): with -baseline, -env's, for this checkout only.
	env   []string
	q     queries
	procs *procs
	// postmaster is the process id of the bench's own cluster's
	// postmaster, whose CPU use the bench reads; 0 on another server.
	postmaster int
	// history is how many students each latency run's databases hold
	// before it starts (seedHistory).
	history int
	// statements: pg_stat_statements is loaded on the bench's own
	// cluster, so a run's work counts its statements (work.go).
	statements bool
	// perfDir (-perf) is where profiles of the runs at profileRate go,
	// and perfName the name of the run measured now; "" for none.
	perfDir, perfName string

	mu    sync.Mutex
	seq   int             // numbers databases and log files
	dbs   map[string]bool // databases created and not yet dropped
	slots map[string]bool // replication slots a cdc sender may have made, not yet dropped
}

// The sender's bearer token, as Users lists it (USERS_API_TOKENS).
const senderToken = "bench-sender-token-0123456789"

func (b *bench) next() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	return b.seq
}

func (b *bench) printf(format string, args ...any) {
	fmt.Fprintf(b.out, format, args...)
}

// dbURL is the server's URL for database name, logged in as role with
// password ("" for none: a process reads its password from a variable).
// role "" keeps the administrator.
func (b *bench) dbURL(name, role, password string) string {
	u := *b.server
	u.Path = "/" + name
	switch {
	case role != "" && password != "":
		u.User = url.UserPassword(role, password)
	case role != "":
		u.User = url.User(role)
	}
	return u.String()
}

// databases is a fresh pair, Student's and Users', migrated by the binaries.
type databases struct {
	student, users string // database names
	// slot is the replication slot a sender with SENDER_SOURCE=cdc uses
	// on Student's database (SENDER_CDC_SLOT): slots belong to the whole
	// server, so each pair has its own, dropped before its database.
	slot string
	// As the administrator: for seeding, counting and checking.
	studentAdmin, usersAdmin *pgxpool.Pool
}

// freshDatabases creates Student's and Users' databases and has the real
// binaries migrate them ("student migrate", "users migrate"), as a
// deployment does.
func (b *bench) freshDatabases(ctx context.Context) (*databases, error) {
	n := b.next()
	d := &databases{student: fmt.Sprintf("bench_student_%d", n), users: fmt.Sprintf("bench_users_%d", n), slot: fmt.Sprintf("bench_cdc_%d", n)}
	for _, name := range []string{d.student, d.users} {
		if err := b.createDatabase(ctx, name); err != nil {
			return nil, err
		}
	}
	if err := b.migrate(ctx, studentBin, d.student, n); err != nil {
		return nil, err
	}
	if err := b.migrate(ctx, usersBin, d.users, n); err != nil {
		return nil, err
	}
	var err error
	if d.studentAdmin, err = pgxpool.New(ctx, b.dbURL(d.student, "", "")); err != nil {
		return nil, fmt.Errorf("connect %s: %w", d.student, err)
	}
	if d.usersAdmin, err = pgxpool.New(ctx, b.dbURL(d.users, "", "")); err != nil {
		d.studentAdmin.Close()
		return nil, fmt.Errorf("connect %s: %w", d.users, err)
	}
	return d, nil
}

// createDatabase makes an empty database with synchronous commits, even on
// a TEST_DATABASE_URL server set up for tests' speed (such as make test's,
// with synchronous_commit=off): a commit that does not wait for its WAL
// would flatter every figure here. fsync is the server's own affair.
func (b *bench) createDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, b.server.String())
	if err != nil {
		return fmt.Errorf("create database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ident := pgx.Identifier{name}.Sanitize()
	b.mu.Lock()
	b.dbs[name] = true
	b.mu.Unlock()
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+ident+" SET synchronous_commit = on"); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// migrate runs "BIN migrate" on database name as the administrator, giving
// the runtime roles the tests' passwords: roles belong to the whole server,
// which `make test` may share.
func (b *bench) migrate(ctx context.Context, bin, name string, n int) error {
	var env []string
	switch bin {
	case studentBin:
		env = []string{
			"STUDENT_MIGRATE_DATABASE_URL=" + b.dbURL(name, "", ""),
			"STUDENT_DATABASE_PASSWORD=" + pgtest.Passwords[migrations.StudentApp],
			"SENDER_DATABASE_PASSWORD=" + pgtest.Passwords[migrations.OutboxSender],
			"SENDER_CDC_DATABASE_PASSWORD=" + pgtest.Passwords[migrations.OutboxCDC],
			"RECONCILER_STUDENT_DATABASE_PASSWORD=" + pgtest.Passwords[migrations.Reconciler],
		}
	case usersBin:
		env = []string{
			"USERS_MIGRATE_DATABASE_URL=" + b.dbURL(name, "", ""),
			"USERS_DATABASE_PASSWORD=" + pgtest.Passwords[migrations.UsersApp],
			"RECONCILER_USERS_DATABASE_PASSWORD=" + pgtest.Passwords[migrations.Reconciler],
		}
	}
	logPath := filepath.Join(b.dir, fmt.Sprintf("%s-migrate-%d.log", bin, n))
	p, err := startProc(filepath.Join(b.bins, bin), logPath, append(env, "LOG_LEVEL=warn"), "migrate")
	if err != nil {
		return err
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		p.stop()
		return ctx.Err()
	}
	if !p.cmd.ProcessState.Success() {
		return fmt.Errorf("%s migrate failed (%s); see %s", bin, p.cmd.ProcessState, logPath)
	}
	return nil
}

// drop closes the pools and drops both databases, and first the
// replication slot, if a cdc sender made one: a database that a slot
// decodes cannot be dropped, even WITH (FORCE).
func (b *bench) drop(d *databases) {
	d.studentAdmin.Close()
	d.usersAdmin.Close()
	b.dropSlots(d.slot)
	b.dropDatabases(d.student, d.users)
}

// dropSlots drops the named replication slots that exist. A slot that a
// sender still streams from cannot be dropped, and a sender reconnects
// fast, so its walsender is ended and the drop tried again until it
// succeeds (as dropSlot in outbox-sender/sender/cdc_test.go). The bench
// stops its senders before it drops anything; this is for a sender that
// did not stop.
func (b *bench) dropSlots(names ...string) {
	b.mu.Lock()
	var todo []string
	for _, name := range names {
		if b.slots[name] {
			todo = append(todo, name)
		}
	}
	b.mu.Unlock()
	if len(todo) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, b.server.String())
	if err != nil {
		b.printf("warning: drop replication slots %v: %v\n", todo, err)
		return
	}
	defer conn.Close(ctx)
	for _, name := range todo {
		for {
			_, _ = conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, name)
			_, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, name)
			if err == nil {
				b.mu.Lock()
				delete(b.slots, name)
				b.mu.Unlock()
				break
			}
			if ctx.Err() != nil {
				b.printf("warning: drop replication slot %s: %v\n", name, err)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func (b *bench) dropDatabases(names ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, b.server.String())
	if err != nil {
		b.printf("warning: drop databases %v: %v\n", names, err)
		return
	}
	defer conn.Close(ctx)
	for _, name := range names {
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			b.printf("warning: drop database %s: %v\n", name, err)
			continue
		}
		b.mu.Lock()
		delete(b.dbs, name)
		b.mu.Unlock()
	}
}

func (b *bench) dropAll() {
	b.mu.Lock()
	var names, slots []string
	for name := range b.dbs {
		names = append(names, name)
	}
	for name := range b.slots {
		slots = append(slots, name)
	}
	b.mu.Unlock()
	b.dropSlots(slots...)
	if len(names) > 0 {
		b.dropDatabases(names...)
	}
}

// Where the sender takes new rows from (SENDER_SOURCE).
const (
	sourcePoll = "poll" // the shipped default: the table, woken by notifications
	sourceCDC  = "cdc"  // the write-ahead log, through a logical replication slot
)

// system is the binaries running on one pair of databases.
type system struct {
	b      *bench
	d      *databases
	n      int                 // numbers the log files
	extra  map[string][]string // more variables, by binary (the soak's retentions)
	source string              // the sender's SENDER_SOURCE: sourcePoll or sourceCDC

	student, users, sender *proc
	// nats is the broker's process, when the sender's transport is
	// nats (brokered); natsURL and natsPasswords are how to reach it.
	nats                            *proc
	natsURL                         string
	natsPasswords                   map[string]string
	studentAddr, usersAddr, admAddr string // listen addresses, 127.0.0.1:port
	// Student's and Users' admin listeners (/metrics), unused by the
	// bench but given free ports so that no two systems collide.
	studentAdmAddr, usersAdmAddr string
}

// which of the binaries to start, and the sender's source ("" is poll,
// the shipped default).
type which struct {
	student, users, sender bool
	source                 string
}

// start starts the chosen binaries on d (see system.launch), Users before
// the sender, so that the sender never meets a Users that is not there yet.
func (b *bench) start(ctx context.Context, d *databases, w which, extra map[string][]string) (*system, error) {
	s, err := b.newSystem(d, extra)
	if err != nil {
		return nil, err
	}
	s.source = cmp.Or(w.source, sourcePoll)
	if b.brokered() && (w.users || w.sender) {
		if err := s.startBroker(ctx); err != nil {
			return nil, err
		}
	}
	for _, step := range []struct {
		want bool
		bin  string
	}{{w.users, usersBin}, {w.student, studentBin}, {w.sender, senderBin}} {
		if !step.want {
			continue
		}
		if err := s.launch(ctx, step.bin); err != nil {
			s.stop()
			return nil, err
		}
	}
	return s, nil
}

// newSystem picks the listen addresses; nothing runs yet.
func (b *bench) newSystem(d *databases, extra map[string][]string) (*system, error) {
	s := &system{b: b, d: d, n: b.next(), extra: extra}
	for _, addr := range []*string{&s.studentAddr, &s.usersAddr, &s.admAddr, &s.studentAdmAddr, &s.usersAdmAddr} {
		a, err := freeport.Addr()
		if err != nil {
			return nil, err
		}
		*addr = a
	}
	return s, nil
}

func (s *system) studentURL() string { return "http://" + s.studentAddr }

// launch starts one binary with shipped defaults and waits until it is
// ready: only what a deployment must set (its listen address, its database
// login, the tokens, where Users is) and LOG_LEVEL=warn, plus s.extra.
// Nothing tunes batches, polls or pools.
func (s *system) launch(ctx context.Context, bin string) error {
	b, d := s.b, s.d
	var (
		env   []string
		ready string
		slot  **proc
	)
	switch bin {
	case usersBin:
		slot, ready = &s.users, "http://"+s.usersAddr+"/readyz"
		env = []string{
			"USERS_HTTP_ADDR=" + s.usersAddr,
			"USERS_ADMIN_ADDR=" + s.usersAdmAddr,
			"USERS_DATABASE_URL=" + b.dbURL(d.users, migrations.UsersApp, ""),
			"USERS_DATABASE_PASSWORD=" + pgtest.Passwords[migrations.UsersApp],
			"USERS_API_TOKENS=" + senderCaller + ":" + senderToken,
		}
	case studentBin:
		slot, ready = &s.student, s.studentURL()+"/readyz"
		env = []string{
			"STUDENT_HTTP_ADDR=" + s.studentAddr,
			"STUDENT_ADMIN_ADDR=" + s.studentAdmAddr,
			"STUDENT_DATABASE_URL=" + b.dbURL(d.student, migrations.StudentApp, ""),
			"STUDENT_DATABASE_PASSWORD=" + pgtest.Passwords[migrations.StudentApp],
			// A build from before Student took callers ignores it.
			"STUDENT_API_TOKENS=" + clientCaller + ":" + clientToken,
		}
	case senderBin:
		slot, ready = &s.sender, "http://"+s.admAddr+"/readyz"
		env = []string{
			"SENDER_ADMIN_ADDR=" + s.admAddr,
			"SENDER_DATABASE_URL=" + b.dbURL(d.student, migrations.OutboxSender, ""),
			"SENDER_DATABASE_PASSWORD=" + pgtest.Passwords[migrations.OutboxSender],
			"SENDER_USERS_URL=http://" + s.usersAddr,
			"SENDER_USERS_TOKEN=" + senderToken,
		}
		if s.source == sourceCDC {
			// What a deployment must set for the cdc source: the source,
			// the replication login, and a slot of this database's own.
			env = append(env,
				"SENDER_SOURCE="+sourceCDC,
				"SENDER_CDC_DATABASE_URL="+b.dbURL(d.student, migrations.OutboxCDC, ""),
				"SENDER_CDC_DATABASE_PASSWORD="+pgtest.Passwords[migrations.OutboxCDC],
				"SENDER_CDC_SLOT="+d.slot,
			)
			b.mu.Lock()
			b.slots[d.slot] = true
			b.mu.Unlock()
		}
	default:
		return fmt.Errorf("launch: no binary %q", bin)
	}
	if s.natsURL != "" {
		// Users reads commands whatever the transport; the sender's is
		// b.env's SENDER_TRANSPORT.
		prefix, user := "USERS_", natsbus.UsersUser
		if bin == senderBin {
			prefix, user = "SENDER_", natsbus.SenderUser
		}
		env = append(env, prefix+"NATS_URL="+s.natsURL, prefix+"NATS_PASSWORD="+s.natsPasswords[user])
	}
	logPath := filepath.Join(b.dir, fmt.Sprintf("%s-%d.log", bin, s.n))
	env = append(append(append(env, "LOG_LEVEL=warn"), b.env...), s.extra[bin]...)
	p, err := startProc(filepath.Join(b.bins, bin), logPath, env)
	if err != nil {
		return err
	}
	switch {
	case s.source == sourceCDC && bin == senderBin:
		p.peakKey = senderBin + " (cdc)"
	case s.natsURL != "" && bin != studentBin:
		p.peakKey = bin + " (broker)"
	}
	b.procs.add(p)
	*slot = p
	return p.waitReady(ctx, ready)
}

// waitStreaming waits until a sender streams from the system's replication
// slot (pg_replication_slots shows it active): the cdc sender creates its
// slot at start, and rows committed before the slot existed are not
// streamed (the poll claims them after SENDER_CDC_GRACE).
func (s *system) waitStreaming(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var active bool
		err := s.d.studentAdmin.QueryRow(ctx,
			"SELECT COALESCE(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = $1", s.d.slot).Scan(&active)
		if err != nil {
			return fmt.Errorf("replication slot %s: %w", s.d.slot, err)
		}
		if active {
			return nil
		}
		if err := s.alive(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no sender streams from replication slot %s after 30s; see %s", s.d.slot, s.sender.logPath)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// batchSizes reads from the sender's /metrics how many rows its claims
// and its recording transactions carried on average so far
// (outbox_sender_claim_size_rows, outbox_sender_record_size_rows): with
// one or two, every row pays for a claim and a commit of its own.
func (s *system) batchSizes(ctx context.Context) (claim, record float64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.admAddr+"/metrics", nil)
	if err != nil {
		return 0, 0, fmt.Errorf("sender's metrics: %w", err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("sender's metrics: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("sender's metrics: %s", res.Status)
	}
	means, err := histogramMeans(res.Body, "outbox_sender_claim_size_rows", "outbox_sender_record_size_rows")
	if err != nil {
		return 0, 0, fmt.Errorf("sender's metrics: %w", err)
	}
	return means[0], means[1], nil
}

// histogramMeans reads Prometheus' text format and returns each named
// histogram's mean (its _sum over its _count; 0 before any observation).
// A histogram missing from the text is an error: a renamed metric must not
// read as zero.
func histogramMeans(r io.Reader, names ...string) ([]float64, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(names))
	for i, name := range names {
		f, ok := families[name]
		if !ok || f.GetType() != dto.MetricType_HISTOGRAM || len(f.GetMetric()) == 0 {
			return nil, fmt.Errorf("no histogram %s", name)
		}
		var sum float64
		var count uint64
		for _, m := range f.GetMetric() {
			sum += m.GetHistogram().GetSampleSum()
			count += m.GetHistogram().GetSampleCount()
		}
		if count > 0 {
			out[i] = sum / float64(count)
		}
	}
	return out, nil
}

func (s *system) running() []*proc {
	var out []*proc
	for _, p := range []*proc{s.student, s.users, s.sender, s.nats} {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

// alive fails when any of the system's processes has exited.
func (s *system) alive() error {
	for _, p := range s.running() {
		if err := p.alive(); err != nil {
			return err
		}
	}
	return nil
}

// stop stops the sender first, then Student and Users, recording each one's
// peak RSS.
func (s *system) stop() {
	for _, p := range []*proc{s.sender, s.student, s.users, s.nats} {
		if p != nil {
			s.b.procs.stop(p)
		}
	}
}

// natsdBin is the broker's process (testkit/natsserver/natsd), built from
// this checkout whatever the build measured.
const natsdBin = "natsd"

// brokerEnv is the setting of the broker form: the sender delivers through
// NATS JetStream, and Users reads the commands there.
const brokerEnv = "SENDER_TRANSPORT=nats"

// brokered says whether the binaries measured now run with
// SENDER_TRANSPORT=nats (the broker form's, or -env's with -baseline).
func (b *bench) brokered() bool {
	return slices.Contains(b.env, brokerEnv)
}

// startBroker starts a NATS server of the system's own, with the streams
// provisioned and fresh storage, as a process whose CPU counts with the
// others'.
func (s *system) startBroker(ctx context.Context) error {
	client, err := freeport.Addr()
	if err != nil {
		return err
	}
	ready, err := freeport.Addr()
	if err != nil {
		return err
	}
	_, port, _ := strings.Cut(client, ":")
	s.natsURL = "nats://" + client
	s.natsPasswords = map[string]string{}
	var pairs []string
	for _, user := range []string{"admin", natsbus.SenderUser, natsbus.UsersUser} {
		s.natsPasswords[user] = fmt.Sprintf("bench-%s-%d-0123456789", user, s.n)
		pairs = append(pairs, user+"="+s.natsPasswords[user])
	}
	dir := filepath.Join(s.b.dir, fmt.Sprintf("nats-%d", s.n))
	p, err := startProc(filepath.Join(s.b.dir, natsdBin), filepath.Join(s.b.dir, fmt.Sprintf("%s-%d.log", natsdBin, s.n)), []string{
		"NATSD_DIR=" + dir, "NATSD_PORT=" + port, "NATSD_READY_ADDR=" + ready, "NATSD_PASSWORDS=" + strings.Join(pairs, ","),
	})
	if err != nil {
		return err
	}
	s.b.procs.add(p)
	s.nats = p
	return p.waitReady(ctx, "http://"+ready+"/readyz")
}

// rolePool opens a pool on database name as a runtime role, configured as
// the binaries configure theirs (internal/database: the same server-side
// limits and dialer), with size connections: the bound's clients.
func (b *bench) rolePool(ctx context.Context, name, role string, size int32, statementTimeout time.Duration) (*pgxpool.Pool, error) {
	cfg, err := database.Config(b.dbURL(name, role, pgtest.Passwords[role]), database.Limits{MaxConns: size, StatementTimeout: statementTimeout})
	if err != nil {
		return nil, fmt.Errorf("pool as %s: %w", role, err)
	}
	// Opened up front (in the background), as a warm service's pool is.
	cfg.MinConns = size
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pool as %s: %w", role, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("pool as %s: %w", role, err)
	}
	return pool, nil
}
