package main

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

func TestRotated(t *testing.T) {
	t.Parallel()
	both := []string{sourcePoll, sourceCDC}
	require.Equal(t, []string{sourcePoll, sourceCDC}, rotated(both, 1))
	require.Equal(t, []string{sourceCDC, sourcePoll}, rotated(both, 2))
	require.Equal(t, []string{sourcePoll, sourceCDC}, rotated(both, 3))
	require.Equal(t, []string{sourcePoll}, rotated([]string{sourcePoll}, 2))
	require.Equal(t, []string{sourcePoll, sourceCDC}, both, "the sources given are left as they were")
}

// TestReportLines checks the name-value lines scripts read: poll's as they
// were before the cdc source, in the same order, then its costs, then
// cdc's, last; and no cdc line when only poll was measured.
func TestReportLines(t *testing.T) {
	t.Parallel()
	lat := func(p99ms float64, lag float64) latencyResult {
		d := time.Duration(p99ms * float64(time.Millisecond))
		return latencyResult{p50: d / 4, p90: d / 2, p99: d, students: 100, slotLagMax: lag,
			cpuPerStudent: d / 10, usersPerRequest: d / 40}
	}
	poll := &sourceFigures{
		burndown: []float64{1000, 1200, 1100}, burndownRatio: []float64{0.5, 0.7, 0.6},
		burndownCPU:  []time.Duration{1300 * time.Microsecond, 1400 * time.Microsecond, 1350 * time.Microsecond},
		latency:      map[float64][]latencyResult{200: {lat(20, -1), lat(30, -1), lat(25, -1)}, 500: {lat(100, -1), lat(300, -1), lat(200, -1)}},
		idle:         map[string]float64{studentBin: 0, usersBin: 0.04, senderBin: 0.55},
		burndownWork: []dbWork{{statements: 4.3, commits: 1.1, walBytes: 3800}, {statements: 4.4, commits: 1.2, walBytes: 3700}, unmeasured},
	}
	cdc := &sourceFigures{
		burndown: []float64{900, 1300, 1000}, burndownRatio: []float64{0.45, 0.75, 0.5},
		latency: map[float64][]latencyResult{200: {lat(10, 4096), lat(12, 8192), lat(11, 1024)}, 500: {lat(50, 65536), lat(70, 2048), lat(60, 0)}},
		idle:    map[string]float64{studentBin: 0, usersBin: 0, senderBin: 0.8},
	}
	f := figures{
		intake: []float64{2000, 2100, 2050}, intakeBound: []float64{3000, 3000, 3000}, intakeRatio: []float64{0.66, 0.7, 0.68},
		burndownBound: []float64{2000, 2000, 2000},
		src:           map[string]*sourceFigures{sourcePoll: poll, sourceCDC: cdc},
	}
	report := func(f figures) []string {
		var out bytes.Buffer
		b := &bench{out: &out, procs: &procs{set: map[*proc]bool{}, peak: map[string]int64{}}}
		b.report(options{rounds: 3}, f)
		lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
		return lines
	}
	pollLines := []string{
		"intake_ratio 0.68",
		"burndown_ratio 0.60",
		"p99_ms_at_200 25.0",
		"p99_ms_at_500 200.0",
		"idle_cpu_pct_max 0.6",
		"cpu_ms_per_student_at_200 2.50",
		"cpu_ms_per_student_burndown 1.35",
		"users_cpu_ms_per_request 0.62",
	}
	lines := report(f)
	require.Equal(t, append(pollLines,
		"cdc_burndown_ratio 0.50",
		"cdc_p99_ms_at_200 11.0",
		"cdc_p99_ms_at_500 60.0",
		"cdc_idle_cpu_pct 0.80",
		"cdc_slot_lag_bytes_max 65536",
	), lines[len(lines)-13:])
	text := strings.Join(lines, "\n")
	require.Contains(t, text, "poll (default)")
	require.Contains(t, text, "0.50 [0.45–0.75] FAIL")
	// Work: the median of the rounds that counted it; cdc counted none.
	require.Regexp(t, `per student +statements 4\.35, commits 1\.15, WAL 3\.7 kB *\n`, text)
	require.Regexp(t, `per student, burndown +statements 4\.35, commits 1\.15, WAL 3\.7 kB +statements -, commits -, WAL -`, text)

	delete(f.src, sourceCDC)
	lines = report(f)
	require.Equal(t, pollLines, lines[len(lines)-8:])
	require.NotContains(t, strings.Join(lines, "\n"), "cdc")
	require.NotContains(t, strings.Join(lines, "\n"), "broker")

	// The broker form: its four lines last, each ratio the median of the
	// rounds' own (broker over poll in the same round), not a ratio of
	// medians, and each goal judged.
	perStudent := func(ms ...float64) latencyResult {
		r := lat(100, -1)
		r.cpuPerStudent = time.Duration(ms[0] * float64(time.Millisecond))
		r.perStudent = map[string]time.Duration{usersBin: time.Millisecond, natsdBin: 700 * time.Microsecond}
		return r
	}
	poll.latency[200] = []latencyResult{perStudent(3), perStudent(4), perStudent(5)}
	broker := &sourceFigures{
		burndown: []float64{900, 600, 1000}, burndownRatio: []float64{0.45, 0.3, 0.5},
		latency: map[float64][]latencyResult{
			200: {perStudent(3.6), perStudent(6), perStudent(5.5)}, // ratios 1.2, 1.5, 1.1
			500: {lat(120, -1), lat(170, -1), lat(140, -1)},
		},
		idle: map[string]float64{studentBin: 0, usersBin: 0.1, senderBin: 0.3, natsdBin: 1.5},
	}
	f.src[formBroker] = broker
	lines = report(f)
	require.Equal(t, []string{
		"broker_cpu_ms_per_student_at_200 5.50",
		"broker_cpu_ratio_at_200 1.20",
		"broker_burndown_ratio 0.90", // 900/1000, 600/1200, 1000/1100
		"broker_p99_ms_at_500 140.0",
	}, lines[len(lines)-4:])
	require.Equal(t, pollLines[:2], lines[len(lines)-12:len(lines)-10], "poll's lines first, as they were")
	text = strings.Join(lines, "\n")
	require.Regexp(t, `CPU per student at 200/s +4\.00 ms \[3\.00–5\.00\] +5\.50 ms \[3\.60–6\.00\] +1\.20 \[1\.10–1\.50\] PASS +≤ 1\.3×`, text)
	require.Regexp(t, `of it, natsd +0\.70 ms +0\.70 ms`, text)
	require.Regexp(t, `burndown +1100 linked/s \[1000–1200\] +900 linked/s \[600–1000\] +0\.90 \[0\.50–0\.91\] PASS +≥ 0\.7×`, text)
	require.Regexp(t, `latency at 500/s, p50 / p90 / p99 +50\.0 / 100\.0 / 200\.0 ms +35\.0 / 70\.0 / 140\.0 ms PASS +p99 ≤ 150\.0 ms`, text)
	require.Regexp(t, `idle CPU, natsd +- +1\.50% of a core FAIL`, text)

	// Each goal can fail.
	broker.burndown = []float64{600, 700, 700}
	broker.latency[200] = []latencyResult{perStudent(6), perStudent(6), perStudent(6)}
	broker.latency[500] = []latencyResult{lat(151, -1), lat(151, -1), lat(151, -1)}
	text = strings.Join(report(f), "\n")
	require.Regexp(t, `CPU per student at 200/s .* 1\.50 \[1\.20–2\.00\] FAIL`, text)
	require.Regexp(t, `burndown +1100 linked/s .* 0\.60 \[0\.58–0\.64\] FAIL`, text)
	require.Regexp(t, `latency at 500/s, p50 .* 151\.0 ms FAIL`, text)

	// A rate the broker form did not sustain in most rounds fails its goal
	// and says so; the other figures still stand.
	broker.latency[500] = []latencyResult{unsustainedResult(), lat(140, -1), unsustainedResult()}
	lines = report(f)
	require.Equal(t, "broker_p99_ms_at_500 inf", lines[len(lines)-1])
	require.Regexp(t, `latency at 500/s, p50 / p90 / p99 +50\.0 / 100\.0 / 200\.0 ms +not sustained in most rounds FAIL`, strings.Join(lines, "\n"))
	broker.latency[500] = []latencyResult{unsustainedResult(), lat(140, -1), lat(130, -1)}
	lines = report(f)
	require.Equal(t, "broker_p99_ms_at_500 140.0", lines[len(lines)-1], "the median of the rounds, one not sustained")
}

// TestSlotLagAndDrop samples a real slot's lag and drops the slot while a
// replication connection streams from it, as the bench does after each
// cdc run: the drop must end the walsender first.
func TestSlotLagAndDrop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t, migrations.Student)
	admin := pgtest.Connect(t, dbURL)
	var level string
	require.NoError(t, admin.QueryRow(ctx, "SHOW wal_level").Scan(&level))
	if level != "logical" {
		t.Skipf("the server runs with wal_level=%s; the cdc source needs logical", level)
	}
	server, err := url.Parse(dbURL)
	require.NoError(t, err)
	b := &bench{out: &bytes.Buffer{}, server: server, slots: map[string]bool{}}
	slot := "bench_test_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	// Registered after the pool, so run before its database is dropped.
	t.Cleanup(func() { b.dropSlots(slot) })
	b.slots[slot] = true
	_, err = admin.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)
	require.NoError(t, err)

	// A replication connection streaming from the slot, as a sender's.
	cfg, err := pgconn.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	require.NoError(t, pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'outbox_inserts'"},
	}))

	stop := sampleSlotLag(ctx, admin, slot, 10*time.Millisecond)
	// The test server commits without waiting for the WAL (synchronous_commit
	// off), which leaves it to the WAL writer up to 200 ms later; the lag
	// counts only WAL written, so these commits write theirs.
	writer, err := admin.Acquire(ctx)
	require.NoError(t, err)
	defer writer.Release()
	_, err = writer.Exec(ctx, "SET synchronous_commit = on")
	require.NoError(t, err)
	for i := range 3 {
		_, err := writer.Exec(ctx, `
			WITH s AS (INSERT INTO students (id, name, email, document_number) VALUES (gen_random_uuid(), 'S', 's@example.com', $1) RETURNING id)
			INSERT INTO outbox (idempotency_key, operation, student_id, payload) SELECT gen_random_uuid(), 'create-user', id, '{}' FROM s`,
			fmt.Sprintf("LAG-%d", i))
		require.NoError(t, err)
	}
	time.Sleep(100 * time.Millisecond) // nothing confirms: the lag stands
	lag, err := stop()
	require.NoError(t, err)
	require.Positive(t, lag, "WAL written since the slot's confirmed position")

	b.dropSlots(slot)
	require.Zero(t, apitest.Count(t, admin, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", slot))
	require.Empty(t, b.slots)
}

// TestRates: -rates adds rates to the two the goals are set for, which it
// may not leave out; a rate with no goal shows no goal and no verdict,
// and the name-value lines stay the same.
func TestRates(t *testing.T) {
	t.Parallel()
	rates, err := parseRates("500, 400,200,400")
	require.NoError(t, err)
	require.Equal(t, []float64{200, 400, 500}, rates)
	for list, msg := range map[string]string{
		"200":         "must include 500",
		"400,500":     "must include 200",
		"200,500,abc": `"abc" is not a rate`,
		"200,500,0":   `"0" is not a rate`,
		"":            `"" is not a rate`,
	} {
		_, err := parseRates(list)
		require.ErrorContains(t, err, msg, list)
	}
	require.Equal(t, []float64{200, 500}, options{}.latencyRates())

	lat := func(p99ms float64) latencyResult {
		d := time.Duration(p99ms * float64(time.Millisecond))
		return latencyResult{p50: d / 4, p90: d / 2, p99: d, students: 100, slotLagMax: -1, cpuPerStudent: d / 10, usersPerRequest: d / 40}
	}
	poll := &sourceFigures{
		burndown: []float64{1000}, burndownRatio: []float64{0.7}, burndownCPU: []time.Duration{time.Millisecond},
		latency: map[float64][]latencyResult{200: {lat(20)}, 400: {lat(80)}, 500: {lat(100)}},
		idle:    map[string]float64{},
	}
	var out bytes.Buffer
	b := &bench{out: &out, procs: &procs{set: map[*proc]bool{}, peak: map[string]int64{}}}
	b.report(options{rounds: 1, rates: rates}, figures{
		intake: []float64{2000}, intakeBound: []float64{3000}, intakeRatio: []float64{0.66}, burndownBound: []float64{2000},
		src: map[string]*sourceFigures{sourcePoll: poll},
	})
	text := out.String()
	require.Regexp(t, `latency at 200/s +p50 5\.0 ms  p90 10\.0 ms  p99 20\.0 ms +p99 ≤ 50\.0 ms +PASS`, text)
	require.Regexp(t, `latency at 400/s +p50 20\.0 ms  p90 40\.0 ms  p99 80\.0 ms *\n`, text)
	require.Regexp(t, `latency at 500/s +p50 25\.0 ms  p90 50\.0 ms  p99 100\.0 ms +p99 ≤ 150\.0 ms +PASS`, text)
	require.Contains(t, text, "\np99_ms_at_200 20.0\np99_ms_at_500 100.0\n")
}
