package usersnats

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestUnread(t *testing.T) {
	t.Parallel()
	r := read{floor: 10, last: 20}
	for _, tc := range []struct {
		seq    uint64
		unread bool
		why    string
	}{
		{5, false, "below the floor: read"},
		{10, false, "at the floor: read"},
		{11, true, "past the floor: maybe unread"},
		{20, true, "the newest command: unread"},
		{21, false, "past the newest: the stream was made anew, the command is gone"},
	} {
		require.Equal(t, tc.unread, r.unread(tc.seq), "seq %d: %s", tc.seq, tc.why)
	}
}
