package docs

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// labShotSums is what TestLabInBrowser writes beside docs/lab.png when it
// takes it (LAB_SCREENSHOT=update): the checksums of the picture and of
// the page it shows, as sha256sum writes them.
const labShotSums = "docs/lab.sha256"

// staleSums lists the files of a sha256sum listing whose checksum is not
// the one listed, and the wanted files it does not list.
func staleSums(listing string, want []string, sum func(name string) (string, error)) []string {
	var stale []string
	listed := map[string]bool{}
	for line := range strings.SplitSeq(listing, "\n") {
		if line == "" {
			continue
		}
		hash, name, ok := strings.Cut(line, "  ")
		got, err := sum(name)
		switch {
		case !ok:
			stale = append(stale, fmt.Sprintf("%q: not a line of sha256sum", line))
			continue
		case err != nil:
			stale = append(stale, err.Error())
		case got != hash:
			stale = append(stale, name+" has changed since")
		}
		listed[name] = true
	}
	for _, name := range want {
		if !listed[name] {
			stale = append(stale, name+" is not listed")
		}
	}
	return stale
}

// TestLabScreenshotIsOfThisPage: docs/lab.png is the picture the browser
// test took of the lab's page as it is now, so the page cannot change
// without its picture.
func TestLabScreenshotIsOfThisPage(t *testing.T) {
	t.Parallel()
	listing, err := os.ReadFile(filepath.Join(repoRoot, labShotSums))
	if err != nil && !os.IsNotExist(err) {
		require.NoError(t, err)
	}
	stale := staleSums(string(listing), []string{"docs/lab.png", "lab/faultlab/page/index.html"}, func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(name)))
		return fmt.Sprintf("%x", sha256.Sum256(b)), err
	})
	require.Empty(t, stale, "docs/lab.png is not of the lab's page as it is: take it again, from the repository root, with\n"+
		"  LAB_SCREENSHOT=update go test -tags e2e -count=1 -run TestLabInBrowser ./e2e/\n"+
		"and commit docs/lab.png with %s", labShotSums)
}

func TestStaleSums(t *testing.T) {
	t.Parallel()
	files := map[string]string{"a": "1", "b": "2"}
	sum := func(name string) (string, error) {
		v, ok := files[name]
		if !ok {
			return "", fmt.Errorf("%s: no such file", name)
		}
		return v, nil
	}
	require.Empty(t, staleSums("1  a\n2  b\n", []string{"a", "b"}, sum))
	require.Equal(t, []string{"b has changed since", "c: no such file", "d is not listed"},
		staleSums("1  a\n3  b\n1  c\n", []string{"a", "d"}, sum))
}
