// Package docs holds the documentation's tests: every relative link in the
// repository's Markdown files leads somewhere that exists, the README
// stays a short front door to the pages in this folder, and the layout in
// development.md names every folder of code (layout_test.go).
package docs

import (
	"fmt"
	"io/fs"
	"iter"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"unicode"

	"github.com/stretchr/testify/require"
)

// repoRoot is the repository's root, seen from this package's folder.
const repoRoot = ".."

// skippedDirs are what builds and runs leave behind (.gitignore's).
var skippedDirs = []string{"bin", "tmp", "bench", "run", "e2e/logs"}

// skippedFolder says whether the folder at p, named name, is one whose
// Markdown is not the project's documentation, nor its Go files the
// project's code: a hidden one, test data, or one of skippedDirs.
func skippedFolder(p, name string) bool {
	return strings.HasPrefix(name, ".") || name == "testdata" || slices.Contains(skippedDirs, p)
}

// markdownFiles lists every Markdown file of fsys, slash-separated.
func markdownFiles(t *testing.T, fsys fs.FS) []string {
	t.Helper()
	var files []string
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != "." && skippedFolder(p, d.Name()) {
				return fs.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return nil
	})
	require.NoError(t, err)
	return files
}

var (
	fence      = regexp.MustCompile("^\\s*(```|~~~)")
	atxHeading = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$`)
	codeSpan   = regexp.MustCompile("`+[^`]*`+")
	// link matches [text](target) and ![alt](target), with an optional
	// title after the target.
	link       = regexp.MustCompile(`!?\[([^\]]*)\]\(([^)\s]*)(?:\s+"[^"]*")?\)`)
	inlineLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// prose yields the lines of a Markdown text that are not inside a fenced
// code block, with their line numbers.
func prose(text string) iter.Seq2[int, string] {
	return func(yield func(int, string) bool) {
		inFence := false
		marker := ""
		for i, line := range strings.Split(text, "\n") {
			if m := fence.FindStringSubmatch(line); m != nil {
				switch {
				case !inFence:
					inFence, marker = true, m[1]
				case m[1] == marker:
					inFence = false
				}
				continue
			}
			if !inFence && !yield(i+1, line) {
				return
			}
		}
	}
}

// slug is GitHub's anchor for a heading's text: the text as rendered
// (code spans' contents, links' text, no emphasis markers), lower-cased,
// with every character but letters, digits, spaces, '-' and '_' dropped, and
// each space turned into '-'.
func slug(heading string) string {
	heading = inlineLink.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors lists the anchors of a Markdown text's headings, the way GitHub
// makes them: a heading whose slug came before gets -1, -2, ….
func anchors(text string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	for _, line := range prose(text) {
		m := atxHeading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := slug(m[2])
		a := s
		if n := seen[s]; n > 0 {
			a = s + "-" + strconv.Itoa(n)
		}
		seen[s]++
		out[a] = true
	}
	return out
}

// brokenLinks checks every relative link of the Markdown files in fsys:
// its file or folder exists, and its anchor, if any, names a heading of
// that file. Links to http(s) and mailto are not followed. It returns one
// line per broken link.
func brokenLinks(fsys fs.FS, files []string) []string {
	anchorsOf := map[string]map[string]bool{}
	headings := func(file string) (map[string]bool, error) {
		if a, ok := anchorsOf[file]; ok {
			return a, nil
		}
		b, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, err
		}
		anchorsOf[file] = anchors(string(b))
		return anchorsOf[file], nil
	}
	var broken []string
	for _, file := range files {
		b, err := fs.ReadFile(fsys, file)
		if err != nil {
			broken = append(broken, fmt.Sprintf("%s: %v", file, err))
			continue
		}
		for n, line := range prose(string(b)) {
			line = codeSpan.ReplaceAllString(line, "``")
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[2]
				if target == "" || strings.HasPrefix(target, "http://") || strings.HasPrefix(target, "https://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				where := fmt.Sprintf("%s:%d: %s", file, n, m[0])
				ref, anchor, _ := strings.Cut(target, "#")
				dest := file
				if ref != "" {
					dest = path.Clean(path.Join(path.Dir(file), ref))
					if dest == ".." || strings.HasPrefix(dest, "../") {
						broken = append(broken, where+": leads out of the repository")
						continue
					}
					if _, err := fs.Stat(fsys, dest); err != nil {
						broken = append(broken, where+": no such file or folder")
						continue
					}
				}
				if anchor == "" {
					continue
				}
				if !strings.HasSuffix(dest, ".md") {
					broken = append(broken, where+": an anchor into a file that is not Markdown")
					continue
				}
				a, err := headings(dest)
				if err != nil {
					broken = append(broken, fmt.Sprintf("%s: %v", where, err))
					continue
				}
				if !a[anchor] {
					broken = append(broken, fmt.Sprintf("%s: %s has no heading #%s", where, dest, anchor))
				}
			}
		}
	}
	return broken
}

// TestLinksResolve: every relative link in the repository's Markdown leads
// to a file or folder that exists, and every anchor to a heading there.
func TestLinksResolve(t *testing.T) {
	t.Parallel()
	fsys := os.DirFS(repoRoot)
	files := markdownFiles(t, fsys)
	for _, want := range []string{"README.md", "e2e/README.md", "deploy/secrets/README.md"} {
		require.Contains(t, files, want, "the check must read every Markdown file")
	}
	require.Empty(t, brokenLinks(fsys, files))
}

// maxReadmeLines is how long the README may grow: it is the front door,
// and everything else has a page under docs/.
const maxReadmeLines = 300

// mapHeading is the README's section whose table maps the documentation.
const mapHeading = "## Documentation"

// unmappedPages lists the pages under docs/ (as docs/name.md) that the
// README's documentation map does not link to, and what is wrong with
// each page's opening: a # title, then a link back to the README.
func unmappedPages(readme string, pages map[string]string) []string {
	_, section, found := strings.Cut(readme, "\n"+mapHeading+"\n")
	if !found {
		return []string{"README.md has no " + mapHeading + " section"}
	}
	section, _, _ = strings.Cut(section, "\n## ")
	mapped := map[string]bool{}
	for _, m := range link.FindAllStringSubmatch(section, -1) {
		target, _, _ := strings.Cut(m[2], "#")
		mapped[path.Clean(target)] = true
	}
	var wrong []string
	for _, name := range slices.Sorted(maps.Keys(pages)) {
		if !mapped[name] {
			wrong = append(wrong, name+": not in the README's documentation map")
		}
		lines := strings.SplitN(pages[name], "\n", 4)
		if len(lines) < 3 || !strings.HasPrefix(lines[0], "# ") || !strings.Contains(lines[2], "](../README.md)") {
			wrong = append(wrong, name+": does not open with a # title and, below it, a link back to ../README.md")
		}
	}
	return wrong
}

// TestReadmeIsAFrontDoor: the README stays short, and every page under
// docs/ is in its documentation map, opens with its title and links back.
func TestReadmeIsAFrontDoor(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	require.NoError(t, err)
	lines := strings.Count(string(readme), "\n")
	require.LessOrEqual(t, lines, maxReadmeLines, "README.md has %d lines: move the detail to a page under docs/", lines)

	names, err := filepath.Glob("*.md")
	require.NoError(t, err)
	require.NotEmpty(t, names)
	pages := map[string]string{}
	for _, name := range names {
		b, err := os.ReadFile(name)
		require.NoError(t, err)
		pages["docs/"+name] = string(b)
	}
	require.Empty(t, unmappedPages(string(readme), pages))
}

// TestLinkCheckerCatchesMistakes proves the checks above can fail.
func TestLinkCheckerCatchesMistakes(t *testing.T) {
	t.Parallel()
	file := func(text string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(text)} }
	fsys := fstest.MapFS{
		"README.md": file("# Top\n\n## Running it (`make`)\n\n## Running it (`make`)\n\n" +
			"[ok](#running-it-make) [ok](#running-it-make-1) [ok](docs/page.md#a-page) [ok](docs)\n" +
			"[ok](https://example.com/x.md) [ok](mailto:x@example.com) `[not a link](nowhere.md)`\n" +
			"[broken anchor](#running-it-make-2)\n" +
			"[broken file](docs/gone.md)\n" +
			"```sh\n# not a heading\n[not a link](nowhere.md)\n```\n"),
		"docs/page.md": file("# A page\n\n← [README](../README.md) [ok](../README.md#top)\n" +
			"[broken anchor](../README.md#not-a-heading) ![broken image](page.png)\n" +
			"[not a heading](#not-a-heading)\n"),
	}
	require.Equal(t, []string{
		"README.md:9: [broken anchor](#running-it-make-2): README.md has no heading #running-it-make-2",
		"README.md:10: [broken file](docs/gone.md): no such file or folder",
		"docs/page.md:4: [broken anchor](../README.md#not-a-heading): README.md has no heading #not-a-heading",
		"docs/page.md:4: ![broken image](page.png): no such file or folder",
		"docs/page.md:5: [not a heading](#not-a-heading): docs/page.md has no heading #not-a-heading",
	}, brokenLinks(fsys, []string{"README.md", "docs/page.md"}))

	readme := "# Top\n\n## Documentation\n\n| Page | What |\n|---|---|\n| [One](docs/one.md) | x |\n| [Two](docs/two.md#two) | y |\n\n" +
		"## Elsewhere\n\n[Three](docs/three.md)\n"
	page := func(title string) string {
		return "# " + title + "\n\n← [README](../README.md)\n\nWhat it answers.\n"
	}
	require.Empty(t, unmappedPages(readme, map[string]string{"docs/one.md": page("One"), "docs/two.md": page("Two")}))
	require.Equal(t, []string{
		"docs/one.md: does not open with a # title and, below it, a link back to ../README.md",
		"docs/three.md: not in the README's documentation map",
		"docs/two.md: does not open with a # title and, below it, a link back to ../README.md",
	}, unmappedPages(readme, map[string]string{
		"docs/one.md":   "One\n\n← [README](../README.md)\n",
		"docs/two.md":   "# Two\n\nNo way back.\n",
		"docs/three.md": page("Three"),
	}))
	require.Equal(t, []string{"README.md has no ## Documentation section"}, unmappedPages("# Top\n", nil))

	require.Equal(t, "change-data-capture-sender_sourcecdc", slug("Change data capture (`SENDER_SOURCE=cdc`)"))
	require.Equal(t, "dead-letters-a-runbook", slug("Dead letters: a runbook"))
	require.Equal(t, "retention-why-the-inbox-outlasts-the-sender", slug("Retention: why the inbox outlasts the sender"))
	require.Equal(t, "watching-it-run-the-observability-profile", slug("Watching it run: the `observability` profile"))
	require.Equal(t, "students-and-users-metrics", slug("Student's and Users' metrics"))
}
