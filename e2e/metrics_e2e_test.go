//go:build e2e

package e2e

import (
	"fmt"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

// TestMetricsAgreeAcrossProcesses runs the three real binaries through the
// answer-lost fault and then reads the pattern's count on both sides, as an
// operator's dashboard would: every outbox row Student wrote ("inserted")
// was settled by the sender, Users created each user once, and every
// redelivery the lost answers caused was absorbed by Users' inbox as a
// replay, one for one with the sender's retries.
func TestMetricsAgreeAcrossProcesses(t *testing.T) {
	const n = 40
	s := newScenario(t, scenarioDef{id: "00-metrics", title: "students through lost answers, then the metrics of all three",
		opts: scenarioOptions{senders: 1}}, suite.good)

	s.toxi.add("lose-answers", "reset_peer", "downstream", map[string]any{"timeout": 0})
	l := s.startLoad(n, time.Second)
	require.True(t, s.eventually(45*time.Second, fmt.Sprintf("Users committed %d users while every answer was lost", n), func() bool {
		return s.count(s.usersDB, "SELECT count(*) FROM users") >= n
	}), "%v", s.violations)
	l.wait(time.Minute)
	s.toxi.remove("lose-answers")
	require.True(t, s.eventually(time.Minute, "every student linked", func() bool {
		return s.count(s.studentDB, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == n
	}), "%v", s.violations)

	require.Len(t, s.senders, 1)
	student := byName(scrape(t, s.client, s.studentAdmin))
	sender := byName(scrape(t, s.client, adminAddrOf(s.senders[0])))
	users := byName(scrape(t, s.client, s.usersAdmin))

	// Inserted = settled = created.
	require.Equal(t, n, value(t, student, "student_students_created_total", nil))
	require.Equal(t, n, value(t, student, "student_outbox_rows_written_total", map[string]string{"operation": "create-user"}))
	require.Equal(t, n, value(t, sender, "outbox_sender_results_total", map[string]string{"verdict": "delivered", "reason_class": "none"}))
	require.Equal(t, n, value(t, users, "users_inbox_requests_total", map[string]string{"outcome": "created"}))
	require.Equal(t, n, histogramCount(t, sender, "outbox_sender_delivery_lag_seconds"))
	require.Equal(t, n, histogramCount(t, sender, "outbox_sender_settled_row_attempts"))

	// Every first answer was lost, so every student needed a retry, and
	// every retry that reached Users was answered from the inbox.
	retries := value(t, sender, "outbox_sender_results_total", map[string]string{"verdict": "retry", "reason_class": "users-unreachable"})
	require.GreaterOrEqual(t, retries, n, "each student's first answer was lost")
	replayed := value(t, users, "users_inbox_requests_total", map[string]string{"outcome": "replayed"})
	require.GreaterOrEqual(t, replayed, n, "the answer that linked each student was a replay")
	require.Equal(t, retries, replayed, "each lost answer's retry was absorbed by the inbox, one for one")
	require.Equal(t, 0, value(t, sender, "outbox_rows", map[string]string{"state": "pending"}))
	require.Equal(t, 1, value(t, sender, "outbox_stats_read_ok", nil))
}

// byName indexes families by name.
func byName(families []*dto.MetricFamily) map[string]*dto.MetricFamily {
	out := make(map[string]*dto.MetricFamily, len(families))
	for _, f := range families {
		out[f.GetName()] = f
	}
	return out
}

// series is the one series of name whose labels include want.
func series(t *testing.T, families map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	t.Helper()
	f, ok := families[name]
	require.True(t, ok, "%s is not exported", name)
	var found []*dto.Metric
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if match {
			found = append(found, m)
		}
	}
	require.Len(t, found, 1, "%s%v: want exactly one series", name, want)
	return found[0]
}

// value is a counter's or a gauge's value; every one read here counts
// whole things.
func value(t *testing.T, families map[string]*dto.MetricFamily, name string, labels map[string]string) int {
	t.Helper()
	m := series(t, families, name, labels)
	if c := m.GetCounter(); c != nil {
		return int(c.GetValue())
	}
	return int(m.GetGauge().GetValue())
}

// histogramCount is how many observations a histogram holds.
func histogramCount(t *testing.T, families map[string]*dto.MetricFamily, name string) int {
	t.Helper()
	return int(series(t, families, name, nil).GetHistogram().GetSampleCount())
}
