package relay

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/outbox-sender/internal/store"
)

// scriptedFeed offers rows from a script of claims: each claim takes the
// next entry, a number of rows or a failure. It records what was asked.
type scriptedFeed struct {
	mu     sync.Mutex
	script []any // int (rows to return, at most what was asked) or error
	asked  []int
	lasts  []Claimed
	nextID int64
}

func (f *scriptedFeed) String() string { return "scripted" }

func (f *scriptedFeed) Wait(ctx context.Context, last Claimed) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lasts = append(f.lasts, last)
	if len(f.script) == 0 {
		f.mu.Unlock()
		<-ctx.Done()
		f.mu.Lock()
		return 0
	}
	return Unknown
}

func (f *scriptedFeed) Claim(_ context.Context, n int) ([]store.Row, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, n)
	step := f.script[0]
	f.script = f.script[1:]
	if err, ok := step.(error); ok {
		return nil, err
	}
	rows := make([]store.Row, min(step.(int), n))
	for i := range rows {
		f.nextID++
		rows[i] = store.Row{ID: f.nextID}
	}
	return rows, nil
}

// TestClaimLoop: the one claim loop every feed goes through hands claimed
// rows to the workers, gives back the capacity a short claim did not use,
// backs off after a failure and tells the feed how each claim went.
func TestClaimLoop(t *testing.T) {
	t.Parallel()
	e := &Engine{cfg: Config{BatchSize: 5, PollInterval: 10 * time.Millisecond}, log: slog.New(slog.DiscardHandler), metrics: newMetrics()}
	f := &scriptedFeed{script: []any{5, errors.New("database down"), 2}}
	tokens := make(chan struct{}, 8)
	for range 8 {
		tokens <- struct{}{}
	}
	jobs := make(chan store.Row, 8)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.claim(ctx, f, tokens, jobs) }()

	var got []int64
	for len(got) < 7 {
		select {
		case r := <-jobs:
			got = append(got, r.ID)
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d rows reached the workers", len(got))
		}
	}
	require.Eventually(t, func() bool { return len(tokens) == 1 }, 30*time.Second, time.Millisecond,
		"7 rows in flight hold 7 of 8 slots; a short or failed claim gives its slots back")
	cancel()
	<-done

	require.Equal(t, []int64{1, 2, 3, 4, 5, 6, 7}, got)
	require.Equal(t, []int{5, 3, 3}, f.asked, "a batch, then what capacity was left")
	require.Len(t, f.lasts, 4)
	require.Equal(t, Claimed{}, f.lasts[0], "nothing before the first claim")
	require.True(t, f.lasts[1].Full())
	require.Error(t, f.lasts[2].Err)
	require.Equal(t, Claimed{Asked: 3, Got: 2}, f.lasts[3])
}
