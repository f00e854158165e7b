//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/testkit/pgcluster"
)

// The harness's side of the sender's change-data-capture source
// (SENDER_SOURCE=cdc): a replication slot per scenario, dropped when the
// scenario ends, and what a cdc scenario checks beyond the checker.

// What a cdc sender logs (outbox-sender/cdc), which the
// scenarios wait for or count.
const (
	logStreaming = "streaming the outbox from the replication slot"
	logStandby   = "another sender streams from the replication slot; standing by to take over"
	logSlotGone  = "replication slot is gone"
)

// sourceLabel is the source a run of def shows in its subtest name, its
// log folder and the summary.
func sourceLabel(def scenarioDef) string {
	if def.opts.source == "" {
		return sourcePoll
	}
	return def.opts.source
}

// databaseName is the database a URL connects to.
func databaseName(t *testing.T, dbURL string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	return strings.TrimPrefix(u.Path, "/")
}

// dropSlot drops the scenario's replication slot by hand, as an operator
// would: it ends the session that streams from it, then drops it, again
// and again, because a cdc sender reconnects within milliseconds and the
// drop fails while the slot is active. It returns how many rounds it
// took; a slot that does not exist is dropped at once.
func (s *scenario) dropSlot(timeout time.Duration) (rounds int, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), timeout)
	defer cancel()
	// Its own connection: the scenario's pool may be closed (at cleanup)
	// or busy.
	conn, err := pgx.Connect(ctx, s.studentURL)
	if err != nil {
		return 0, fmt.Errorf("connect to drop replication slot %s: %w", s.slot, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		rounds++
		_, _ = conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, s.slot)
		_, err = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, s.slot)
		if err == nil {
			return rounds, nil
		}
		select {
		case <-ctx.Done():
			return rounds, fmt.Errorf("drop replication slot %s: %w (last error: %w)", s.slot, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// dropSlotAtCleanup drops the slot once the scenario's processes are dead
// (newScenario registers it before any of them). A slot left behind would
// hold WAL until the cluster is removed, and would keep the database from
// being dropped.
func (s *scenario) dropSlotAtCleanup() {
	if s.studentURL == "" {
		return
	}
	if _, err := s.dropSlot(30 * time.Second); err != nil {
		s.t.Errorf("cleanup: %v", err)
	}
}

// slotRow is the scenario's slot as pg_replication_slots shows it.
type slotRow struct {
	exists    bool
	activePID int // 0 while no session streams from it
	confirmed string
}

func (s *scenario) readSlot() (slotRow, error) {
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
	defer cancel()
	var r slotRow
	err := s.studentDB.QueryRow(ctx, `SELECT COALESCE(active_pid, 0), COALESCE(confirmed_flush_lsn::text, '')
		FROM pg_replication_slots WHERE slot_name = $1`, s.slot).Scan(&r.activePID, &r.confirmed)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, nil
	}
	r.exists = err == nil
	return r, err
}

// checkStream is what a scenario with cdc senders checks when the system
// is quiet, beyond the checker's verdict. The poll would deliver every
// row by itself once SENDER_CDC_GRACE has passed, so a scenario whose
// stream never worked would pass without testing it: some sender must
// have streamed, by the time the rows are settled or within 30s of it,
// and the slot must end up confirmed past every change, or it would hold
// WAL, and replay the whole run at the next start. A stream that begins
// only after the settling delivered nothing, but the slot it confirms
// still shows that it read the whole run; the note says when that was.
func (s *scenario) checkStream() {
	// A fault may have caught the stream before it began (slot creation
	// waits for the transactions running then), and its next session
	// starts only once the caught connection's deadline passed: wait for
	// it, rather than judge the moment the rows happen to be settled.
	var streamed int
	settled := time.Now()
	deadline := settled.Add(30 * time.Second)
	for {
		streamed = 0
		for _, p := range s.senders {
			streamed += p.logCount(logStreaming)
		}
		if streamed > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if streamed == 0 {
		s.violate("no cdc sender streamed from the replication slot %s within 30s of settling: the poll delivered everything, so the scenario did not test the stream", s.slot)
		return
	}
	if waited := time.Since(settled); waited >= 100*time.Millisecond {
		s.note("cdc: the first stream began %s after the rows were settled", waited.Round(100*time.Millisecond))
	}
	var target string
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
	err := s.studentDB.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&target)
	cancel()
	if err != nil {
		s.violate("read the current WAL position: %v", err)
		return
	}
	start := time.Now()
	var last slotRow
	if s.eventually(30*time.Second, "the replication slot is confirmed up to the WAL position at quiet ("+target+")", func() bool {
		ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
		defer cancel()
		var done bool
		err := s.studentDB.QueryRow(ctx, `SELECT COALESCE(confirmed_flush_lsn >= $2::pg_lsn, false), COALESCE(active_pid, 0), COALESCE(confirmed_flush_lsn::text, '')
			FROM pg_replication_slots WHERE slot_name = $1`, s.slot, target).Scan(&done, &last.activePID, &last.confirmed)
		return err == nil && done
	}) {
		s.note("cdc: %d streaming sessions in all; slot %s confirmed past the WAL position at quiet %s later",
			streamed, s.slot, time.Since(start).Round(100*time.Millisecond))
	} else {
		s.note("cdc: slot %s confirmed at %q, active pid %d, at the end", s.slot, last.confirmed, last.activePID)
	}
}

// logCount is how many times the process's log has s.
func (p *proc) logCount(s string) int {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), s)
}

// waitLogCount polls p's log until it has marker at least n times.
func (s *scenario) waitLogCount(p *proc, marker string, n int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for p.logCount(marker) < n {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// readingSlot reports whether a cdc sender streams from the slot now, as
// its admin /metrics says (outbox_cdc_reading).
func (s *scenario) readingSlot(p *proc) bool {
	if !p.running() {
		return false
	}
	resp, err := s.client.Get("http://" + adminAddrOf(p) + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if sc.Text() == "outbox_cdc_reading 1" {
			return true
		}
	}
	return false
}

// leftoverSlots lists the replication slots left in the suite's shared
// clusters: each scenario drops its own, so any left is a harness bug
// that would hold WAL for the rest of the suite.
func leftoverSlots() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error
	for _, c := range []*pgcluster.Cluster{suite.student, suite.users} {
		if c == nil {
			continue
		}
		conn, err := pgx.Connect(ctx, c.URL())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var slots []string
		err = conn.QueryRow(ctx, `SELECT COALESCE(array_agg(slot_name || ' (' || database || ')' ORDER BY slot_name), '{}') FROM pg_replication_slots`).Scan(&slots)
		conn.Close(ctx)
		switch {
		case err != nil:
			errs = append(errs, err)
		case len(slots) > 0:
			errs = append(errs, fmt.Errorf("cluster on port %d: %d replication slots left behind: %s", c.Port(), len(slots), strings.Join(slots, ", ")))
		}
	}
	return errors.Join(errs...)
}
