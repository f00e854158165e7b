package deploy

// This file reads the Grafana dashboard of the compose profile
// "observability" and pulls out the series its PromQL queries select.
// dashboard_test.go checks that the dashboard shows what the README
// promises; the e2e suite's TestDashboardMetricsAreExported (behind
// -tags e2e) checks that the real binaries export every one of those
// series, so a metric renamed in the code fails a test rather than leaving
// an empty panel.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// DashboardFile is the dashboard Grafana provisions (grafana_test.go checks
// that the provisioning loads it), relative to the repository's root.
const DashboardFile = "deploy/observability/grafana/dashboards/outboxref.json"

// Matcher is one label matcher of a selector: Label Op "Value".
type Matcher struct {
	Label, Op, Value string
}

// Matches says whether a series with these labels is selected by m, the way
// PromQL matches: a missing label is the empty string, and a regex must
// match the whole value.
func (m Matcher) Matches(labels map[string]string) (bool, error) {
	v := labels[m.Label]
	switch m.Op {
	case "=":
		return v == m.Value, nil
	case "!=":
		return v != m.Value, nil
	}
	re, err := regexp.Compile("^(?:" + m.Value + ")$")
	if err != nil {
		return false, err
	}
	return re.MatchString(v) == (m.Op == "=~"), nil
}

// Selector is a series selector of a query: a metric name and its label
// matchers.
type Selector struct {
	Name     string
	Matchers []Matcher
}

// Selects says whether s selects a series with these labels: whether every
// one of its matchers matches them.
func (s Selector) Selects(labels map[string]string) (bool, error) {
	for _, m := range s.Matchers {
		ok, err := m.Matches(labels)
		if err != nil {
			return false, fmt.Errorf("%s: %w", s, err)
		}
		if !ok {
			return false, nil
		}
	}
	return true, nil
}

func (s Selector) String() string {
	if len(s.Matchers) == 0 {
		return s.Name
	}
	ms := make([]string, len(s.Matchers))
	for i, m := range s.Matchers {
		ms[i] = m.Label + m.Op + strconv.Quote(m.Value)
	}
	return s.Name + "{" + strings.Join(ms, ",") + "}"
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
func parseSelectors(expr string) ([]Selector, error) {
	var out []Selector
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
				sel := Selector{Name: word}
				if next < len(expr) && expr[next] == '{' {
					ms, n, err := readMatchers(expr[next:])
					if err != nil {
						return nil, fmt.Errorf("%q: %s: %w", expr, word, err)
					}
					sel.Matchers = ms
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
func readMatchers(s string) ([]Matcher, int, error) {
	var ms []Matcher
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
		ms = append(ms, Matcher{Label: m[1], Op: m[2], Value: value})
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

// dashboardQueries returns every query of the dashboard in file, rows'
// panels included. A panel without a query, or with an empty one, is an
// error: it would show nothing.
func dashboardQueries(file string) ([]dashboardQuery, error) {
	text, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
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
	if err := json.Unmarshal(text, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	var out []dashboardQuery
	var walk func(ps []panel) error
	walk = func(ps []panel) error {
		for _, p := range ps {
			if err := walk(p.Panels); err != nil {
				return err
			}
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				return fmt.Errorf("%s: panel %q has no query", file, p.Title)
			}
			for _, q := range p.Targets {
				if q.Expr == "" {
					return fmt.Errorf("%s: panel %q has an empty query", file, p.Title)
				}
				out = append(out, dashboardQuery{panel: p.Title, expr: q.Expr})
			}
		}
		return nil
	}
	if err := walk(d.Panels); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: the dashboard has no queries", file)
	}
	return out, nil
}

// SelectorUse is a selector and the panels that use it.
type SelectorUse struct {
	Selector
	Panels []string
}

// DashboardSelectors returns every selector the queries of the dashboard
// (DashboardFile, under repoRoot) use, each with the panels it is in, by
// the selector's String. A query it cannot read, or one that selects no
// metric, is an error rather than a selector missed.
func DashboardSelectors(repoRoot string) (map[string]SelectorUse, error) {
	queries, err := dashboardQueries(filepath.Join(repoRoot, filepath.FromSlash(DashboardFile)))
	if err != nil {
		return nil, err
	}
	out := map[string]SelectorUse{}
	for _, q := range queries {
		sels, err := parseSelectors(q.expr)
		if err != nil {
			return nil, fmt.Errorf("panel %q: %w", q.panel, err)
		}
		if len(sels) == 0 {
			return nil, fmt.Errorf("panel %q: query %q selects no metric", q.panel, q.expr)
		}
		for _, s := range sels {
			u := out[s.String()]
			u.Selector = s
			if !slices.Contains(u.Panels, q.panel) {
				u.Panels = append(u.Panels, q.panel)
			}
			out[s.String()] = u
		}
	}
	return out, nil
}
