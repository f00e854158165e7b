package deploy

// The tests of the dashboard reader (dashboard.go), and that the dashboard
// shows what docs/observability.md promises.

import (
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDashboardParseSelectors(t *testing.T) {
	t.Parallel()
	for expr, want := range map[string][]string{
		`sum(rate(student_outbox_rows_written_total[$__rate_interval]))`: {"student_outbox_rows_written_total"},
		`histogram_quantile(0.95, sum by (le) (rate(outbox_sender_delivery_lag_seconds_bucket[5m])))`: {
			"outbox_sender_delivery_lag_seconds_bucket"},
		`sum(rate(x_total{verdict=~"delivered|dead", reason_class!="none"}[1m])) by (verdict) / on() group_left sum(y)`: {
			`x_total{verdict=~"delivered|dead",reason_class!="none"}`, "y"},
		`max(outbox_rows{state='pending'}) offset 5m > 1e3 and up == bool 0`: {`outbox_rows{state="pending"}`, "up"},
		`a{l="q\"uote}"} - b`: {`a{l="q\"uote}"}`, "b"},
	} {
		sels, err := parseSelectors(expr)
		require.NoError(t, err, expr)
		got := make([]string, len(sels))
		for i, s := range sels {
			got[i] = s.String()
		}
		require.Equal(t, want, got, expr)
	}
	for _, bad := range []string{`{__name__="x"}`, `x{l=}`, `rate(x[5m)`, `x{l="open`} {
		_, err := parseSelectors(bad)
		require.Error(t, err, bad)
	}
}

func TestDashboardMatcher(t *testing.T) {
	t.Parallel()
	labels := map[string]string{"verdict": "dead"}
	for m, want := range map[Matcher]bool{
		{"verdict", "=", "dead"}:            true,
		{"verdict", "!=", "dead"}:           false,
		{"verdict", "=~", "delivered|dead"}: true,
		{"verdict", "=~", "dea"}:            false, // anchored, as in PromQL
		{"verdict", "!~", "retry"}:          true,
		{"state", "=", ""}:                  true, // a missing label is ""
	} {
		got, err := m.Matches(labels)
		require.NoError(t, err)
		require.Equal(t, want, got, "%+v", m)
	}
	// A selector selects a series when all of its matchers match.
	sel := Selector{Name: "x", Matchers: []Matcher{{"verdict", "=~", "delivered|dead"}, {"state", "=", ""}}}
	got, err := sel.Selects(labels)
	require.NoError(t, err)
	require.True(t, got, "%s", sel)
	sel.Matchers = append(sel.Matchers, Matcher{"verdict", "!=", "dead"})
	got, err = sel.Selects(labels)
	require.NoError(t, err)
	require.False(t, got, "%s", sel)
	_, err = Selector{Name: "x", Matchers: []Matcher{{"verdict", "=~", "("}}}.Selects(labels)
	require.Error(t, err, "a regex PromQL would refuse")
}

// TestDashboardQueries: the dashboard shows what the issue asks of it and
// docs/observability.md describes. The metrics are named here once more on purpose:
// the e2e test proves the binaries export whatever the dashboard queries,
// and this one that the dashboard still queries what matters.
func TestDashboardQueries(t *testing.T) {
	t.Parallel()
	used := map[string]bool{}
	selectors, err := DashboardSelectors(repoRoot)
	require.NoError(t, err)
	for _, u := range selectors {
		used[u.String()] = true
		used[u.Name] = true
	}
	for what, sel := range map[string]string{
		"inserted":                `student_outbox_rows_written_total`,
		"settled":                 `outbox_sender_results_total{verdict=~"delivered|dead"}`,
		"lag percentiles":         `outbox_sender_delivery_lag_seconds_bucket`,
		"pending":                 `outbox_rows{state="pending"}`,
		"oldest pending age":      `outbox_oldest_pending_age_seconds`,
		"dead rows":               `outbox_rows{state="dead"}`,
		"new dead letters":        `outbox_sender_dead_letters_total`,
		"replays at Users' inbox": `users_inbox_requests_total{outcome="replayed"}`,
		"replays at Student":      `student_idempotency_requests_total{outcome="replayed"}`,
		"drift, by class":         `reconciler_drift`,
		"the last full pass":      `reconciler_last_pass_timestamp_seconds{kind="full"}`,
	} {
		require.True(t, used[sel], "the dashboard shows no %s: no query selects %s (it selects %v)", what, sel, slices.Sorted(maps.Keys(used)))
	}
}
