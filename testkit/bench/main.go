// Command bench is the project's performance statement: the three real
// binaries, built plainly and run with shipped defaults, each measured
// against a bound, the same database work done by a Go client with no HTTP
// and no processes in between, at the same concurrency, on the same server.
//
//   - intake: students/s that POST /students creates with -clients
//     keep-alive clients (Student alone), against Student's transaction run
//     by as many workers;
//   - burndown: students linked/s while the sender and Users work off a
//     backlog of -rows, against the same claim, Users transaction and
//     recording done as SQL only;
//   - latency: creation to link at 200 and 500 students/s, p50/p90/p99;
//   - idle CPU of each process, and each one's peak RSS.
//
// Burndown, latency and idle CPU are measured for the sender's two sources
// of new rows (SENDER_SOURCE): poll, the default, and cdc, the WAL through
// a logical replication slot, side by side in the same rounds (-cdc=false
// measures poll alone). The cdc source needs a server with
// wal_level=logical; the bench's own cluster has it (testkit/pgcluster).
// They are measured a third time in the broker form (SENDER_TRANSPORT=nats,
// through a NATS JetStream server of the bench's own; -broker=false leaves
// it out), judged against the HTTP hop's figures of the same rounds.
//
// Rounds are interleaved (each round measures everything once, the two
// sources in turn, the first one alternating from round to round) and
// medians reported. The last lines are "name value" pairs for scripts. With -soak
// it instead sends -students students through the whole system at -rate
// per second and watches memory and table sizes (soak.go).
//
// Run it with `make bench` or `make soak`. It starts a throwaway
// PostgreSQL of its own, with a deployment's durability, unless
// TEST_DATABASE_URL names a server. It measures on Linux (it reads /proc).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outboxref/testkit/pgcluster"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// The goals the issue sets; the bench reports against them, it does not
// enforce them.
const (
	goalRatio      = 0.6 // intake and burndown, of their bounds
	goalP99At200   = 50 * time.Millisecond
	goalP99At500   = 150 * time.Millisecond
	goalIdleCPUPct = 1.0 // of one core, per process

	// The broker form beside the HTTP hop, each round's pair a ratio.
	goalBrokerCPURatio      = 1.3 // CPU per student at 200/s, at most
	goalBrokerBurndownRatio = 0.7 // burndown, at least
)

// defaultRates are the rates the latency is measured at unless -rates
// says otherwise: the two the goals are set for.
var defaultRates = []float64{200, 500}

// latencyRates are the rates the latency is measured at (-rates).
func (o options) latencyRates() []float64 {
	if len(o.rates) == 0 {
		return defaultRates
	}
	return o.rates
}

// parseRates reads -rates: students per second, comma-separated, which
// must include the two rates the goals and the name-value lines are for.
func parseRates(list string) ([]float64, error) {
	var rates []float64
	for field := range strings.SplitSeq(list, ",") {
		rate, err := strconv.ParseFloat(strings.TrimSpace(field), 64)
		if err != nil || rate <= 0 || rate > 10000 {
			return nil, fmt.Errorf("-rates: %q is not a rate from 1 to 10000 students/s", field)
		}
		if !slices.Contains(rates, rate) {
			rates = append(rates, rate)
		}
	}
	for _, must := range defaultRates {
		if !slices.Contains(rates, must) {
			return nil, fmt.Errorf("-rates: must include %.0f, a rate the goals are set for", must)
		}
	}
	slices.Sort(rates)
	return rates, nil
}

type options struct {
	rates            []float64
	rounds           int
	clients          int
	warmup, duration time.Duration
	rows             int
	latencyWarmup    time.Duration
	latencyDuration  time.Duration
	history          int
	perfDir          string
	idleSettle       time.Duration
	idleWindow       time.Duration
	cdc              bool
	broker           bool
	baseline         string
	env              string
	baselineEnv      string

	soak       bool
	reconciler bool
	// reconcileNew is how many students arrive between the reconciler's
	// full pass and the incremental one measured.
	reconcileNew int
	students     int
	rate         float64
	sample       time.Duration
	soakWarmup   time.Duration
}

func run(ctx context.Context, args []string, getenv func(string) string, out io.Writer) (err error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(out)
	var o options
	fs.IntVar(&o.rounds, "rounds", 3, "rounds, each measuring everything once; medians are reported")
	fs.IntVar(&o.clients, "clients", 64, "intake: concurrent keep-alive clients (and the bound's workers)")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "intake: warm-up before measuring")
	fs.DurationVar(&o.duration, "duration", 8*time.Second, "intake: measured time")
	fs.IntVar(&o.rows, "rows", 20000, "burndown: backlog of students with their outbox rows")
	fs.DurationVar(&o.latencyWarmup, "latency-warmup", 2*time.Second, "latency: warm-up at the rate, not measured")
	fs.DurationVar(&o.latencyDuration, "latency-duration", 15*time.Second, "latency: measured time at each rate")
	fs.StringVar(&o.perfDir, "perf", "", "latency: a whole-machine CPU profile (Linux perf) of each run at 200/s, into this directory: NAME.data and a report, NAME.txt")
	rates := fs.String("rates", "200,500", "latency: the rates measured, students/s, comma-separated; 200 and 500 always (the goals' rates)")
	fs.IntVar(&o.history, "history", 20000, "latency: students already linked in both databases, with statistics, before each run, as in a deployment that has run a while (0: empty databases)")
	fs.DurationVar(&o.idleSettle, "idle-settle", 5*time.Second, "idle CPU: wait after the last latency run before sampling")
	fs.DurationVar(&o.idleWindow, "idle-window", 20*time.Second, "idle CPU: sampling window")
	fs.BoolVar(&o.cdc, "cdc", true, "burndown, latency and idle CPU also with SENDER_SOURCE=cdc, beside the default poll (needs wal_level=logical)")
	fs.BoolVar(&o.broker, "broker", true, "burndown, latency and idle CPU also in the broker form (SENDER_TRANSPORT=nats, through a NATS JetStream server of the bench's own), beside the HTTP hop")
	fs.StringVar(&o.baseline, "baseline", "", "measure only the costs (burndown, latency, CPU per student; poll), of this checkout beside the binaries of this git commit, in turn")
	fs.StringVar(&o.baselineEnv, "baseline-env", "", "with -baseline: more variables for the baseline's processes, as -env gives this checkout's (the same setting on both sides measures a change under it)")
	fs.StringVar(&o.env, "env", "", "with -baseline: more variables for this checkout's processes, as NAME=VALUE,NAME=VALUE (a setting measured against the baseline's defaults)")
	fs.BoolVar(&o.soak, "soak", false, "run the soak instead: -students through the whole system at -rate")
	fs.BoolVar(&o.reconciler, "reconciler", false, "measure the reconciler instead: a full and an incremental pass over -students linked students")
	fs.IntVar(&o.reconcileNew, "reconcile-new", 1000, "reconciler: students made between the full pass and the incremental one measured")
	fs.IntVar(&o.students, "students", 1_000_000, "soak: students to send; reconciler: students in the databases")
	fs.Float64Var(&o.rate, "rate", 500, "soak: students per second, a rate the system sustains")
	fs.DurationVar(&o.sample, "sample", 10*time.Second, "soak: how often memory and table sizes are sampled")
	fs.DurationVar(&o.soakWarmup, "soak-warmup", 2*time.Minute, "soak: memory at the first sample after this is the baseline")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.rates, err = parseRates(*rates); err != nil {
		return err
	}
	switch {
	case o.rounds < 1, o.clients < 1 || o.clients > 1024, o.rows < 1, o.students < 1, o.rate <= 0, o.history < 0,
		o.duration <= 0, o.latencyDuration <= 0, o.idleWindow <= 0, o.sample <= 0,
		o.warmup < 0, o.latencyWarmup < 0, o.idleSettle < 0, o.soakWarmup < 0:
		return errors.New("flags out of range: rounds, rows, students and rate at least 1, clients 1 to 1024, " +
			"measuring durations positive, warm-ups, settling and history not negative")
	}
	if o.perfDir != "" {
		if o.soak {
			return errors.New("-perf profiles the latency runs, not the soak")
		}
		if err := checkPerf(ctx, o.perfDir); err != nil {
			return err
		}
	}
	if o.baseline != "" && o.soak {
		return errors.New("-baseline compares the bench's measures, not the soak: use one or the other")
	}
	if o.reconciler && (o.soak || o.baseline != "") {
		return errors.New("-reconciler measures the reconciler alone: leave out -soak and -baseline")
	}
	if o.reconcileNew < 1 {
		return errors.New("-reconcile-new: at least 1")
	}
	if (o.env != "" || o.baselineEnv != "") && o.baseline == "" {
		return errors.New("-env and -baseline-env set variables beside a baseline: give -baseline too")
	}
	thisEnv, err := envList("-env", o.env)
	if err != nil {
		return err
	}
	baseEnv, err := envList("-baseline-env", o.baselineEnv)
	if err != nil {
		return err
	}

	// A throwaway server of its own, durable as a deployment is: the test
	// clusters skip fsync, which would make every commit cheaper than it
	// is. TEST_DATABASE_URL, when set, names another server to measure on.
	server, durability := getenv(pgtest.EnvVar), "a server of your own ("+pgtest.EnvVar+"): its durability settings are its own"
	ownServer := server == ""
	statements := false // pg_stat_statements counts the services' statements
	if ownServer {
		cluster, err := pgcluster.Start(ctx, pgcluster.Options{Durable: true})
		if err != nil {
			return fmt.Errorf("start PostgreSQL: %w", err)
		}
		defer func() { _ = cluster.Cleanup(context.WithoutCancel(ctx)) }()
		server, durability = cluster.URL(), "a throwaway cluster with fsync, full-page writes and synchronous commits on"
		// Latency ends when the link commits, which only the commit's
		// own timestamp tells; the setting takes a restart, as does the
		// library that counts statements.
		settings := []string{"ALTER SYSTEM SET track_commit_timestamp = on"}
		track, err := trackStatements(ctx, server)
		if err != nil {
			return err
		}
		if track != "" {
			settings = append(settings, track)
		}
		if err := setAndRestart(ctx, cluster, settings...); err != nil {
			return err
		}
		if statements, err = enableStatements(ctx, server); err != nil {
			return err
		}
	}
	commitTimes, err := tracksCommitTimes(ctx, server)
	if err != nil {
		return err
	}
	if o.cdc && !o.soak && o.baseline == "" {
		if err := logicalDecoding(ctx, server); err != nil {
			return err
		}
	}
	// PostgreSQL's own CPU use is measured on the bench's own cluster
	// only: another server may be serving others, or on another host.
	postmaster := 0
	if ownServer {
		if postmaster, err = postmasterPID(ctx, server); err != nil {
			return err
		}
	}
	serverURL, err := url.Parse(server)
	if err != nil {
		return fmt.Errorf("%s: %w", pgtest.EnvVar, err)
	}
	root, err := repoRoot()
	if err != nil {
		return err
	}
	q, err := loadQueries(root)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "outboxref-bench-")
	if err != nil {
		return err
	}
	b := &bench{
		out: out, server: serverURL, durability: durability, commitTimes: commitTimes, dir: dir, q: q,
		procs: &procs{set: map[*proc]bool{}, peak: map[string]int64{}},
		dbs:   map[string]bool{}, slots: map[string]bool{}, postmaster: postmaster, history: o.history,
		perfDir: o.perfDir, statements: statements,
	}
	// Whatever happens, no child and no database outlives the bench. The
	// logs are kept when something failed, for the paths the error names,
	// but not after a Ctrl-C.
	defer func() {
		b.procs.stopAll()
		b.dropAll()
		if err == nil || ctx.Err() != nil {
			os.RemoveAll(dir)
		} else {
			fmt.Fprintf(out, "logs kept in %s\n", dir)
		}
	}()

	b.printf("building the binaries into %s\n", dir)
	if err := buildBinaries(ctx, root, dir); err != nil {
		return err
	}
	defaultRun := !o.soak && !o.reconciler && o.baseline == ""
	if (defaultRun && o.broker) || slices.Contains(thisEnv, brokerEnv) || slices.Contains(baseEnv, brokerEnv) {
		if err := buildBroker(ctx, root, dir); err != nil {
			return err
		}
	}
	b.bins = dir
	if o.reconciler {
		if err := buildReconciler(ctx, root, dir); err != nil {
			return err
		}
	}
	switch {
	case o.reconciler:
		err = b.reconcilerMeasure(ctx, o)
	case o.soak:
		err = b.soak(ctx, o)
	case o.baseline != "":
		b.printf("building the baseline %s\n", o.baseline)
		base, desc, berr := buildBaseline(ctx, root, o.baseline, dir)
		if berr != nil {
			return berr
		}
		base.env = baseEnv
		err = b.compare(ctx, o, []build{base, {name: "this", bins: dir, env: thisEnv}}, desc)
	default:
		err = b.measure(ctx, o)
	}
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("interrupted: %w", err)
	}
	return err
}

// figures are the results, a value per round for each measure.
type figures struct {
	intake, intakeBound, burndownBound []float64
	intakeRatio                        []float64
	// src holds what is measured per form (sourcePoll, sourceCDC,
	// formBroker).
	src map[string]*sourceFigures
}

// sourceFigures are the measures of the sender with one SENDER_SOURCE.
type sourceFigures struct {
	burndown, burndownRatio []float64
	// burndownCPU is each round's whole-system CPU per linked row.
	burndownCPU []time.Duration
	// burndownWork is each round's PostgreSQL work per linked row.
	burndownWork []dbWork
	latency      map[float64][]latencyResult
	idle         map[string]float64
	// idleServer is PostgreSQL's CPU use while idle, in percent of a core
	// (-1: not measured).
	idleServer float64
}

// formBroker names the broker form: poll's rows delivered through NATS
// JetStream (brokerEnv) rather than over HTTP.
const formBroker = "broker"

// form is one way the sender is run and measured: its source of new rows,
// and the variables that pick its transport.
type form struct {
	name   string // sourcePoll, sourceCDC or formBroker
	source string // SENDER_SOURCE
	env    []string
}

// forms are what the default run measures in turn: poll over HTTP always,
// then cdc and the broker form unless -cdc=false or -broker=false.
func (o options) forms() []form {
	forms := []form{{name: sourcePoll, source: sourcePoll}}
	if o.cdc {
		forms = append(forms, form{name: sourceCDC, source: sourceCDC})
	}
	if o.broker {
		forms = append(forms, form{name: formBroker, source: sourcePoll, env: []string{brokerEnv}})
	}
	return forms
}

// tagFor is what a measurement's lines say after the round: nothing for
// poll, the default, whose lines are as they always were.
func tagFor(name string) string {
	if name == sourcePoll {
		return ""
	}
	return ", " + name
}

// measure runs the rounds and reports.
func (b *bench) measure(ctx context.Context, o options) error {
	b.printf("bench: %d rounds; intake %d clients for %s after %s; burndown %d rows; latency %s after %s at %v/s, after a history of %d students; shipped defaults\n",
		o.rounds, o.clients, o.duration, o.warmup, o.rows, o.latencyDuration, o.latencyWarmup, o.latencyRates(), o.history)
	b.printf("intake POSTs without an Idempotency-Key, as the README's curl session does\n")
	forms := o.forms()
	if len(forms) > 1 {
		names := make([]string, len(forms))
		for i, fm := range forms {
			names[i] = fm.name
		}
		b.printf("burndown, latency and idle CPU for each of %s in turn: poll is the default; cdc reads the WAL; broker is poll through NATS JetStream\n", strings.Join(names, ", "))
	}
	f := figures{src: map[string]*sourceFigures{}}
	for _, fm := range forms {
		f.src[fm.name] = &sourceFigures{latency: map[float64][]latencyResult{}}
	}
	// use points the processes started next at fm; b.env is nil for the
	// intake and the bounds.
	use := func(fm form) { b.env = fm.env }
	defer func() { b.env = nil }()
	icfg := intakeConfig{clients: o.clients, warmup: o.warmup, duration: o.duration}
	for r := 1; r <= o.rounds; r++ {
		tag := fmt.Sprintf("round %d/%d", r, o.rounds)
		order := rotated(forms, r)
		b.printf("%s  intake, real ...\n", tag)
		got, err := b.intakeReal(ctx, icfg)
		if err != nil {
			return fmt.Errorf("%s, intake: %w", tag, err)
		}
		b.printf("%s  intake, bound ...\n", tag)
		bound, err := b.intakeBound(ctx, icfg)
		if err != nil {
			return fmt.Errorf("%s, intake bound: %w", tag, err)
		}
		f.intake, f.intakeBound, f.intakeRatio = append(f.intake, got), append(f.intakeBound, bound), append(f.intakeRatio, got/bound)
		b.printf("%s  intake    %8.0f students/s   bound %8.0f/s   ratio %.2f\n", tag, got, bound, got/bound)

		burned := map[string]float64{}
		for _, fm := range order {
			use(fm)
			b.printf("%s  burndown of %d, real%s ...\n", tag, o.rows, tagFor(fm.name))
			got, cpu, work, err := b.burndownReal(ctx, o.rows, fm.source)
			if err != nil {
				return fmt.Errorf("%s, burndown%s: %w", tag, tagFor(fm.name), err)
			}
			burned[fm.name] = got
			sf := f.src[fm.name]
			if cpu >= 0 {
				sf.burndownCPU = append(sf.burndownCPU, cpu)
			}
			sf.burndownWork = append(sf.burndownWork, work)
			b.printf("%s  burndown%s per student: %s\n", tag, tagFor(fm.name), work)
		}
		use(form{})
		b.printf("%s  burndown of %d, bound ...\n", tag, o.rows)
		bound, err = b.burndownBound(ctx, o.rows)
		if err != nil {
			return fmt.Errorf("%s, burndown bound: %w", tag, err)
		}
		f.burndownBound = append(f.burndownBound, bound)
		for _, fm := range forms {
			sf, got := f.src[fm.name], burned[fm.name]
			sf.burndown, sf.burndownRatio = append(sf.burndown, got), append(sf.burndownRatio, got/bound)
			label := "burndown" + tagFor(fm.name)
			b.printf("%s  %-9s %8.0f linked/s     bound %8.0f/s   ratio %.2f\n", tag, label, got, bound, got/bound)
		}

		for i, rate := range o.latencyRates() {
			for _, fm := range order {
				use(fm)
				sf, tf := f.src[fm.name], tagFor(fm.name)
				var after func(*system) error
				if r == o.rounds && i == len(o.latencyRates())-1 {
					// The last run of each source leaves its processes up
					// for the idle measurement: warm, having done real work.
					after = func(sys *system) error {
						b.printf("%s  idle CPU%s: %s to settle, then %s of sampling ...\n", tag, tf, o.idleSettle, o.idleWindow)
						idle, server, err := b.idleCPU(ctx, sys, o.idleSettle, o.idleWindow)
						sf.idle, sf.idleServer = idle, server
						return err
					}
				}
				b.printf("%s  latency at %.0f/s%s ...\n", tag, rate, tf)
				b.perfName = fmt.Sprintf("round%d-%s", r, fm.name)
				res, err := b.latency(ctx, rate, fm.source, o.latencyWarmup, o.latencyDuration, after)
				if err != nil && fm.name == formBroker && errors.Is(err, errNotSustained) {
					// The broker form is judged beside the HTTP hop, not
					// fatal to the run: a rate it cannot sustain is its
					// goal failed, and the rest still gets measured.
					b.printf("%s  latency at %.0f/s%s: %v\n", tag, rate, tf, err)
					res, err = unsustainedResult(), nil
				}
				if err != nil {
					return fmt.Errorf("%s, latency%s: %w", tag, tf, err)
				}
				if res.p99 == notSustained {
					sf.latency[rate] = append(sf.latency[rate], res)
					continue
				}
				sf.latency[rate] = append(sf.latency[rate], res)
				lag := ""
				if res.slotLagMax >= 0 {
					lag = fmt.Sprintf("  slot lag max %s; %d linked ≥ %s after sent", kB(res.slotLagMax), res.late, cdcGrace)
				}
				b.printf("%s  latency at %.0f/s%s: p50 %s  p90 %s  p99 %s  (%d students)%s\n",
					tag, rate, tf, ms(res.p50), ms(res.p90), ms(res.p99), res.students, lag)
				b.printf("%s    %s\n", tag, res.costs())
				if split := res.serverSplit(); split != "" {
					b.printf("%s    %s\n", tag, split)
				}
				if sleeps := res.sleeps(); sleeps != "" {
					b.printf("%s    %s\n", tag, sleeps)
				}
				if res.tail != nil {
					b.printf("%s    %s\n", tag, res.tail)
				}
			}
		}
	}
	b.report(o, f)
	return nil
}

// goalP99 is the latency goal at rate, if the issue set one for it.
func goalP99(rate float64) (time.Duration, bool) {
	switch rate {
	case 200:
		return goalP99At200, true
	case 500:
		return goalP99At500, true
	}
	return 0, false
}

// goalCells are a p99's goal and verdict as the tables show them, blank
// at a rate with no goal.
func goalCells(rate float64, p99 time.Duration) (goal, verdictCell string) {
	g, ok := goalP99(rate)
	if !ok {
		return "", ""
	}
	return "p99 ≤ " + ms(g), verdict(p99 <= g)
}

// p99 is the median over the rounds of the runs' p99 at rate.
func (sf *sourceFigures) p99(rate float64) time.Duration {
	return medianDuration(sf.latency[rate], func(r latencyResult) time.Duration { return r.p99 })
}

// slotLagMax is the largest slot lag sampled in any run, -1 if none was.
func (sf *sourceFigures) slotLagMax(rates ...float64) float64 {
	most := -1.0
	for _, rate := range rates {
		for _, r := range sf.latency[rate] {
			most = max(most, r.slotLagMax)
		}
	}
	return most
}

// report prints the table of medians with each goal's verdict, then the
// sources side by side, then the name-value lines, last.
func (b *bench) report(o options, f figures) {
	poll := f.src[sourcePoll]
	idleMax := 0.0
	for _, v := range poll.idle {
		idleMax = max(idleMax, v)
	}
	intakeRatio, burndownRatio := median(f.intakeRatio), median(poll.burndownRatio)

	b.printf("\nmedians of %d rounds (a ratio is the median of the rounds' ratios)\n", o.rounds)
	w := tabwriter.NewWriter(b.out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "measure\tfigure\tbound\tratio\tgoal\t\n")
	fmt.Fprintf(w, "intake\t%.0f students/s\t%.0f/s\t%.2f\t≥ %.1f× bound\t%s\n",
		median(f.intake), median(f.intakeBound), intakeRatio, goalRatio, verdict(intakeRatio >= goalRatio))
	fmt.Fprintf(w, "burndown\t%.0f linked/s\t%.0f/s\t%.2f\t≥ %.1f× bound\t%s\n",
		median(poll.burndown), median(f.burndownBound), burndownRatio, goalRatio, verdict(burndownRatio >= goalRatio))
	fmt.Fprintf(w, "  per student\t%s\t\t\t\t\n", medianWork(poll.burndownWork))
	for _, rate := range o.latencyRates() {
		res := poll.latency[rate]
		goal, v := goalCells(rate, poll.p99(rate))
		fmt.Fprintf(w, "latency at %.0f/s\tp50 %s  p90 %s  p99 %s\t\t\t%s\t%s\n", rate,
			ms(medianDuration(res, func(r latencyResult) time.Duration { return r.p50 })),
			ms(medianDuration(res, func(r latencyResult) time.Duration { return r.p90 })),
			ms(poll.p99(rate)), goal, v)
	}
	for _, name := range []string{studentBin, usersBin, senderBin} {
		fmt.Fprintf(w, "idle CPU, %s\t%.2f%% of a core\t\t\t< %.0f%%\t%s\n", name, poll.idle[name], goalIdleCPUPct, verdict(poll.idle[name] < goalIdleCPUPct))
	}
	for _, name := range []string{studentBin, usersBin, senderBin} {
		fmt.Fprintf(w, "peak RSS, %s\t%.1f MB\t\t\t\t\n", name, float64(b.procs.peakKB(name))/1024)
	}
	w.Flush()
	b.printf("latency: from the client's scheduled send of POST /students to %s,\n", b.linkedAt())
	b.printf("over students sent after the warm-up; peak RSS is VmHWM, the highest over every run of the binary.\n")
	b.printf("PostgreSQL: %s.\n\n", b.durability)

	cdc, broker := f.src[sourceCDC], f.src[formBroker]
	if cdc != nil {
		b.sideBySide(o, f)
	}
	var bb brokerBeside
	if broker != nil {
		bb = brokerFigures(poll, broker)
		b.brokerBeside(o, poll, broker, bb)
	}

	fmt.Fprintf(b.out, "intake_ratio %.2f\n", intakeRatio)
	fmt.Fprintf(b.out, "burndown_ratio %.2f\n", burndownRatio)
	fmt.Fprintf(b.out, "p99_ms_at_200 %.1f\n", msFloat(poll.p99(200)))
	fmt.Fprintf(b.out, "p99_ms_at_500 %.1f\n", msFloat(poll.p99(500)))
	fmt.Fprintf(b.out, "idle_cpu_pct_max %.1f\n", idleMax)
	// Costs, not times (issue: CPU per student on two cores): the whole
	// system's CPU per student at 200/s and per row in the burndown, and
	// Users' own per create-user request at 200/s; "-" when not measured.
	poll.printCosts(b.out, "")
	if cdc != nil {
		fmt.Fprintf(b.out, "cdc_burndown_ratio %.2f\n", median(cdc.burndownRatio))
		fmt.Fprintf(b.out, "cdc_p99_ms_at_200 %.1f\n", msFloat(cdc.p99(200)))
		fmt.Fprintf(b.out, "cdc_p99_ms_at_500 %.1f\n", msFloat(cdc.p99(500)))
		fmt.Fprintf(b.out, "cdc_idle_cpu_pct %.2f\n", cdc.idle[senderBin])
		fmt.Fprintf(b.out, "cdc_slot_lag_bytes_max %.0f\n", max(0, cdc.slotLagMax(o.latencyRates()...)))
	}
	if broker != nil {
		fmt.Fprintf(b.out, "broker_cpu_ms_per_student_at_200 %s\n", msMedian(latencyCosts(broker.latency[200], func(r latencyResult) time.Duration { return r.cpuPerStudent })))
		fmt.Fprintf(b.out, "broker_cpu_ratio_at_200 %s\n", ratioCell(bb.cpuRatio))
		fmt.Fprintf(b.out, "broker_burndown_ratio %s\n", ratioCell(bb.burndownRatio))
		fmt.Fprintf(b.out, "broker_p99_ms_at_500 %s\n", p99Value(broker.p99(500)))
	}
}

// brokerBeside are the broker form's figures over the HTTP hop's (poll),
// one ratio per round, each of a pair measured in the same round.
type brokerBeside struct {
	cpuRatio, burndownRatio []float64
}

// brokerFigures pairs the rounds of http and broker; a round either did
// not measure (CPU, on a server not the bench's own) is left out.
func brokerFigures(http, broker *sourceFigures) brokerBeside {
	var bb brokerBeside
	for i := range min(len(http.latency[200]), len(broker.latency[200])) {
		h, k := http.latency[200][i].cpuPerStudent, broker.latency[200][i].cpuPerStudent
		if h > 0 && k >= 0 {
			bb.cpuRatio = append(bb.cpuRatio, float64(k)/float64(h))
		}
	}
	for i := range min(len(http.burndown), len(broker.burndown)) {
		if http.burndown[i] > 0 {
			bb.burndownRatio = append(bb.burndownRatio, broker.burndown[i]/http.burndown[i])
		}
	}
	return bb
}

// p99Value is a p99 for a name-value line: milliseconds, or inf when the
// rate was not sustained.
func p99Value(d time.Duration) string {
	if d == notSustained {
		return "inf"
	}
	return fmt.Sprintf("%.1f", msFloat(d))
}

// ratioCell is the median of ratios to the hundredth, "-" for none.
func ratioCell(ratios []float64) string {
	if len(ratios) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", median(ratios))
}

// brokerBeside prints the broker form beside the HTTP hop, with the three
// goals the broker is held to, and where each one's CPU goes by process.
func (b *bench) brokerBeside(o options, http, broker *sourceFigures, bb brokerBeside) {
	b.printf("the broker form beside the HTTP hop (%s, poll; medians of %d rounds, the rounds' range in brackets;\n", brokerEnv, o.rounds)
	b.printf("broker/HTTP is the median of each round's ratio, the two measured in the same round)\n")
	w := tabwriter.NewWriter(b.out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "measure\tHTTP (poll)\tbroker\tbroker/HTTP\tgoal\t\n")
	cpu := func(sf *sourceFigures) string {
		costs := latencyCosts(sf.latency[200], func(r latencyResult) time.Duration { return r.cpuPerStudent })
		ms := make([]float64, len(costs))
		for i, c := range costs {
			ms[i] = msFloat(c)
		}
		return fmt.Sprintf("%s ms [%s]", msMedian(costs), spread(ms, "%.2f"))
	}
	judged := func(ratios []float64, ok func(float64) bool) string {
		if len(ratios) == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f [%s] %s", median(ratios), spread(ratios, "%.2f"), verdict(ok(median(ratios))))
	}
	fmt.Fprintf(w, "CPU per student at 200/s\t%s\t%s\t%s\t≤ %.1f×\t\n", cpu(http), cpu(broker),
		judged(bb.cpuRatio, func(r float64) bool { return r <= goalBrokerCPURatio }), goalBrokerCPURatio)
	for _, name := range []string{studentBin, usersBin, senderBin, natsdBin, postgresName} {
		split := func(sf *sourceFigures) string {
			var xs []float64
			for _, r := range sf.latency[200] {
				if v, ok := r.perStudent[name]; ok {
					xs = append(xs, msFloat(v))
				}
			}
			if len(xs) == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f ms", median(xs))
		}
		fmt.Fprintf(w, "  of it, %s\t%s\t%s\t\t\t\n", name, split(http), split(broker))
	}
	burn := func(sf *sourceFigures) string {
		return fmt.Sprintf("%.0f linked/s [%s]", median(sf.burndown), spread(sf.burndown, "%.0f"))
	}
	fmt.Fprintf(w, "burndown\t%s\t%s\t%s\t≥ %.1f×\t\n", burn(http), burn(broker),
		judged(bb.burndownRatio, func(r float64) bool { return r >= goalBrokerBurndownRatio }), goalBrokerBurndownRatio)
	burnCPU := func(sf *sourceFigures) string {
		if len(sf.burndownCPU) == 0 {
			return "-"
		}
		return msMedian(sf.burndownCPU) + " ms"
	}
	fmt.Fprintf(w, "  CPU per student, burndown\t%s\t%s\t\t\t\n", burnCPU(http), burnCPU(broker))
	fmt.Fprintf(w, "  per student, burndown\t%s\t%s\t\t\t\n", medianWork(http.burndownWork), medianWork(broker.burndownWork))
	for _, rate := range o.latencyRates() {
		p99 := func(sf *sourceFigures) string {
			res := sf.latency[rate]
			if sf.p99(rate) == notSustained {
				return "not sustained in most rounds"
			}
			return fmt.Sprintf("%.1f / %.1f / %.1f ms",
				msFloat(medianDuration(res, func(r latencyResult) time.Duration { return r.p50 })),
				msFloat(medianDuration(res, func(r latencyResult) time.Duration { return r.p90 })),
				msFloat(sf.p99(rate)))
		}
		goal, v := "", ""
		if rate == 500 {
			// The broker's one latency goal; at 200/s it is held to none.
			goal, v = "p99 ≤ "+ms(goalP99At500), verdict(broker.p99(rate) <= goalP99At500)
		}
		fmt.Fprintf(w, "latency at %.0f/s, p50 / p90 / p99\t%s\t%s %s\t\t%s\t\n", rate, p99(http), p99(broker), v, goal)
	}
	for _, name := range []string{usersBin, senderBin, natsdBin} {
		idle := func(sf *sourceFigures) string {
			v, ok := sf.idle[name]
			if !ok {
				return "-"
			}
			return fmt.Sprintf("%.2f%% of a core %s", v, verdict(v < goalIdleCPUPct))
		}
		fmt.Fprintf(w, "idle CPU, %s\t%s\t%s\t\t< %.0f%%\t\n", name, idle(http), idle(broker), goalIdleCPUPct)
	}
	for _, name := range []string{usersBin, senderBin} {
		fmt.Fprintf(w, "peak RSS, %s\t%.1f MB\t%.1f MB\t\t\t\n", name,
			float64(b.procs.peakKB(name))/1024, float64(b.procs.peakKB(name+" (broker)"))/1024)
	}
	fmt.Fprintf(w, "peak RSS, %s\t-\t%.1f MB\t\t\t\n", natsdBin, float64(b.procs.peakKB(natsdBin))/1024)
	w.Flush()
	b.printf("the broker form's CPU counts the NATS server's process (%s) beside the others'; its JetStream storage is on\n", natsdBin)
	b.printf("this machine's disk, one node, as the bench's PostgreSQL is.\n\n")
}

// printCosts prints the name-value lines of what a student costs, each
// name after prefix.
func (sf *sourceFigures) printCosts(out io.Writer, prefix string) {
	fmt.Fprintf(out, "%scpu_ms_per_student_at_200 %s\n", prefix, msMedian(latencyCosts(sf.latency[200], func(r latencyResult) time.Duration { return r.cpuPerStudent })))
	fmt.Fprintf(out, "%scpu_ms_per_student_burndown %s\n", prefix, msMedian(sf.burndownCPU))
	fmt.Fprintf(out, "%susers_cpu_ms_per_request %s\n", prefix, msMedian(latencyCosts(sf.latency[200], func(r latencyResult) time.Duration { return r.usersPerRequest })))
}

// sideBySide prints the sender's two sources in columns: medians, with the
// rounds' range beside each, since one round on a shared machine can be
// far from the next.
func (b *bench) sideBySide(o options, f figures) {
	poll, cdc := f.src[sourcePoll], f.src[sourceCDC]
	b.printf("the sender's sources side by side (SENDER_SOURCE; medians of %d rounds, the rounds' range in brackets)\n", o.rounds)
	w := tabwriter.NewWriter(b.out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "measure\tpoll (default)\tcdc\tgoal\t\n")
	cells := func(cell func(sf *sourceFigures) string) string {
		return cell(poll) + "\t" + cell(cdc)
	}
	fmt.Fprintf(w, "burndown\t%s\t\t\n", cells(func(sf *sourceFigures) string {
		return fmt.Sprintf("%.0f linked/s", median(sf.burndown))
	}))
	fmt.Fprintf(w, "burndown, of its bound (%.0f/s)\t%s\t≥ %.1f×\t\n", median(f.burndownBound), cells(func(sf *sourceFigures) string {
		r := median(sf.burndownRatio)
		return fmt.Sprintf("%.2f [%s] %s", r, spread(sf.burndownRatio, "%.2f"), verdict(r >= goalRatio))
	}), goalRatio)
	fmt.Fprintf(w, "  per student, burndown\t%s\t\t\n", cells(func(sf *sourceFigures) string {
		return medianWork(sf.burndownWork).String()
	}))
	for _, rate := range o.latencyRates() {
		goal, _ := goalCells(rate, 0)
		fmt.Fprintf(w, "latency at %.0f/s, p50 / p90 / p99\t%s\t%s\t\n", rate, cells(func(sf *sourceFigures) string {
			res := sf.latency[rate]
			_, v := goalCells(rate, sf.p99(rate))
			return strings.TrimSpace(fmt.Sprintf("%.1f / %.1f / %.1f ms %s",
				msFloat(medianDuration(res, func(r latencyResult) time.Duration { return r.p50 })),
				msFloat(medianDuration(res, func(r latencyResult) time.Duration { return r.p90 })),
				msFloat(sf.p99(rate)), v))
		}), goal)
		fmt.Fprintf(w, "  p99 at %.0f/s, rounds\t%s\t\t\n", rate, cells(func(sf *sourceFigures) string {
			p99s := make([]float64, 0, len(sf.latency[rate]))
			for _, r := range sf.latency[rate] {
				p99s = append(p99s, msFloat(r.p99))
			}
			return "[" + spread(p99s, "%.0f") + " ms]"
		}))
	}
	for _, rate := range o.latencyRates() {
		fmt.Fprintf(w, "  linked ≥ %s after sent at %.0f/s, rounds\t%s\t\t\n", cdcGrace, rate, cells(func(sf *sourceFigures) string {
			late, all := 0, 0
			for _, r := range sf.latency[rate] {
				late, all = late+r.late, all+r.students
			}
			return fmt.Sprintf("%d of %d", late, all)
		}))
	}
	for _, rate := range o.latencyRates() {
		lag := cdc.slotLagMax(rate)
		fmt.Fprintf(w, "slot lag at %.0f/s, largest sample\t-\t%s\t\t\n", rate, kB(lag))
	}
	fmt.Fprintf(w, "idle CPU, %s\t%s\t< %.0f%%\t\n", senderBin, cells(func(sf *sourceFigures) string {
		return fmt.Sprintf("%.2f%% of a core %s", sf.idle[senderBin], verdict(sf.idle[senderBin] < goalIdleCPUPct))
	}), goalIdleCPUPct)
	for _, rate := range o.latencyRates() {
		fmt.Fprintf(w, "PostgreSQL CPU at %.0f/s\t%s\t\t\n", rate, cells(func(sf *sourceFigures) string {
			return pct(median(serverCPUs(sf.latency[rate])))
		}))
	}
	fmt.Fprintf(w, "PostgreSQL CPU, idle\t%s\t\t\n", cells(func(sf *sourceFigures) string { return pct(sf.idleServer) }))
	fmt.Fprintf(w, "peak RSS, %s\t%.1f MB\t%.1f MB\t\t\n", senderBin,
		float64(b.procs.peakKB(senderBin))/1024, float64(b.procs.peakKB(senderBin+" (cdc)"))/1024)
	w.Flush()
	b.printf("slot lag: pg_current_wal_lsn() minus the slot's confirmed_flush_lsn, sampled every %s from the first send\n", slotLagEvery)
	b.printf("to the last link (the server's WAL position: other databases' WAL counts until the slot confirms past it).\n")
	if b.postmaster != 0 {
		b.printf("PostgreSQL CPU: all the server's processes (backends, walsenders, checkpointer...), from the first send to the\n")
		b.printf("last link, and over the idle window; the bench's own cluster serves nothing else meanwhile.\n")
	}
	b.printf("cdc burndown: the slot exists before the backlog, as after an outage (burndownReal); its bound is poll's.\n\n")
}

// serverCPUs are the runs' PostgreSQL CPU figures, those measured.
func serverCPUs(runs []latencyResult) []float64 {
	var out []float64
	for _, r := range runs {
		if r.serverCPU >= 0 {
			out = append(out, r.serverCPU)
		}
	}
	return out
}

// pct is a share of one core, or "-" when not measured.
func pct(v float64) string {
	if v < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%% of a core", v)
}

// spread is "min–max" of xs, each in format.
func spread(xs []float64, format string) string {
	if len(xs) == 0 {
		return "-"
	}
	return fmt.Sprintf(format+"–"+format, slices.Min(xs), slices.Max(xs))
}

// kB is a size in bytes as kB, or "-" when negative (not measured).
func kB(bytes float64) string {
	if bytes < 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f kB", bytes/1024)
}

func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func medianDuration[T any](xs []T, f func(T) time.Duration) time.Duration {
	fs := make([]float64, len(xs))
	for i, x := range xs {
		fs[i] = float64(f(x))
	}
	return time.Duration(median(fs))
}

func msFloat(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", msFloat(d)) }

// setAndRestart runs ALTER SYSTEM statements on cluster and restarts it
// for the settings to take effect.
func setAndRestart(ctx context.Context, cluster *pgcluster.Cluster, statements ...string) error {
	conn, err := pgx.Connect(ctx, cluster.URL())
	if err != nil {
		return fmt.Errorf("configure PostgreSQL: %w", err)
	}
	for _, statement := range statements {
		if _, err = conn.Exec(ctx, statement); err != nil {
			err = fmt.Errorf("%s: %w", statement, err)
			break
		}
	}
	_ = conn.Close(ctx)
	if err != nil {
		return fmt.Errorf("configure PostgreSQL: %w", err)
	}
	if err := cluster.Restart(ctx); err != nil {
		return fmt.Errorf("configure PostgreSQL: %w", err)
	}
	return nil
}

// logicalDecoding fails unless the server can decode its WAL for a
// replication slot (wal_level=logical), which the cdc source needs.
func logicalDecoding(ctx context.Context, server string) error {
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var level string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	if level != "logical" {
		return fmt.Errorf("the server runs with wal_level=%s; the sender's cdc source needs logical (a restart is needed), or run with -cdc=false", level)
	}
	return nil
}

// postmasterPID is the process id of the server's postmaster, on this
// host: the parent of a backend.
func postmasterPID(ctx context.Context, server string) (int, error) {
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		return 0, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var backend int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return 0, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	pid, err := parentPID(backend)
	if err != nil {
		return 0, fmt.Errorf("PostgreSQL's postmaster: %w", err)
	}
	return pid, nil
}

// tracksCommitTimes says whether the server records when each transaction
// committed (track_commit_timestamp).
func tracksCommitTimes(ctx context.Context, server string) (bool, error) {
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		return false, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	var on string
	if err := conn.QueryRow(ctx, "SHOW track_commit_timestamp").Scan(&on); err != nil {
		return false, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	return on == "on", nil
}

// latencyCosts is f of each run that measured it (f not negative).
func latencyCosts(runs []latencyResult, f func(latencyResult) time.Duration) []time.Duration {
	var out []time.Duration
	for _, r := range runs {
		if c := f(r); c >= 0 {
			out = append(out, c)
		}
	}
	return out
}

// msMedian is the median of ds in milliseconds, to the hundredth, or "-"
// for none.
func msMedian(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", msFloat(medianDuration(ds, func(d time.Duration) time.Duration { return d })))
}

// envList reads NAME=VALUE,NAME=VALUE as flag gives it.
func envList(flag, list string) ([]string, error) {
	var env []string
	if list == "" {
		return nil, nil
	}
	for kv := range strings.SplitSeq(list, ",") {
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" {
			return nil, fmt.Errorf("%s: %q is not NAME=VALUE", flag, kv)
		}
		env = append(env, kv)
	}
	return env, nil
}
