package e2e

import (
	"encoding/json"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/deploy"
)

// TestBrokenPatchesApply keeps the broken variants usable: each must still
// find the code it edits, and the patched package must still compile
// (type-checked with go build -overlay, without linking a binary).
func TestBrokenPatchesApply(t *testing.T) {
	names, err := PatchNames(".")
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"no-wait-limits", "sender-early-ack", "users-no-inbox"}, names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			p, err := LoadPatch(".", name)
			require.NoError(t, err)
			require.NotEmpty(t, p.Summary)
			work := t.TempDir()
			// An absolute root: go build resolves the overlay's paths from
			// its own working directory, the repository root.
			root, err := filepath.Abs("..")
			require.NoError(t, err)
			overlayPath, err := p.WriteOverlay(root, work)
			require.NoError(t, err)

			var overlay struct{ Replace map[string]string }
			b, err := os.ReadFile(overlayPath)
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal(b, &overlay))
			require.Len(t, overlay.Replace, 1)
			for orig, copyPath := range overlay.Replace {
				require.Equal(t, filepath.Join(root, filepath.FromSlash(p.File)), orig)
				_, err := parser.ParseFile(token.NewFileSet(), copyPath, nil, parser.AllErrors)
				require.NoError(t, err, "the patched file must still be Go")
				patched, err := os.ReadFile(copyPath)
				require.NoError(t, err)
				require.Contains(t, string(patched), "BROKEN on purpose")
			}

			goCmd := deploy.GoCommand()
			pkg := "./" + path.Dir(p.File)
			// With the suite's build tag, as the harness builds it.
			cmd := exec.Command(goCmd, "build", "-tags", "crashpoints", "-overlay", overlayPath, pkg)
			cmd.Dir = root
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "go build -overlay %s %s:\n%s", overlayPath, pkg, out)

			// The harness rebuilds exactly the binaries the package: line
			// names. Each must contain the patched package, and no shipped
			// binary that contains it may be left out, or it would run the
			// good code in a broken build.
			patched := deploy.Module + "/" + path.Dir(p.File)
			var want []string
			for _, bin := range deploy.SystemBinaries() {
				deps, err := deploy.GoList(root, "-deps", bin)
				require.NoError(t, err)
				if slices.Contains(deps, patched) {
					want = append(want, bin)
				}
			}
			require.ElementsMatch(t, want, p.Packages, "the package: line of %s.patch must name every binary built from %s", name, p.File)
		})
	}
}

func TestParsePatch(t *testing.T) {
	p, err := ParsePatch("x", []byte("# why\nfile: a/b.go\npackage: ./a\nsummary: s\n<<<<<<< find\nold()\n=======\nnew()\nnewer()\n>>>>>>> end\n"))
	require.NoError(t, err)
	require.Equal(t, Patch{Name: "x", File: "a/b.go", Packages: []string{"./a"}, Summary: "s",
		Edits: []Edit{{Find: "old()\n", Replace: "new()\nnewer()\n"}}}, p)

	shared, err := ParsePatch("y", []byte("file: internal/c/c.go\npackage: ./a  ./b\n<<<<<<< find\nold()\n=======\n>>>>>>> end\n"))
	require.NoError(t, err)
	require.Equal(t, []string{"./a", "./b"}, shared.Packages, "a shared file names every binary it is part of")

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
