package e2e

// This file reads the Grafana dashboard of the compose profile
// "observability" and pulls out the series its PromQL queries select. The
// test here checks that the dashboard shows what the README promises;
// dashboard_e2e_test.go (behind -tags e2e) checks that the real binaries
// export every one of those series, so a metric renamed in the code fails
// a test rather than leaving an empty panel.

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// dashboardFile is the dashboard Grafana provisions (compose_test.go checks
// that the provisioning loads it), relative to this package's folder.
const dashboardFile = "../deploy/observability/grafana/dashboards/outboxref.json"

// matcher is one label matcher of a selector: label op "value".
type matcher struct {
	label, op, value string
}

// matches says whether a series with these labels is selected by m, the way
// PromQL matches: a missing label is the empty string, and a regex must
// match the whole value.
func (m matcher) matches(labels map[string]string) (bool, error) {
	v := labels[m.label]
	switch m.op {
	case "=":
		return v == m.value, nil
	case "!=":
		return v != m.value, nil
	}
	re, err := regexp.Compile("^(?:" + m.value + ")$")
	if err != nil {
		return false, err
	}
	return re.MatchString(v) == (m.op == "=~"), nil
}

// selector is a series selector of a query: a metric name and its label
// matchers.
type selector struct {
	name     string
	matchers []matcher
}

func (s selector) String() string {
	if len(s.matchers) == 0 {
		return s.name
	}
	ms := make([]string, len(s.matchers))
	for i, m := range s.matchers {
		ms[i] = m.label + m.op + strconv.Quote(m.value)
	}
	return s.name + "{" + strings.Join(ms, ",") + "}"
}

// promqlKeywords are words PromQL uses that are not metric names; the
// grouping ones are followed by a list of labels, which is no selector
// either.
var (
	promqlKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true, "inf": true, "nan": true}
	promqlGrouping = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}
	// promqlAggregations may put their by/without clause before their
	// parentheses.
	promqlAggregations = map[string]bool{"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
		"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true}
)

// parseSelectors returns the series selectors of a PromQL expression. It
// understands as much PromQL as a dashboard uses (functions, aggregations
// with by/without, binary operators, ranges, numbers and durations, Grafana's
// $variables) and fails on what it cannot read, rather than missing a name.
func parseSelectors(expr string) ([]selector, error) {
	var out []selector
	isIdentStart := func(c byte) bool { return c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
	isIdent := func(c byte) bool { return isIdentStart(c) || '0' <= c && c <= '9' }
	skipSpace := func(i int) int {
		for i < len(expr) && strings.ContainsRune(" \t\r\n", rune(expr[i])) {
			i++
		}
		return i
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '$': // a Grafana variable, such as $__rate_interval
			i++
			for i < len(expr) && (isIdent(expr[i]) || expr[i] == '{' || expr[i] == '}') {
				i++
			}
		case '0' <= c && c <= '9' || c == '.': // a number or a duration
			for i < len(expr) && (isIdent(expr[i]) || expr[i] == '.') {
				i++
			}
		case c == '[': // a range or a subquery's
			end := strings.IndexByte(expr[i:], ']')
			if end < 0 {
				return nil, fmt.Errorf("%q: unclosed [", expr)
			}
			i += end + 1
		case c == '"' || c == '\'' || c == '`':
			_, n, err := readString(expr[i:])
			if err != nil {
				return nil, fmt.Errorf("%q: %w", expr, err)
			}
			i += n
		case c == '{': // a selector without a name
			return nil, fmt.Errorf("%q: a selector without a metric name at %d", expr, i)
		case isIdentStart(c):
			start := i
			for i < len(expr) && isIdent(expr[i]) {
				i++
			}
			word := expr[start:i]
			next := skipSpace(i)
			switch {
			case promqlGrouping[strings.ToLower(word)]:
				if next < len(expr) && expr[next] == '(' {
					end := strings.IndexByte(expr[next:], ')')
					if end < 0 {
						return nil, fmt.Errorf("%q: unclosed %s (", expr, word)
					}
					i = next + end + 1
				}
			case promqlKeywords[strings.ToLower(word)]:
			case next < len(expr) && expr[next] == '(': // a function or an aggregation
			case promqlAggregations[strings.ToLower(word)]: // sum by (le) (...)
			default:
				sel := selector{name: word}
				if next < len(expr) && expr[next] == '{' {
					ms, n, err := readMatchers(expr[next:])
					if err != nil {
						return nil, fmt.Errorf("%q: %s: %w", expr, word, err)
					}
					sel.matchers = ms
					i = next + n
				}
				out = append(out, sel)
			}
		default: // operators, parentheses, commas, spaces
			i++
		}
	}
	return out, nil
}

// readMatchers reads `{label op "value", ...}` from the start of s and
// returns the matchers and how many bytes they took.
func readMatchers(s string) ([]matcher, int, error) {
	var ms []matcher
	labelRe := regexp.MustCompile(`^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*`)
	i := 1
	for {
		for i < len(s) && (s[i] == ' ' || s[i] == ',') {
			i++
		}
		if i < len(s) && s[i] == '}' {
			return ms, i + 1, nil
		}
		m := labelRe.FindStringSubmatch(s[i:])
		if m == nil {
			return nil, 0, fmt.Errorf("cannot read label matcher at %q", s[i:])
		}
		i += len(m[0])
		value, n, err := readString(s[i:])
		if err != nil {
			return nil, 0, err
		}
		i += n
		ms = append(ms, matcher{label: m[1], op: m[2], value: value})
	}
}

// readString reads a PromQL string literal from the start of s.
func readString(s string) (string, int, error) {
	if s == "" || !strings.ContainsRune("\"'`", rune(s[0])) {
		return "", 0, fmt.Errorf("want a string at %q", s)
	}
	q := s[0]
	for i := 1; i < len(s); i++ {
		switch {
		case s[i] == '\\' && q != '`':
			i++
		case s[i] == q:
			if q == '`' {
				return s[1:i], i + 1, nil
			}
			// PromQL's escapes are Go's; a single-quoted string is one
			// Go would read as a rune, so unquote it as double-quoted.
			body := s[1:i]
			if q == '\'' {
				body = strings.ReplaceAll(strings.ReplaceAll(body, `\'`, `'`), `"`, `\"`)
			}
			v, err := strconv.Unquote(`"` + body + `"`)
			return v, i + 1, err
		}
	}
	return "", 0, fmt.Errorf("unterminated string %q", s)
}

// dashboardQuery is one query of a panel.
type dashboardQuery struct {
	panel, expr string
}

// dashboardQueries returns every query of the dashboard, rows' panels
// included.
func dashboardQueries(t *testing.T) []dashboardQuery {
	t.Helper()
	text, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	type panel struct {
		Title   string  `json:"title"`
		Type    string  `json:"type"`
		Panels  []panel `json:"panels"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	}
	var d struct {
		Panels []panel `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(text, &d), dashboardFile)
	var out []dashboardQuery
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
			for _, q := range p.Targets {
				require.NotEmpty(t, q.Expr, "panel %q has an empty query", p.Title)
				out = append(out, dashboardQuery{panel: p.Title, expr: q.Expr})
			}
		}
	}
	walk(d.Panels)
	require.NotEmpty(t, out, "the dashboard has no queries")
	return out
}

// dashboardSelectors returns every selector the dashboard's queries use,
// each with the panel it is in.
func dashboardSelectors(t *testing.T) map[string]selectorUse {
	t.Helper()
	out := map[string]selectorUse{}
	for _, q := range dashboardQueries(t) {
		sels, err := parseSelectors(q.expr)
		require.NoError(t, err, "panel %q", q.panel)
		require.NotEmpty(t, sels, "panel %q: query %q selects no metric", q.panel, q.expr)
		for _, s := range sels {
			u := out[s.String()]
			u.selector = s
			if !slices.Contains(u.panels, q.panel) {
				u.panels = append(u.panels, q.panel)
			}
			out[s.String()] = u
		}
	}
	return out
}

// selectorUse is a selector and the panels that use it.
type selectorUse struct {
	selector
	panels []string
}

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
	for m, want := range map[matcher]bool{
		{"verdict", "=", "dead"}:            true,
		{"verdict", "!=", "dead"}:           false,
		{"verdict", "=~", "delivered|dead"}: true,
		{"verdict", "=~", "dea"}:            false, // anchored, as in PromQL
		{"verdict", "!~", "retry"}:          true,
		{"state", "=", ""}:                  true, // a missing label is ""
	} {
		got, err := m.matches(labels)
		require.NoError(t, err)
		require.Equal(t, want, got, "%+v", m)
	}
}

// TestDashboardQueries: the dashboard shows what the issue asks of it and
// the README describes. The metrics are named here once more on purpose:
// the e2e test proves the binaries export whatever the dashboard queries,
// and this one that the dashboard still queries what matters.
func TestDashboardQueries(t *testing.T) {
	t.Parallel()
	used := map[string]bool{}
	for _, u := range dashboardSelectors(t) {
		used[u.String()] = true
		used[u.name] = true
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
	} {
		require.True(t, used[sel], "the dashboard shows no %s: no query selects %s (it selects %v)", what, sel, slices.Sorted(maps.Keys(used)))
	}
}
