package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	// ciStep is a step of .ci/run: its label, and the make target it runs
	// when it runs one.
	ciStep = regexp.MustCompile(`(?m)step "([^"]+)";?\s*(?:make (\S+))?`)
	// ciRow is development.md's row for .ci/run.
	ciRow = regexp.MustCompile("(?m)^\\| `bash \\.ci/run` \\| (.*) \\|$")
	// ciTarget is the Makefile's ci target, with the targets it runs.
	ciTarget = regexp.MustCompile(`(?m)^ci: (.*)$`)
)

// TestCIStepsAreDescribed: development.md names every step .ci/run takes,
// installs included, in the order it takes them, and make ci runs the
// same make targets as .ci/run, in the same order.
func TestCIStepsAreDescribed(t *testing.T) {
	t.Parallel()
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(repoRoot, name))
		require.NoError(t, err)
		return string(b)
	}
	row := ciRow.FindStringSubmatch(read("docs/development.md"))
	require.NotNil(t, row, "docs/development.md has no row for `bash .ci/run`")
	steps := ciStep.FindAllStringSubmatch(read(".ci/run"), -1)
	require.NotEmpty(t, steps, "no steps in .ci/run")

	rest := row[1]
	var targets []string
	for _, step := range steps {
		label := strings.TrimPrefix(step[1], "installing ")
		_, after, found := strings.Cut(rest, label)
		require.True(t, found, "docs/development.md's row for .ci/run does not name %q after the steps before it: %s", label, row[1])
		rest = after
		if step[2] != "" {
			targets = append(targets, step[2])
		}
	}
	ci := ciTarget.FindStringSubmatch(read("Makefile"))
	require.NotNil(t, ci, "the Makefile has no ci target")
	require.Equal(t, targets, strings.Fields(ci[1]), "make ci's targets against .ci/run's")
}
