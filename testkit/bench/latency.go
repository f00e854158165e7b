package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
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
			cancel(fmt.Errorf("%.0f/s is not sustained: %d requests unanswered", rate, maxInFlight))
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

// latencyResult is one run's creation-to-link latencies.
type latencyResult struct {
	p50, p90, p99 time.Duration
	students      int
}

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
func (b *bench) latency(ctx context.Context, rate float64, warmup, duration time.Duration, after func(*system) error) (latencyResult, error) {
	d, err := b.freshDatabases(ctx)
	if err != nil {
		return latencyResult{}, err
	}
	defer b.drop(d)
	sys, err := b.start(ctx, d, which{student: true, users: true, sender: true}, nil)
	if err != nil {
		return latencyResult{}, err
	}
	defer sys.stop()

	firstMeasured := int64(math.Round(warmup.Seconds()*rate)) + 1
	var (
		mu        sync.Mutex
		scheduled = map[uuid.UUID]time.Time{}
		sent      atomic.Int64
	)
	client := httpClient(256)
	defer client.CloseIdleConnections()
	count := int64(math.Round((warmup + duration).Seconds() * rate))
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
	if _, err := waitLinked(ctx, d.studentAdmin, int(sent.Load()), 60*time.Second, sys.alive); err != nil {
		return latencyResult{}, fmt.Errorf("%.0f/s: %w", rate, err)
	}
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
	if err := verifyLinked(ctx, d, int(sent.Load())); err != nil {
		return latencyResult{}, err
	}
	slices.Sort(lat)
	res := latencyResult{p50: percentile(lat, 50), p90: percentile(lat, 90), p99: percentile(lat, 99), students: len(lat)}
	if after != nil {
		if err := after(sys); err != nil {
			return res, err
		}
	}
	return res, sys.alive()
}

// percentile is the nearest-rank percentile of sorted.
func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// idleCPU is each process's CPU use while nothing is asked of the system,
// in percent of one core: settle first, then utime+stime over window.
func idleCPU(ctx context.Context, sys *system, settle, window time.Duration) (map[string]float64, error) {
	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	if err := sleep(settle); err != nil {
		return nil, err
	}
	ps := sys.running()
	before := make([]time.Duration, len(ps))
	for i, p := range ps {
		t, err := cpuTime(p.pid())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		before[i] = t
	}
	start := time.Now()
	if err := sleep(window); err != nil {
		return nil, err
	}
	elapsed := time.Since(start)
	out := map[string]float64{}
	for i, p := range ps {
		t, err := cpuTime(p.pid())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		out[p.name] = 100 * (t - before[i]).Seconds() / elapsed.Seconds()
	}
	return out, nil
}

// linkedAt says where latency ends, for the report.
func (b *bench) linkedAt() string {
	if b.commitTimes {
		return "the commit of the transaction that linked the student (track_commit_timestamp)"
	}
	return "the outbox row's delivered_at, the start of the transaction that linked the student\n" +
		"(the server does not track commit timestamps; its commit is not counted)"
}
