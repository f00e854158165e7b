package relay

import (
	"context"
	"log/slog"
	"time"

	"github.com/outboxref/outboxref/outbox-sender/internal/store"
)

// claim is the claim loop, one per feed: it waits until the feed may have
// rows, takes capacity for as many as it can deliver, claims them and hands
// them to the workers, until ctx ends. A failed claim is retried after a
// backoff; the rows of a claim that did not commit are due again, and those
// of one that did but was reported failed come back when their lease runs
// out.
func (e *Engine) claim(ctx context.Context, f Feed, tokens chan struct{}, jobs chan<- store.Row) {
	var last Claimed
	failures := 0 // consecutive failed claims
	for {
		limit := f.Wait(ctx, last)
		if limit <= 0 || ctx.Err() != nil {
			return
		}
		n, ok := e.capacity(ctx, tokens, min(limit, e.cfg.BatchSize), last.Full())
		if !ok {
			return
		}
		// The lease is counted from before the claim was sent: by the
		// sender's clock it ends no later than the database's lease does.
		// A zero lease (an engine built by hand) stamps no end.
		var leaseEnds time.Time
		if e.cfg.Lease.For > 0 {
			leaseEnds = time.Now().Add(e.cfg.Lease.For)
		}
		rows, err := f.Claim(context.WithoutCancel(ctx), n)
		last = Claimed{Asked: n, Got: len(rows), Err: err}
		for i := range rows {
			rows[i].LeaseEnds = leaseEnds
		}
		e.metrics.claimed.Add(float64(len(rows)))
		if len(rows) > 0 {
			e.metrics.claimSize.Observe(float64(len(rows)))
		}
		for _, row := range rows {
			jobs <- row
		}
		for range n - len(rows) {
			tokens <- struct{}{}
		}
		switch {
		case err == nil:
			if failures > 0 {
				e.log.Info("claiming again", slog.String("feed", f.String()), slog.Int("failed_claims", failures))
			}
			failures = 0
		case ctx.Err() == nil:
			// While the database is down, back off to at most 5s between
			// tries and log the first failure and every tenth, not each.
			failures++
			if failures%10 == 1 {
				e.log.Error("claim outbox rows", slog.String("feed", f.String()),
					slog.Int("failed_claims", failures), slog.String("error", err.Error()))
			}
			select {
			case <-ctx.Done():
			case <-time.After(min(e.cfg.PollInterval<<min(failures, 16), 5*time.Second)):
			}
		}
	}
}

// capacity waits for one free delivery slot, then takes as many more as
// are free right now, up to want: one claim serves them all. Under a
// backlog (the last claim came back full) it waits up to BusyLinger for the
// rest, since slots free one by one as deliveries finish. ok is false, and
// nothing is taken, once ctx has ended.
func (e *Engine) capacity(ctx context.Context, tokens chan struct{}, want int, backlog bool) (n int, ok bool) {
	select {
	case <-ctx.Done():
		return 0, false
	case <-tokens:
	}
	n = 1 + take(tokens, want-1)
	if !backlog || n >= want {
		return n, true
	}
	linger := time.NewTimer(BusyLinger)
	defer linger.Stop()
	for n < want {
		select {
		case <-tokens:
			n++
		case <-linger.C:
			return n, true
		case <-ctx.Done():
			for range n {
				tokens <- struct{}{}
			}
			return 0, false
		}
	}
	return n, true
}

// take takes up to limit tokens that are free right now, without waiting,
// and returns how many it took.
func take(tokens chan struct{}, limit int) int {
	n := 0
	for n < limit {
		select {
		case <-tokens:
			n++
		default:
			return n
		}
	}
	return n
}
