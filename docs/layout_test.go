package docs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
)

// The repository's layout (development.md's ## Repository layout) names
// every folder that holds Go files on a line of its own, with what it is
// for, and nothing that is not there. These tests hold it to the
// repository, so that a package added, moved or removed cannot leave the
// layout behind.

// layoutEntry is one path the layout names.
type layoutEntry struct {
	path    string // slash-separated; a folder's without its trailing slash
	purpose string // what the line says it is for
	line    string // the line, for messages
}

// layoutEntries reads the paths that the code blocks of the ## Repository
// layout section name: each line's first word, and what follows it. A line
// indented under a folder's line names a path in that folder, and
// {a,b} names a and b.
func layoutEntries(page string) ([]layoutEntry, error) {
	_, section, found := strings.Cut(page, "\n## Repository layout\n")
	if !found {
		return nil, errors.New("no ## Repository layout section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var entries []layoutEntry
	inFence, parent := false, ""
	for line := range strings.SplitSeq(section, "\n") {
		if fence.MatchString(line) {
			inFence, parent = !inFence, ""
			continue
		}
		fields := strings.Fields(line)
		if !inFence || len(fields) == 0 {
			continue
		}
		name := fields[0]
		purpose := strings.TrimSpace(strings.TrimLeft(line, " ")[len(name):])
		if strings.HasPrefix(line, " ") {
			if parent == "" {
				return nil, fmt.Errorf("an indented line under no folder's line: %s", line)
			}
			name = parent + name
		} else {
			parent = ""
			if strings.HasSuffix(name, "/") {
				parent = name
			}
		}
		for _, p := range expandBraces(name) {
			entries = append(entries, layoutEntry{path: strings.TrimSuffix(p, "/"), purpose: purpose, line: strings.TrimSpace(line)})
		}
	}
	if len(entries) == 0 {
		return nil, errors.New("the ## Repository layout section names no path in a code block")
	}
	return entries, nil
}

// expandBraces returns p with its first {a,b,…} replaced by each of a, b,
// …, and so on for the braces after it.
func expandBraces(p string) []string {
	open := strings.Index(p, "{")
	end := strings.Index(p, "}")
	if open < 0 || end < open {
		return []string{p}
	}
	var out []string
	for alt := range strings.SplitSeq(p[open+1:end], ",") {
		out = append(out, expandBraces(p[:open]+alt+p[end+1:])...)
	}
	return out
}

// layoutProblems says what is wrong with the layout's entries against
// fsys: a path named that does not exist, a line that does not say what its
// path is for, a folder holding Go files that no line names, and a
// top-level folder that no line names or names something in.
func layoutProblems(fsys fs.FS, entries []layoutEntry) []string {
	var wrong []string
	named := map[string]bool{}
	for _, e := range entries {
		named[e.path] = true
		if _, err := fs.Stat(fsys, e.path); err != nil {
			wrong = append(wrong, fmt.Sprintf("the layout names %s, which does not exist (%q)", e.path, e.line))
		}
		if e.purpose == "" {
			wrong = append(wrong, fmt.Sprintf("the layout's line for %s does not say what it is for", e.path))
		}
	}
	for _, dir := range goFolders(fsys) {
		if !named[dir] {
			wrong = append(wrong, dir+"/ holds Go files, and the layout has no line for it: add one saying what it is for")
		}
	}
	tops, _ := fs.ReadDir(fsys, ".")
	for _, top := range tops {
		if !top.IsDir() || skippedFolder(top.Name(), top.Name()) {
			continue
		}
		if !slices.ContainsFunc(entries, func(e layoutEntry) bool { return e.path == top.Name() || strings.HasPrefix(e.path, top.Name()+"/") }) {
			wrong = append(wrong, top.Name()+"/ is a top-level folder the layout does not name, nor anything in it")
		}
	}
	return wrong
}

// goFolders lists the folders of fsys that hold a Go file, tests
// included, but for the folders Markdown is not looked for in either
// (hidden ones, test data, what builds and runs leave behind).
func goFolders(fsys fs.FS) []string {
	var dirs []string
	_ = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && p != "." && skippedFolder(p, d.Name()):
			return fs.SkipDir
		case !d.IsDir() && strings.HasSuffix(p, ".go") && path.Dir(p) != ".":
			if dir := path.Dir(p); !slices.Contains(dirs, dir) {
				dirs = append(dirs, dir)
			}
		}
		return nil
	})
	return dirs
}

// TestLayoutNamesEveryFolder: development.md's layout names every folder
// with Go files and every top-level folder, says what each is for, and
// names nothing that is not there.
func TestLayoutNamesEveryFolder(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile(path.Join(repoRoot, "docs", "development.md"))
	require.NoError(t, err)
	entries, err := layoutEntries(string(page))
	require.NoError(t, err)
	fsys := os.DirFS(repoRoot)
	require.Contains(t, goFolders(fsys), "outbox-sender/relay", "the walk must find the repository's packages")
	wrong := layoutProblems(fsys, entries)
	require.Emptyf(t, wrong, "docs/development.md's layout is out of step with the folders:\n%s", strings.Join(wrong, "\n"))
}

// TestLayoutCheckCatchesMistakes proves the check above can fail: a
// package the layout leaves out, a top-level folder it leaves out, a path
// that is gone, a line with no purpose.
func TestLayoutCheckCatchesMistakes(t *testing.T) {
	t.Parallel()
	page := "# Development\n\n## Repository layout\n\n```\n" +
		"db/{student,users}/   the schemas\n" +
		"sender/               the relay\n" +
		"  relay/                the engine\n" +
		"  gone/                 moved away\n" +
		"  poll/\n" +
		".ci/run               what CI runs\n" +
		"```\n\nText.\n\n```\nlab/   the lab\n```\n\n## Next\n\n```\nnot/   read\n```\n"
	entries, err := layoutEntries(page)
	require.NoError(t, err)
	var paths []string
	for _, e := range entries {
		paths = append(paths, e.path)
	}
	require.Equal(t, []string{"db/student", "db/users", "sender", "sender/relay", "sender/gone", "sender/poll", ".ci/run", "lab"}, paths)

	fsys := fstest.MapFS{
		"db/student/1.sql":         {},
		"db/users/1.sql":           {},
		"sender/main.go":           {},
		"sender/relay/relay.go":    {},
		"sender/poll/poll.go":      {},
		"sender/usersnats/nats.go": {},
		".ci/run":                  {},
		"lab/main.go":              {},
		"lab/testdata/x.go":        {},
		"tools/go.mod":             {},
		"bin/tool.go":              {},
		".git/hook.go":             {},
	}
	require.Equal(t, []string{
		`the layout names sender/gone, which does not exist ("gone/                 moved away")`,
		"the layout's line for sender/poll does not say what it is for",
		"sender/usersnats/ holds Go files, and the layout has no line for it: add one saying what it is for",
		"tools/ is a top-level folder the layout does not name, nor anything in it",
	}, layoutProblems(fsys, entries))

	_, err = layoutEntries("# x\n\n## Repository layout\n\n```\n  relay/   the engine\n```\n")
	require.ErrorContains(t, err, "under no folder")
}
