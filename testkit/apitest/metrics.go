package apitest

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// Scrape reads an admin listener's /metrics, which must answer 200 in
// Prometheus' text format, and returns the text.
func Scrape(t testing.TB, adminURL string) string {
	t.Helper()
	res := Do(t, http.MethodGet, adminURL+"/metrics", "")
	require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
	require.Contains(t, res.Header.Get("Content-Type"), "text/plain")
	return string(res.Body)
}

// RequireSample checks that scraped has the sample, such as
// `student_students_created_total 4`, value included, on a line of its own.
func RequireSample(t testing.TB, scraped, sample string) {
	t.Helper()
	require.Contains(t, "\n"+scraped, "\n"+sample+"\n")
}
