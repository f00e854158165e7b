package cdc

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"
)

// TestTrackerConfirmsOnlySettledPrefixes: the position passes a
// transaction only once its rows and those of every transaction before it
// are settled; keepalives move it only when nothing is unsettled.
func TestTrackerConfirmsOnlySettledPrefixes(t *testing.T) {
	t.Parallel()
	tr := newTracker()
	tr.reset(100)
	tr.committed(200, time.Now(), []int64{1, 2})
	tr.committed(300, time.Now(), []int64{3})
	tr.committed(400, time.Now(), nil) // no outbox rows: passes with the rest
	pos := func() pglogrepl.LSN { p, _ := tr.position(); return p }

	require.Equal(t, []int64{1, 2}, tr.take(2))
	require.Equal(t, 1, tr.queued())
	tr.settle(3)
	require.Equal(t, pglogrepl.LSN(100), pos(), "a later transaction settled first moves nothing")
	tr.idle(1000)
	require.Equal(t, pglogrepl.LSN(100), pos(), "a keepalive moves nothing while rows are unsettled")
	tr.settle(1)
	require.Equal(t, pglogrepl.LSN(100), pos())
	tr.settle(2, 2, 99) // twice, and an id it never saw
	p, rows := tr.position()
	require.Equal(t, pglogrepl.LSN(400), p)
	require.Equal(t, int64(3), rows)
	require.Zero(t, tr.unsettled())
	tr.idle(1000)
	require.Equal(t, pglogrepl.LSN(1000), pos(), "with nothing unsettled a keepalive moves it")
	tr.idle(900)
	require.Equal(t, pglogrepl.LSN(1000), pos(), "never backwards")

	tr.committed(1100, time.Now(), []int64{5})
	ids := tr.take(10)
	tr.retake(ids)
	require.Equal(t, 1, tr.queued(), "a failed claim's rows are claimed again")
	tr.reset(1000)
	require.Equal(t, 1, tr.queued(), "a row announced but not claimed is still claimed after a reset")
	require.Zero(t, tr.unsettled(), "but no longer followed")
	tr.settle(5) // settles against nothing after a reset
	require.Equal(t, pglogrepl.LSN(1000), pos())
}
