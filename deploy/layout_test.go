package deploy

// This file checks the layout's promise: the system's binaries are built
// from the pattern's packages only. Test and dev scaffolding (testkit/,
// e2e/, and this package's checks in deploy/) and the crash points of the
// fault-injection builds never reach them. The fault lab, a teaching tool
// shipped beside them, takes one piece of scaffolding: the invariant
// checker it shows live.

import (
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// shippedBinaries are the packages the Dockerfile builds (and make build,
// which should build the same): the system's binaries, the reconciler,
// which checks the system's databases, and the fault lab, which
// docker-compose.yml runs beside them and which watches the system rather
// than being part of it.
var shippedBinaries = append(SystemBinaries(), "./reconciler", "./lab")

// goList runs go list in the repository's root.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := GoList(repoRoot, args...)
	require.NoError(t, err)
	return out
}

// scaffoldingFolders are the repository's folders of test and dev
// scaffolding: the test tooling, the fault-injection suite, and the
// deployment checks.
var scaffoldingFolders = []string{"testkit", "e2e", "deploy"}

// scaffolding reports the packages of deps that are test or dev scaffolding:
// those in one of scaffoldingFolders, or below one.
func scaffolding(deps []string) []string {
	var bad []string
	for _, d := range deps {
		rel, ok := strings.CutPrefix(d, Module+"/")
		if !ok {
			continue
		}
		if top, _, _ := strings.Cut(rel, "/"); slices.Contains(scaffoldingFolders, top) {
			bad = append(bad, d)
		}
	}
	return bad
}

// TestShippedBinariesImportNoScaffolding reads the shipped binaries' import
// graph with go list -deps.
func TestShippedBinariesImportNoScaffolding(t *testing.T) {
	t.Parallel()
	deps := goList(t, append([]string{"-deps"}, SystemBinaries()...)...)
	require.Contains(t, deps, Module+"/internal/inbox", "go list -deps must list the binaries' own packages")
	require.Empty(t, scaffolding(deps), "a system binary imports test or dev scaffolding")
	// The reconciler judges by internal/drift, the definition the fault
	// suite's checker (testkit/invariant) judges by too; never by the
	// checker itself.
	reconciler := goList(t, "-deps", "./reconciler")
	require.Contains(t, reconciler, Module+"/internal/drift")
	require.Empty(t, scaffolding(reconciler), "the reconciler imports test or dev scaffolding")
	lab := goList(t, "-deps", "./lab")
	require.Contains(t, lab, Module+"/lab/faultlab", "go list -deps must list every shipped binary's packages")
	require.Equal(t, []string{Module + "/testkit/invariant"}, scaffolding(lab),
		"the fault lab takes the invariant checker from the scaffolding, and nothing else")

	// The check itself must catch a scaffolding import: it counts every
	// package in the scaffolding folders, as go list finds them, and no
	// package of the binaries.
	scaffold := goList(t, "./testkit/...", "./e2e/...", "./deploy/...")
	for _, pkg := range []string{"testkit/pgtest", "e2e", "deploy"} {
		require.Contains(t, scaffold, Module+"/"+pkg, "go list must find the scaffolding")
	}
	require.Equal(t, scaffold, scaffolding(slices.Concat(scaffold, deps)),
		"the check itself must catch a scaffolding import")
}

// TestShippedBinariesAreTheImagesBinaries: shippedBinaries are exactly
// the packages the Dockerfile builds into its final image (read as
// dockerfile_test.go reads it) and those make build builds, so that a binary
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
	// The recipe of the build target: its lines start with a tab.
	var made []string
	inBuild := false
	for line := range strings.SplitSeq(string(makefile), "\n") {
		switch {
		case line == "build:":
			inBuild = true
		case inBuild && strings.HasPrefix(line, "\t"):
			for f := range strings.FieldsSeq(line) {
				if strings.HasPrefix(f, "./") {
					made = append(made, path.Clean(f))
				}
			}
		default:
			inBuild = false
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
	require.Contains(t, deps, Module+"/internal/httpapi")
	for _, d := range deps {
		require.False(t, strings.HasPrefix(d, Module+"/services/") || strings.HasPrefix(d, Module+"/outbox-sender") || strings.HasPrefix(d, Module+"/lab"),
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

// TestStudentDoesNotImportSender: Student's binary is built without the
// sender's code; the words both speak come from internal/outbox.
func TestStudentDoesNotImportSender(t *testing.T) {
	t.Parallel()
	deps := goList(t, "-deps", "./services/student")
	require.Contains(t, deps, Module+"/services/student/studentsvc")
	for _, d := range deps {
		require.False(t, strings.HasPrefix(d, Module+"/outbox-sender"), "Student imports %s", d)
	}
}
