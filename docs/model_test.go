package docs

import (
	"os"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/model"
)

// The model's page (docs/model.md) maps each step of the model to the code
// that performs it, and each mutation to the broken build that does the
// same to the real binaries. These tests hold it to the code: a function
// or query renamed or removed, a broken build gone, or a mutation left out
// of the table fails them.

var (
	// codeRef finds `file.go:Name` or `file.sql:Name` and the names that
	// follow it in the same cell (", `Name`" or " and `Name`").
	codeRef  = regexp.MustCompile("`([A-Za-z0-9_./-]+\\.(?:go|sql)):([A-Za-z_][A-Za-z0-9_]*)`((?:(?:, | and )`[A-Za-z_][A-Za-z0-9_]*`)*)")
	brokenOf = regexp.MustCompile("`e2e/testdata/broken/([a-z0-9-]+)\\.patch`")
)

func TestModelPageNamesRealCode(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile(path.Join(repoRoot, "docs", "model.md"))
	require.NoError(t, err)
	fsys := os.DirFS(repoRoot)
	refs := 0
	for _, m := range codeRef.FindAllStringSubmatch(string(page), -1) {
		names := []string{m[2]}
		for _, n := range andName.FindAllStringSubmatch(m[3], -1) {
			names = append(names, n[1])
		}
		for _, name := range names {
			_, err := definition(fsys, m[1], name)
			require.NoErrorf(t, err, "docs/model.md names %s:%s", m[1], name)
			refs++
		}
	}
	require.GreaterOrEqual(t, refs, 20, "the page's table of steps seems lost")
	for _, m := range brokenOf.FindAllStringSubmatch(string(page), -1) {
		_, err := os.Stat(path.Join(repoRoot, "e2e", "testdata", "broken", m[1]+".patch"))
		require.NoErrorf(t, err, "docs/model.md names the broken build %s", m[1])
	}
}

func TestModelPageListsEveryMutation(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile(path.Join(repoRoot, "docs", "model.md"))
	require.NoError(t, err)
	rows := map[string]string{}
	for line := range strings.SplitSeq(string(page), "\n") {
		if name, ok := strings.CutPrefix(line, "| `"); ok {
			name, _, _ = strings.Cut(name, "`")
			if _, seen := rows[name]; !seen { // the first table naming it: properties, mutations
				rows[name] = line
			}
		}
	}
	var mutations []model.Mutation
	var properties []model.Property
	for _, m := range model.Models {
		mutations = append(mutations, m.Mutations...)
		properties = append(properties, m.Properties...)
	}
	for _, m := range mutations {
		row, ok := rows[m.Name]
		require.Truef(t, ok, "docs/model.md has no row for the mutation %s", m.Name)
		require.Containsf(t, row, "| `"+m.Breaks+"` |", "mutation %s breaks %s", m.Name, m.Breaks)
		for _, d := range m.Defines {
			require.Containsf(t, row, "`"+d+"`", "mutation %s switches on %s", m.Name, d)
		}
		if m.Broken == "" {
			require.Truef(t, strings.HasSuffix(row, "| none |"), "mutation %s has no broken build; its row says otherwise", m.Name)
		} else {
			require.Containsf(t, row, "e2e/testdata/broken/"+m.Broken+".patch", "mutation %s is mirrored by %s", m.Name, m.Broken)
		}
	}
	for _, p := range properties {
		require.Containsf(t, rows, p.Name, "docs/model.md has no row for the property %s", p.Name)
	}
}
