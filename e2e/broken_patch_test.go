package e2e

import (
	"encoding/json"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBrokenPatchesApply keeps the broken variants usable: each must still
// find the code it edits, and the patched package must still compile
// (type-checked with go build -overlay, without linking a binary).
func TestBrokenPatchesApply(t *testing.T) {
	names, err := PatchNames(".")
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"sender-early-ack", "users-no-inbox"}, names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			p, err := LoadPatch(".", name)
			require.NoError(t, err)
			require.NotEmpty(t, p.Summary)
			work := t.TempDir()
			overlayPath, err := p.WriteOverlay("..", work)
			require.NoError(t, err)

			var overlay struct{ Replace map[string]string }
			b, err := os.ReadFile(overlayPath)
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal(b, &overlay))
			require.Len(t, overlay.Replace, 1)
			for orig, copyPath := range overlay.Replace {
				require.Equal(t, filepath.Join("..", filepath.FromSlash(p.File)), orig)
				_, err := parser.ParseFile(token.NewFileSet(), copyPath, nil, parser.AllErrors)
				require.NoError(t, err, "the patched file must still be Go")
				patched, err := os.ReadFile(copyPath)
				require.NoError(t, err)
				require.Contains(t, string(patched), "BROKEN on purpose")
			}

			goCmd := goCommand()
			pkg := "./" + path.Dir(p.File)
			cmd := exec.Command(goCmd, "build", "-overlay", overlayPath, pkg)
			cmd.Dir = ".."
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "go build -overlay %s %s:\n%s", overlayPath, pkg, out)
		})
	}
}

func TestParsePatch(t *testing.T) {
	p, err := ParsePatch("x", []byte("# why\nfile: a/b.go\npackage: ./a\nsummary: s\n<<<<<<< find\nold()\n=======\nnew()\nnewer()\n>>>>>>> end\n"))
	require.NoError(t, err)
	require.Equal(t, Patch{Name: "x", File: "a/b.go", Package: "./a", Summary: "s",
		Edits: []Edit{{Find: "old()\n", Replace: "new()\nnewer()\n"}}}, p)

	out, err := p.Apply([]byte("func f() {\nold()\n}\n"))
	require.NoError(t, err)
	require.Equal(t, "func f() {\nnew()\nnewer()\n}\n", string(out))

	_, err = p.Apply([]byte("old()\nold()\n"))
	require.ErrorContains(t, err, "occurs 2 times")
	_, err = p.Apply([]byte("gone()\n"))
	require.ErrorContains(t, err, "not in a/b.go any more")

	for _, bad := range []string{
		"file: a\npackage: b\n<<<<<<< find\nx\n",              // unterminated
		"package: b\n<<<<<<< find\nx\n=======\n>>>>>>> end\n", // no file
		"file: a\npackage: b\n",                               // no edits
		"what is this\n",
	} {
		_, err := ParsePatch("bad", []byte(bad))
		require.Error(t, err, "%q", bad)
	}
}
