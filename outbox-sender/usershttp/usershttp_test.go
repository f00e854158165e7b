package usershttp

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Users' answers, and what the sender makes of each, are tested with the
// whole relay in package sender; this is the header's own reading.

func TestRetryAfterIsRead(t *testing.T) {
	t.Parallel()
	for header, want := range map[string]time.Duration{
		"":          0,
		"7":         7 * time.Second,
		"-5":        0,
		"nonsense":  0,
		"315360000": 315360000 * time.Second, // the engine caps it
		time.Now().Add(30 * time.Second).UTC().Format(http.TimeFormat): 30 * time.Second,
	} {
		resp := &http.Response{Header: http.Header{}}
		if header != "" {
			resp.Header.Set("Retry-After", header)
		}
		// An HTTP date has whole seconds: 30 s from now reads as 29 to 30 s,
		// less the time the test took to get here.
		require.InDelta(t, want, retryAfter(resp), float64(2*time.Second), "Retry-After: %q", header)
	}
}
