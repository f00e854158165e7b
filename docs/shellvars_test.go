package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	// shellBlock is a ```sh block of a page, its commands in group 1.
	shellBlock = regexp.MustCompile("(?s)```sh\n(.*?)\n```")
	// shellUse is a variable a command expands: $NAME or ${NAME}.
	shellUse = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)`)
	// printedVars is a line of make run's block of variables, as
	// testkit/run/system.go writes it: "  S=localhost:%d U=… T=%s".
	printedVars = regexp.MustCompile(`(?m)^  ((?:[A-Z][A-Z_]*=\S+ ?)+)$`)
)

// unsetShellVars lists, for a page, each variable its shell blocks expand
// that no block of the page sets and that is not among given.
func unsetShellVars(page string, given []string) []string {
	var commands strings.Builder
	for _, m := range shellBlock.FindAllStringSubmatch(page, -1) {
		commands.WriteString(m[1] + "\n")
	}
	var unset []string
	for _, m := range shellUse.FindAllStringSubmatch(commands.String(), -1) {
		name := m[1]
		set := regexp.MustCompile(`(?m)(^|[\s;(])(export\s+)?` + name + `=`)
		if !slices.Contains(given, name) && !set.MatchString(commands.String()) && !slices.Contains(unset, name) {
			unset = append(unset, name)
		}
	}
	return unset
}

// TestShellVariablesAreSet: a command the docs print works as printed only
// if every variable it expands has a value: set on the same page, or one
// of those make run prints for the curl session and the runbook.
func TestShellVariablesAreSet(t *testing.T) {
	t.Parallel()
	system, err := os.ReadFile(filepath.Join(repoRoot, "testkit", "run", "system.go"))
	require.NoError(t, err)
	var printed []string
	for _, m := range printedVars.FindAllStringSubmatch(string(system), -1) {
		for pair := range strings.FieldsSeq(m[1]) {
			name, _, _ := strings.Cut(pair, "=")
			printed = append(printed, name)
		}
	}
	require.Subset(t, printed, []string{"S", "U", "A", "T", "UDB"}, "make run's variables, read from testkit/run/system.go")

	var wrong []string
	for _, name := range markdownFiles(t, os.DirFS(repoRoot)) {
		page, err := os.ReadFile(filepath.Join(repoRoot, name))
		require.NoError(t, err)
		for _, v := range unsetShellVars(string(page), printed) {
			wrong = append(wrong, fmt.Sprintf("%s: $%s is neither set on the page nor printed by make run", name, v))
		}
	}
	require.Empty(t, wrong)
}

func TestUnsetShellVars(t *testing.T) {
	t.Parallel()
	page := "Text $NOT_A_COMMAND.\n\n```sh\nB=1; export C=2\necho $A ${B} $C $D $D\n```\n\n```go\nfmt.Print($E)\n```\n"
	require.Equal(t, []string{"D"}, unsetShellVars(page, []string{"A"}))
}
