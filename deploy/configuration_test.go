package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/envconfig"
	"github.com/outboxref/outboxref/lab/faultlab"
	"github.com/outboxref/outboxref/outbox-sender/sender"
	"github.com/outboxref/outboxref/reconciler/reconcile"
	"github.com/outboxref/outboxref/services/student/studentsvc"
	"github.com/outboxref/outboxref/services/users/usersvc"
)

// configLoaders are the binaries' config loaders, by the heading of their
// configuration table in docs/configuration.md.
var configLoaders = map[string]func(func(string) string) *envconfig.Reader{
	"student":       func(g func(string) string) *envconfig.Reader { _, r, _ := studentsvc.LoadConfig(g); return r },
	"users":         func(g func(string) string) *envconfig.Reader { _, r, _ := usersvc.LoadConfig(g); return r },
	"outbox-sender": func(g func(string) string) *envconfig.Reader { _, r, _ := sender.LoadConfig(g); return r },
	"lab":           func(g func(string) string) *envconfig.Reader { _, r, _ := faultlab.LoadConfig(g); return r },
	"reconciler":    func(g func(string) string) *envconfig.Reader { _, r, _ := reconcile.LoadConfig(g); return r },
}

// configTables reads the configuration page's tables: for each binary's
// heading (a line such as **student**), its rows' variable and default.
// The tables are the page's # Configuration section, up to its next
// heading of level 2 (or 1).
func configTables(t *testing.T, page string) map[string]map[string]string {
	t.Helper()
	section, found := strings.CutPrefix(page, "# Configuration\n")
	require.True(t, found, "the configuration page does not begin with # Configuration")
	section, _, _ = strings.Cut(section, "\n## ")
	section, _, _ = strings.Cut(section, "\n# ")
	heading := regexp.MustCompile(`^\*\*([a-z-]+)\*\*$`)
	row := regexp.MustCompile("^\\| `([A-Z_]+)` \\| ([^|]*) \\|")
	tables := map[string]map[string]string{}
	current := ""
	for line := range strings.SplitSeq(section, "\n") {
		if m := heading.FindStringSubmatch(line); m != nil {
			current = m[1]
			tables[current] = map[string]string{}
		}
		if m := row.FindStringSubmatch(line); m != nil {
			require.NotEmpty(t, current, "a configuration row before any binary's heading: %s", line)
			tables[current][m[1]] = strings.TrimSpace(m[2])
		}
	}
	return tables
}

// configPage is the documentation page that holds the configuration tables.
const configPage = "docs/configuration.md"

// TestDocsConfigurationMatchesCode keeps the configuration page's tables and
// the binaries in step: each binary's table lists exactly the variables its
// LoadConfig reads, each with the default LoadConfig uses.
func TestDocsConfigurationMatchesCode(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile(filepath.Join(repoRoot, configPage))
	require.NoError(t, err)
	tables := configTables(t, string(page))
	require.Len(t, tables, len(configLoaders), "one configuration table per binary")
	for name, load := range configLoaders {
		table, ok := tables[name]
		require.True(t, ok, "%s has no configuration table headed **%s**", configPage, name)
		vars := load(func(string) string { return "" }).Vars()
		require.Len(t, table, len(vars), "%s: %s rows %v", name, configPage, table)
		for _, v := range vars {
			cell, ok := table[v.Name]
			require.True(t, ok, "%s reads %s, which the table in %s does not list", name, v.Name, configPage)
			require.NoError(t, sameDefault(cell, v.Default), "%s %s", name, v.Name)
		}
	}
}

// sameDefault compares a table cell such as `5s`, `10000` or `:8080` with
// a default from the code, by its type. A variable without a default (a
// secret, or its _FILE form; its code default is "") is written none.
func sameDefault(cell string, def any) error {
	if cell == "none" || def == "" {
		if cell != "none" || def != "" {
			return fmt.Errorf("the docs say %s, the code %q: write none for no default, and only then", cell, def)
		}
		return nil
	}
	if !strings.HasPrefix(cell, "`") || !strings.HasSuffix(cell, "`") {
		return fmt.Errorf("default %q: write it in backquotes", cell)
	}
	v := strings.Trim(cell, "`")
	var same bool
	switch d := def.(type) {
	case string:
		same = v == d
	case int:
		n, err := strconv.Atoi(strings.ReplaceAll(v, ",", ""))
		same = err == nil && n == d
	case time.Duration:
		p, err := time.ParseDuration(v)
		same = err == nil && p == d
	default:
		return fmt.Errorf("default of type %T: teach this test to compare it", def)
	}
	if !same {
		return fmt.Errorf("the docs say %s, the code %v", cell, def)
	}
	return nil
}

// TestDocsConfigCheckerCatchesMistakes proves the check above can fail.
func TestDocsConfigCheckerCatchesMistakes(t *testing.T) {
	t.Parallel()
	require.NoError(t, sameDefault("`5s`", 5*time.Second))
	require.NoError(t, sameDefault("`10,000`", 10000))
	require.Error(t, sameDefault("`1000`", 10000))
	require.Error(t, sameDefault("`4s`", 5*time.Second))
	require.Error(t, sameDefault("`:8081`", ":8080"))
	require.Error(t, sameDefault(":8080", ":8080"))
	require.NoError(t, sameDefault("none", ""))
	require.Error(t, sameDefault("none", "x"))
	require.Error(t, sameDefault("``", ""))
	tables := configTables(t, "# Configuration\n**users**\n| `USERS_X` | `1s` | x |\n## Next\n| `NOT_ME` | `2` | y |\n")
	require.Equal(t, map[string]map[string]string{"users": {"USERS_X": "`1s`"}}, tables)
	tables = configTables(t, "# Configuration\n**lab**\n| `LAB_X` | none | x |\n# Another page's title\n**users**\n| `USERS_X` | `1s` | x |\n")
	require.Equal(t, map[string]map[string]string{"lab": {"LAB_X": "none"}}, tables)
}

// TestBadGOMAXPROCSIsReportedWithTheRest: the page says one message names
// every bad variable, and a bad GOMAXPROCS (Go's own, read by each
// binary's main) is one of them.
func TestBadGOMAXPROCSIsReportedWithTheRest(t *testing.T) {
	t.Parallel()
	env := map[string]string{"GOMAXPROCS": "0", "LOG_LEVEL": "loud"}
	for _, name := range []string{"student", "users", "outbox-sender", "reconciler"} {
		err := configLoaders[name](func(k string) string { return env[k] }).Err()
		require.ErrorContains(t, err, `GOMAXPROCS="0": want a whole number of cores`, name)
		require.ErrorContains(t, err, `LOG_LEVEL="loud"`, name)
	}
}
