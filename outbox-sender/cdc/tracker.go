package cdc

import (
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
)

// tracker follows the streamed transactions from their arrival until every
// outbox row in them is settled, and so says how far the replication slot
// may be confirmed: up to the end of the last transaction before which
// nothing is unsettled. A row is settled once the table carries it: its
// answer is recorded (delivered, a retry scheduled, dead), or the claim
// found it locked by another transaction or no longer due. (A row handed
// back at shutdown is not: the slot replays it to the next reader.)
//
// Confirming less than that would be safe (what the slot replays, the
// claim finds settled); confirming more would lose rows whose delivery is
// not yet recorded, had the sender died before the poll found them.
type tracker struct {
	mu   sync.Mutex
	txns []*txn         // streamed transactions not yet confirmed, in commit order
	rows map[int64]*txn // streamed rows not yet settled
	todo []int64        // streamed rows not yet claimed, in commit order
	pos  pglogrepl.LSN  // the slot may be confirmed up to here
	// done counts the streamed rows whose transactions position has
	// passed.
	done int64
	// visible holds the followed rows a lookup found visible after a
	// claim missed them (settleUnclaimed).
	visible map[int64]bool
	// ready holds a signal while todo is not empty; freed, once rows
	// settle, so that a reader holding back for memory reads again.
	ready chan struct{}
	freed chan struct{}
}

// txn is one streamed transaction with outbox inserts.
type txn struct {
	end       pglogrepl.LSN // where its commit record ends
	commit    time.Time     // by the database's clock
	received  time.Time     // by the sender's
	rows      int
	unsettled int
}

func newTracker() *tracker {
	return &tracker{rows: map[int64]*txn{}, visible: map[int64]bool{}, ready: make(chan struct{}, 1), freed: make(chan struct{}, 1)}
}

// reset forgets what was streamed before: a new session streams it again
// from the slot's confirmed position, from. Rows of the old session still
// in flight settle against nothing, harmlessly. Rows announced but not yet
// claimed stay to be claimed: a new slot (the old one lost) would never
// announce them again. Claimed twice, the second claim finds them leased.
func (t *tracker) reset(from pglogrepl.LSN) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.txns, t.pos = nil, from
	clear(t.rows)
	clear(t.visible)
	if len(t.todo) > 0 {
		wakeUp(t.ready)
	}
}

// committed adds a transaction the stream delivered whole, with the ids
// of the outbox rows it inserted.
func (t *tracker) committed(end pglogrepl.LSN, at time.Time, ids []int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	// A transaction without rows (pgoutput may send one) still waits
	// behind those before it.
	x := &txn{end: end, commit: at, received: time.Now()}
	for _, id := range ids {
		if _, dup := t.rows[id]; !dup {
			t.rows[id] = x
			x.rows++
			x.unsettled++
			t.todo = append(t.todo, id)
		}
	}
	t.txns = append(t.txns, x)
	t.confirmPrefix()
	if len(t.todo) > 0 {
		wakeUp(t.ready)
	}
}

// idle moves the position to walEnd, the server's position in a keepalive,
// if nothing streamed is unsettled: the server sends a keepalive only
// after everything before it, so the slot may skip the WAL of every other
// table. Without this an idle outbox in a busy database would keep its
// slot, and the WAL it holds, where it was.
func (t *tracker) idle(walEnd pglogrepl.LSN) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.txns) == 0 {
		t.advance(walEnd)
	}
}

// take hands out up to n streamed rows to claim.
func (t *tracker) take(n int) []int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	n = min(n, len(t.todo))
	ids := append([]int64(nil), t.todo[:n]...)
	t.todo = t.todo[n:]
	if len(t.todo) > 0 {
		wakeUp(t.ready)
	}
	return ids
}

// retake puts rows whose claim failed back in front, to be claimed again.
func (t *tracker) retake(ids []int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var keep []int64
	for _, id := range ids {
		if _, ok := t.rows[id]; ok {
			keep = append(keep, id)
		}
	}
	t.todo = append(keep, t.todo...)
	if len(t.todo) > 0 {
		wakeUp(t.ready)
	}
}

// age is how long ago the stream delivered a row this tracker follows.
func (t *tracker) age(id int64) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	x, ok := t.rows[id]
	if !ok {
		return 0, false
	}
	return time.Since(x.received), true
}

// markVisible records that followed rows were found visible.
func (t *tracker) markVisible(ids []int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, id := range ids {
		if _, ok := t.rows[id]; ok {
			t.visible[id] = true
		}
	}
}

// seenVisible says whether a row was found visible since a claim missed it.
func (t *tracker) seenVisible(id int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.visible[id]
}

// queued is how many streamed rows wait to be claimed.
func (t *tracker) queued() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.todo)
}

// settle marks rows settled. Ids it does not follow (rows the poll
// claimed, or streamed before a reset) are ignored, and so is a second
// settlement of the same row.
func (t *tracker) settle(ids ...int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, id := range ids {
		if x, ok := t.rows[id]; ok {
			delete(t.rows, id)
			delete(t.visible, id)
			x.unsettled--
			n++
		}
	}
	if n > 0 {
		t.confirmPrefix()
		wakeUp(t.freed)
	}
}

// confirmPrefix moves the position past the settled transactions at the
// front. Callers hold t.mu.
func (t *tracker) confirmPrefix() {
	i := 0
	for i < len(t.txns) && t.txns[i].unsettled == 0 {
		t.advance(t.txns[i].end)
		t.done += int64(t.txns[i].rows)
		i++
	}
	t.txns = t.txns[i:]
}

func (t *tracker) advance(to pglogrepl.LSN) {
	t.pos = max(t.pos, to)
}

// position is how far the slot may be confirmed, and how many streamed
// rows lie before it.
func (t *tracker) position() (pglogrepl.LSN, int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pos, t.done
}

// unsettled is how many streamed rows are not settled yet.
func (t *tracker) unsettled() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.rows)
}

// oldest is the commit time of the oldest streamed transaction not yet
// confirmed; zero when there is none.
func (t *tracker) oldest() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.txns) == 0 {
		return time.Time{}
	}
	return t.txns[0].commit
}

// wakeUp signals c, or leaves the signal already pending.
func wakeUp(c chan<- struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
