//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
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

	"github.com/outboxref/outboxref/testkit/pgcluster"
)

// scenarioDef is one fault scenario.
type scenarioDef struct {
	id    string // "01-response-lost": number and name, also the subtest name
	title string
	opts  scenarioOptions
	run   func(s *scenario)
}

type scenarioOptions struct {
	senders     int    // senders started with the scenario
	httpFaults  bool   // put the 5xx-injecting HTTP proxy in front of Users
	ownClusters bool   // fresh clusters for this scenario alone (it restarts them)
	usersCrash  string // CRASH_POINT for Users' first run
	// latency delays every answer from Users by this much (±50%), as a
	// real network would. It widens the window in which a request is in
	// flight, so that a random kill lands on one rather than on an idle
	// process.
	latency time.Duration
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
	senders        []*proc
	usersAddr      string
	studentAddr    string
	toxi           *faultProxy
	faults         *httpFaults // nil unless opts.httpFaults
	client         *http.Client

	loads       []*studentLoad
	foreignKeys []string
	expect      Expect
	minReplays  int
	minRedeliv  int
	afterChecks []func(Report)
	notes       []string
	violations  []string
}

// scenarioOutcome is what a scenario run found.
type scenarioOutcome struct {
	report     Report
	violations []string
	duration   time.Duration
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
	recordResult(scenarioResult{name: def.id, build: bins.label, verdict: verdict, duration: out.duration, report: out.report})
	t.Logf("%s finished in %s: %s", def.id, out.duration.Round(100*time.Millisecond), verdict)
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
	s.dir = filepath.Join(suite.e2eDir, "logs", fmt.Sprintf("%s-%s-%s", def.id, bins.label, time.Now().Format("20060102-150405")))
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
	s.migrate(bins.student, "STUDENT_DATABASE_URL="+s.studentURL)
	s.migrate(bins.users, "USERS_DATABASE_URL="+s.usersURL)
	s.studentDB = s.pool(s.studentURL)
	s.usersDB = s.pool(s.usersURL)

	s.usersAddr = freeAddr(t)
	s.users = s.newProc("users", bins.users, "http://"+s.usersAddr+"/readyz",
		"USERS_HTTP_ADDR="+s.usersAddr, "USERS_DATABASE_URL="+s.usersURL, "USERS_INBOX_RETENTION=168h", "LOG_LEVEL=info")
	if def.opts.usersCrash != "" {
		s.startProc(s.users, "CRASH_POINT="+def.opts.usersCrash)
	} else {
		s.startProc(s.users)
	}

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

	s.studentAddr = freeAddr(t)
	s.student = s.newProc("student", bins.student, "http://"+s.studentAddr+"/readyz",
		"STUDENT_HTTP_ADDR="+s.studentAddr, "STUDENT_DATABASE_URL="+s.studentURL, "LOG_LEVEL=info")
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
			if t.Failed() {
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

// newSender prepares one more sender on the scenario's outbox.
func (s *scenario) newSender() *proc {
	n := len(s.senders) + 1
	admin := freeAddr(s.t)
	env := append([]string{
		"SENDER_DATABASE_URL=" + s.studentURL,
		"SENDER_USERS_URL=http://" + s.toxi.addr(),
		"SENDER_ADMIN_ADDR=" + admin,
		"SENDER_ID=sender-" + strconv.Itoa(n),
		"LOG_LEVEL=info",
	}, senderTuning...)
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

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
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
	if s.eventually(90*time.Second, "no outbox row is pending", func() bool {
		return s.count(s.studentDB, "SELECT count(*) FROM outbox WHERE state = 'pending'") == 0
	}) {
		s.note("quiet %s after the last fault and load", time.Since(settleStart).Round(100*time.Millisecond))
	}
	for _, p := range append([]*proc{s.users, s.student}, s.senders...) {
		for _, why := range p.takeSurprises() {
			s.violate("%s", why)
		}
	}

	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	defer cancel()
	st, err := Load(ctx, s.studentURL, s.usersURL)
	require.NoError(t, err, "the checker could not read the databases")
	rep := Classify(st, Input{ForeignKeys: s.foreignKeys, Acked: s.acked()})

	v := Violations(rep, s.expect)
	if rep.Replays < s.minReplays {
		v = append(v, fmt.Sprintf("replays = %d, want at least %d", rep.Replays, s.minReplays))
	}
	if rep.Redeliveries < s.minRedeliv {
		v = append(v, fmt.Sprintf("redeliveries = %d, want at least %d", rep.Redeliveries, s.minRedeliv))
	}
	v = append(v, s.checkAPI(rep, st)...)
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
	if len(v) > 0 {
		b.WriteString("VIOLATIONS:\n  " + strings.Join(v, "\n  ") + "\n")
	} else {
		b.WriteString("verdict: nothing lost, nothing duplicated\n")
	}
	t.Log(b.String())
	_ = os.WriteFile(filepath.Join(s.dir, "report.txt"), []byte(b.String()), 0o644)
	return scenarioOutcome{report: rep, violations: v}
}

// checkAPI compares what Student's API shows for each acknowledged student
// with the checker's verdict: linked with the same user id, or failed for a
// dead-lettered row. It is what a user of the system would see.
func (s *scenario) checkAPI(rep Report, st State) []string {
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
				State     string  `json:"state"`
				LastError *string `json:"last_error"`
			} `json:"provisioning"`
		}
		resp, err := s.client.Get("http://" + s.studentAddr + "/students/" + id.String())
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&got)
			resp.Body.Close()
		}
		var why string
		switch {
		case err != nil:
			why = err.Error()
		case class == Linked && (got.Provisioning.State != "linked" || got.UserID == nil || *got.UserID != userOf[id]):
			why = fmt.Sprintf("state %q, user_id %v; the database has %s", got.Provisioning.State, got.UserID, userOf[id])
		case class == Dead && (got.Provisioning.State != "failed" || got.Provisioning.LastError == nil):
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
