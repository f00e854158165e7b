//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/testkit/invariant"
)

// cdcScenarios are the faults of the change-data-capture source alone
// (SENDER_SOURCE=cdc): the sender dies between recording answers and
// confirming the slot, Student's database restarts under the stream, the
// slot is dropped by hand, and cdc senders share an outbox with each other
// and with a polling sender. TestFaults runs them after scenarios, with
// the cdc source only (17 starts its senders itself, of both sources).
var cdcScenarios = []scenarioDef{
	{id: "14-cdc-kill-before-confirm", title: "cdc sender killed after recording answers and before confirming the slot, restarted",
		opts: scenarioOptions{senders: 0}, run: cdcKillBeforeConfirm, sources: []string{sourceCDC}},
	{id: "15-cdc-database-restart", title: "Student's database restarted cleanly, then killed and restarted, under a cdc sender",
		opts: scenarioOptions{senders: 1, ownClusters: true, latency: 100 * time.Millisecond}, run: cdcDatabaseRestart, sources: []string{sourceCDC}},
	{id: "16-cdc-slot-dropped", title: "the replication slot dropped by hand mid-load, twice",
		opts: scenarioOptions{senders: 1}, run: cdcSlotDropped, sources: []string{sourceCDC}},
	{id: "17-cdc-mixed-senders", title: "two cdc senders and a polling one on one outbox, the streaming one killed again and again",
		opts: scenarioOptions{senders: 0, latency: 250 * time.Millisecond}, run: cdcMixedSenders, sources: []string{sourceCDC}},
}

// 14. The sender has recorded the answers of streamed rows and is about to
// confirm their position to PostgreSQL when it dies
// (CRASH_POINT=sender-before-confirm, then @3 and @5), and is restarted
// each time. The slot still holds those rows' inserts: the next run
// streams them again, and its claim must find them settled (delivered)
// instead of asking Users again; rows that were in flight come back
// through their leases and Users' inbox replays them. A sender that
// confirmed before recording would lose the rows it died holding.
func cdcKillBeforeConfirm(s *scenario) {
	l := s.startLoad(300, 10*time.Second)
	sender := s.newSender()
	crashes := 0
	var replayable []int
	for _, spec := range []string{"sender-before-confirm", "sender-before-confirm@3", "sender-before-confirm@5"} {
		s.startProc(sender, "CRASH_POINT="+spec)
		if !s.expectCrash(sender, "sender-before-confirm", 30*time.Second) {
			continue
		}
		crashes++
		// The crash point is hit only when rows are recorded whose
		// position the server has not been told: the slot must still
		// hold inserts to replay.
		n := s.unconfirmedInserts()
		replayable = append(replayable, n)
		if n == 0 {
			s.violate("the sender crashed before confirming, but its slot holds no unconfirmed insert to replay")
		}
	}
	s.startProc(sender)
	l.wait(time.Minute)
	s.note("sender crashed at sender-before-confirm %d times (runs: 1st, 3rd and 5th hit); the slot held %v unconfirmed outbox inserts after each crash, replayed by the next run",
		crashes, replayable)
}

// unconfirmedInserts is how many outbox inserts the slot would stream
// again, read without consuming them (pg_logical_slot_peek_binary_changes)
// once no session streams from it. -1 if it could not tell.
func (s *scenario) unconfirmedInserts() int {
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		var n int
		// pgoutput's insert messages start with 'I'.
		err := s.studentDB.QueryRow(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
			'proto_version', '1', 'publication_names', 'outbox_inserts') WHERE get_byte(data, 0) = ascii('I')`, s.slot).Scan(&n)
		if err == nil {
			return n
		}
		// The killed sender's walsender may not have noticed yet.
		time.Sleep(100 * time.Millisecond)
	}
	s.violate("could not read the slot's unconfirmed changes within 10s")
	return -1
}

// 15. Student's database is restarted under load with a cdc sender: first
// cleanly (pg_ctl stop -m fast, as a maintenance window does), then by
// SIGKILL with crash recovery. The slot is on disk and survives both, at
// its last confirmed position (after a crash, possibly an older one). The
// sender must stream again after each restart, and what the slot replays
// or the sender could not record is delivered once.
func cdcDatabaseRestart(s *scenario) {
	l := s.startLoad(300, 14*time.Second)
	sender := s.senders[0]
	time.Sleep(2 * time.Second)
	start := time.Now()
	require.NoError(s.t, s.studentCluster.Restart(s.ctx))
	stopped := time.Since(start)
	s.eventually(30*time.Second, "the sender streams again after the clean restart", func() bool {
		return sender.logCount(logStreaming) >= 2
	})
	time.Sleep(2 * time.Second)
	require.NoError(s.t, s.studentCluster.Kill())
	time.Sleep(3 * time.Second)
	require.NoError(s.t, s.studentCluster.Restart(s.ctx))
	s.eventually(30*time.Second, "the sender streams again after the crash", func() bool {
		return sender.logCount(logStreaming) >= 3
	})
	l.wait(2 * time.Minute)
	s.note("Student's database restarted cleanly (the restart took %s) and then SIGKILLed, down 3s, with crash recovery; the sender streamed %d times",
		stopped.Round(100*time.Millisecond), sender.logCount(logStreaming))
}

// 16. The replication slot is dropped by hand while students arrive, as
// an operator cleaning up might: the session streaming from it is ended
// and the slot dropped, in a loop until the drop wins the race with the
// sender's reconnection. The sender must say so as an error, deliver
// what was committed while no slot decoded it (the poll, after
// SENDER_CDC_GRACE), and create the slot again and stream from it. Twice.
func cdcSlotDropped(s *scenario) {
	l := s.startLoad(300, 10*time.Second)
	sender := s.senders[0]
	var rounds []int
	for i := range 2 {
		s.sleep(1500*time.Millisecond, 2500*time.Millisecond)
		n, err := s.dropSlot(20 * time.Second)
		if err != nil {
			s.violate("%v", err)
			return
		}
		rounds = append(rounds, n)
		if !s.waitLogCount(sender, logSlotGone, i+1, 20*time.Second) {
			s.violate("the sender did not log %q within 20s of drop %d", logSlotGone, i+1)
		}
		s.eventually(20*time.Second, "the slot is created again and streamed", func() bool {
			r, err := s.readSlot()
			return err == nil && r.exists && r.activePID != 0 && s.readingSlot(sender)
		})
	}
	l.wait(time.Minute)
	s.note("slot dropped by hand twice (terminate and drop rounds: %v); the sender logged %q %d times and streamed %d times",
		rounds, logSlotGone, sender.logCount(logSlotGone), sender.logCount(logStreaming))
}

// 17. Two cdc senders and a polling sender on one outbox, under load with
// answers taking 250ms. One cdc sender streams; the other stands by, and
// must take the slot over each time the streaming one is SIGKILLed (four
// times, each restarted to stand by in turn). The polling sender, one
// delivery at a time, claims new rows as they commit whenever it is free,
// racing the stream for them: the claims (SKIP LOCKED, leases) give every
// row to one of them, and whatever a dead sender held is redelivered and
// absorbed by Users' inbox.
func cdcMixedSenders(s *scenario) {
	cdcA, cdcB := s.newSenderOf(sourceCDC), s.newSenderOf(sourceCDC)
	poll := s.newSenderOf(sourcePoll)
	s.startProc(cdcA)
	s.eventually(20*time.Second, "the first cdc sender streams", func() bool { return s.readingSlot(cdcA) })
	s.startProc(cdcB)
	if !s.waitLog(cdcB, logStandby, 10*time.Second) {
		s.violate("the second cdc sender did not stand by within 10s: %q is not in its log", logStandby)
	}
	// One delivery at a time. A polling sender claims a notified row
	// within a millisecond of its commit, the stream some milliseconds
	// later: with its full capacity the poll took every row, and the race
	// was never run. Busy with one answer (250 ms here) most of the time,
	// it leaves most rows to the stream, and each time it comes free it
	// races the stream for the newest.
	s.startProc(poll, "SENDER_CONCURRENCY=1", "SENDER_BATCH_SIZE=1")
	l := s.startLoad(450, 12*time.Second)
	cdc := []*proc{cdcA, cdcB}
	takeovers, bothRead := 0, 0
	var pids []int
	var took []time.Duration
	for range 4 {
		s.sleep(800*time.Millisecond, 1800*time.Millisecond)
		reader, standby := cdcA, cdcB
		if !s.eventually(10*time.Second, "one cdc sender streams", func() bool {
			for i, p := range cdc {
				if s.readingSlot(p) {
					reader, standby = p, cdc[1-i]
					return true
				}
			}
			return false
		}) {
			break
		}
		before, _ := s.readSlot()
		reader.killGroup()
		killed := time.Now()
		if s.eventually(15*time.Second, standby.name+" takes the slot over from "+reader.name, func() bool {
			r, err := s.readSlot()
			return err == nil && r.activePID != 0 && r.activePID != before.activePID && s.readingSlot(standby)
		}) {
			takeovers++
			took = append(took, time.Since(killed))
			if r, err := s.readSlot(); err == nil {
				pids = append(pids, before.activePID, r.activePID)
			}
		}
		s.startProc(reader)
		// One reader per slot: the restarted sender finds it busy.
		time.Sleep(300 * time.Millisecond)
		if s.readingSlot(reader) && s.readingSlot(standby) {
			bothRead++
		}
	}
	l.wait(time.Minute)
	if takeovers < 4 {
		s.violate("the standby took the slot over %d times out of 4 kills", takeovers)
	}
	if bothRead > 0 {
		s.violate("both cdc senders said they streamed from the slot at once, %d times", bothRead)
	}
	standbys := 0
	for _, p := range cdc {
		standbys += p.logCount(logStandby)
	}
	s.note("2 cdc senders and 1 polling sender; the streaming one SIGKILLed 4 times, taken over %d times (after %v; walsender pids %v); %d stand-bys logged",
		takeovers, roundAll(took), pids, standbys)
	s.minRedeliv = 1
	// Both sources must have delivered: otherwise one of them only stood
	// by, and the race between them was not tested.
	s.afterChecks = append(s.afterChecks, func(r invariant.Report) {
		if r.ClaimedBy[poll.name] == 0 {
			s.violate("the polling sender delivered no row: it never raced the stream")
		}
		if r.ClaimedBy[cdcA.name]+r.ClaimedBy[cdcB.name] == 0 {
			s.violate("the cdc senders delivered no row: the poll took everything")
		}
	})
}

func roundAll(ds []time.Duration) string {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(100 * time.Millisecond)
	}
	return fmt.Sprint(out)
}
