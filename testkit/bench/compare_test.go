package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCompareReport checks the comparison's last lines, which scripts
// read: this build's figures under the bench's usual names, then the
// baseline's prefixed; and that the ratio column is the median of each
// round's ratio, not the ratio of the medians.
func TestCompareReport(t *testing.T) {
	t.Parallel()
	lat := func(p99ms, cpuMS float64) latencyResult {
		return latencyResult{p99: time.Duration(p99ms * float64(time.Millisecond)), cpuPerStudent: time.Duration(cpuMS * float64(time.Millisecond)),
			usersPerRequest: time.Millisecond / 2, perStudent: map[string]time.Duration{postgresName: time.Millisecond}}
	}
	base := &buildFigures{
		burndown: []float64{1000, 1000, 1000}, burndownCPU: []time.Duration{2 * time.Millisecond, 2 * time.Millisecond, 2 * time.Millisecond},
		burndownWork: []dbWork{{statements: 9, commits: 2, walBytes: 5120}, {statements: 9, commits: 2, walBytes: 5120}, {statements: 9, commits: 2, walBytes: 5120}},
		latency:      map[float64][]latencyResult{200: {lat(20, 6), lat(30, 4), lat(25, 5)}, 500: {lat(100, 3), lat(300, 3), lat(200, 3)}},
	}
	this := &buildFigures{
		burndown: []float64{1100, 1200, 900}, burndownCPU: []time.Duration{time.Millisecond, time.Millisecond, time.Millisecond},
		burndownWork: []dbWork{{statements: 6, commits: 1, walBytes: 4096}, unmeasured, {statements: 7, commits: 1, walBytes: 4096}},
		// Per round: 3/6, 4/4, 2.5/5: median ratio 0.5; the medians' ratio would be 3/5.
		latency: map[float64][]latencyResult{200: {lat(10, 3), lat(12, 4), lat(11, 2.5)}, 500: {lat(50, 2), lat(70, 2), lat(60, 2)}},
	}
	var out bytes.Buffer
	b := &bench{out: &out}
	b.compareReport(options{rounds: 3}, base, this, "HEAD (0123456789)")
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	require.Equal(t, []string{
		"p99_ms_at_200 11.0",
		"p99_ms_at_500 60.0",
		"cpu_ms_per_student_at_200 3.00",
		"cpu_ms_per_student_burndown 1.00",
		"users_cpu_ms_per_request 0.50",
		"baseline_p99_ms_at_200 25.0",
		"baseline_p99_ms_at_500 200.0",
		"baseline_cpu_ms_per_student_at_200 5.00",
		"baseline_cpu_ms_per_student_burndown 2.00",
		"baseline_users_cpu_ms_per_request 0.50",
	}, lines[len(lines)-10:])
	text := out.String()
	require.Regexp(t, `CPU ms per student at 200/s +5\.00 \[4\.00–6\.00\] +3\.00 \[2\.50–4\.00\] +0\.50`, text)
	require.Regexp(t, `CPU ms per student, burndown +2\.00 \[2\.00–2\.00\] +1\.00 \[1\.00–1\.00\] +0\.50`, text)
	// A round that did not count is left out of the ratio.
	require.Regexp(t, `WAL kB per student, burndown +5\.00 \[5\.00–5\.00\] +4\.00 \[4\.00–4\.00\] +0\.80`, text)
	require.Regexp(t, `statements per student, burndown +9\.00 \[9\.00–9\.00\] +6\.50 \[6\.00–7\.00\] +0\.72`, text)
}

func TestServerRole(t *testing.T) {
	t.Parallel()
	// A process that is not PostgreSQL's has no role.
	cmd := exec.CommandContext(context.Background(), "sleep", "5")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	require.Equal(t, "?", serverRole(cmd.Process.Pid))
	require.Equal(t, "?", serverRole(-1))
}

func TestRoleOfTitle(t *testing.T) {
	t.Parallel()
	for title, want := range map[string]string{
		"postgres: users_app bench_users_3 127.0.0.1(40312) idle": "users_app",
		"postgres: outbox_sender bench_student_3 [local] UPDATE":  "outbox_sender",
		"postgres: walwriter ":         "walwriter",
		"postgres: background writer ": "background writer",
		"postgres: walsender outbox_cdc 127.0.0.1(5555) START_REPLICATION": "walsender outbox_cdc",
		"/usr/lib/postgresql/15/bin/postgres -D /tmp/x":                    "?",
	} {
		require.Equal(t, want, roleOfTitle(title), title)
	}
}

// TestServerSplit: each running process counts what it used since the
// first reading (all of it when new), and what none accounts for, such as
// a backend that exited, is the postmaster's line; the parts sum to the
// total.
func TestServerSplit(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	before := map[int]serverProc{10: {role: "student_app", cpu: 100 * ms}, 11: {role: "users_app", cpu: 50 * ms}, 12: {role: "autovacuum worker", cpu: 30 * ms}}
	after := map[int]serverProc{10: {role: "student_app", cpu: 160 * ms}, 11: {role: "users_app", cpu: 70 * ms}, 13: {role: "users_app", cpu: 5 * ms}}
	// 60 + 20 + 5 by the running ones, and the exited worker's 40 (its 30
	// before and 10 more) moved into the postmaster's reaped time.
	split := serverSplit(125*ms, before, after)
	require.Equal(t, map[string]time.Duration{"student_app": 60 * ms, "users_app": 25 * ms, exitedRole: 40 * ms}, split)
}

// TestServerSleeps: each process running at the second reading counts the
// sleeps since the first (all of them when new); one that exited, or whose
// count could not be read at either reading, counts none.
func TestServerSleeps(t *testing.T) {
	t.Parallel()
	before := map[int]serverProc{
		10: {role: "student_app", sleeps: 100}, 11: {role: "users_app", sleeps: 50},
		12: {role: "autovacuum worker", sleeps: 30}, 14: {role: "walwriter", sleeps: -1},
	}
	after := map[int]serverProc{
		10: {role: "student_app", sleeps: 160}, 11: {role: "users_app", sleeps: 70},
		13: {role: "users_app", sleeps: 5}, 14: {role: "walwriter", sleeps: 9}, 15: {role: "checkpointer", sleeps: -1},
	}
	total, byRole := serverSleeps(before, after)
	require.Equal(t, map[string]int64{"student_app": 60, "users_app": 25}, byRole)
	require.Equal(t, int64(85), total)
}

// TestSleepsCounted: sleeps adds up every thread of the process, not only
// the first, whose count /proc/PID/status shows: a thread of its own that
// sleeps a hundred times puts the sum a hundred or more above the first
// thread's count.
func TestSleepsCounted(t *testing.T) {
	t.Parallel()
	slept := make(chan struct{})
	release := make(chan struct{})
	go func() {
		// Locked, the goroutine's thread sleeps each time it does; it is
		// unlocked before the goroutine ends, so that the thread, and its
		// count, live on.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for range 100 {
			time.Sleep(100 * time.Microsecond)
		}
		close(slept)
		<-release
	}()
	<-slept
	defer close(release)
	first, err := statusValue("/proc/self/status", "voluntary_ctxt_switches")
	require.NoError(t, err)
	all, err := sleeps(os.Getpid())
	require.NoError(t, err)
	require.GreaterOrEqual(t, all-first, int64(100))
	_, err = sleeps(-1)
	require.Error(t, err)
}

// TestNamedBackends: a backend a service names is split apart from the
// other backends of its role; the others, and processes that are not
// backends, keep their label.
func TestNamedBackends(t *testing.T) {
	t.Parallel()
	procs := map[int]serverProc{
		10: {role: "outbox_sender", cpu: time.Second},
		11: {role: "outbox_sender", cpu: 2 * time.Second},
		12: {role: "walwriter", cpu: time.Millisecond},
	}
	got := named(procs, map[int]string{11: "outbox-sender listener"})
	require.Equal(t, map[int]serverProc{
		10: {role: "outbox_sender", cpu: time.Second},
		11: {role: "outbox_sender (outbox-sender listener)", cpu: 2 * time.Second},
		12: {role: "walwriter", cpu: time.Millisecond},
	}, got)
	require.Equal(t, "outbox_sender", procs[11].role, "the reading itself is left as it was")
	split := serverSplit(4*time.Second, named(map[int]serverProc{}, nil), got)
	require.Equal(t, 2*time.Second, split["outbox_sender (outbox-sender listener)"])
	require.Equal(t, time.Second, split["outbox_sender"])
}

// TestRunLinesByRole: a run's split of PostgreSQL's CPU and its sleeps
// name the roles largest first, by name among equals, and leave out
// those below the line's precision.
func TestRunLinesByRole(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	r := latencyResult{
		serverPerStudent:       map[string]time.Duration{"users_app": 300 * time.Microsecond, "outbox_sender": 700 * time.Microsecond, "walwriter": 5 * time.Microsecond, "student_app": 300 * time.Microsecond},
		sleepsPerStudent:       map[string]float64{studentBin: 7.3, usersBin: 10.9, postgresName: 13.2},
		serverSleepsPerStudent: map[string]float64{"users_app": 4.2, "outbox_sender": 4.2, "student_app": 3.6, "walwriter": 0.01},
	}
	require.Equal(t, "PostgreSQL's ms per student by process: outbox_sender 0.70, student_app 0.30, users_app 0.30", r.serverSplit())
	require.Equal(t, "sleeps per student (each ends in a wake-up): Student 7.3, Users 10.9, sender -, PostgreSQL 13.2 (outbox_sender 4.2, users_app 4.2, student_app 3.6)", r.sleeps())
	require.Equal(t, []string{"b", "a", "c"}, largestFirst(map[string]time.Duration{"a": ms, "b": 2 * ms, "c": ms, "d": 0}, time.Microsecond))
	require.Empty(t, latencyResult{}.sleeps())
}
