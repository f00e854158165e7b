package relay

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/outbox-sender/internal/store"
)

// outageSummaryEvery is how often, at most, the sender says that
// deliveries are still failing.
const outageSummaryEvery = 30 * time.Second

// outage paces what the sender says while deliveries fail and are retried:
// Users is down, unreachable, or answers 503 for a while. The first failure
// of a spell is logged at once, with its row and its error; while the spell
// lasts, a summary at most every outageSummaryEvery; and the first delivery
// after it, as the recovery. Never a line per attempt: an hour's outage
// would write one for every row at every retry. (Refused credentials have
// a louder line of their own, from the transport, or from the broker's
// connection.)
type outage struct {
	mu       sync.Mutex
	failing  bool
	since    time.Time      // when the spell began
	failures int            // failed attempts in the spell
	unsaid   map[string]int // failed attempts since the last line, by reason class
	said     time.Time      // when the last line was logged
	err      string         // the latest error
}

// failed notes a failed attempt that will be retried, and logs when the
// pace allows.
func (o *outage) failed(ctx context.Context, log *slog.Logger, now time.Time, r store.Result) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.failures++
	o.err = r.Error
	if !o.failing {
		o.failing, o.since, o.said, o.unsaid = true, now, now, map[string]int{}
		log.LogAttrs(ctx, slog.LevelWarn, "deliveries failing; rows are retried with backoff, and this is said again every 30s while it lasts",
			append(RowAttrs(r.Row), slog.String("reason_class", r.Class), slog.String("error", r.Error))...)
		return
	}
	o.unsaid[r.Class]++
	if now.Sub(o.said) < outageSummaryEvery {
		return
	}
	log.LogAttrs(ctx, slog.LevelWarn, "deliveries still failing",
		slog.Int("failed_attempts_since_last_line", sum(o.unsaid)), slog.String("reason_classes", classes(o.unsaid)),
		slog.String("failing_for", now.Sub(o.since).Round(time.Second).String()), slog.String("last_error", o.err))
	o.said, o.unsaid = now, map[string]int{}
}

// delivered notes a delivery, and logs the recovery if it ends a spell.
func (o *outage) delivered(ctx context.Context, log *slog.Logger, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.failing {
		return
	}
	log.LogAttrs(ctx, slog.LevelInfo, "deliveries succeed again",
		slog.Int("failed_attempts", o.failures), slog.String("failing_for", now.Sub(o.since).Round(time.Millisecond).String()))
	o.failing, o.failures = false, 0
}

// note tells the outage what came of one attempt.
func (e *Engine) note(ctx context.Context, r store.Result) {
	switch {
	case r.Outcome == retry && r.Class != outbox.ReasonUsersAuthRefused && r.Class != outbox.ReasonBrokerAuthRefused:
		e.outage.failed(ctx, e.log, time.Now(), r)
	case r.Outcome == delivered:
		e.outage.delivered(ctx, e.log, time.Now())
	}
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// classes writes counts by class as "users-unavailable=3 users-unreachable=1".
func classes(m map[string]int) string {
	var b strings.Builder
	for _, class := range slices.Sorted(maps.Keys(m)) {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", class, m[class])
	}
	return b.String()
}
