package deploy

// This file holds the alert rules (deploy/observability/alerts.yml) to
// their unit tests (alerts_test.yml, run by promtool), to the metrics the
// binaries serve (through the observability page, which metrics_test.go
// holds to the binaries), and to the pages an operator is sent to.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/outboxref/outboxref/internal/drift"
)

// alertRulesTestFile is the rules' unit tests, beside them.
const alertRulesTestFile = "deploy/observability/alerts_test.yml"

// promtoolTimeout bounds one promtool run: it takes well under a second.
const promtoolTimeout = 2 * time.Minute

// silentScenarios are the words that name the tests in which no alert may
// fire: what a running system does on its own.
var silentScenarios = []string{"backlog", "restart", "scrape gap"}

type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type ruleFile struct {
	Groups []struct {
		Name  string      `yaml:"name"`
		Rules []alertRule `yaml:"rules"`
	} `yaml:"groups"`
}

type ruleTests struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		Name           string `yaml:"name"`
		AlertRuleTests []struct {
			Alertname string `yaml:"alertname"`
			ExpAlerts []any  `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
		PromQLTests []struct {
			Expr       string `yaml:"expr"`
			ExpSamples []any  `yaml:"exp_samples"`
		} `yaml:"promql_expr_test"`
	} `yaml:"tests"`
}

func readYAML[T any](t *testing.T, file string) T {
	t.Helper()
	var v T
	text, err := os.ReadFile(filepath.Join(repoRoot, file))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(text, &v), file)
	return v
}

func alertRules(t *testing.T) []alertRule {
	t.Helper()
	var out []alertRule
	for _, g := range readYAML[ruleFile](t, alertRulesFile).Groups {
		out = append(out, g.Rules...)
	}
	require.NotEmpty(t, out, "%s has no rules", alertRulesFile)
	return out
}

// promtool runs Prometheus' promtool with args in the rules' folder. It is
// Debian's prometheus package's; .ci/run installs it when it is missing.
func promtool(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("promtool")
	require.NoError(t, err, "promtool is not on PATH: install it (Debian: apt-get install prometheus), "+
		"which the alert rules' checks and unit tests need")
	ctx, cancel := context.WithTimeout(context.Background(), promtoolTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = filepath.Join(repoRoot, filepath.Dir(alertRulesFile))
	out, err := cmd.CombinedOutput()
	if exit, ok := errors.AsType[*exec.ExitError](err); ok {
		require.NoError(t, exit, "promtool %s:\n%s", strings.Join(args, " "), out)
	}
	require.NoError(t, err, "promtool %s", strings.Join(args, " "))
	return string(out)
}

// TestAlertRulesPass: promtool finds the rules well-formed and every unit
// test passing.
func TestAlertRulesPass(t *testing.T) {
	t.Parallel()
	out := promtool(t, "check", "rules", filepath.Base(alertRulesFile))
	require.Contains(t, out, fmt.Sprintf("SUCCESS: %d rules found", len(alertRules(t))))
	out = promtool(t, "test", "rules", filepath.Base(alertRulesTestFile))
	require.Contains(t, out, "SUCCESS")
}

// TestAlertRulesAreEachTested: every alert has a test that makes it fire,
// and the scenarios in which none may fire are there, each asking of
// ALERTS that nothing fired at any evaluation.
func TestAlertRulesAreEachTested(t *testing.T) {
	t.Parallel()
	tests := readYAML[ruleTests](t, alertRulesTestFile)
	require.Equal(t, []string{filepath.Base(alertRulesFile)}, tests.RuleFiles)
	fires := map[string]bool{}
	silent := map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTests {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			}
		}
		for _, q := range tc.PromQLTests {
			if q.Expr == `count_over_time(ALERTS{alertstate="firing"}[4h])` && len(q.ExpSamples) == 0 {
				for _, s := range silentScenarios {
					if strings.Contains(tc.Name, s) {
						silent[s] = true
					}
				}
			}
		}
	}
	var untested []string
	for _, r := range alertRules(t) {
		if !fires[r.Alert] {
			untested = append(untested, r.Alert)
		}
	}
	require.Empty(t, untested, "%s has no test in which these fire", alertRulesTestFile)
	for _, s := range silentScenarios {
		require.True(t, silent[s], "%s has no test named for a %s in which no alert fires", alertRulesTestFile, s)
	}
}

// documentedMetricNames are the metrics the observability page's tables
// name, and up, which Prometheus makes for every target.
func documentedMetricNames(t *testing.T) map[string]bool {
	t.Helper()
	page, err := os.ReadFile(filepath.Join(repoRoot, observabilityPage))
	require.NoError(t, err)
	names := map[string]bool{"up": true}
	for _, heading := range []string{"Student's and Users' metrics", "The sender's metrics", "The broker transport's metrics", "The reconciler's metrics"} {
		docs, err := documentedMetrics(string(page), heading)
		require.NoError(t, err)
		for _, m := range docs {
			names[m.name] = true
		}
	}
	return names
}

// TestAlertRulesReadServedMetrics: every series a rule reads is one the
// observability page names, and the page's metrics are served by the
// binaries from the start (TestDocumentedMetricsExistFromTheStart). A rule
// on a renamed metric would otherwise never fire.
func TestAlertRulesReadServedMetrics(t *testing.T) {
	t.Parallel()
	documented := documentedMetricNames(t)
	var unknown []string
	for _, r := range alertRules(t) {
		sels, err := parseSelectors(r.Expr)
		require.NoError(t, err, "%s: %s", r.Alert, r.Expr)
		require.NotEmpty(t, sels, "%s reads no series", r.Alert)
		for _, s := range sels {
			if !documented[s.Name] {
				unknown = append(unknown, r.Alert+": "+s.Name)
			}
		}
	}
	require.Empty(t, unknown, "rules read metrics %s does not name", observabilityPage)
}

// headingLine is a Markdown heading; its text, lower-cased, with code
// spans' backquotes dropped, is the anchor the rules' runbook links use
// (every one is a single word, or words joined by '-').
var headingLine = regexp.MustCompile("(?m)^#{2,4} `?([A-Za-z-]+)`?\\s*$")

// TestAlertRulesSendOperatorsSomewhere: every rule has a severity of the
// two the file's header defines, a summary, and a runbook link to a
// heading that exists; the reconciler's drift alert links the section of
// the class that fired, so each class of the invariant has one. The
// observability page's alert table names exactly the file's alerts.
func TestAlertRulesSendOperatorsSomewhere(t *testing.T) {
	t.Parallel()
	runbook, err := os.ReadFile(filepath.Join(repoRoot, "docs", "runbook.md"))
	require.NoError(t, err)
	anchors := map[string]bool{}
	for _, m := range headingLine.FindAllStringSubmatch(string(runbook), -1) {
		anchors[strings.ToLower(m[1])] = true
	}
	var problems []string
	var names []string
	for _, r := range alertRules(t) {
		names = append(names, r.Alert)
		if s := r.Labels["severity"]; s != "page" && s != "ticket" {
			problems = append(problems, fmt.Sprintf("%s: severity %q, want page or ticket", r.Alert, s))
		}
		if r.Annotations["summary"] == "" {
			problems = append(problems, r.Alert+": no summary")
		}
		link, ok := strings.CutPrefix(r.Annotations["runbook"], "docs/runbook.md#")
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s: runbook %q is not a section of docs/runbook.md", r.Alert, r.Annotations["runbook"]))
		case link == "{{ $labels.class }}":
			for _, class := range invariantClasses() {
				if !anchors[class] {
					problems = append(problems, fmt.Sprintf("%s: docs/runbook.md has no section %q for the class", r.Alert, class))
				}
			}
		case link != strings.ToLower(r.Alert) || !anchors[link]:
			problems = append(problems, fmt.Sprintf("%s: runbook %q, want docs/runbook.md#%s, a section of its own", r.Alert, r.Annotations["runbook"], strings.ToLower(r.Alert)))
		}
	}
	require.Empty(t, problems)

	page, err := os.ReadFile(filepath.Join(repoRoot, observabilityPage))
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(page), "\n## What to alert on\n")
	require.True(t, ok, "%s has no section ## What to alert on", observabilityPage)
	section, _, _ = strings.Cut(section, "\n## ")
	tabled := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| \\[`([A-Za-z]+)`\\]").FindAllStringSubmatch(section, -1) {
		tabled[m[1]] = true
	}
	require.Equal(t, slices.Sorted(slices.Values(names)), slices.Sorted(maps.Keys(tabled)),
		"the alert table of %s and the rules of %s", observabilityPage, alertRulesFile)
}

// invariantClasses are the reconciler's classes that break the invariant.
func invariantClasses() []string {
	var out []string
	for _, c := range drift.Classes {
		if c.Invariant() {
			out = append(out, string(c))
		}
	}
	return out
}

// TestDriftAlertSelectsEveryDriftClass: the reconciler's drift alert pages
// for each class that breaks the invariant, and for no other (stuck and
// dead rows have alerts of their own, for working hours).
func TestDriftAlertSelectsEveryDriftClass(t *testing.T) {
	t.Parallel()
	var selected []string
	for _, r := range alertRules(t) {
		if r.Alert != "ReconcilerDrift" {
			continue
		}
		sels, err := parseSelectors(r.Expr)
		require.NoError(t, err)
		for _, s := range sels {
			for _, m := range s.Matchers {
				if s.Name == "reconciler_drift" && m.Label == "class" && m.Op == "=~" {
					selected = strings.Split(m.Value, "|")
				}
			}
		}
	}
	require.ElementsMatch(t, invariantClasses(), selected, "ReconcilerDrift's class=~ matcher")
}
