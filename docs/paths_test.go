package docs

import (
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
)

// codePath matches a path in backquotes, such as `outbox-sender/relay/claim.go`,
// `db/queries/outbox/outbox.sql:ClaimDue` or `testkit/`, optionally with
// the name of what it defines after a colon.
var codePath = regexp.MustCompile("`([A-Za-z0-9_.-]+/[A-Za-z0-9_./-]*)(?::[A-Za-z_][A-Za-z0-9_]*)?`")

// stalePaths returns the paths named in backquotes in files that start
// with one of the repository's top-level folders but do not exist: a file
// or folder the code moved away from. Paths that start anywhere else
// (net/http, application/json, a package's testdata/) are not the
// repository's.
func stalePaths(fsys fs.FS, files []string) []string {
	top := map[string]bool{}
	entries, _ := fs.ReadDir(fsys, ".")
	for _, e := range entries {
		if e.IsDir() {
			top[e.Name()] = true
		}
	}
	var stale []string
	for _, file := range files {
		text, err := fs.ReadFile(fsys, file)
		if err != nil {
			stale = append(stale, fmt.Sprintf("%s: %v", file, err))
			continue
		}
		for i, line := range strings.Split(string(text), "\n") {
			for _, m := range codePath.FindAllStringSubmatch(line, -1) {
				p := strings.TrimSuffix(m[1], "/")
				first, _, _ := strings.Cut(p, "/")
				if !top[first] {
					continue
				}
				if _, err := fs.Stat(fsys, p); err != nil {
					stale = append(stale, fmt.Sprintf("%s:%d: `%s` does not exist", file, i+1, m[1]))
				}
			}
		}
	}
	return stale
}

// TestCodePathsExist: every path into the repository that the
// documentation names still exists.
func TestCodePathsExist(t *testing.T) {
	t.Parallel()
	fsys := os.DirFS(repoRoot)
	require.Empty(t, stalePaths(fsys, markdownFiles(t, fsys)))
}

// TestCodePathCheckCatchesMistakes proves the check can fail.
func TestCodePathCheckCatchesMistakes(t *testing.T) {
	t.Parallel()
	fsys := fstest.MapFS{
		"relay/claim.go": {Data: []byte("package relay\n")},
		"README.md": {Data: []byte("Read `relay/claim.go:claim`, `relay/`, `net/http` and `testdata/fuzz/`;\n" +
			"not `relay/sender.go` or `gone/`.\n")},
	}
	require.Equal(t, []string{
		"README.md:2: `relay/sender.go` does not exist",
	}, stalePaths(fsys, []string{"README.md"}), "a folder that is not the repository's (gone/) is not checked")
}
