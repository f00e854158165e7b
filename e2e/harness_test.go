//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/natsbus"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/invariant"
	"github.com/outboxref/outboxref/testkit/natsserver"
	"github.com/outboxref/outboxref/testkit/pgcluster"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// scenarioDef is one fault scenario.
type scenarioDef struct {
	id    string // "01-response-lost": number and name, also the subtest name
	title string
	opts  scenarioOptions
	run   func(s *scenario)
	// sources are the sources of new rows TestFaults runs the scenario
	// with, each as a subtest of its own; nil is both. A scenario that
	// runs once says why beside its definition.
	sources []string
}

// The sources of new rows a scenario's senders use (SENDER_SOURCE), and
// the label of a scenario that has no sender.
const (
	sourcePoll = "poll"
	sourceCDC  = "cdc"
	noSender   = "none"
)

// cdcGrace is SENDER_CDC_GRACE in the suite: how long a cdc sender's poll
// leaves a new row to the stream. Short, so that the rows a fault keeps
// from the stream (a dropped slot, a sender killed before it confirmed)
// are picked up within the scenario's seconds, not the default's 10s;
// long enough that the stream, which claims within milliseconds, is not
// raced by the poll for every row.
const cdcGrace = 2 * time.Second

type scenarioOptions struct {
	senders     int    // senders started with the scenario
	httpFaults  bool   // put the 5xx-injecting HTTP proxy in front of Users
	ownClusters bool   // fresh clusters for this scenario alone (it restarts them)
	usersCrash  string // CRASH_POINT for Users' first run
	usersPause  string // PAUSE_POINT for Users' first run
	// senderDBProxy and usersDBProxy put a dbProxy, which can freeze, between
	// the sender(s) and Student's database, or between Users and its own.
	// Student and the checker always connect directly.
	senderDBProxy bool
	usersDBProxy  bool
	// latency delays every answer from Users by this much (±50%), as a
	// real network would. It widens the window in which a request is in
	// flight, so that a random kill lands on one rather than on an idle
	// process.
	latency time.Duration
	// otlp is an OTLP/HTTP endpoint every process exports its spans to
	// (OTEL_EXPORTER_OTLP_ENDPOINT); "" leaves tracing off (trace_test.go).
	otlp string
	// source is where the senders take new rows from: sourcePoll (also
	// "") or sourceCDC; TestFaults sets it from scenarioDef.sources.
	source string
	// transport is how rows reach Users: transportHTTP (also "") or
	// transportNATS, through a NATS JetStream server the scenario starts.
	transport string
	// brokerNodes is 3 for a three-node JetStream cluster with streams
	// replicated on each; otherwise one server.
	brokerNodes int
	// senderBrokerProxy puts a Toxiproxy proxy between the senders and
	// the broker (scenario.brokerToxi), so that the broker can be cut
	// off from the sender alone.
	senderBrokerProxy bool
}

// The transports to Users (SENDER_TRANSPORT).
const (
	transportHTTP = "http"
	transportNATS = "nats"
)

// transportLabel is the transport a scenario runs with, for its summary.
func transportLabel(def scenarioDef) string {
	if def.opts.transport == "" {
		return transportHTTP
	}
	return def.opts.transport
}

// The sender's tuning for the suite: fast polls and backoffs so that
// recoveries take seconds, a request timeout short enough that "slower than
// the timeout" is quick to provoke, and a lease that passes the sender's own
// check (lease >= timeout * (2 + batch/concurrency) = 1s * 5). Attempts are
// effectively unlimited: a fault that lasts a few seconds must never
// dead-letter a row.
var senderTuning = []string{
	"SENDER_BATCH_SIZE=50",
	"SENDER_CONCURRENCY=16",
	"SENDER_POLL_INTERVAL=50ms",
	"SENDER_LEASE=5s",
	"SENDER_REQUEST_TIMEOUT=1s",
	"SENDER_MAX_ATTEMPTS=1000",
	"SENDER_BACKOFF_MIN=50ms",
	"SENDER_BACKOFF_MAX=1s",
}

// requestTimeout matches SENDER_REQUEST_TIMEOUT above.
const requestTimeout = time.Second

// The callers Users knows in the suite: the senders, and the suite itself
// where it calls Users directly (a seeded user, bursts of one key). Being
// two callers, their keys are two scopes, as in production.
const (
	senderCaller = "outbox-sender"
	senderToken  = "e2e-sender-token-0123456789"
	suiteToken   = "e2e-suite-token-0123456789"
	usersTokens  = senderCaller + ":" + senderToken + ",e2e-suite:" + suiteToken
	// Student's callers: the suite's clients, and the lab's page.
	labStudentToken = "e2e-lab-student-token-0123456789"
	studentTokens   = "e2e-suite:" + suiteToken + ",lab:" + labStudentToken
)

// asSuite is the Authorization header of the suite's own calls to Users
// and Student.
var asSuite = []string{"Authorization", "Bearer " + suiteToken}

// scenario is one running system: fresh databases, Users, Student, the
// fault proxy and the senders, plus what the scenario has learnt.
type scenario struct {
	t    *testing.T
	def  scenarioDef
	bins buildSet
	dir  string // logs; kept when the scenario fails
	rng  *rand.Rand
	ctx  context.Context

	studentCluster, usersCluster *pgcluster.Cluster
	studentURL, usersURL         string
	studentDB, usersDB           *pgxpool.Pool

	users, student *proc
	// broker is the NATS JetStream server between the sender and Users,
	// with the nats transport, or brokerNodes its cluster's nodes, each a
	// process (nil with HTTP); brokerURL and brokerPasswords are how to
	// reach either.
	broker          *natsserver.Server
	brokerNodes     []*proc
	brokerURL       string
	brokerPasswords map[string]auth.Secret
	// brokerToxi is the senders' way to the broker, with
	// senderBrokerProxy.
	brokerToxi    *faultProxy
	senders       []*proc
	usersAddr     string
	studentAddr   string
	usersAdmin    string // Users' admin listener (/metrics)
	studentAdmin  string // Student's admin listener (/metrics)
	toxi          *faultProxy
	faults        *httpFaults // nil unless opts.httpFaults
	client        *http.Client
	senderDBProxy *dbProxy // nil unless opts.senderDBProxy
	senderDBURL   string   // Student's database as the sender reaches it
	usersDBProxy  *dbProxy // nil unless opts.usersDBProxy
	// source is where the scenario's senders take new rows from
	// (opts.source, poll by default); slot is the replication slot its cdc
	// senders stream from, one per Student database, since slots belong to
	// the whole cluster.
	source     string
	slot       string
	cdcSenders bool // a cdc sender was started: settle checks the stream

	loads       []*studentLoad
	foreignKeys []string
	expect      invariant.Expect
	minReplays  int
	minRedeliv  int
	afterChecks []func(invariant.Report)
	notes       []string
	violations  []string
	// drain is how long the system took from the network's heal until every
	// student was linked (scenarios 11 to 13); settleWait overrides settle's
	// 90s wait for the outbox to empty, once a scenario has already seen it
	// fail to.
	drain      time.Duration
	settleWait time.Duration
}

// scenarioOutcome is what a scenario run found.
type scenarioOutcome struct {
	report     invariant.Report
	violations []string
	duration   time.Duration
	drain      time.Duration // 0 unless the scenario measures one
}

var dbCounter atomic.Int64

// runScenario builds a fresh system from bins, runs the scenario, waits
// until the system is quiet, and judges both databases. Harness failures
// (a process that will not start) fail t at once; what the checker finds
// is returned, so that the broken-build test can expect failures.
func runScenario(t *testing.T, def scenarioDef, bins buildSet) scenarioOutcome {
	start := time.Now()
	s := newScenario(t, def, bins)
	def.run(s)
	out := s.settle()
	out.duration = time.Since(start)
	verdict := "ok"
	if len(out.violations) > 0 {
		verdict = fmt.Sprintf("FAIL (%d)", len(out.violations))
	}
	recordResult(scenarioResult{name: def.id, source: sourceLabel(def), transport: transportLabel(def), build: bins.label, verdict: verdict, duration: out.duration, drain: out.drain, report: out.report, violations: out.violations})
	t.Logf("%s (%s) finished in %s: %s", def.id, sourceLabel(def), out.duration.Round(100*time.Millisecond), verdict)
	return out
}

func newScenario(t *testing.T, def scenarioDef, bins buildSet) *scenario {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s := &scenario{
		t: t, def: def, bins: bins, ctx: ctx,
		rng:    rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x0e2e)),
		client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: loadWorkers * 2}},
	}
	t.Cleanup(s.client.CloseIdleConnections)
	s.source = def.opts.source
	if s.source == "" || s.source == noSender {
		s.source = sourcePoll
	}
	s.dir = filepath.Join(suite.e2eDir, "logs", fmt.Sprintf("%s-%s-%s-%s", def.id, sourceLabel(def), bins.label, time.Now().Format("20060102-150405")))
	require.NoError(t, os.MkdirAll(s.dir, 0o755))
	// Registered first, so it runs last: after every process is dead and
	// every log written.
	t.Cleanup(func() {
		switch {
		case t.Failed():
			t.Logf("%s failed: its logs are kept in %s", def.id, s.dir)
		case os.Getenv("E2E_KEEP_LOGS") != "":
			t.Logf("logs of %s kept in %s (E2E_KEEP_LOGS)", def.id, s.dir)
		default:
			_ = os.RemoveAll(s.dir)
		}
	})

	s.studentCluster, s.usersCluster = suite.student, suite.users
	if def.opts.ownClusters {
		s.studentCluster, s.usersCluster = s.ownClusters()
	}
	s.studentURL = s.createDatabase(s.studentCluster, "student")
	s.usersURL = s.createDatabase(s.usersCluster, "users")
	// Any scenario may start a cdc sender (17 mixes both sources), so
	// every Student database gets a slot name of its own, named after it.
	// Registered before any process, so that it runs after every sender
	// is dead: a slot outlives its database's senders and keeps its WAL
	// for ever, and a database with a slot cannot be dropped.
	s.slot = "e2e_" + databaseName(t, s.studentURL)
	t.Cleanup(func() { s.dropSlotAtCleanup() })
	// As in production: migrate logs in as the administrator and gives
	// each runtime role its password (from the same secret file the
	// process logs in with); every process logs in as its own role.
	s.migrate(bins.student, "STUDENT_MIGRATE_DATABASE_URL="+s.studentURL,
		"STUDENT_DATABASE_PASSWORD_FILE="+roleSecret(t, migrations.StudentApp),
		"SENDER_DATABASE_PASSWORD_FILE="+roleSecret(t, migrations.OutboxSender),
		"SENDER_CDC_DATABASE_PASSWORD_FILE="+roleSecret(t, migrations.OutboxCDC),
		"RECONCILER_STUDENT_DATABASE_PASSWORD_FILE="+roleSecret(t, migrations.Reconciler))
	s.migrate(bins.users, "USERS_MIGRATE_DATABASE_URL="+s.usersURL,
		"USERS_DATABASE_PASSWORD_FILE="+roleSecret(t, migrations.UsersApp),
		"RECONCILER_USERS_DATABASE_PASSWORD_FILE="+roleSecret(t, migrations.Reconciler))
	s.studentDB = s.pool(s.studentURL)
	s.usersDB = s.pool(s.usersURL)

	usersDBURL := s.usersURL
	if def.opts.usersDBProxy {
		s.usersDBProxy, usersDBURL = newDBProxy(t, s.dir, "users-db", s.usersURL)
	}
	s.senderDBURL = s.studentURL
	if def.opts.senderDBProxy {
		s.senderDBProxy, s.senderDBURL = newDBProxy(t, s.dir, "sender-db", s.studentURL)
	}

	s.usersAddr = apitest.FreeAddr(t)
	// Admin listeners on free ports too: their defaults (:8090, :8091)
	// would collide between scenarios and with whatever else runs here.
	s.usersAdmin = apitest.FreeAddr(t)
	s.users = s.newProc("users", bins.users, "http://"+s.usersAddr+"/readyz",
		"USERS_HTTP_ADDR="+s.usersAddr, "USERS_ADMIN_ADDR="+s.usersAdmin, "USERS_INBOX_RETENTION=168h", "LOG_LEVEL=info",
		"USERS_DATABASE_URL="+asRole(t, usersDBURL, migrations.UsersApp),
		"USERS_DATABASE_PASSWORD_FILE="+roleSecret(t, migrations.UsersApp),
		"USERS_API_TOKENS="+usersTokens)
	s.users.env = append(s.users.env, s.tracingEnv()...)
	if def.opts.transport == transportNATS {
		s.startBroker()
		s.users.env = append(s.users.env, "USERS_NATS_URL="+s.brokerURL,
			"USERS_NATS_PASSWORD="+string(s.brokerPasswords[natsbus.UsersUser]))
	}
	var usersExtra []string
	if def.opts.usersCrash != "" {
		usersExtra = append(usersExtra, "CRASH_POINT="+def.opts.usersCrash)
	}
	if def.opts.usersPause != "" {
		usersExtra = append(usersExtra, "PAUSE_POINT="+def.opts.usersPause)
	}
	s.startProc(s.users, usersExtra...)

	upstream := s.usersAddr
	if def.opts.httpFaults {
		s.faults, upstream = newHTTPFaults(t, s.usersAddr)
	}
	s.toxi = newFaultProxy(t, s.dir, def.id, upstream)
	if def.opts.latency > 0 {
		ms := def.opts.latency.Milliseconds()
		s.toxi.add("network-latency", "latency", "downstream", map[string]any{"latency": ms, "jitter": ms / 2})
		s.note("answers from Users delayed %s ± %s throughout (latency toxic, downstream)", def.opts.latency, def.opts.latency/2)
	}

	s.studentAddr = apitest.FreeAddr(t)
	s.studentAdmin = apitest.FreeAddr(t)
	s.student = s.newProc("student", bins.student, "http://"+s.studentAddr+"/readyz",
		"STUDENT_HTTP_ADDR="+s.studentAddr, "STUDENT_ADMIN_ADDR="+s.studentAdmin, "LOG_LEVEL=info",
		"STUDENT_DATABASE_URL="+asRole(t, s.studentURL, migrations.StudentApp),
		"STUDENT_DATABASE_PASSWORD_FILE="+roleSecret(t, migrations.StudentApp), "STUDENT_API_TOKENS="+studentTokens)
	s.student.env = append(s.student.env, s.tracingEnv()...)
	s.startProc(s.student)

	for range def.opts.senders {
		s.startProc(s.newSender())
	}
	return s
}

// ownClusters starts two clusters for a scenario that restarts them.
func (s *scenario) ownClusters() (student, users *pgcluster.Cluster) {
	t := s.t
	var wg sync.WaitGroup
	var errStudent, errUsers error
	wg.Go(func() { student, errStudent = startCluster("student") })
	wg.Go(func() { users, errUsers = startCluster("users") })
	wg.Wait()
	for _, c := range []*pgcluster.Cluster{student, users} {
		if c == nil {
			continue
		}
		t.Cleanup(func() {
			if t.Failed() || os.Getenv("E2E_KEEP_LOGS") != "" {
				if b, err := os.ReadFile(c.LogPath()); err == nil {
					_ = os.WriteFile(filepath.Join(s.dir, fmt.Sprintf("postgres-%d.log", c.Port())), b, 0o644)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := c.Cleanup(ctx); err != nil {
				t.Errorf("remove cluster: %v", err)
			}
			untrackCluster(c)
		})
	}
	require.NoError(t, errStudent)
	require.NoError(t, errUsers)
	return student, users
}

// createDatabase makes a fresh, empty database with durable commits (see
// pgcluster.CreateDatabase), named after the scenario for inspection.
func (s *scenario) createDatabase(c *pgcluster.Cluster, role string) string {
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	name := fmt.Sprintf("s%s_%s_%s_%d", s.def.id[:2], strings.ReplaceAll(s.bins.label, "-", "_"), role, dbCounter.Add(1))
	url, err := c.CreateDatabase(ctx, name)
	require.NoError(s.t, err)
	return url
}

// migrate runs "BINARY migrate", as a deployment would.
func (s *scenario) migrate(bin string, env ...string) {
	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "migrate")
	cmd.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin", "LOG_LEVEL=warn"}, env...)
	out, err := cmd.CombinedOutput()
	require.NoError(s.t, err, "%s migrate: %s", filepath.Base(bin), out)
}

// asRole returns dbURL logging in as role, without a password: the
// process reads it from its secret file.
func asRole(t *testing.T, dbURL, role string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.User(role)
	return u.String()
}

// roleSecrets holds the runtime roles' passwords, one file each, written
// once for the suite like the secret files compose mounts. They are
// pgtest's: roles belong to a whole cluster, and this package's in-process
// tests, which log in through pgtest, share the Student cluster (main_test.go
// lends it as TEST_DATABASE_URL).
var roleSecrets = struct {
	sync.Mutex
	files map[string]string
}{files: map[string]string{}}

func roleSecret(t *testing.T, role string) string {
	t.Helper()
	roleSecrets.Lock()
	defer roleSecrets.Unlock()
	if f, ok := roleSecrets.files[role]; ok {
		return f
	}
	dir := filepath.Join(suite.work, "secrets")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	f := filepath.Join(dir, role)
	require.NoError(t, os.WriteFile(f, []byte(pgtest.Passwords[role]+"\n"), 0o600))
	roleSecrets.files[role] = f
	return f
}

func (s *scenario) pool(url string) *pgxpool.Pool {
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(s.t, err)
	cfg.MaxConns = 2
	p, err := pgxpool.NewWithConfig(s.ctx, cfg)
	require.NoError(s.t, err)
	s.t.Cleanup(p.Close)
	return p
}

// newProc prepares a process; every process is killed at cleanup.
func (s *scenario) newProc(name, bin, ready string, env ...string) *proc {
	p := &proc{name: name, bin: bin, env: env, ready: ready, logPath: filepath.Join(s.dir, name+".log")}
	s.t.Cleanup(func() {
		p.killGroup()
		untrackProc(p)
	})
	return p
}

// newSender prepares one more sender on the scenario's outbox, with the
// scenario's source.
func (s *scenario) newSender() *proc { return s.newSenderOf(s.source) }

// newSenderOf prepares one more sender on the scenario's outbox, taking
// new rows from source (sourcePoll or sourceCDC).
func (s *scenario) newSenderOf(source string) *proc {
	n := len(s.senders) + 1
	admin := apitest.FreeAddr(s.t)
	env := append([]string{
		"SENDER_DATABASE_URL=" + asRole(s.t, s.senderDBURL, migrations.OutboxSender),
		"SENDER_DATABASE_PASSWORD_FILE=" + roleSecret(s.t, migrations.OutboxSender),
		"SENDER_USERS_URL=http://" + s.toxi.addr(),
		"SENDER_ADMIN_ADDR=" + admin,
		"SENDER_ID=sender-" + strconv.Itoa(n),
		"SENDER_USERS_TOKEN=" + senderToken,
		"LOG_LEVEL=info",
	}, senderTuning...)
	env = append(env, s.tracingEnv()...)
	if s.brokerURL != "" {
		senderBroker := s.brokerURL
		if s.brokerToxi != nil {
			senderBroker = "nats://" + s.brokerToxi.addr()
		}
		env = append(env, "SENDER_TRANSPORT=nats", "SENDER_NATS_URL="+senderBroker,
			"SENDER_NATS_PASSWORD="+string(s.brokerPasswords[natsbus.SenderUser]),
			// Short, so that a command the broker lost is asked for again
			// within a scenario; the broker drops a repeat it still holds.
			"SENDER_NATS_ANSWER_WAIT=2s")
	}
	if source == sourceCDC {
		s.cdcSenders = true
		// The replication connection takes the same way to the database
		// as the sender's pool, so a freeze catches the stream too: the
		// sender must notice that the server stopped answering its
		// heartbeats, and stream again once the network heals.
		cdcURL := s.senderDBURL
		env = append(env,
			"SENDER_SOURCE=cdc",
			"SENDER_CDC_DATABASE_URL="+asRole(s.t, cdcURL, migrations.OutboxCDC),
			"SENDER_CDC_DATABASE_PASSWORD_FILE="+roleSecret(s.t, migrations.OutboxCDC),
			"SENDER_CDC_SLOT="+s.slot,
			"SENDER_CDC_GRACE="+cdcGrace.String())
	}
	p := s.newProc("sender-"+strconv.Itoa(n), s.bins.sender, "http://"+admin+"/readyz", env...)
	s.senders = append(s.senders, p)
	return p
}

// startProc starts p and waits until it is ready. A run with a crash point
// may end before it is seen ready; the scenario judges that itself.
func (s *scenario) startProc(p *proc, extra ...string) {
	s.t.Helper()
	require.NoError(s.t, p.start(extra...))
	err := p.waitReady(20 * time.Second)
	if errors.Is(err, errExited) && len(extra) > 0 {
		return
	}
	require.NoError(s.t, err)
}

// sleep pauses for a random duration in [lo, hi).
func (s *scenario) sleep(lo, hi time.Duration) {
	time.Sleep(lo + time.Duration(s.rng.Int64N(int64(hi-lo))))
}

func (s *scenario) note(format string, args ...any) {
	s.notes = append(s.notes, fmt.Sprintf(format, args...))
}

// violate records something the scenario itself saw go wrong.
func (s *scenario) violate(format string, args ...any) {
	s.violations = append(s.violations, fmt.Sprintf(format, args...))
}

// eventually polls cond until it holds, and records a violation if it does
// not within the timeout. Every wait in the suite is bounded.
func (s *scenario) eventually(timeout time.Duration, what string, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			s.violate("timed out after %s waiting until %s", timeout, what)
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// count runs a count query, returning -1 while the database is unreachable.
func (s *scenario) count(db *pgxpool.Pool, sql string) int {
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
	defer cancel()
	var n int
	if err := db.QueryRow(ctx, sql).Scan(&n); err != nil {
		return -1
	}
	return n
}

// expectCrash waits for a run started with a crash point to kill itself
// there, and reports whether it did.
func (s *scenario) expectCrash(p *proc, point string, timeout time.Duration) bool {
	st, exited := p.waitExit(timeout)
	switch {
	case !exited:
		s.violate("%s did not reach crash point %s within %s", p.name, point, timeout)
		p.killGroup()
		return false
	case !killedBySIGKILL(st):
		s.violate("%s ended with %s instead of crashing at %s", p.name, st, point)
		return false
	case !p.logContains("crashpoint: " + point + " hit"):
		s.violate("%s was killed, but its log does not show crash point %s", p.name, point)
		return false
	}
	return true
}

func (s *scenario) acked() []uuid.UUID {
	var ids []uuid.UUID
	for _, l := range s.loads {
		ids = append(ids, l.ackedIDs()...)
	}
	return ids
}

// settle waits until the system is quiet (every load answered, no outbox
// row pending), then reads both databases and judges them.
func (s *scenario) settle() scenarioOutcome {
	t := s.t
	for i, l := range s.loads {
		if !l.wait(3 * time.Minute) {
			s.violate("load %d still running after 3m", i+1)
		}
		l.mu.Lock()
		if len(l.failures) > 0 {
			s.violate("the load driver got no 201 for %d students; first: %s", len(l.failures), l.failures[0])
		}
		retries, replayed := l.retries, l.replayed
		l.mu.Unlock()
		if retries > 0 {
			s.note("load %d: %d students, %d POST retries, %d answered from Student's inbox", i+1, len(l.ackedIDs()), retries, replayed)
		}
	}
	settleStart := time.Now()
	settleWait := 90 * time.Second
	if s.settleWait > 0 {
		settleWait = s.settleWait
	}
	// A published row (SENDER_TRANSPORT=nats) waits for Users' answer:
	// not settled either. Its reply may come only after the broker's ack
	// wait, when a sender was killed holding it.
	if s.eventually(settleWait, "no outbox row is pending or published", func() bool {
		return s.count(s.studentDB, "SELECT count(*) FROM outbox WHERE state IN ('pending', 'published')") == 0
	}) {
		s.note("quiet %s after the last fault and load", time.Since(settleStart).Round(100*time.Millisecond))
	}
	for _, p := range append([]*proc{s.users, s.student}, s.senders...) {
		for _, why := range p.takeSurprises() {
			s.violate("%s", why)
		}
	}
	if s.cdcSenders {
		s.checkStream()
	}

	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	defer cancel()
	st, err := invariant.Load(ctx, s.studentURL, s.usersURL)
	require.NoError(t, err, "the checker could not read the databases")
	rep := invariant.Classify(st, invariant.Input{ForeignKeys: s.foreignKeys, Acked: s.acked(), Caller: senderCaller})

	v := invariant.Violations(rep, s.expect)
	if rep.Replays < s.minReplays {
		v = append(v, fmt.Sprintf("replays = %d, want at least %d", rep.Replays, s.minReplays))
	}
	if rep.Redeliveries < s.minRedeliv {
		v = append(v, fmt.Sprintf("redeliveries = %d, want at least %d", rep.Redeliveries, s.minRedeliv))
	}
	v = append(v, s.checkAPI(rep, st)...)
	reconciled, rv := s.reconcile()
	v = append(v, rv...)
	for _, f := range s.afterChecks {
		f(rep)
	}
	v = append(v, s.violations...)

	var b strings.Builder
	fmt.Fprintf(&b, "\n=== %s: %s [%s build]\n", s.def.id, s.def.title, s.bins.label)
	for _, n := range s.notes {
		fmt.Fprintf(&b, "  %s\n", n)
	}
	if len(rep.ClaimedBy) > 1 {
		fmt.Fprintf(&b, "  delivered rows by last claimer: %v\n", rep.ClaimedBy)
	}
	b.WriteString(rep.Table())
	b.WriteString(reconciled)
	if len(v) > 0 {
		b.WriteString("VIOLATIONS:\n  " + strings.Join(v, "\n  ") + "\n")
	} else {
		b.WriteString("verdict: nothing lost, nothing duplicated\n")
	}
	t.Log(b.String())
	_ = os.WriteFile(filepath.Join(s.dir, "report.txt"), []byte(b.String()), 0o644)
	return scenarioOutcome{report: rep, violations: v, drain: s.drain}
}

// checkAPI compares what Student's API shows for each acknowledged student
// with the checker's verdict: linked with the same user id, or failed for a
// dead-lettered row. It is what a user of the system would see.
func (s *scenario) checkAPI(rep invariant.Report, st invariant.State) []string {
	userOf := map[uuid.UUID]uuid.UUID{}
	for _, row := range st.Students {
		userOf[row.ID] = row.UserID.UUID
	}
	var v []string
	bad := 0
	for _, id := range s.acked() {
		class, ok := rep.ByClass[id]
		if !ok {
			continue // vanished: already a violation
		}
		var got struct {
			UserID       *uuid.UUID `json:"user_id"`
			Provisioning struct {
				State  string `json:"state"`
				Reason *struct {
					Class string `json:"class"`
				} `json:"reason"`
			} `json:"provisioning"`
		}
		req, err := http.NewRequest(http.MethodGet, "http://"+s.studentAddr+"/students/"+id.String(), nil)
		var resp *http.Response
		if err == nil {
			req.Header.Set(asSuite[0], asSuite[1])
			resp, err = s.client.Do(req)
		}
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&got)
			resp.Body.Close()
		}
		var why string
		switch {
		case err != nil:
			why = err.Error()
		case class == invariant.Linked && (got.Provisioning.State != "linked" || got.UserID == nil || *got.UserID != userOf[id]):
			why = fmt.Sprintf("state %q, user_id %v; the database has %s", got.Provisioning.State, got.UserID, userOf[id])
		case class == invariant.Dead && (got.Provisioning.State != "failed" || got.Provisioning.Reason == nil):
			why = fmt.Sprintf("state %q for a dead-lettered row", got.Provisioning.State)
		}
		if why != "" {
			bad++
			if bad <= 3 {
				v = append(v, fmt.Sprintf("GET /students/%s disagrees with the checker (%s): %s", id, class, why))
			}
		}
	}
	if bad > 3 {
		v = append(v, fmt.Sprintf("... and %d more students whose API view disagrees", bad-3))
	}
	return v
}

// The frozen-connection scenarios (11 to 13): how long the network stays
// frozen, and the bound on the drain after it heals. The bound is the
// issue's promise: with the limits of internal/database (a session idle in a
// transaction is ended after 10s) the system is linked again within it.
const (
	freezeHold = 5 * time.Second
	drainBound = 60 * time.Second
)

// caughtSession is a database session the freeze caught inside a
// transaction: the server still has it, idle, with its locks.
type caughtSession struct {
	pid  int32
	idle time.Duration // since its last statement, when the network healed
}

// freezeAtPause waits until p holds still at its pause point, freezes px
// (every connection through it stops; the one p holds sends its next
// statement into the freeze), keeps the network frozen for freezeHold and
// heals it. It returns when it healed and the sessions that the freeze left
// inside a transaction, read from db's pg_stat_activity. With wantTx, a
// freeze that caught no transaction is a violation: the scenario would not
// have tested what it claims.
func (s *scenario) freezeAtPause(p *proc, point string, px *dbProxy, db *pgxpool.Pool, forbidTx bool) (healed time.Time, caught []caughtSession, ok bool) {
	marker := "pausepoint: " + point + " reached"
	if !s.waitLog(p, marker, 45*time.Second) {
		s.violate("%s never reached pause point %s within 45s", p.name, point)
		return time.Time{}, nil, false
	}
	px.freeze()
	// Sessions inside a transaction when the network froze: normally still
	// there when it heals, but a client that gives up on its statement may
	// close its end, and the proxy may pass the close on, ending the
	// session early. Either way the freeze caught that transaction.
	atFreeze := s.sessionsInTx(db, px.app)
	time.Sleep(freezeHold)
	caught = s.sessionsInTx(db, px.app)
	if len(caught) == 0 && len(atFreeze) > 0 {
		s.note("the %d session(s) inside a transaction when the network froze had ended before it healed", len(atFreeze))
		caught = atFreeze
	}
	px.heal()
	healed = time.Now()
	dirs, bytes := px.caught()
	pids := make([]string, len(caught))
	for i, c := range caught {
		pids[i] = fmt.Sprintf("pid %d idle %s", c.pid, c.idle.Round(100*time.Millisecond))
	}
	s.note("%s held still at %s; the network to its database froze meanwhile and healed %s later: %d connection directions caught, %d bytes dropped; sessions left inside a transaction: %d %v",
		p.name, point, freezeHold, dirs, bytes, len(caught), pids)
	if dirs == 0 {
		s.violate("the freeze caught no connection: %s sent nothing into it", p.name)
	}
	if forbidTx && len(caught) > 0 {
		s.violate("the freeze left %d session(s) of %s inside a transaction: it waited for a round trip inside one", len(caught), p.name)
	}
	return healed, caught, true
}

// drainAfterHeal waits until every load has been answered and every
// student is linked, at most drainBound after healed, and records how long
// it took. It also follows the sessions the freeze caught inside a
// transaction: each must have been ended by the server by then, or its
// locks would hold rows for ever.
func (s *scenario) drainAfterHeal(healed time.Time, db *pgxpool.Pool, caught []caughtSession) {
	pids := make([]int32, len(caught))
	for i, c := range caught {
		pids[i] = c.pid
	}
	var sessionsEnded, d time.Duration
	left := len(caught)
	drained := false
	for time.Since(healed) < drainBound {
		if left > 0 {
			// count is -1 while the database does not answer: keep the last.
			if n := s.count(db, fmt.Sprintf("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY('{%s}'::int[])", joinInts(pids))); n >= 0 {
				if left = n; left == 0 {
					sessionsEnded = time.Since(healed)
				}
			}
		}
		if !drained && s.loadsDone() &&
			s.count(s.studentDB, "SELECT count(*) FROM students WHERE user_id IS NULL") == 0 &&
			s.count(s.studentDB, "SELECT count(*) FROM outbox WHERE state = 'pending'") == 0 {
			drained, d = true, time.Since(healed)
		}
		// A caught session need not hold up the drain (it may hold rows
		// that were settled again meanwhile, or none), but it must still
		// end: keep watching it until the server ends it or the bound.
		if drained && left == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(caught) > 0 && left == 0 {
		s.note("the server ended the %d session(s) caught in a transaction %s after the heal", len(caught), sessionsEnded.Round(100*time.Millisecond))
	}
	if left > 0 {
		s.violate("%d of the %d session(s) the freeze caught inside a transaction are still open %s after the heal, holding their locks: nothing ends them",
			left, len(caught), time.Since(healed).Round(time.Second))
	}
	if !drained {
		s.violate("not drained within %s of the heal: %d students unlinked, %d outbox rows pending", drainBound,
			s.count(s.studentDB, "SELECT count(*) FROM students WHERE user_id IS NULL"),
			s.count(s.studentDB, "SELECT count(*) FROM outbox WHERE state = 'pending'"))
		// settle would wait its 90s for the same rows: the verdict is in.
		s.settleWait = 5 * time.Second
		return
	}
	s.drain = d
	s.note("drained: every student linked %s after the heal (bound %s)", d.Round(100*time.Millisecond), drainBound)
}

func joinInts(xs []int32) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(int(x))
	}
	return strings.Join(s, ",")
}

// sessionsInTx lists the sessions of application app that sit idle inside
// a transaction (or an aborted one).
func (s *scenario) sessionsInTx(db *pgxpool.Pool, app string) []caughtSession {
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
	defer cancel()
	rows, err := db.Query(ctx, `SELECT pid, (extract(epoch FROM now() - state_change) * 1000)::bigint
		FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1 AND state LIKE 'idle in transaction%'
		ORDER BY pid`, app)
	if err != nil {
		s.violate("read pg_stat_activity: %v", err)
		return nil
	}
	var out []caughtSession
	for rows.Next() {
		var c caughtSession
		var ms int64
		if err := rows.Scan(&c.pid, &ms); err != nil {
			s.violate("read pg_stat_activity: %v", err)
			return nil
		}
		c.idle = time.Duration(ms) * time.Millisecond
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		s.violate("read pg_stat_activity: %v", err)
	}
	return out
}

func (s *scenario) loadsDone() bool {
	for _, l := range s.loads {
		if !closed(l.done) {
			return false
		}
	}
	return true
}

// waitLog polls p's log until it has marker.
func (s *scenario) waitLog(p *proc, marker string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for !p.logContains(marker) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// reconcilerEnv is the reconciler's environment on the scenario's two
// databases, as its own read-only role.
func (s *scenario) reconcilerEnv() []string {
	return []string{
		"RECONCILER_STUDENT_DATABASE_URL=" + asRole(s.t, s.studentURL, migrations.Reconciler),
		"RECONCILER_STUDENT_DATABASE_PASSWORD_FILE=" + roleSecret(s.t, migrations.Reconciler),
		"RECONCILER_USERS_DATABASE_URL=" + asRole(s.t, s.usersURL, migrations.Reconciler),
		"RECONCILER_USERS_DATABASE_PASSWORD_FILE=" + roleSecret(s.t, migrations.Reconciler),
		"RECONCILER_SENDER_CALLER=" + senderCaller}
}

// reconcile runs the shipped reconciler once on the scenario's two
// databases, as its own read-only role, after the checker: the same rules
// (internal/drift) applied the way an operator would, through the binary,
// its paged reads and its role's grants. A quiet system must show no drift
// (exit status 0), no stuck row, and exactly the dead rows the scenario
// provokes. It returns the report's line for the scenario's report, and
// what is wrong.
func (s *scenario) reconcile() (string, []string) {
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.bins.reconciler, "once", "--json")
	cmd.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, s.reconcilerEnv()...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	_ = os.WriteFile(filepath.Join(s.dir, "reconciler.json"), out, 0o644)
	var r struct {
		Drift   bool `json:"drift"`
		Classes map[string]struct {
			Count     int      `json:"count"`
			Invariant bool     `json:"invariant"`
			Examples  []string `json:"examples"`
		} `json:"classes"`
		Judged struct {
			Students int `json:"students"`
			Users    int `json:"users"`
		} `json:"judged"`
		DurationSeconds float64 `json:"duration_seconds"`
	}
	if jerr := json.Unmarshal(out, &r); jerr != nil || len(r.Classes) == 0 {
		return "", []string{fmt.Sprintf("reconciler once: %v (%v): %s", err, jerr, stderr.String())}
	}
	var v []string
	if err != nil {
		v = append(v, fmt.Sprintf("reconciler once: %v (exit status 0 wanted: no drift)", err))
	}
	var counts []string
	for _, class := range []string{"stuck", "dead", "lost", "mislinked", "missing-user", "orphan-user", "duplicate-document", "unrecorded-answer"} {
		c, ok := r.Classes[class]
		want := 0
		if class == "dead" {
			want = s.expect.Dead
		}
		switch {
		case !ok:
			v = append(v, "reconciler: its report has no class "+class)
		case c.Count != want:
			v = append(v, fmt.Sprintf("reconciler: %s = %d, want %d (first: %v)", class, c.Count, want, c.Examples))
		}
		counts = append(counts, fmt.Sprintf("%s %d", class, c.Count))
	}
	line := fmt.Sprintf("reconciler once: drift %v, judged %d students and %d users in %.2fs: %s\n",
		r.Drift, r.Judged.Students, r.Judged.Users, r.DurationSeconds, strings.Join(counts, ", "))
	return line, v
}
