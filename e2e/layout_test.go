package e2e

// This file checks the layout's promise: the shipped binaries are built
// from the pattern's packages only. Test and dev scaffolding (testkit/, this
// folder) and the crash points of the fault-injection builds never reach
// them.

import (
	"context"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const module = "github.com/outboxref/outboxref"

// systemBinaries are the pattern's own binaries: the two services and the
// sender, the system the e2e suite puts under test (and rebuilds with a
// broken variant's code).
var systemBinaries = []string{"./services/student", "./services/users", "./outbox-sender"}

// shippedBinaries are the packages the Dockerfile builds (and make build,
// which should build the same): the system's binaries and the fault lab,
// which docker-compose.yml runs beside them and which watches the system
// rather than being part of it.
var shippedBinaries = append(slices.Clone(systemBinaries), "./lab")

func goList(t *testing.T, args ...string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goCommand(), append([]string{"list"}, args...)...)
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	require.NoError(t, err, "go list %v", args)
	return strings.Fields(string(out))
}

// goCommand is the go command: the one on PATH, as make and CI have it, or
// the one in /usr/local/go, where this machine's Go lives.
func goCommand() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

// scaffolding reports the packages of deps that are test or dev scaffolding.
func scaffolding(deps []string) []string {
	var bad []string
	for _, d := range deps {
		rel, ok := strings.CutPrefix(d, module+"/")
		if !ok {
			continue
		}
		if strings.HasPrefix(rel, "testkit/") || strings.HasPrefix(rel, "e2e") {
			bad = append(bad, d)
		}
	}
	return bad
}

// TestShippedBinariesImportNoScaffolding reads the shipped binaries' import
// graph with go list -deps.
func TestShippedBinariesImportNoScaffolding(t *testing.T) {
	t.Parallel()
	deps := goList(t, append([]string{"-deps"}, shippedBinaries...)...)
	require.Contains(t, deps, module+"/internal/inbox", "go list -deps must list the binaries' own packages")
	require.Contains(t, deps, module+"/lab/faultlab", "go list -deps must list every shipped binary's packages")
	require.Empty(t, scaffolding(deps), "a shipped binary imports test or dev scaffolding")
	require.Equal(t, []string{module + "/testkit/pgtest"}, scaffolding([]string{module + "/testkit/pgtest", module + "/internal/inbox"}),
		"the check itself must catch a scaffolding import")
}

// TestShippedBinariesAreTheImagesBinaries: shippedBinaries are exactly
// the packages the Dockerfile builds into its final image (read as
// compose_test.go reads it) and those make build builds, so that a binary
// added to either is checked for scaffolding too.
func TestShippedBinariesAreTheImagesBinaries(t *testing.T) {
	t.Parallel()
	text, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	require.NoError(t, err)
	img, err := parseDockerfile(string(text))
	require.NoError(t, err)
	var built []string
	for _, pkg := range img.installed {
		if !slices.Contains(built, pkg) {
			built = append(built, pkg)
		}
	}
	var want []string
	for _, pkg := range shippedBinaries {
		want = append(want, path.Clean(pkg))
	}
	require.ElementsMatch(t, want, built, "the Dockerfile's binaries")

	makefile, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	require.NoError(t, err)
	var made []string
	for line := range strings.SplitSeq(string(makefile), "\n") {
		if strings.Contains(line, " build ") && strings.Contains(line, "-o bin/") {
			for f := range strings.FieldsSeq(line) {
				if strings.HasPrefix(f, "./") {
					made = append(made, path.Clean(f))
				}
			}
		}
	}
	require.ElementsMatch(t, want, made, "the binaries make build builds")
}

// TestNothingInInternalImportsABinary: internal/ holds what the binaries
// share; an import from there into a service, the sender or the lab would
// run the dependency graph backwards.
func TestNothingInInternalImportsABinary(t *testing.T) {
	t.Parallel()
	deps := goList(t, "-deps", "./internal/...")
	require.Contains(t, deps, module+"/internal/httpapi")
	for _, d := range deps {
		require.False(t, strings.HasPrefix(d, module+"/services/") || strings.HasPrefix(d, module+"/outbox-sender") || strings.HasPrefix(d, module+"/lab"),
			"internal/ imports %s", d)
	}
}

// TestShippedBuildsHaveNoCrashPointTag: the Dockerfile and make build
// build without the tag that compiles crash points in.
func TestShippedBuildsHaveNoCrashPointTag(t *testing.T) {
	t.Parallel()
	for _, file := range []string{"Dockerfile", "Makefile"} {
		b, err := os.ReadFile(filepath.Join(repoRoot, file))
		require.NoError(t, err)
		for line := range strings.SplitSeq(string(b), "\n") {
			if strings.Contains(line, "go build") {
				require.NotContains(t, line, "crashpoints", "%s builds shipped binaries with crash points: %s", file, line)
			}
		}
	}
}

// TestCrashPointsAreNotShipped: the package the binaries call for crash
// points compiles to a no-op without the e2e suite's build tag.
func TestCrashPointsAreNotShipped(t *testing.T) {
	t.Parallel()
	files := func(tags string) []string {
		return goList(t, "-tags", tags, "-f", "{{range .GoFiles}}{{.}} {{end}}", "./internal/crashpoint")
	}
	require.ElementsMatch(t, []string{"crashpoint.go", "off.go"}, files(""), "a shipped build")
	require.ElementsMatch(t, []string{"crashpoint.go", "on.go"}, files("crashpoints"), "the e2e suite's build")
}
