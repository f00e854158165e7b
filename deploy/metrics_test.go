package deploy

// This file holds the observability page to the binaries: every metric it
// names is served from the start, before the first event, so that a
// dashboard panel or an alert built from the page has a series to read.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/db/migrations"
	"github.com/outboxref/outboxref/outbox-sender/sender"
	"github.com/outboxref/outboxref/services/student/studentsvc"
	"github.com/outboxref/outboxref/services/users/usersvc"
	"github.com/outboxref/outboxref/testkit/apitest"
	"github.com/outboxref/outboxref/testkit/pgtest"
)

const observabilityPage = "docs/observability.md"

// documentedMetric is a row of one of the page's metric tables.
type documentedMetric struct {
	name     string
	labelled bool // the page names its labels: name{label,…}
	counter  bool
}

// metricRow matches a table row that starts with one or more metric names
// in backquotes, and captures the type column.
var (
	metricRow  = regexp.MustCompile("^\\| (`[a-z_]+(?:\\{[a-z_,]+\\})?`(?:, `[a-z_]+(?:\\{[a-z_,]+\\})?`)*) \\| ([a-z]+) \\|")
	metricName = regexp.MustCompile("`([a-z_]+)(\\{[a-z_,]+\\})?`")
)

// documentedMetrics reads the metric tables of the page's section heading
// (up to the next ## heading).
func documentedMetrics(page, heading string) ([]documentedMetric, error) {
	_, section, ok := strings.Cut(page, "\n## "+heading+"\n")
	if !ok {
		return nil, fmt.Errorf("%s has no section ## %s", observabilityPage, heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var out []documentedMetric
	for line := range strings.SplitSeq(section, "\n") {
		m := metricRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		for _, n := range metricName.FindAllStringSubmatch(m[1], -1) {
			out = append(out, documentedMetric{name: n[1], labelled: n[2] != "", counter: m[2] == "counter"})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no metric table under ## %s", observabilityPage, heading)
	}
	return out, nil
}

// bornOnFirstEvent are the metrics the page itself says appear only with
// their first event: the request histogram gets a series per route and
// status as requests come.
var bornOnFirstEvent = map[string]bool{"http_request_duration_seconds": true}

// scrapeFamilies reads a /metrics answer.
func scrapeFamilies(t *testing.T, url string) map[string]int {
	t.Helper()
	res := apitest.Do(t, http.MethodGet, url, "")
	require.Equal(t, http.StatusOK, res.Status, "%s: %s", url, res.Body)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(res.Body)))
	require.NoError(t, err)
	series := map[string]int{}
	for name, f := range families {
		series[name] = len(f.GetMetric())
	}
	return series
}

// missingMetrics says which documented metrics a fresh binary does not
// serve with at least one series: a labelled counter without one would
// give increase() nothing to start from.
func missingMetrics(docs []documentedMetric, served map[string]int) []string {
	var missing []string
	for _, m := range docs {
		if served[m.name] == 0 && !bornOnFirstEvent[m.name] {
			missing = append(missing, m.name+": not served")
		}
	}
	return missing
}

// TestDocumentedMetricsExistFromTheStart runs Student, Users, a polling
// sender and a streaming one on fresh databases, scrapes each admin port
// before anything happened, and finds every metric the observability page
// names.
func TestDocumentedMetricsExistFromTheStart(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile(filepath.Join(repoRoot, observabilityPage))
	require.NoError(t, err)
	services, err := documentedMetrics(string(page), "Student's and Users' metrics")
	require.NoError(t, err)
	senders, err := documentedMetrics(string(page), "The sender's metrics")
	require.NoError(t, err)

	studentDB, usersDB := pgtest.URL(t, migrations.Student), pgtest.URL(t, migrations.Users)
	const token = "metrics-test-token-0123456789"
	studentAdmin, usersAdmin := apitest.FreeAddr(t), apitest.FreeAddr(t)
	type runFunc func(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error
	run := func(ready string, run runFunc, env func(string) string) {
		apitest.RunUntilReady(t, "http://"+ready+"/readyz", func(ctx context.Context) error { return run(ctx, nil, env, &apitest.Logs{}) })
	}
	run(studentAdmin, studentsvc.Run, apitest.Env("STUDENT_DATABASE_URL", pgtest.RoleURL(t, studentDB, migrations.StudentApp),
		"STUDENT_HTTP_ADDR", apitest.FreeAddr(t), "STUDENT_ADMIN_ADDR", studentAdmin, "STUDENT_API_TOKENS", "client:deploy-client-token-0123456"))
	run(usersAdmin, usersvc.Run, apitest.Env("USERS_DATABASE_URL", pgtest.RoleURL(t, usersDB, migrations.UsersApp),
		"USERS_API_TOKENS", "outbox-sender:"+token, "USERS_HTTP_ADDR", apitest.FreeAddr(t), "USERS_ADMIN_ADDR", usersAdmin))
	served := scrapeFamilies(t, "http://"+studentAdmin+"/metrics")
	for name, n := range scrapeFamilies(t, "http://"+usersAdmin+"/metrics") {
		served[name] += n
	}
	require.Empty(t, missingMetrics(services, served), "Student's and Users' metrics")

	// One sender of each source, each on a Student database of its own.
	for _, source := range []string{sender.SourcePoll, sender.SourceCDC} {
		db := pgtest.URL(t, migrations.Student)
		admin, slot := apitest.FreeAddr(t), fmt.Sprintf("metrics_%d", time.Now().UnixNano())
		env := apitest.Env("SENDER_DATABASE_URL", pgtest.RoleURL(t, db, migrations.OutboxSender), "SENDER_USERS_TOKEN", token,
			"SENDER_ADMIN_ADDR", admin, "SENDER_SOURCE", source, "SENDER_CDC_SLOT", slot,
			"SENDER_CDC_DATABASE_URL", pgtest.RoleURL(t, db, migrations.OutboxCDC))
		if source == sender.SourceCDC {
			dropSlotAtCleanup(t, db, slot)
		}
		run(admin, sender.Run, env)
		docs := senders
		if source == sender.SourcePoll {
			docs = pollMetrics(senders)
		} else {
			// The slot's figures are there once the sender made its slot.
			// Making one waits for every transaction then running in the
			// whole cluster, other tests' included.
			require.Eventually(t, func() bool {
				return scrapeFamilies(t, "http://"+admin+"/metrics")["outbox_cdc_retained_wal_bytes"] > 0
			}, time.Minute, 50*time.Millisecond, "the cdc sender's slot")
		}
		require.Empty(t, missingMetrics(docs, scrapeFamilies(t, "http://"+admin+"/metrics")), "a %s sender's metrics", source)
	}
}

// pollMetrics leaves out the change-data-capture source's metrics, which
// the page names for SENDER_SOURCE=cdc only.
func pollMetrics(docs []documentedMetric) []documentedMetric {
	var out []documentedMetric
	for _, m := range docs {
		if !strings.HasPrefix(m.name, "outbox_cdc_") {
			out = append(out, m)
		}
	}
	return out
}

// dropSlotAtCleanup drops the replication slot once the sender that made it
// has stopped (cleanups run last-registered first): a database with a slot
// cannot be dropped.
func dropSlotAtCleanup(t *testing.T, dbURL, slot string) {
	t.Helper()
	pool := pgtest.Connect(t, dbURL)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
	})
}

// TestMetricsCheckCatchesMistakes proves the check can fail: a metric the
// page names that is not served, and a labelled counter with no series.
func TestMetricsCheckCatchesMistakes(t *testing.T) {
	t.Parallel()
	page := "# O\n\n## Mine\n\n| Metric | Type | Meaning |\n|---|---|---|\n" +
		"| `a_total{kind}` | counter | x |\n| `b_seconds`, `c_rows` | histogram | y |\n| `http_request_duration_seconds{route}` | histogram | z |\n\n## Next\n| `d_total` | counter | w |\n"
	docs, err := documentedMetrics(page, "Mine")
	require.NoError(t, err)
	require.Equal(t, []documentedMetric{{"a_total", true, true}, {"b_seconds", false, false}, {"c_rows", false, false},
		{"http_request_duration_seconds", true, false}}, docs)
	require.Equal(t, []string{"a_total: not served", "c_rows: not served"}, missingMetrics(docs, map[string]int{"b_seconds": 1}))
	require.Empty(t, missingMetrics(docs, map[string]int{"a_total": 2, "b_seconds": 1, "c_rows": 1}))
	_, err = documentedMetrics(page, "Other")
	require.Error(t, err)
}
