package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/internal/database"
	"github.com/outboxref/outboxref/testkit/freeport"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

// The reconciler's measure (-reconciler): what a full pass and an
// incremental pass cost over a deployment's worth of students, with the
// shipped defaults (pages of 1,000, 20ms apart).
//
// The databases hold -students students, each linked to its user, with its
// delivered outbox row and Users' answer under its key, made over the last
// weeks: every row kept, as if neither retention ever purged (the most a
// pass can have to read). Then:
//
//   - a full pass: `reconciler once`, its wall time, its own CPU and the
//     CPU of the server's backends it used (by database), its report's rows
//     and statements, and its longest statement; meanwhile a writer makes a
//     student with its outbox row every 10ms, as Student's app role, with
//     Student's own statement, and the bench compares those writes'
//     latency with the writer's alone, before the pass;
//   - an incremental pass: `reconciler serve`, whose first pass is full;
//     once it ends, -reconcile-new new students arrive (linked, as the
//     sender would leave them), and the next pass, incremental, is measured
//     the same way from /report, its CPU between the two passes' ends.

const reconcilerBin = "reconciler"

// reconcilerToken is the bench's operator token for /report.
const reconcilerToken = "bench-reconciler-token-0123456789"

func buildReconciler(ctx context.Context, root, dir string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, reconcilerBin), "./reconciler")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build the reconciler: %w\n%s", err, out)
	}
	return nil
}

// reconcilerReport is the part of the reconciler's JSON report read here.
type reconcilerReport struct {
	Kind            string    `json:"kind"`
	FinishedAt      time.Time `json:"finished_at"`
	DurationSeconds float64   `json:"duration_seconds"`
	Drift           bool      `json:"drift"`
	Judged          struct {
		Students int `json:"students"`
		Users    int `json:"users"`
	} `json:"judged"`
	Read map[string]struct {
		Rows           int     `json:"rows"`
		Statements     int     `json:"statements"`
		LongestSeconds float64 `json:"longest_statement_seconds"`
	} `json:"read"`
	Classes map[string]struct {
		Count int `json:"count"`
	} `json:"classes"`
}

func (r reconcilerReport) rows() int {
	n := 0
	for _, s := range r.Read {
		n += s.Rows
	}
	return n
}

// passCost is one pass, measured.
type passCost struct {
	report      reconcilerReport
	reconciler  time.Duration            // the reconciler process's CPU
	server      time.Duration            // its backends' CPU
	serverByDB  map[string]time.Duration // the same, by database
	wall        time.Duration
	writeBefore []time.Duration // the writer's latencies alone (full pass only)
	writeDuring []time.Duration // and during the pass
	locks       lockWatch       // full pass only
}

// lockWatch is what samples of pg_locks saw during a pass.
type lockWatch struct {
	samples int
	modes   map[string]bool // every lock mode the reconciler's sessions held
	waits   int             // locks some session waited for, summed over the samples
	err     error
}

func (l *lockWatch) sample(ctx context.Context, b *bench) {
	if l.err != nil {
		return
	}
	l.err = b.withServer(ctx, func(conn *pgx.Conn) error {
		rows, err := conn.Query(ctx, `
			SELECT l.mode, l.granted, COALESCE(a.usename = $1, false)
			FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'relation' OR NOT l.granted`, migrations.Reconciler)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var mode string
			var granted, reconciler bool
			if err := rows.Scan(&mode, &granted, &reconciler); err != nil {
				return err
			}
			if !granted {
				l.waits++
			}
			if reconciler && granted {
				l.modes[mode] = true
			}
		}
		l.samples++
		return rows.Err()
	})
}

func (b *bench) reconcilerMeasure(ctx context.Context, o options) error {
	if b.postmaster == 0 {
		return fmt.Errorf("-reconciler measures the server's CPU, on the bench's own cluster only: unset %s", pgtest.EnvVar)
	}
	b.printf("reconciler: %d students, linked, with their outbox rows and Users' answers\n", o.students)
	d, err := b.freshDatabases(ctx)
	if err != nil {
		return err
	}
	defer b.drop(d)
	seeded := time.Now()
	if err := seedLinked(ctx, d, o.students); err != nil {
		return err
	}
	b.printf("  seeded in %s\n", time.Since(seeded).Round(time.Second))

	full, err := b.fullPass(ctx, d)
	if err != nil {
		return err
	}
	b.printPass("full pass (reconciler once)", full)
	b.printWrites(full)
	inc, fullServe, err := b.incrementalPass(ctx, d, o)
	if err != nil {
		return err
	}
	b.printPass("full pass (reconciler serve's first)", fullServe)
	b.printPass(fmt.Sprintf("incremental pass, %d new students", o.reconcileNew), inc)

	b.printf("\nname value pairs:\n")
	for _, p := range []struct {
		name string
		c    passCost
	}{{"full", full}, {"incremental", inc}} {
		b.printf("reconciler_%s_pass_seconds %.2f\n", p.name, p.c.report.DurationSeconds)
		b.printf("reconciler_%s_pass_cpu_seconds %.2f\n", p.name, p.c.reconciler.Seconds())
		b.printf("reconciler_%s_pass_server_cpu_seconds %.2f\n", p.name, p.c.server.Seconds())
		b.printf("reconciler_%s_pass_rows_per_second %.0f\n", p.name, float64(p.c.report.rows())/p.c.report.DurationSeconds)
		b.printf("reconciler_%s_pass_longest_statement_ms %.1f\n", p.name, 1000*p.c.longest())
	}
	b.printf("reconciler_writes_during_full_pass_p99_ms %.1f\n", msFloat(latencyAt(full.writeDuring, 99)))
	b.printf("reconciler_writes_before_full_pass_p99_ms %.1f\n", msFloat(latencyAt(full.writeBefore, 99)))
	b.printf("reconciler_full_pass_lock_waits %d\n", full.locks.waits)
	return nil
}

func (c passCost) longest() float64 {
	l := 0.0
	for _, s := range c.report.Read {
		l = max(l, s.LongestSeconds)
	}
	return l
}

func (b *bench) printPass(title string, c passCost) {
	r := c.report
	b.printf("\n%s: %s, drift %v, judged %d students and %d users\n", title,
		time.Duration(r.DurationSeconds*float64(time.Second)).Round(10*time.Millisecond), r.Drift, r.Judged.Students, r.Judged.Users)
	for _, db := range slices.Sorted(func(yield func(string) bool) {
		for k := range r.Read {
			if !yield(k) {
				return
			}
		}
	}) {
		s := r.Read[db]
		b.printf("  read from %s's database: %d rows in %d statements, the longest %.1f ms\n", db, s.Rows, s.Statements, 1000*s.LongestSeconds)
	}
	b.printf("  rows read per second: %.0f\n", float64(r.rows())/r.DurationSeconds)
	b.printf("  CPU: the reconciler %s, PostgreSQL's backends for it %s (%s)\n",
		c.reconciler.Round(time.Millisecond), c.server.Round(time.Millisecond), byDatabase(c.serverByDB))
	b.printf("  load: the reconciler %.0f%% of a core, PostgreSQL %.0f%% of a core, over the pass\n",
		100*c.reconciler.Seconds()/r.DurationSeconds, 100*c.server.Seconds()/r.DurationSeconds)
}

func byDatabase(m map[string]time.Duration) string {
	var parts []string
	for _, db := range slices.Sorted(func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}) {
		parts = append(parts, fmt.Sprintf("%s %s", db, m[db].Round(time.Millisecond)))
	}
	return strings.Join(parts, ", ")
}

func (b *bench) printWrites(c passCost) {
	if len(c.writeDuring) == 0 {
		return
	}
	b.printf("  locks, in %d samples of pg_locks: the reconciler held %v; locks waited for: %d\n",
		c.locks.samples, slices.Sorted(maps.Keys(c.locks.modes)), c.locks.waits)
	for _, w := range []struct {
		when string
		l    []time.Duration
	}{{"alone, before the pass", c.writeBefore}, {"during the pass", c.writeDuring}} {
		b.printf("  Student's writes %s: %d, p50 %s, p99 %s, max %s\n", w.when, len(w.l),
			ms(latencyAt(w.l, 50)), ms(latencyAt(w.l, 99)), ms(latencyAt(w.l, 100)))
	}
}

// latencyAt is the p-th percentile (0 to 100) of l.
func latencyAt(l []time.Duration, p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	return percentile(s, p)
}

// seedLinked fills the pair with n students as a running system leaves
// them: each linked to its user, its outbox row delivered, Users' user and
// its answer under the row's key, created over the last weeks (a second
// apart, the newest a day old, so that none is "since" the passes
// measured here). Ids and keys come from the row's number, so that the two
// databases agree without the client carrying a million of each.
func seedLinked(ctx context.Context, d *databases, n int) error {
	const chunk = 100_000
	for from := 1; from <= n; from += chunk {
		to := min(from+chunk-1, n)
		if _, err := d.studentAdmin.Exec(ctx, `
			WITH s AS (
				INSERT INTO students (id, name, email, document_number, user_id, created_at, updated_at)
				SELECT md5('student-' || i)::uuid, 'Graduate ' || i, 'graduate' || i || '@example.com', 'graduate-' || i,
				       md5('user-' || i)::uuid, at, at
				FROM generate_series($1::int, $2::int) i,
				     LATERAL (SELECT now() - interval '1 day' - (($3::int - i) * interval '1 second') AS at) t
				RETURNING id, name, email, document_number, created_at)
			INSERT INTO outbox (idempotency_key, operation, student_id, payload, state, attempts, created_at, age_from, key_minted_at, delivered_at)
			SELECT md5('key-' || replace(s.document_number, 'graduate-', ''))::uuid, 'create-user', s.id,
			       jsonb_build_object('name', s.name, 'email', s.email, 'document_number', s.document_number),
			       'delivered', 1, s.created_at, s.created_at, s.created_at, s.created_at + interval '1 second'
			FROM s`, from, to, n); err != nil {
			return fmt.Errorf("seed Student's database: %w", err)
		}
		if _, err := d.usersAdmin.Exec(ctx, `
			WITH u AS (
				INSERT INTO users (id, name, email, document_number, created_at)
				SELECT md5('user-' || i)::uuid, 'Graduate ' || i, 'graduate' || i || '@example.com', 'graduate-' || i, at
				FROM generate_series($1::int, $2::int) i,
				     LATERAL (SELECT now() - interval '1 day' - (($3::int - i) * interval '1 second') + interval '500 milliseconds' AS at) t
				RETURNING id, name, email, document_number, created_at)
			INSERT INTO inbox (caller, idempotency_key, request_hash, request, status_code, response_body, resource_id, created_at)
			SELECT $4::text, md5('key-' || replace(u.document_number, 'graduate-', ''))::uuid::text, sha256(r.request::text::bytea),
			       r.request, 201, '{}', u.id, u.created_at
			FROM u CROSS JOIN LATERAL (SELECT jsonb_build_object('name', u.name, 'email', u.email, 'document_number', u.document_number) AS request) r`,
			from, to, n, senderCaller); err != nil {
			return fmt.Errorf("seed Users' database: %w", err)
		}
	}
	// As autovacuum leaves a table that has run a while: statistics, and a
	// visibility map that lets index-only scans skip the heap.
	if _, err := d.studentAdmin.Exec(ctx, "VACUUM (ANALYZE) students, outbox"); err != nil {
		return fmt.Errorf("vacuum Student's database: %w", err)
	}
	if _, err := d.usersAdmin.Exec(ctx, "VACUUM (ANALYZE) users, inbox"); err != nil {
		return fmt.Errorf("vacuum Users' database: %w", err)
	}
	return nil
}

// reconcilerEnv is the reconciler's environment on the pair, as its role.
func (b *bench) reconcilerEnv(d *databases) []string {
	return []string{
		"RECONCILER_STUDENT_DATABASE_URL=" + b.dbURL(d.student, migrations.Reconciler, ""),
		"RECONCILER_STUDENT_DATABASE_PASSWORD=" + pgtest.Passwords[migrations.Reconciler],
		"RECONCILER_USERS_DATABASE_URL=" + b.dbURL(d.users, migrations.Reconciler, ""),
		"RECONCILER_USERS_DATABASE_PASSWORD=" + pgtest.Passwords[migrations.Reconciler],
		"RECONCILER_SENDER_CALLER=" + senderCaller,
		"LOG_LEVEL=warn",
	}
}

// backendCPU is one of the reconciler's backends: the database it serves
// and the CPU it has used.
type backendCPU struct {
	db  string
	cpu time.Duration
}

// reconcilerBackends are the reconciler's backends now, by process id.
func (b *bench) reconcilerBackends() (map[int]backendCPU, error) {
	_, procs, err := serverCPU(b.postmaster)
	if err != nil {
		return nil, err
	}
	out := map[int]backendCPU{}
	for pid, p := range procs {
		if p.role == migrations.Reconciler {
			out[pid] = backendCPU{databaseOf(pid), p.cpu}
		}
	}
	return out, nil
}

// cpuBetween is the CPU the backends used between two readings, by
// database: a backend new since the first reading, all of its CPU; one
// gone by the second, none (fullPass samples while they live).
func cpuBetween(before, after map[int]backendCPU) map[string]time.Duration {
	out := map[string]time.Duration{}
	for pid, a := range after {
		out[a.db] += a.cpu - before[pid].cpu
	}
	return out
}

func sum(m map[string]time.Duration) time.Duration {
	var t time.Duration
	for _, v := range m {
		t += v
	}
	return t
}

// databaseOf is the database a backend serves, from its title ("postgres:
// ROLE DATABASE HOST(PORT) STATE"), named as the reports name the pair:
// Student's or Users'.
func databaseOf(pid int) string {
	title := procTitle(pid)
	f := strings.Fields(strings.TrimPrefix(title, "postgres: "))
	if len(f) < 2 {
		return "?"
	}
	switch {
	case strings.HasPrefix(f[1], "bench_student_"):
		return "student"
	case strings.HasPrefix(f[1], "bench_users_"):
		return "users"
	}
	return f[1]
}

// fullPass runs `reconciler once --json` beside Student's writer.
func (b *bench) fullPass(ctx context.Context, d *databases) (passCost, error) {
	w, err := b.startWriter(ctx, d)
	if err != nil {
		return passCost{}, err
	}
	defer w.stop()
	// The writer alone first, for the latencies to compare with.
	if err := pause(ctx, 10*time.Second); err != nil {
		return passCost{}, err
	}
	alone := w.take()

	before, err := b.reconcilerBackends()
	if err != nil {
		return passCost{}, err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(b.bins, reconcilerBin), "once", "--json")
	cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, b.reconcilerEnv(d)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	// A pass's backends end with it: their CPU is read while they live,
	// by a sampler, each one's last reading kept (up to 100ms of a
	// backend's last work can be missed).
	// The same sampler looks at the server's locks: every mode the
	// reconciler's sessions hold, and every lock anyone waits for.
	seen := map[int]backendCPU{}
	locks := lockWatch{modes: map[string]bool{}}
	sampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if now, err := b.reconcilerBackends(); err == nil {
				maps.Copy(seen, now)
			}
			locks.sample(ctx, b)
			select {
			case <-sampling:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	out, err := cmd.Output()
	close(sampling)
	<-sampled
	wall := time.Since(start)
	during := w.take()
	if err != nil {
		return passCost{}, fmt.Errorf("reconciler once: %w: %s", err, stderr.String())
	}
	var r reconcilerReport
	if err := json.Unmarshal(out, &r); err != nil {
		return passCost{}, fmt.Errorf("reconciler once: its report: %w", err)
	}
	if locks.err != nil {
		return passCost{}, fmt.Errorf("watch locks: %w", locks.err)
	}
	byDB := cpuBetween(before, seen)
	return passCost{report: r, wall: wall, serverByDB: byDB, server: sum(byDB), writeBefore: alone, writeDuring: during,
		reconciler: cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), locks: locks}, nil
}

// incrementalPass starts `reconciler serve`, lets its first (full) pass
// end, adds o.reconcileNew students with their users, and measures the
// incremental pass that follows. It returns that pass and the full one.
func (b *bench) incrementalPass(ctx context.Context, d *databases, o options) (inc, full passCost, err error) {
	admin, err := freeport.Addr()
	if err != nil {
		return passCost{}, passCost{}, err
	}
	const interval = 20 * time.Second
	env := append(b.reconcilerEnv(d), "RECONCILER_ADMIN_ADDR="+admin, "RECONCILER_ADMIN_TOKENS=operator:"+reconcilerToken,
		"RECONCILER_INTERVAL="+interval.String(), "RECONCILER_FULL_EVERY=24h")
	serverStart, err := b.reconcilerBackends()
	if err != nil {
		return passCost{}, passCost{}, err
	}
	p, err := startProc(filepath.Join(b.bins, reconcilerBin), filepath.Join(b.dir, "reconciler-serve.log"), env, "serve")
	if err != nil {
		return passCost{}, passCost{}, err
	}
	b.procs.add(p)
	defer b.procs.stop(p)

	first, err := waitReport(ctx, admin, p, func(r reconcilerReport) bool { return r.Kind == "full" })
	if err != nil {
		return passCost{}, passCost{}, err
	}
	cpuFull, err := cpuTime(p.pid())
	if err != nil {
		return passCost{}, passCost{}, err
	}
	serverFull, err := b.reconcilerBackends()
	if err != nil {
		return passCost{}, passCost{}, err
	}
	byDB := cpuBetween(serverStart, serverFull)
	full = passCost{report: first, reconciler: cpuFull, serverByDB: byDB, server: sum(byDB)}
	// New students, as the sender leaves them: linked, their rows
	// delivered, their users and answers in Users.
	if err := seedRecent(ctx, d, o.students, o.reconcileNew); err != nil {
		return passCost{}, passCost{}, err
	}
	next, err := waitReport(ctx, admin, p, func(r reconcilerReport) bool {
		return r.Kind == "incremental" && r.FinishedAt.After(first.FinishedAt)
	})
	if err != nil {
		return passCost{}, passCost{}, err
	}
	cpuInc, err := cpuTime(p.pid())
	if err != nil {
		return passCost{}, passCost{}, err
	}
	serverInc, err := b.reconcilerBackends()
	if err != nil {
		return passCost{}, passCost{}, err
	}
	byDB = cpuBetween(serverFull, serverInc)
	inc = passCost{report: next, reconciler: cpuInc - cpuFull, serverByDB: byDB, server: sum(byDB)}
	if next.Judged.Students < o.reconcileNew {
		return passCost{}, passCost{}, fmt.Errorf("the incremental pass judged %d students, fewer than the %d new ones", next.Judged.Students, o.reconcileNew)
	}
	return inc, full, nil
}

// seedRecent adds k students after the n seeded ones, made now.
func seedRecent(ctx context.Context, d *databases, n, k int) error {
	if _, err := d.studentAdmin.Exec(ctx, `
		WITH s AS (
			INSERT INTO students (id, name, email, document_number, user_id)
			SELECT md5('student-' || i)::uuid, 'Graduate ' || i, 'graduate' || i || '@example.com', 'graduate-' || i, md5('user-' || i)::uuid
			FROM generate_series($1::int, $2::int) i
			RETURNING id, name, email, document_number)
		INSERT INTO outbox (idempotency_key, operation, student_id, payload, state, attempts, delivered_at)
		SELECT md5('key-' || replace(s.document_number, 'graduate-', ''))::uuid, 'create-user', s.id,
		       jsonb_build_object('name', s.name, 'email', s.email, 'document_number', s.document_number), 'delivered', 1, now()
		FROM s`, n+1, n+k); err != nil {
		return fmt.Errorf("seed new students: %w", err)
	}
	if _, err := d.usersAdmin.Exec(ctx, `
		WITH u AS (
			INSERT INTO users (id, name, email, document_number)
			SELECT md5('user-' || i)::uuid, 'Graduate ' || i, 'graduate' || i || '@example.com', 'graduate-' || i
			FROM generate_series($1::int, $2::int) i
			RETURNING id, name, email, document_number)
		INSERT INTO inbox (caller, idempotency_key, request_hash, request, status_code, response_body, resource_id)
		SELECT $3::text, md5('key-' || replace(u.document_number, 'graduate-', ''))::uuid::text, sha256(r.request::text::bytea),
		       r.request, 201, '{}', u.id
		FROM u CROSS JOIN LATERAL (SELECT jsonb_build_object('name', u.name, 'email', u.email, 'document_number', u.document_number) AS request) r`,
		n+1, n+k, senderCaller); err != nil {
		return fmt.Errorf("seed new users: %w", err)
	}
	return nil
}

// pause waits d, or until ctx ends.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// waitReport polls the serving reconciler's /report until done says the
// pass it shows is the one waited for.
func waitReport(ctx context.Context, admin string, p *proc, done func(reconcilerReport) bool) (reconcilerReport, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(20 * time.Minute)
	for {
		if err := p.alive(); err != nil {
			return reconcilerReport{}, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/report", http.NoBody)
		if err != nil {
			return reconcilerReport{}, err
		}
		req.Header.Set("Authorization", "Bearer "+reconcilerToken)
		if resp, err := client.Do(req); err == nil {
			var r reconcilerReport
			ok := resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&r) == nil
			resp.Body.Close()
			if ok && done(r) {
				return r, nil
			}
		}
		if time.Now().After(deadline) {
			return reconcilerReport{}, fmt.Errorf("the reconciler's pass did not end within 20 minutes; see %s", p.logPath)
		}
		if err := pause(ctx, 200*time.Millisecond); err != nil {
			return reconcilerReport{}, err
		}
	}
}

// writer makes a student with its outbox row every 10ms, as Student's app
// role with Student's statement, and keeps each write's latency.
type writer struct {
	stop func()
	lat  chan time.Duration
	got  []time.Duration
}

func (w *writer) take() []time.Duration {
	for {
		select {
		case l := <-w.lat:
			w.got = append(w.got, l)
		default:
			out := w.got
			w.got = nil
			return out
		}
	}
}

func (b *bench) startWriter(ctx context.Context, d *databases) (*writer, error) {
	pool, err := b.rolePool(ctx, d.student, migrations.StudentApp, 2, studentTimeout)
	if err != nil {
		return nil, err
	}
	insert := b.q["InsertStudentWithOutbox"]
	ctx, cancel := context.WithCancel(ctx)
	w := &writer{lat: make(chan time.Duration, 1<<16)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for n := int64(1); ctx.Err() == nil; n++ {
			p := newStudent(n)
			payload, err := json.Marshal(p)
			if err != nil {
				return
			}
			args, err := insert.args(map[string]any{
				"id": uuid.Must(uuid.NewV7()), "name": p.Name, "email": p.Email, "document_number": "writer-" + strconv.FormatInt(n, 10),
				"created_at": time.Now().UTC(), "idempotency_key": uuid.New(), "operation": "create-user", "payload": payload, "trace_parent": "",
			})
			if err != nil {
				return
			}
			start := time.Now()
			wctx, wcancel := database.WithDeadline(ctx, studentTimeout)
			_, err = pool.Exec(wctx, insert.sql, args...)
			wcancel()
			if err == nil {
				select {
				case w.lat <- time.Since(start):
				default:
				}
			}
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()
	w.stop = func() { cancel(); <-done; pool.Close() }
	return w, nil
}
