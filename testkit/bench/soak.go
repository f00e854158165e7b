package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
)

// The soak shortens the retentions to their minimums, and the purges'
// intervals, so that a run of minutes shows the outbox and the inbox
// staying bounded: with the defaults (a week of delivered rows and of keys,
// purged every 10 minutes) they would only grow within any soak. Users'
// retention is then far below SENDER_MAX_AGE, which is unsafe in a
// deployment (docs/contract.md, "Retention"); here every row is delivered at once.
const (
	soakRetention = time.Minute      // the minimum each binary accepts
	soakPurge     = 15 * time.Second // the purges' interval
)

var soakEnv = map[string][]string{
	senderBin: {
		"SENDER_DELIVERED_RETENTION=" + soakRetention.String(),
		"SENDER_PURGE_INTERVAL=" + soakPurge.String(),
	},
	usersBin: {
		"USERS_INBOX_RETENTION=" + soakRetention.String(),
		"USERS_INBOX_PURGE_INTERVAL=" + soakPurge.String(),
	},
	studentBin: {
		"STUDENT_INBOX_RETENTION=" + soakRetention.String(),
		"STUDENT_INBOX_PURGE_INTERVAL=" + soakPurge.String(),
	},
}

// soakSample is one look at the running system.
type soakSample struct {
	at                   time.Duration // since the first student was sent
	rssKB                map[string]int64
	outbox, inbox, users int64
	pending, linked      int64
}

// soak sends o.students students through the whole system at o.rate per
// second, sampling each process's memory and the tables every o.sample,
// then checks that nothing was lost or duplicated.
func (b *bench) soak(ctx context.Context, o options) error {
	b.printf("soak: %d students at %.0f/s (about %s), sampling every %s\n",
		o.students, o.rate, time.Duration(float64(o.students)/o.rate*float64(time.Second)).Round(time.Second), o.sample)
	b.printf("soak: shipped defaults except, to show retention bounding the tables within the run:\n")
	for _, bin := range []string{senderBin, usersBin, studentBin} {
		b.printf("  %s: %v\n", bin, soakEnv[bin])
	}
	d, err := b.freshDatabases(ctx)
	if err != nil {
		return err
	}
	defer b.drop(d)
	sys, err := b.start(ctx, d, which{student: true, users: true, sender: true}, soakEnv)
	if err != nil {
		return err
	}
	defer sys.stop()

	var (
		mu      sync.Mutex
		samples []soakSample
	)
	start := time.Now()
	sample := func() error {
		// A process that died ends the soak now, not at the final wait.
		if err := sys.alive(); err != nil {
			return err
		}
		s := soakSample{at: time.Since(start).Round(time.Second), rssKB: map[string]int64{}}
		for _, p := range sys.running() {
			kb, err := procStatusKB(p.pid(), "VmRSS")
			if err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
			s.rssKB[p.name] = kb
		}
		if err := d.studentAdmin.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox),
			(SELECT count(*) FROM outbox WHERE state = 'pending'),
			(SELECT count(*) FROM students WHERE user_id IS NOT NULL)`).Scan(&s.outbox, &s.pending, &s.linked); err != nil {
			return fmt.Errorf("sample: %w", err)
		}
		if err := d.usersAdmin.QueryRow(ctx, "SELECT (SELECT count(*) FROM inbox), (SELECT count(*) FROM users)").Scan(&s.inbox, &s.users); err != nil {
			return fmt.Errorf("sample: %w", err)
		}
		mu.Lock()
		samples = append(samples, s)
		mu.Unlock()
		b.printf("soak %7s  linked %8d  pending %6d  outbox %7d  inbox %7d  users %8d  RSS MB: student %.1f  users %.1f  sender %.1f\n",
			s.at, s.linked, s.pending, s.outbox, s.inbox, s.users,
			float64(s.rssKB[studentBin])/1024, float64(s.rssKB[usersBin])/1024, float64(s.rssKB[senderBin])/1024)
		return nil
	}
	// A failed sample stops the whole soak: the load and the wait run
	// under runCtx.
	runCtx, stopRun := context.WithCancelCause(ctx)
	defer stopRun(nil)
	samplerCtx, stopSampler := context.WithCancel(runCtx)
	samplerDone := make(chan error, 1)
	go func() {
		t := time.NewTicker(o.sample)
		defer t.Stop()
		for {
			select {
			case <-samplerCtx.Done():
				samplerDone <- nil
				return
			case <-t.C:
				if err := sample(); err != nil {
					stopRun(err)
					samplerDone <- err
					return
				}
			}
		}
	}()

	client := httpClient(256)
	defer client.CloseIdleConnections()
	// A backlog of a few seconds' requests means the rate is not sustained.
	maxInFlight := int64(math.Max(256, 5*o.rate))
	err = openLoop(runCtx, client, sys.studentURL(), o.rate, int64(o.students), maxInFlight, func(int64, time.Time, uuid.UUID) {})
	if err == nil {
		_, err = waitLinked(runCtx, d.studentAdmin, o.students, 30*time.Minute, sys.alive)
	}
	stopSampler()
	if serr := <-samplerDone; serr != nil {
		err = serr // the cause; the load saw only a cancellation
	}
	if err != nil {
		return errors.Join(fmt.Errorf("soak: %w", err), sys.alive())
	}
	if err := sample(); err != nil { // the end state
		return err
	}
	if err := verifyLinked(ctx, d, o.students); err != nil {
		return fmt.Errorf("soak: %w", err)
	}
	b.printf("soak: all %d students linked, each to its own user; Users holds exactly %d users\n", o.students, o.students)
	return b.soakReport(o, samples, time.Since(start))
}

// soakReport compares each process's memory at the end of warm-up with its
// memory at the end, and reports the largest outbox and inbox seen.
func (b *bench) soakReport(o options, samples []soakSample, elapsed time.Duration) error {
	base := samples[len(samples)-1]
	for _, s := range samples {
		if s.at >= o.soakWarmup {
			base = s
			break
		}
	}
	end := samples[len(samples)-1]
	var maxOutbox, maxInbox, maxPending int64
	for _, s := range samples {
		maxOutbox, maxInbox, maxPending = max(maxOutbox, s.outbox), max(maxInbox, s.inbox), max(maxPending, s.pending)
	}
	b.printf("\nsoak: %d students in %s\n", o.students, elapsed.Round(time.Second))
	w := tabwriter.NewWriter(b.out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "RSS\tat %s (warm)\tat %s (end)\tgrowth\tflat (within 20%%)\t\n", base.at, end.at)
	growthMax := math.Inf(-1)
	for _, name := range []string{studentBin, usersBin, senderBin} {
		from, to := base.rssKB[name], end.rssKB[name]
		growth := 100 * float64(to-from) / float64(max(from, 1))
		growthMax = max(growthMax, growth)
		fmt.Fprintf(w, "%s\t%.1f MB\t%.1f MB\t%+.0f%%\t%s\n", name, float64(from)/1024, float64(to)/1024, growth, verdict(growth <= 20))
	}
	w.Flush()
	if base.at == end.at {
		b.printf("(the soak ended before -soak-warmup %s: warm and end are the same sample, which shows nothing)\n", o.soakWarmup)
	}
	// Once rows older than the retention are purged, the outbox holds at
	// most the last retention plus one purge interval of students, and the
	// inbox the same of keys.
	bound := int64(o.rate * (soakRetention + soakPurge).Seconds())
	b.printf("outbox rows: max %d, at the end %d; inbox rows: max %d, at the end %d; retention bounds each near %d (%.0f/s × (%s + %s))\n",
		maxOutbox, end.outbox, maxInbox, end.inbox, bound, o.rate, soakRetention, soakPurge)
	if elapsed < 2*(soakRetention+soakPurge) {
		b.printf("(the soak was shorter than twice retention plus a purge interval: too short to show the bound)\n")
	} else {
		b.printf("tables bounded by retention: %s\n", verdict(maxOutbox <= bound*3/2 && maxInbox <= bound*3/2))
	}
	// A backlog that grows means the rate is more than the system
	// sustains: the soak then measures a queue, and the outbox grows with it.
	keptUp := float64(maxPending) <= 5*o.rate
	b.printf("backlog: at most %d rows pending; kept up (at most 5s of traffic pending): %s\n", maxPending, verdict(keptUp))
	if !keptUp {
		b.printf("(the system did not sustain %.0f/s here: run again with a lower -rate)\n", o.rate)
	}
	b.printf("\n")
	fmt.Fprintf(b.out, "soak_students %d\n", o.students)
	// From the last sample, taken after every student was linked.
	fmt.Fprintf(b.out, "soak_lost %d\n", int64(o.students)-end.linked)
	fmt.Fprintf(b.out, "soak_duplicated %d\n", end.users-end.linked)
	fmt.Fprintf(b.out, "soak_rss_growth_pct_max %.0f\n", growthMax)
	fmt.Fprintf(b.out, "soak_outbox_rows_max %d\n", maxOutbox)
	fmt.Fprintf(b.out, "soak_inbox_rows_max %d\n", maxInbox)
	fmt.Fprintf(b.out, "soak_pending_max %d\n", maxPending)
	return nil
}
