//go:build e2e

package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/outboxref/outboxref/deploy"
	"github.com/outboxref/outboxref/testkit/invariant"
	"github.com/outboxref/outboxref/testkit/pgcluster"
)

// suite is what every scenario shares: the binaries, built once, and one
// PostgreSQL cluster for Student and one for Users, in which each scenario
// gets fresh databases.
var suite struct {
	root    string // the repository root
	e2eDir  string // this package's directory
	work    string // temporary directory for binaries and overlays
	pgBin   string
	good    buildSet
	broken  map[string]buildSet // by E2E_BROKEN variant
	student *pgcluster.Cluster
	users   *pgcluster.Cluster

	mu      sync.Mutex
	results []scenarioResult
}

// buildSet is the three programs a scenario runs, the reconciler that
// judges every scenario's databases at its end, and the fault lab
// (TestLabInBrowser); no broken variant patches the last two.
type buildSet struct {
	label                  string // "good" or the broken variant
	student, users, sender string
	reconciler             string
	lab                    string
	// natsd is a NATS server as a process of its own: the nodes of the
	// broker scenarios' cluster, which a scenario kills with SIGKILL.
	natsd string
}

// scenarioResult is one scenario's line in the closing summary.
type scenarioResult struct {
	name   string
	source string // where the senders took new rows from: poll, cdc, or none
	// transport is how rows reached Users: http, or nats (a JetStream
	// broker between the sender and Users).
	transport string
	build     string
	verdict   string
	duration  time.Duration
	drain     time.Duration // from the heal until every student was linked; 0 if not measured
	report    invariant.Report
	// violations is what the scenario found wrong, printed under the
	// summary for the good build: CI keeps only the end of a long run's
	// output.
	violations []string
}

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	start := time.Now()
	stopGuard := guardAgainstOrphans()
	defer stopGuard()
	defer killEverything("suite finished")

	if err := setUp(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: set-up failed:", err)
		return 1
	}
	fmt.Printf("e2e: set-up took %s (binaries in %s; Student cluster on port %d, Users cluster on port %d)\n",
		time.Since(start).Round(time.Millisecond), suite.work, suite.student.Port(), suite.users.Port())
	// The package's plain tests (the checker's loader) want a server in
	// TEST_DATABASE_URL, which make test provides and make e2e does not:
	// lend them the Student cluster.
	if os.Getenv("TEST_DATABASE_URL") == "" {
		os.Setenv("TEST_DATABASE_URL", suite.student.URL())
	}
	code := m.Run()
	printSummary(time.Since(start))
	// Each scenario drops its replication slot; one left behind would
	// have held WAL for every scenario after it.
	if err := leftoverSlots(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		code = 1
	}
	return code
}

func setUp() error {
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	suite.e2eDir = wd
	suite.root = filepath.Dir(wd)
	suite.work, err = os.MkdirTemp("", "outboxref-e2e-")
	if err != nil {
		return err
	}
	addCleanup(func() { _ = os.RemoveAll(suite.work) })

	suite.pgBin = os.Getenv("PGCLUSTER_BIN_DIR")
	if suite.pgBin == "" {
		if suite.pgBin, err = pgcluster.FindBinDir(); err != nil {
			return err
		}
	}

	// The build and the two clusters are independent; on two cores the
	// clusters' initdb runs while the compiler waits on I/O.
	var wg sync.WaitGroup
	var buildErr, studentErr, usersErr error
	wg.Go(func() { buildErr = buildAll() })
	wg.Go(func() { suite.student, studentErr = startCluster("student") })
	wg.Go(func() { suite.users, usersErr = startCluster("users") })
	wg.Wait()
	return errors.Join(buildErr, studentErr, usersErr)
}

// startCluster starts a throwaway cluster that killEverything removes.
func startCluster(name string) (*pgcluster.Cluster, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{BinDir: suite.pgBin})
	if err != nil {
		return nil, fmt.Errorf("start %s cluster: %w", name, err)
	}
	// Like a production server, the cluster checks every role's password:
	// the binaries log in as their runtime roles with the ones migrate
	// gave them.
	trackCluster(c)
	return c, nil
}

// buildAll builds the three binaries and the lab, and the broken variants
// that E2E_BROKEN asks for.
func buildAll() error {
	start := time.Now()
	dir := filepath.Join(suite.work, "good")
	if err := goBuild(dir, "", "./services/student", "./services/users", "./outbox-sender", "./reconciler", "./lab", "./testkit/natsserver/natsd"); err != nil {
		return err
	}
	suite.good = buildSet{
		label:      "good",
		student:    filepath.Join(dir, "student"),
		users:      filepath.Join(dir, "users"),
		sender:     filepath.Join(dir, "outbox-sender"),
		reconciler: filepath.Join(dir, "reconciler"),
		lab:        filepath.Join(dir, "lab"),
		natsd:      filepath.Join(dir, "natsd"),
	}
	fmt.Printf("e2e: built the binaries in %s\n", time.Since(start).Round(time.Millisecond))

	suite.broken = map[string]buildSet{}
	for _, name := range brokenVariants() {
		p, err := LoadPatch(suite.e2eDir, name)
		if err != nil {
			return err
		}
		overlay, err := p.WriteOverlay(suite.root, suite.work)
		if err != nil {
			return err
		}
		out := filepath.Join(suite.work, "broken-"+name)
		// Every binary the patched file is part of is rebuilt with it (a
		// file under internal/ may be in all three); the others are the
		// good build's.
		if err := goBuild(out, overlay, p.Packages...); err != nil {
			return fmt.Errorf("build broken variant %s: %w", name, err)
		}
		b := suite.good
		b.label = name
		for _, pkg := range p.Packages {
			built := filepath.Join(out, filepath.Base(pkg))
			switch pkg {
			case "./outbox-sender":
				b.sender = built
			case "./services/users":
				b.users = built
			case "./services/student":
				b.student = built
			default:
				return fmt.Errorf("broken variant %s: unknown package %s", name, pkg)
			}
		}
		suite.broken[name] = b
		fmt.Printf("e2e: built broken variant %s (%s)\n", name, p.Summary)
	}
	return nil
}

// brokenVariants reads E2E_BROKEN: variant names separated by commas.
func brokenVariants() []string {
	var names []string
	for n := range strings.SplitSeq(os.Getenv("E2E_BROKEN"), ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	return names
}

func goBuild(outDir, overlay string, pkgs ...string) error {
	goCmd := deploy.GoCommand()
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	// The crash points the scenarios use exist only in builds with this
	// tag; the shipped binaries are built without it.
	args := []string{"build", "-tags", "crashpoints", "-o", outDir + string(filepath.Separator)}
	if overlay != "" {
		args = append(args, "-overlay", overlay)
	}
	cmd := exec.Command(goCmd, append(args, pkgs...)...)
	cmd.Dir = suite.root
	// Static binaries, as make build makes them.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

func recordResult(r scenarioResult) {
	suite.mu.Lock()
	defer suite.mu.Unlock()
	suite.results = append(suite.results, r)
}

// printSummary prints one line per scenario run: the figures the README
// quotes.
func printSummary(total time.Duration) {
	suite.mu.Lock()
	defer suite.mu.Unlock()
	if len(suite.results) == 0 {
		return
	}
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "scenario\tsource\ttransport\tbuild\tverdict\ttime\tdrain\tstudents\tlinked\tdead\tlost\tdup\tmislinked\tunexpected\tusers\tredeliveries\treplays")
	for _, r := range suite.results {
		p := r.report
		drain := "-"
		if r.drain > 0 {
			drain = r.drain.Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n",
			r.name, r.source, r.transport, r.build, r.verdict, r.duration.Round(100*time.Millisecond), drain,
			p.Students, p.Linked, p.Dead, p.Lost, p.Duplicated, p.Mislinked, p.Unexpected, p.Users, p.Redeliveries, p.Replays)
	}
	_ = w.Flush()
	// A broken build is meant to fail: only the good build's failures are
	// news.
	header := false
	for _, r := range suite.results {
		if r.build != suite.good.label {
			continue
		}
		for _, v := range r.violations {
			if !header {
				b.WriteString("\nfailures of the good build:\n")
				header = true
			}
			fmt.Fprintf(&b, "%s (%s, %s) failed: %s\n", r.name, r.source, r.transport, v)
		}
	}
	fmt.Printf("\ne2e summary (total %s):\n%s\n", total.Round(100*time.Millisecond), b.String())
}

// Everything the suite starts is tracked here, so that a timeout or an
// interrupt, which skip every deferred call and t.Cleanup, still leaves no
// process or cluster behind.
var live = struct {
	sync.Mutex
	procs    map[*proc]bool
	clusters map[*pgcluster.Cluster]bool
	cleanups []func()
}{procs: map[*proc]bool{}, clusters: map[*pgcluster.Cluster]bool{}}

func trackCluster(c *pgcluster.Cluster) {
	live.Lock()
	defer live.Unlock()
	live.clusters[c] = true
}

func untrackCluster(c *pgcluster.Cluster) {
	live.Lock()
	defer live.Unlock()
	delete(live.clusters, c)
}

func addCleanup(f func()) {
	live.Lock()
	defer live.Unlock()
	live.cleanups = append(live.cleanups, f)
}

// killEverything kills every tracked process group, removes every tracked
// cluster and runs the suite's cleanups. It is safe to call more than once.
func killEverything(why string) {
	live.Lock()
	procs := make([]*proc, 0, len(live.procs))
	for p := range live.procs {
		procs = append(procs, p)
	}
	clusters := make([]*pgcluster.Cluster, 0, len(live.clusters))
	for c := range live.clusters {
		clusters = append(clusters, c)
	}
	cleanups := live.cleanups
	live.procs, live.clusters, live.cleanups = map[*proc]bool{}, map[*pgcluster.Cluster]bool{}, nil
	live.Unlock()

	if len(procs) > 0 {
		fmt.Fprintf(os.Stderr, "e2e: %s: killing %d processes still running\n", why, len(procs))
	}
	for _, p := range procs {
		p.killGroup()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range clusters {
		if err := c.Cleanup(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: remove cluster on port %d: %v\n", c.Port(), err)
		}
	}
	for _, cleanup := range slices.Backward(cleanups) {
		cleanup()
	}
}

// guardAgainstOrphans cleans up on SIGINT/SIGTERM, and shortly before go
// test's -timeout would kill the binary with a panic that runs no cleanup.
func guardAgainstOrphans() (stop func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-sigs:
			killEverything("received " + sig.String())
			os.Exit(130)
		case <-done:
		}
	}()
	var timer *time.Timer
	if f := flag.Lookup("test.timeout"); f != nil {
		if d, err := time.ParseDuration(f.Value.String()); err == nil && d > time.Minute {
			timer = time.AfterFunc(d-30*time.Second, func() {
				killEverything("the test binary is about to time out")
			})
		}
	}
	return func() {
		signal.Stop(sigs)
		close(done)
		if timer != nil {
			timer.Stop()
		}
	}
}
