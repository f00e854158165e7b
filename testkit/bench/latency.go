package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
)

// openLoop POSTs count students to Student at rate per second, each at
// its scheduled time whether or not earlier ones were answered (an open
// loop: a slow answer does not slow the arrivals, as with real clients).
// Student n (from 1) is scheduled at start + (n-1)/rate. created is called
// for each 201 with the scheduled time; any other answer ends the run with
// an error. More than maxInFlight unanswered requests means the system does
// not sustain the rate, which is also an error.
func openLoop(ctx context.Context, client *http.Client, base string, rate float64, count, maxInFlight int64,
	created func(n int64, scheduled time.Time, id uuid.UUID)) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		wg       sync.WaitGroup
		inFlight atomic.Int64
	)
	start := time.Now()
	for n := int64(1); n <= count; n++ {
		at := start.Add(time.Duration(float64(n-1) / rate * float64(time.Second)))
		if wait := time.Until(at); wait > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
		if ctx.Err() != nil {
			break
		}
		if inFlight.Add(1) > maxInFlight {
			cancel(fmt.Errorf("%.0f/s is %w: %d requests unanswered", rate, errNotSustained, maxInFlight))
			break
		}
		wg.Go(func() {
			defer inFlight.Add(-1)
			id, err := postStudent(ctx, client, base, newStudent(n))
			if err != nil {
				cancel(err)
				return
			}
			// Without its monotonic reading, so that it compares with
			// the database's timestamps by the wall clock.
			created(n, at.Round(0), id)
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}

// errNotSustained is a run whose rate outran the system: too many
// requests were left unanswered to go on.
var errNotSustained = errors.New("not sustained")

// notSustained is the p99 (and p50, p90) of a run that did not sustain its
// rate, where one is reported rather than fatal (the broker form's): it
// fails any goal, and prints as "not sustained". 2^53 ns (104 days) is
// far beyond any run and exact as a float64, which medians go through.
const notSustained = time.Duration(1 << 53)

// unsustainedResult is a run that did not sustain its rate.
func unsustainedResult() latencyResult {
	return latencyResult{p50: notSustained, p90: notSustained, p99: notSustained, slotLagMax: -1, serverCPU: -1,
		cpuPerStudent: -1, usersPerRequest: -1}
}

// latencyResult is one run's creation-to-link latencies.
type latencyResult struct {
	p50, p90, p99 time.Duration
	students      int
	// slotLagMax (cdc only) is the largest lag of the replication slot
	// sampled during the run, in bytes of WAL: pg_current_wal_lsn() minus
	// the slot's confirmed_flush_lsn; -1 when not sampled.
	slotLagMax float64
	// serverCPU is PostgreSQL's CPU use over the run, from the first send
	// to the last link, in percent of one core; -1 when not measured (a
	// server not the bench's own).
	serverCPU float64
	// late counts the students linked cdcGrace or more after they were
	// sent: with the cdc source, rows the stream did not claim, left to
	// the poll until they were that old.
	late int
	// tail is where the slowest 1% spent their time; nil when the server
	// does not track commit timestamps.
	tail *tailStages
	// claimRows and recordRows are the mean rows per claim and per
	// recording transaction over the run (system.batchSizes).
	claimRows, recordRows float64
	// cpuPerStudent is the whole system's CPU (Student, Users, the sender
	// and PostgreSQL's processes; not the load generator) over the run,
	// per student sent; usersPerRequest is Users' process alone per
	// student (one create-user request each, retries aside). Both -1 when
	// not measured.
	cpuPerStudent, usersPerRequest time.Duration
	// perStudent splits cpuPerStudent by process: each binary, and
	// "postgres" for the server's processes; nil when not measured.
	perStudent map[string]time.Duration
	// serverPerStudent splits perStudent's PostgreSQL by process
	// (cpuUse.serverByRole); nil when not measured.
	serverPerStudent map[string]time.Duration
	// sleepsPerStudent is how often each process went to sleep over the
	// run, per student sent (cpuUse.sleeps), and serverSleepsPerStudent
	// PostgreSQL's by role; PostgreSQL is absent, and the split nil, when
	// not measured.
	sleepsPerStudent       map[string]float64
	serverSleepsPerStudent map[string]float64
}

// postgresName is what PostgreSQL's processes are called in a split of
// the CPU by process.
const postgresName = "PostgreSQL"

// costs is the run's line of batch sizes and CPU: PostgreSQL's share of a
// core, the whole system's milliseconds per student and their split by
// process, and Users' per request.
func (r latencyResult) costs() string {
	split := ""
	if r.perStudent != nil {
		split = fmt.Sprintf(" (Student %.2f, Users %.2f, sender %.2f, PostgreSQL %.2f)", msFloat(r.perStudent[studentBin]),
			msFloat(r.perStudent[usersBin]), msFloat(r.perStudent[senderBin]), msFloat(r.perStudent[postgresName]))
		if broker, ok := r.perStudent[natsdBin]; ok {
			split = strings.TrimSuffix(split, ")") + fmt.Sprintf(", broker %.2f)", msFloat(broker))
		}
	}
	one := []latencyResult{r}
	line := fmt.Sprintf("rows per claim %.1f, per recording %.1f; PostgreSQL CPU %s; CPU ms per student %s%s, Users' per request %s",
		r.claimRows, r.recordRows, pct(r.serverCPU), msMedian(latencyCosts(one, func(r latencyResult) time.Duration { return r.cpuPerStudent })),
		split, msMedian(latencyCosts(one, func(r latencyResult) time.Duration { return r.usersPerRequest })))
	return line
}

// serverSplit is PostgreSQL's CPU per student by process, largest first,
// "" when not measured.
func (r latencyResult) serverSplit() string {
	if len(r.serverPerStudent) == 0 {
		return ""
	}
	var parts []string
	for _, role := range largestFirst(r.serverPerStudent, 10*time.Microsecond) {
		parts = append(parts, fmt.Sprintf("%s %.2f", role, msFloat(r.serverPerStudent[role])))
	}
	return "PostgreSQL's ms per student by process: " + strings.Join(parts, ", ")
}

// largestFirst is m's keys whose values are at least least, largest value
// first (by name among equals).
func largestFirst[V cmp.Ordered](m map[string]V, least V) []string {
	keys := slices.DeleteFunc(slices.Collect(maps.Keys(m)), func(k string) bool { return m[k] < least })
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(cmp.Compare(m[b], m[a]), cmp.Compare(a, b)) })
	return keys
}

// sleeps is the run's line of wake-ups: how often each process went to
// sleep per student sent, and PostgreSQL's by role, "" when not measured.
func (r latencyResult) sleeps() string {
	if len(r.sleepsPerStudent) == 0 {
		return ""
	}
	of := func(name string) string {
		if v, ok := r.sleepsPerStudent[name]; ok {
			return fmt.Sprintf("%.1f", v)
		}
		return "-"
	}
	line := fmt.Sprintf("sleeps per student (each ends in a wake-up): Student %s, Users %s, sender %s",
		of(studentBin), of(usersBin), of(senderBin))
	if _, ok := r.sleepsPerStudent[natsdBin]; ok {
		line += ", broker " + of(natsdBin)
	}
	if pg, ok := r.sleepsPerStudent[postgresName]; ok {
		var parts []string
		for _, role := range largestFirst(r.serverSleepsPerStudent, 0.05) {
			parts = append(parts, fmt.Sprintf("%s %.1f", role, r.serverSleepsPerStudent[role]))
		}
		line += fmt.Sprintf(", PostgreSQL %.1f", pg)
		if len(parts) > 0 {
			line += " (" + strings.Join(parts, ", ") + ")"
		}
	}
	return line
}

// tailStages splits the latency of the slowest 1% of a run (those at or
// above its p99) into the five legs a student travels, each the median
// over those students, so that a missed goal says where to look:
//   - toStudent: the client's scheduled send to the start of Student's
//     transaction (the load generator, HTTP, Student's pool);
//   - toClaim: that start to the sender's claim of the row (Student's
//     commit, the sender's wake-up or poll, a free slot, the claim query);
//   - toUsers: the claim to the start of Users' transaction for the key
//     (the claim's answer, a free worker, the request to Users);
//   - inUsers: Users' transaction, start to commit;
//   - toLink: Users' commit to the commit that linked the student (the
//     answer back, the wait for a recorder, the recording).
//
// seconds is in how many distinct seconds of the run those students were
// sent: few means a stall that caught everyone at once, many a tail spread
// through the run. retried counts those delivered on a second attempt or
// later: for them the Users legs are those of the first attempt that
// reached Users, so to Users may be negative and in Users run on to the
// replay.
type tailStages struct {
	toStudent, toClaim, toUsers, inUsers, toLink time.Duration
	seconds, retried                             int
}

func (t *tailStages) String() string {
	return fmt.Sprintf("slowest 1%%, medians: to Student %s, to claim %s, to Users %s, in Users %s, to link %s; sent in %d distinct seconds; %d retried",
		ms(t.toStudent), ms(t.toClaim), ms(t.toUsers), ms(t.inUsers), ms(t.toLink), t.seconds, t.retried)
}

// cdcGrace is the sender's shipped SENDER_CDC_GRACE.
const cdcGrace = 10 * time.Second

// latency runs all three binaries with shipped defaults, sends students at
// rate per second for warm-up plus duration, and measures, for each student
// sent after the warm-up, creation to link: from the moment the client was
// scheduled to send POST /students to the commit of the transaction that
// linked the student (b.linkedAt). That spans Student's request and
// transaction, the sender noticing the row (its wake-up or poll), the
// claim, the delivery to Users and Users' transaction, and the recording
// transaction. Client and database must share a clock: the bench's own
// cluster does; a TEST_DATABASE_URL on another host adds its skew.
// after, when not nil, runs while the system is still up (idle CPU).
// The sender takes new rows from source (SENDER_SOURCE); a cdc sender is
// streaming from its slot before the first student is sent, and the slot's
// lag is sampled from the first send until the last student is linked.
func (b *bench) latency(ctx context.Context, rate float64, source string, warmup, duration time.Duration, after func(*system) error) (latencyResult, error) {
	d, err := b.freshDatabases(ctx)
	if err != nil {
		return latencyResult{}, err
	}
	defer b.drop(d)
	if err := seedHistory(ctx, d, b.history); err != nil {
		return latencyResult{}, err
	}
	sys, err := b.start(ctx, d, which{student: true, users: true, sender: true, source: source}, nil)
	if err != nil {
		return latencyResult{}, err
	}
	defer sys.stop()
	lagMax := func() (float64, error) { return -1, nil }
	if source == sourceCDC {
		if err := sys.waitStreaming(ctx); err != nil {
			return latencyResult{}, err
		}
		lagMax = sampleSlotLag(ctx, d.studentAdmin, d.slot, slotLagEvery)
		defer func() { _, _ = lagMax() }() // on the way out of an error
	}

	firstMeasured := int64(math.Round(warmup.Seconds()*rate)) + 1
	var (
		mu        sync.Mutex
		scheduled = map[uuid.UUID]time.Time{}
		sent      atomic.Int64
	)
	client := httpClient(256)
	defer client.CloseIdleConnections()
	count := int64(math.Round((warmup + duration).Seconds() * rate))
	spent, err := b.cpuSince(ctx, sys)
	if err != nil {
		return latencyResult{}, err
	}
	profiled := func() error { return nil }
	if b.perfDir != "" && rate == profileRate {
		profiled = b.profile(ctx, fmt.Sprintf("%s-%.0f", b.perfName, rate), warmup, duration)
		defer func() { _ = profiled() }() // perf ends before the run's processes, even after an error
	}
	err = openLoop(ctx, client, sys.studentURL(), rate, count, 2048, func(n int64, at time.Time, id uuid.UUID) {
		sent.Add(1)
		if n < firstMeasured {
			return
		}
		mu.Lock()
		scheduled[id] = at
		mu.Unlock()
	})
	if err != nil {
		return latencyResult{}, errors.Join(fmt.Errorf("%.0f/s: %w", rate, err), sys.alive())
	}
	if _, err := waitLinked(ctx, d.studentAdmin, b.history+int(sent.Load()), 60*time.Second, sys.alive); err != nil {
		return latencyResult{}, fmt.Errorf("%.0f/s: %w", rate, err)
	}
	if err := profiled(); err != nil {
		return latencyResult{}, fmt.Errorf("%.0f/s: %w", rate, err)
	}
	cost, err := spent()
	if err != nil {
		return latencyResult{}, fmt.Errorf("%.0f/s: %w", rate, err)
	}
	claimRows, recordRows, err := sys.batchSizes(ctx)
	if err != nil {
		return latencyResult{}, fmt.Errorf("%.0f/s: %w", rate, err)
	}
	slotLag, err := lagMax()
	if err != nil {
		return latencyResult{}, fmt.Errorf("%.0f/s: %w", rate, err)
	}
	atEnd, err := spent()
	if err != nil {
		return latencyResult{}, fmt.Errorf("%.0f/s: %w", rate, err)
	}
	serverPct := atEnd.pct(atEnd.server)
	ids := make([]uuid.UUID, 0, len(scheduled))
	for id := range scheduled {
		ids = append(ids, id)
	}
	// The outbox row was last written by the recording transaction that
	// linked its student, so its xmin is that transaction.
	linkedAt := "delivered_at"
	if b.commitTimes {
		linkedAt = "pg_xact_commit_timestamp(xmin)"
	}
	rows, err := d.studentAdmin.Query(ctx,
		"SELECT student_id, "+linkedAt+" FROM outbox WHERE student_id = ANY($1) AND delivered_at IS NOT NULL", ids)
	if err != nil {
		return latencyResult{}, fmt.Errorf("delivery times: %w", err)
	}
	lat := make([]time.Duration, 0, len(ids))
	for rows.Next() {
		var (
			id uuid.UUID
			at time.Time
		)
		if err := rows.Scan(&id, &at); err != nil {
			rows.Close()
			return latencyResult{}, fmt.Errorf("delivery times: %w", err)
		}
		lat = append(lat, at.Sub(scheduled[id]))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return latencyResult{}, fmt.Errorf("delivery times: %w", err)
	}
	if len(lat) != len(ids) {
		return latencyResult{}, fmt.Errorf("%.0f/s: %d of %d measured students have no delivered_at", rate, len(ids)-len(lat), len(ids))
	}
	if len(lat) == 0 {
		return latencyResult{}, fmt.Errorf("%.0f/s: no student sent after the warm-up", rate)
	}
	if err := verifyLinked(ctx, d, b.history+int(sent.Load())); err != nil {
		return latencyResult{}, err
	}
	slices.Sort(lat)
	late := len(lat) - sort.Search(len(lat), func(i int) bool { return lat[i] >= cdcGrace })
	res := latencyResult{p50: percentile(lat, 50), p90: percentile(lat, 90), p99: percentile(lat, 99), students: len(lat), slotLagMax: slotLag, serverCPU: serverPct, late: late,
		claimRows: claimRows, recordRows: recordRows, cpuPerStudent: -1, usersPerRequest: -1}
	if n := time.Duration(sent.Load()); n > 0 {
		if total := cost.total(); total >= 0 {
			res.cpuPerStudent = total / n
			res.perStudent = map[string]time.Duration{postgresName: cost.server / n}
			for name, d := range cost.byProc {
				res.perStudent[name] = d / n
			}
			res.serverPerStudent = map[string]time.Duration{}
			for role, d := range cost.serverByRole {
				res.serverPerStudent[role] = d / n
			}
		}
		if users, ok := cost.byProc[usersBin]; ok {
			res.usersPerRequest = users / n
		}
		res.sleepsPerStudent = map[string]float64{}
		for name, c := range cost.sleeps {
			res.sleepsPerStudent[name] = float64(c) / float64(n)
		}
		if cost.serverSleepsByRole != nil {
			res.serverSleepsPerStudent = map[string]float64{}
			for role, c := range cost.serverSleepsByRole {
				res.serverSleepsPerStudent[role] = float64(c) / float64(n)
			}
		}
	}
	if b.commitTimes {
		if res.tail, err = tailOf(ctx, d, ids, scheduled, res.p99); err != nil {
			return latencyResult{}, fmt.Errorf("%.0f/s: %w", rate, err)
		}
	}
	if after != nil {
		if err := after(sys); err != nil {
			return res, err
		}
	}
	return res, sys.alive()
}

// slotLagEvery is how often the replication slot's lag is sampled during
// a cdc latency run: one catalog read, cheap beside the run's traffic.
const slotLagEvery = 100 * time.Millisecond

// sampleSlotLag reads the slot's lag in bytes (the server's current WAL
// position minus the slot's confirmed_flush_lsn, as the sender's
// outbox_cdc_slot_lag_bytes) every interval, in the background, until the
// function it returns is called; that returns the largest lag seen. The
// WAL position is the server's, so WAL that other databases write counts
// too, until the slot confirms past it.
func sampleSlotLag(ctx context.Context, pool *pgxpool.Pool, slot string, every time.Duration) (stop func() (float64, error)) {
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	var (
		most float64
		err  error
	)
	sample := func(ctx context.Context) (float64, error) {
		var lag float64
		e := pool.QueryRow(ctx, `
			SELECT COALESCE(max(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)), 0)::float8
			FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&lag)
		if e != nil {
			return 0, fmt.Errorf("slot lag: %w", e)
		}
		return lag, nil
	}
	go func() {
		defer close(done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			lag, e := sample(ctx)
			if ctx.Err() != nil {
				return
			}
			if e != nil {
				err = e
				return
			}
			most = max(most, lag)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() (float64, error) {
		cancel()
		<-done
		if err != nil {
			return most, err
		}
		// One more at the end: on a loaded machine a sample may still have
		// been in flight when the loop was stopped, and the lag then counts.
		lag, err := sample(parent)
		return max(most, lag), err
	}
}

// tailOf measures the legs of the students whose creation-to-link latency
// is at least p99 (tailStages). The legs' ends are Student's clock just
// before its insert (students.created_at), the start and the commit of Users'
// (the inbox row's created_at and its last writer's commit: a replay
// would move that later, and is rare at a steady rate) and the commit that
// linked the student. The claim's time is its lease's end (available_at)
// less the shipped SENDER_LEASE: the last claim set it, and nothing after.
func tailOf(ctx context.Context, d *databases, ids []uuid.UUID, scheduled map[uuid.UUID]time.Time, p99 time.Duration) (*tailStages, error) {
	type legs struct {
		sent, studentBegan, claimed, usersBegan, usersCommitted, linked time.Time
		attempts                                                        int
	}
	byKey := map[string]*legs{}
	keys := []string{}
	rows, err := d.studentAdmin.Query(ctx, `
		SELECT s.id, o.idempotency_key::text, s.created_at, o.available_at - $2::interval, o.attempts,
		       pg_xact_commit_timestamp(o.xmin)
		FROM outbox o JOIN students s ON s.id = o.student_id
		WHERE o.student_id = ANY($1) AND o.delivered_at IS NOT NULL`, ids, senderLease)
	if err != nil {
		return nil, fmt.Errorf("tail legs: %w", err)
	}
	for rows.Next() {
		var (
			id  uuid.UUID
			key string
			l   legs
		)
		if err := rows.Scan(&id, &key, &l.studentBegan, &l.claimed, &l.attempts, &l.linked); err != nil {
			rows.Close()
			return nil, fmt.Errorf("tail legs: %w", err)
		}
		l.sent = scheduled[id]
		if l.linked.Sub(l.sent) >= p99 {
			byKey[key] = &l
			keys = append(keys, key)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tail legs: %w", err)
	}
	rows, err = d.usersAdmin.Query(ctx,
		"SELECT idempotency_key, created_at, pg_xact_commit_timestamp(xmin) FROM inbox WHERE caller = $1 AND idempotency_key = ANY($2)",
		senderCaller, keys)
	if err != nil {
		return nil, fmt.Errorf("tail legs in Users: %w", err)
	}
	for rows.Next() {
		var (
			key           string
			began, commit time.Time
		)
		if err := rows.Scan(&key, &began, &commit); err != nil {
			rows.Close()
			return nil, fmt.Errorf("tail legs in Users: %w", err)
		}
		if l := byKey[key]; l != nil {
			l.usersBegan, l.usersCommitted = began, commit
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tail legs in Users: %w", err)
	}
	var toStudent, toClaim, toUsers, inUsers, toLink []time.Duration
	seconds, retried := map[int64]bool{}, 0
	for key, l := range byKey {
		if l.usersBegan.IsZero() {
			return nil, fmt.Errorf("tail legs: key %s is linked but Users has no inbox row for it", key)
		}
		toStudent = append(toStudent, l.studentBegan.Sub(l.sent))
		toClaim = append(toClaim, l.claimed.Sub(l.studentBegan))
		toUsers = append(toUsers, l.usersBegan.Sub(l.claimed))
		inUsers = append(inUsers, l.usersCommitted.Sub(l.usersBegan))
		toLink = append(toLink, l.linked.Sub(l.usersCommitted))
		seconds[l.sent.Unix()] = true
		if l.attempts > 1 {
			retried++
		}
	}
	if len(byKey) == 0 {
		return nil, errors.New("tail legs: no student at or above p99")
	}
	mid := func(ds []time.Duration) time.Duration {
		slices.Sort(ds)
		return percentile(ds, 50)
	}
	return &tailStages{toStudent: mid(toStudent), toClaim: mid(toClaim), toUsers: mid(toUsers), inUsers: mid(inUsers), toLink: mid(toLink),
		seconds: len(seconds), retried: retried}, nil
}

// percentile is the nearest-rank percentile of sorted.
func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// idleCPU is each process's CPU use while nothing is asked of the system,
// in percent of one core: settle first, then utime+stime over window.
// server is PostgreSQL's own over the window, the server's part of what
// the sender's source costs at rest (-1 when not measured).
func (b *bench) idleCPU(ctx context.Context, sys *system, settle, window time.Duration) (procs map[string]float64, server float64, err error) {
	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	if err := sleep(settle); err != nil {
		return nil, 0, err
	}
	spent, err := b.cpuSince(ctx, sys)
	if err != nil {
		return nil, 0, err
	}
	if err := sleep(window); err != nil {
		return nil, 0, err
	}
	use, err := spent()
	if err != nil {
		return nil, 0, err
	}
	out := map[string]float64{}
	for name := range use.byProc {
		out[name] = use.pct(use.byProc[name])
	}
	return out, use.pct(use.server), nil
}

// linkedAt says where latency ends, for the report.
func (b *bench) linkedAt() string {
	if b.commitTimes {
		return "the commit of the transaction that linked the student (track_commit_timestamp)"
	}
	return "the outbox row's delivered_at, the start of the transaction that linked the student\n" +
		"(the server does not track commit timestamps; its commit is not counted)"
}

// cpuUse is the CPU time used over a window: by each of the system's
// processes (by binary), and by PostgreSQL's (its postmaster and every
// backend, b.postmaster; -1 when not measured: a server not the bench's
// own, or one that could not be read).
type cpuUse struct {
	byProc  map[string]time.Duration
	server  time.Duration
	elapsed time.Duration
	// serverByRole splits server by what each of PostgreSQL's processes
	// is (serverCPU); nil when not measured.
	serverByRole map[string]time.Duration
	// sleeps is how often each process went to sleep over the window (by
	// binary, and postgresName for PostgreSQL's when measured), and
	// serverSleepsByRole PostgreSQL's split by role; see sleeps.
	sleeps             map[string]int64
	serverSleepsByRole map[string]int64
}

// total is every process's and PostgreSQL's use, -1 when PostgreSQL's was
// not measured.
func (u cpuUse) total() time.Duration {
	if u.server < 0 {
		return -1
	}
	t := u.server
	for _, d := range u.byProc {
		t += d
	}
	return t
}

// pct is d over the window in percent of one core, -1 for -1.
func (u cpuUse) pct(d time.Duration) float64 {
	if d < 0 {
		return -1
	}
	return 100 * d.Seconds() / u.elapsed.Seconds()
}

// cpuSince starts measuring CPU: the function it returns gives the use
// since (and may be called more than once). A process that cannot be read
// is an error; PostgreSQL's that cannot be read is "not measured".
func (b *bench) cpuSince(ctx context.Context, sys *system) (func() (cpuUse, error), error) {
	ps := sys.running()
	before := make([]time.Duration, len(ps))
	slept := make([]int64, len(ps))
	for i, p := range ps {
		t, err := cpuTime(p.pid())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		before[i] = t
		if slept[i], err = sleeps(p.pid()); err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
	}
	server := func() (time.Duration, map[int]serverProc, error) {
		return 0, nil, errors.New("no server of the bench's own")
	}
	if b.postmaster != 0 {
		server = func() (time.Duration, map[int]serverProc, error) { return serverCPU(b.postmaster) }
	}
	serverBefore, procsBefore, serverErr := server()
	start := time.Now()
	return func() (cpuUse, error) {
		use := cpuUse{byProc: map[string]time.Duration{}, server: -1, elapsed: time.Since(start), sleeps: map[string]int64{}}
		for i, p := range ps {
			t, err := cpuTime(p.pid())
			if err != nil {
				return cpuUse{}, fmt.Errorf("%s: %w", p.name, err)
			}
			use.byProc[p.name] += t - before[i]
			n, err := sleeps(p.pid())
			if err != nil {
				return cpuUse{}, fmt.Errorf("%s: %w", p.name, err)
			}
			// Fewer than before: a thread exited with its count. The
			// count is then not measured (absent), rather than wrong.
			if n >= slept[i] {
				use.sleeps[p.name] += n - slept[i]
			}
		}
		if after, procs, err := server(); serverErr == nil && err == nil {
			// A connection a service names (the sender's listener) is told
			// apart from its role's others: it is woken for other reasons.
			// Without the names the split is by role alone.
			apps, _ := b.backendApps(ctx)
			use.server = after - serverBefore
			use.serverByRole = serverSplit(use.server, named(procsBefore, apps), named(procs, apps))
			use.sleeps[postgresName], use.serverSleepsByRole = serverSleeps(named(procsBefore, apps), named(procs, apps))
		}
		return use, nil
	}, nil
}
