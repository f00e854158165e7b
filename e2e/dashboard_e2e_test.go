//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/deploy"
	"github.com/outboxref/outboxref/testkit/apitest"
)

// TestDashboardMetricsAreExported runs the three real binaries, puts one
// student through, and one of each event a panel counts (a replay at
// Student and at Users, a dead letter), then scrapes the three admin
// listeners: every series a dashboard query selects must be there, name
// and labels, in some binary's answer. A panel whose metric was renamed, or
// whose label value the code spells differently, would otherwise stay
// empty in Grafana without anyone noticing.
func TestDashboardMetricsAreExported(t *testing.T) {
	selectors, err := deploy.DashboardSelectors(suite.root)
	require.NoError(t, err)
	s := newScenario(t, scenarioDef{id: "00-dashboard", title: "one student through, for the dashboard's metrics",
		opts: scenarioOptions{senders: 1}}, suite.good)

	// Users: a user created with a key, then the same request again,
	// answered from the inbox. Its document number is then taken, so the
	// student below that reuses it is refused for good and dead-lettered.
	const takenDoc = "DASH-TAKEN"
	usersKey := "dashboard-" + uuid.NewString()
	body, err := json.Marshal(personBody{Name: "Someone Else", Email: "someone@example.com", DocumentNumber: takenDoc})
	require.NoError(t, err)
	for _, replay := range []bool{false, true} {
		status, answer, replayed, err := postWithKey(s.client, "http://"+s.usersAddr+"/users", usersKey, body, asSuite...)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status, "%s", answer)
		require.Equal(t, replay, replayed, "the second POST /users with the key is a replay")
	}

	// Student: one student, sent twice with its key as a client retrying
	// would (the second answer is a replay), and one that dies.
	studentKey := uuid.NewString()
	body, err = json.Marshal(personBody{Name: "Dashboard Student", Email: "dashboard@example.com", DocumentNumber: "DASH-00001"})
	require.NoError(t, err)
	for _, replay := range []bool{false, true} {
		status, answer, replayed, err := postWithKey(s.client, "http://"+s.studentAddr+"/students", studentKey, body, asSuite...)
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status, "%s", answer)
		require.Equal(t, replay, replayed, "the second POST /students with the key is a replay")
	}
	body, err = json.Marshal(personBody{Name: "Dashboard Poison", Email: "poison@example.com", DocumentNumber: takenDoc})
	require.NoError(t, err)
	status, answer, _, err := postWithKey(s.client, "http://"+s.studentAddr+"/students", uuid.NewString(), body, asSuite...)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status, "%s", answer)

	require.True(t, s.eventually(time.Minute, "one outbox row delivered and one dead", func() bool {
		return s.count(s.studentDB, "SELECT count(*) FROM outbox WHERE state = 'delivered'") == 1 &&
			s.count(s.studentDB, "SELECT count(*) FROM outbox WHERE state = 'dead'") == 1
	}), "%v", s.violations)

	require.Len(t, s.senders, 1)
	// The change-data-capture panels read a sender streaming from its
	// replication slot.
	cdc := s.newSenderOf(sourceCDC)
	s.startProc(cdc)
	require.True(t, s.eventually(30*time.Second, "the cdc sender streams", func() bool { return s.readingSlot(cdc) }), "%v", s.violations)
	// The drift panels read a serving reconciler's gauges, which appear
	// with its first pass.
	reconcilerAdmin := apitest.FreeAddr(t)
	reconciler := s.newProc("reconciler", s.bins.reconciler, "http://"+reconcilerAdmin+"/readyz",
		append(s.reconcilerEnv(), "RECONCILER_ADMIN_ADDR="+reconcilerAdmin)...)
	reconciler.args = []string{"serve"}
	s.startProc(reconciler)
	require.True(t, s.eventually(time.Minute, "the reconciler's first pass ends", func() bool {
		return len(samples(scrape(t, s.client, reconcilerAdmin))["reconciler_drift"]) > 0
	}), "%v", s.violations)
	exported := map[string][]*dto.MetricFamily{
		"student":             scrape(t, s.client, s.studentAdmin),
		"users":               scrape(t, s.client, s.usersAdmin),
		"outbox-sender":       scrape(t, s.client, adminAddrOf(s.senders[0])),
		"outbox-sender (cdc)": scrape(t, s.client, adminAddrOf(cdc)),
		"reconciler":          scrape(t, s.client, reconcilerAdmin),
	}
	series := map[string]map[string][]map[string]string{} // binary → sample name → each series' labels
	for bin, families := range exported {
		series[bin] = samples(families)
	}

	var missing []string
	for _, key := range slices.Sorted(maps.Keys(selectors)) {
		use := selectors[key]
		var named []string // binaries exporting the name, with other labels
		found := false
		for _, bin := range slices.Sorted(maps.Keys(series)) {
			labelSets, ok := series[bin][use.Name]
			if !ok {
				continue
			}
			named = append(named, bin)
			for _, labels := range labelSets {
				selected, err := use.Selects(labels)
				require.NoError(t, err)
				if selected {
					found = true
				}
			}
		}
		switch {
		case found:
		case len(named) == 0:
			missing = append(missing, fmt.Sprintf("%s (panels %q): no binary exports %s", key, use.Panels, use.Name))
		default:
			missing = append(missing, fmt.Sprintf("%s (panels %q): %v export %s, but no series with these labels: %v",
				key, use.Panels, named, use.Name, labelSetsOf(series, named, use.Name)))
		}
	}
	require.Empty(t, missing, "the dashboard queries series the binaries do not export:\n  %s", strings.Join(missing, "\n  "))
}

// adminAddrOf is a sender's admin address: the harness makes the sender
// ready when its admin listener answers /readyz, so that is where it is.
func adminAddrOf(p *proc) string {
	return strings.TrimSuffix(strings.TrimPrefix(p.ready, "http://"), "/readyz")
}

// scrape reads an admin listener's /metrics as Prometheus would.
func scrape(t *testing.T, client *http.Client, addr string) []*dto.MetricFamily {
	t.Helper()
	resp, err := client.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s/metrics: %s", addr, text)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(text))
	require.NoError(t, err, "%s/metrics", addr)
	return slices.Collect(maps.Values(families))
}

// samples indexes families by the names of the samples they expose, which
// are the names PromQL selects: a histogram's _bucket (with le), _sum and
// _count; a counter's or a gauge's own name.
func samples(families []*dto.MetricFamily) map[string][]map[string]string {
	out := map[string][]map[string]string{}
	add := func(name string, labels map[string]string) { out[name] = append(out[name], labels) }
	for _, f := range families {
		name := f.GetName()
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if f.GetType() != dto.MetricType_HISTOGRAM {
				add(name, labels)
				continue
			}
			add(name+"_sum", labels)
			add(name+"_count", labels)
			// The text format's +Inf bucket is among them.
			for _, b := range m.GetHistogram().GetBucket() {
				withLE := map[string]string{"le": model.SampleValue(b.GetUpperBound()).String()}
				maps.Copy(withLE, labels)
				add(name+"_bucket", withLE)
			}
		}
	}
	return out
}

// labelSetsOf lists the label sets the binaries export for name, for a
// failure message.
func labelSetsOf(series map[string]map[string][]map[string]string, bins []string, name string) []string {
	var out []string
	for _, bin := range bins {
		for _, labels := range series[bin][name] {
			out = append(out, fmt.Sprint(labels))
		}
	}
	return out
}
