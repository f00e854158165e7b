package alarm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAlarmPacesItsLines: the first event rings, then one per interval,
// with the number of events since the last ring.
func TestAlarmPacesItsLines(t *testing.T) {
	t.Parallel()
	var a Alarm
	t0 := time.Now()
	n, ok := a.Ring(t0, time.Minute)
	require.True(t, ok)
	require.Equal(t, 1, n)
	for i := range 3 {
		_, ok = a.Ring(t0.Add(time.Duration(i+1)*time.Second), time.Minute)
		require.False(t, ok)
	}
	n, ok = a.Ring(t0.Add(time.Minute), time.Minute)
	require.True(t, ok)
	require.Equal(t, 4, n, "three held back, and this one")
}
