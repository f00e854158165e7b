// Package alarm paces a log line that many events could trigger at once:
// every row of the outbox failing alike, or every scrape while the
// database is down. The first event rings; then at most one ring per
// interval, saying how many events there were since the last.
package alarm

import (
	"sync"
	"time"
)

// Alarm is safe for concurrent use; its zero value is ready.
type Alarm struct {
	mu     sync.Mutex
	last   time.Time
	events int
}

// Ring counts an event at now. ok says whether to log it: for the first
// event, and then for the first event at least every after the last ring.
// events is how many were counted since the last ring, this one included.
func (a *Alarm) Ring(now time.Time, every time.Duration) (events int, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events++
	if !a.last.IsZero() && now.Sub(a.last) < every {
		return 0, false
	}
	events, a.events, a.last = a.events, 0, now
	return events, true
}
