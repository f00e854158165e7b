// Package e2e is the end-to-end fault-injection suite: it runs the real
// binaries against real PostgreSQL, breaks things, and proves with numbers
// (testkit/invariant) that nothing was lost and nothing was duplicated.
// The suite itself is behind the e2e build tag (make e2e); the pieces that
// need no running system, such as the broken-build patches, build without
// it so that make test covers them.
package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// A broken build proves that the checker notices when the pattern is
// implemented wrongly. The broken code never ships: a Patch describes one
// small edit to one source file, the harness applies it to a copy, and
// `go build -overlay` compiles the binary with the copy in place of the
// original. The patches live in testdata/broken/NAME.patch.
//
// Applying edits to the current source, rather than keeping whole modified
// copies, means a patch keeps working while others change the rest of the
// file, and fails loudly (TestBrokenPatchesApply) when the code it edits
// moves.

// Patch is one broken variant.
type Patch struct {
	Name string // the file name without .patch, used as E2E_BROKEN=Name
	File string // the source file to replace, relative to the repository root
	// Packages are the main packages to rebuild with the patched file, such
	// as ./outbox-sender; a file shared by several binaries (a package
	// under internal/) names each of them.
	Packages []string
	Summary  string // one line for the docs and the logs
	Edits    []Edit
}

// Edit replaces Find, which must occur exactly once, with Replace.
type Edit struct {
	Find, Replace string
}

// The patch format is line based:
//
//	# comments and blank lines before the first block are ignored
//	file: outbox-sender/internal/store/store.go
//	package: ./outbox-sender
//	summary: the sender marks a row delivered before Users answers
//	<<<<<<< find
//	exact lines to find
//	=======
//	lines to put in their place
//	>>>>>>> end
//
// and any number of find blocks may follow. A package: line may name
// several main packages, separated by spaces, when the file is shared:
//
//	package: ./services/student ./services/users ./outbox-sender
const (
	markFind    = "<<<<<<< find"
	markReplace = "======="
	markEnd     = ">>>>>>> end"
)

// ParsePatch reads a patch in the format above.
func ParsePatch(name string, text []byte) (Patch, error) {
	p := Patch{Name: name}
	lines := strings.Split(strings.ReplaceAll(string(text), "\r\n", "\n"), "\n")
	const (
		header = iota
		find
		replace
	)
	state := header
	var cur []string
	var edit Edit
	for i, line := range lines {
		switch state {
		case header:
			switch {
			case line == markFind:
				state, cur = find, nil
			case strings.TrimSpace(line) == "", strings.HasPrefix(line, "#"):
			case strings.HasPrefix(line, "file:"):
				p.File = strings.TrimSpace(strings.TrimPrefix(line, "file:"))
			case strings.HasPrefix(line, "package:"):
				p.Packages = append(p.Packages, strings.Fields(strings.TrimPrefix(line, "package:"))...)
			case strings.HasPrefix(line, "summary:"):
				p.Summary = strings.TrimSpace(strings.TrimPrefix(line, "summary:"))
			default:
				return Patch{}, fmt.Errorf("%s.patch:%d: unexpected line %q", name, i+1, line)
			}
		case find:
			if line == markReplace {
				edit.Find = strings.Join(cur, "\n") + "\n"
				state, cur = replace, nil
				continue
			}
			cur = append(cur, line)
		case replace:
			if line == markEnd {
				edit.Replace = strings.Join(cur, "\n") + "\n"
				if strings.TrimSpace(edit.Find) == "" {
					return Patch{}, fmt.Errorf("%s.patch:%d: empty find block", name, i+1)
				}
				p.Edits = append(p.Edits, edit)
				state, edit = header, Edit{}
				continue
			}
			cur = append(cur, line)
		}
	}
	switch {
	case state != header:
		return Patch{}, fmt.Errorf("%s.patch: unterminated block", name)
	case p.File == "" || len(p.Packages) == 0:
		return Patch{}, fmt.Errorf("%s.patch: needs file: and package: lines", name)
	case len(p.Edits) == 0:
		return Patch{}, fmt.Errorf("%s.patch: no edits", name)
	}
	return p, nil
}

// Apply returns src with every edit made.
func (p Patch) Apply(src []byte) ([]byte, error) {
	out := src
	for i, e := range p.Edits {
		switch n := bytes.Count(out, []byte(e.Find)); n {
		case 1:
			out = bytes.Replace(out, []byte(e.Find), []byte(e.Replace), 1)
		case 0:
			return nil, fmt.Errorf("%s.patch: edit %d: its find block is not in %s any more; update the patch to the current code", p.Name, i+1, p.File)
		default:
			return nil, fmt.Errorf("%s.patch: edit %d: its find block occurs %d times in %s; make it unique", p.Name, i+1, n, p.File)
		}
	}
	return out, nil
}

// LoadPatch reads testdata/broken/NAME.patch from the e2e directory.
func LoadPatch(e2eDir, name string) (Patch, error) {
	text, err := os.ReadFile(filepath.Join(e2eDir, "testdata", "broken", name+".patch"))
	if errors.Is(err, os.ErrNotExist) {
		known, _ := PatchNames(e2eDir)
		return Patch{}, fmt.Errorf("no broken variant %q (known: %s)", name, strings.Join(known, ", "))
	}
	if err != nil {
		return Patch{}, err
	}
	return ParsePatch(name, text)
}

// PatchNames lists the broken variants in testdata/broken.
func PatchNames(e2eDir string) ([]string, error) {
	paths, err := filepath.Glob(filepath.Join(e2eDir, "testdata", "broken", "*.patch"))
	if err != nil {
		return nil, err
	}
	names := make([]string, len(paths))
	for i, p := range paths {
		names[i] = strings.TrimSuffix(filepath.Base(p), ".patch")
	}
	return names, nil
}

// WriteOverlay applies the patch to the file under repoRoot, writes the
// result and an overlay file for `go build -overlay` into workDir, and
// returns the overlay file's path.
func (p Patch) WriteOverlay(repoRoot, workDir string) (string, error) {
	orig := filepath.Join(repoRoot, filepath.FromSlash(p.File))
	src, err := os.ReadFile(orig)
	if err != nil {
		return "", err
	}
	patched, err := p.Apply(src)
	if err != nil {
		return "", err
	}
	copyPath := filepath.Join(workDir, p.Name+"-"+filepath.Base(orig))
	if err := os.WriteFile(copyPath, patched, 0o644); err != nil {
		return "", err
	}
	overlay, err := json.Marshal(map[string]map[string]string{"Replace": {orig: copyPath}})
	if err != nil {
		return "", err
	}
	overlayPath := filepath.Join(workDir, p.Name+"-overlay.json")
	return overlayPath, os.WriteFile(overlayPath, overlay, 0o644)
}
