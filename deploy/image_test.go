package deploy

// This file checks the Dockerfile's build stage against the code: the image
// cannot be built on a machine without Docker, so the only way to learn that
// a folder the binaries import was left out of it is to read it.

import (
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// buildSources are the paths the Dockerfile's build stage copies from the
// build context (COPY without --from), as written there.
func buildSources(t *testing.T, dockerfile string) []string {
	t.Helper()
	text := strings.ReplaceAll(dockerfile, "\\\n", " ")
	var sources []string
	stage := 0
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		words, err := shellFields(line)
		require.NoError(t, err)
		if len(words) == 0 {
			continue
		}
		switch strings.ToUpper(words[0]) {
		case "FROM":
			stage++
		case "COPY":
			if stage != 1 || slices.ContainsFunc(words, func(w string) bool { return strings.HasPrefix(w, "--from") }) {
				continue
			}
			var paths []string
			for _, w := range words[1:] {
				if !strings.HasPrefix(w, "--") {
					paths = append(paths, path.Clean(w))
				}
			}
			sources = append(sources, paths[:len(paths)-1]...)
		}
	}
	return sources
}

// ignored says whether .dockerignore keeps rel (a path relative to the
// build context) out of the context: the last pattern that matches rel, or
// a folder above it, decides, and a pattern with ! takes it back in.
func ignored(patterns []string, rel string) bool {
	out := false
	for _, p := range patterns {
		negate := strings.HasPrefix(p, "!")
		p = path.Clean(strings.TrimPrefix(p, "!"))
		for at := rel; at != "." && at != "/"; at = path.Dir(at) {
			if matchIgnore(p, at) {
				out = !negate
				break
			}
		}
	}
	return out
}

func matchIgnore(pattern, p string) bool {
	if rest, ok := strings.CutPrefix(pattern, "**/"); ok {
		parts := strings.Split(p, "/")
		for i := range parts {
			if ok, _ := path.Match(rest, strings.Join(parts[i:], "/")); ok {
				return true
			}
		}
		return false
	}
	ok, _ := path.Match(pattern, p)
	return ok
}

func dockerignore(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	require.NoError(t, err)
	var patterns []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			patterns = append(patterns, line)
		}
	}
	return patterns
}

// TestImageHasItsSources: every Go file and embedded file of every package
// the shipped binaries are built from, and the go.mod and go.sum of every
// module they need, is copied into the build stage and not kept out of the
// build context by .dockerignore.
func TestImageHasItsSources(t *testing.T) {
	t.Parallel()
	text, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	require.NoError(t, err)
	sources := buildSources(t, string(text))
	patterns := dockerignore(t)
	root, err := filepath.Abs(repoRoot)
	require.NoError(t, err)

	lines := goList(t, append([]string{"-deps", "-f", "{{if .Module}}{{.Module.Dir}}|{{.Dir}}|{{join .GoFiles \",\"}},{{join .EmbedFiles \",\"}}{{end}}"},
		shippedBinaries...)...)
	var files []string
	for _, line := range lines {
		parts := strings.Split(line, "|")
		require.Len(t, parts, 3, line)
		modDir, dir := parts[0], parts[1]
		if !strings.HasPrefix(dir, root+string(filepath.Separator)) {
			continue // a dependency from the module cache
		}
		for _, m := range []string{"go.mod", "go.sum"} {
			rel, err := filepath.Rel(root, filepath.Join(modDir, m))
			require.NoError(t, err)
			if !slices.Contains(files, rel) {
				files = append(files, rel)
			}
		}
		for f := range strings.SplitSeq(parts[2], ",") {
			if f != "" {
				rel, err := filepath.Rel(root, filepath.Join(dir, f))
				require.NoError(t, err)
				files = append(files, filepath.ToSlash(rel))
			}
		}
	}
	require.Contains(t, files, "lab/faultlab/page/index.html", "the check must see the lab's embedded page")
	require.Contains(t, files, "lab/go.mod", "the check must see the lab's module")
	for _, f := range files {
		copied := slices.ContainsFunc(sources, func(src string) bool { return f == src || strings.HasPrefix(f, src+"/") })
		require.True(t, copied, "the Dockerfile's build stage copies no path holding %s (it copies %v)", f, sources)
		require.False(t, ignored(patterns, f), ".dockerignore keeps %s out of the build context", f)
	}
}

// TestImageCheckCatchesMistakes proves the check can fail: a folder left
// out of the copies, and one ignored but not taken back.
func TestImageCheckCatchesMistakes(t *testing.T) {
	t.Parallel()
	sources := buildSources(t, "FROM golang AS build\nCOPY go.mod go.sum ./\nCOPY internal/ internal/\nFROM scratch\nCOPY --from=build /out/ /bin/\n")
	require.Equal(t, []string{"go.mod", "go.sum", "internal"}, sources)
	patterns := []string{"testkit", "!testkit/invariant", "**/*.test", "*.md"}
	require.True(t, ignored(patterns, "testkit/pgtest/pgtest.go"))
	require.False(t, ignored(patterns, "testkit/invariant/invariant.go"))
	require.True(t, ignored(patterns, "lab/faultlab/faultlab.test"))
	require.True(t, ignored(patterns, "README.md"))
	require.False(t, ignored(patterns, "lab/README.md"), "*.md is the context's top folder only")
	require.False(t, ignored(patterns, "internal/inbox/inbox.go"))
}
