package deploy

// This file reads what the checks need of the Dockerfile: the binaries its
// final stage holds and where, what it EXPOSEs, and whether it has an
// ENTRYPOINT.

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
)

// image is what the checks need from a Dockerfile's final stage.
type image struct {
	installed  map[string]string // absolute path in the final image → package built into it
	expose     []uint32
	entrypoint bool
}

// lookup resolves a command's first word the way the container runtime will,
// and returns the package that binary was built from.
func (img image) lookup(cmd string) (string, bool) {
	if strings.Contains(cmd, "/") {
		pkg, ok := img.installed[path.Clean(cmd)]
		return pkg, ok
	}
	for _, dir := range defaultPath {
		if pkg, ok := img.installed[path.Join(dir, cmd)]; ok {
			return pkg, true
		}
	}
	return "", false
}

// defaultPath is the PATH of distroless images, and the one Docker gives an
// image that sets none; a bare command name is looked up there.
var defaultPath = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

func (img image) installedPaths() []string {
	return slices.Sorted(maps.Keys(img.installed))
}

// parseDockerfile understands as much of a Dockerfile as the checks need:
// the `go build` commands in RUN, COPY --from of their output into the final
// stage, and the final stage's EXPOSE and ENTRYPOINT. Anything fancier
// (JSON-form COPY, ARG expansion) is not recognised, and the build check
// then fails rather than passing by accident.
func parseDockerfile(text string) (image, error) {
	built := map[string]string{} // path in the build stage → package
	var img image
	stages := 0
	text = strings.ReplaceAll(text, "\\\r\n", " ")
	text = strings.ReplaceAll(text, "\\\n", " ")
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue // a comment may hold an apostrophe, which is no quote
		}
		words, err := shellFields(line)
		if err != nil {
			return image{}, err
		}
		if len(words) == 0 {
			continue
		}
		args := words[1:]
		switch strings.ToUpper(words[0]) {
		case "FROM":
			stages++
			img = image{installed: map[string]string{}}
		case "RUN":
			for i, w := range args {
				if w == "go" && i+1 < len(args) && args[i+1] == "build" {
					recordGoBuild(args[i+2:], built)
				}
			}
		case "COPY":
			var from string
			var paths []string
			for _, a := range args {
				if v, ok := strings.CutPrefix(a, "--from="); ok {
					from = v
				} else if !strings.HasPrefix(a, "--") {
					paths = append(paths, a)
				}
			}
			if from == "" || len(paths) < 2 {
				continue
			}
			dst := paths[len(paths)-1]
			for _, src := range paths[:len(paths)-1] {
				for p, pkg := range built {
					if to, ok := copiedTo(p, src, dst); ok {
						img.installed[to] = pkg
					}
				}
			}
		case "EXPOSE":
			for _, a := range args {
				a, _, _ = strings.Cut(a, "/")
				n, err := strconv.ParseUint(a, 10, 16)
				if err != nil {
					return image{}, fmt.Errorf("EXPOSE %s: %w", a, err)
				}
				img.expose = append(img.expose, uint32(n))
			}
		case "ENTRYPOINT":
			img.entrypoint = true
		}
	}
	if stages == 0 {
		return image{}, errors.New("no FROM")
	}
	if len(built) == 0 {
		return image{}, errors.New("no `go build` command")
	}
	return img, nil
}

// recordGoBuild notes the binaries one `go build` produces. With -o naming a
// folder (trailing slash) each package's binary is named after its last path
// element; otherwise -o names the one binary.
func recordGoBuild(args []string, built map[string]string) {
	var out string
	var pkgs []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "&&" || a == ";" || a == "|" || a == "||":
			i = len(args) // the rest is another command
		case a == "-o" && i+1 < len(args):
			out = args[i+1]
			i++
		case strings.HasPrefix(a, "-o="):
			out = strings.TrimPrefix(a, "-o=")
		case strings.HasPrefix(a, "./") || a == ".":
			pkgs = append(pkgs, a)
		}
	}
	for _, pkg := range pkgs {
		switch {
		case out == "":
			// go build of several packages without -o writes nothing
		case strings.HasSuffix(out, "/"):
			built[path.Join(out, path.Base(pkg))] = path.Clean(pkg)
		case len(pkgs) == 1:
			built[path.Clean(out)] = path.Clean(pkg)
		}
	}
}

// copiedTo says where COPY src dst puts the build-stage file p, if anywhere.
func copiedTo(p, src, dst string) (string, bool) {
	src = path.Clean(src)
	var rel string
	switch {
	case p == src:
		rel = path.Base(p)
		if !strings.HasSuffix(dst, "/") {
			return path.Clean(dst), true
		}
	case strings.HasPrefix(p, src+"/"):
		rel = strings.TrimPrefix(p, src+"/")
	default:
		return "", false
	}
	return path.Join(dst, rel), true
}

// shellFields splits a line into words, honouring single and double quotes,
// so that -ldflags="-s -w" stays one word.
func shellFields(line string) ([]string, error) {
	var words []string
	var word strings.Builder
	inWord := false
	var quote rune
	for _, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				word.WriteRune(r)
			}
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t' || r == '\r':
			if inWord {
				words = append(words, word.String())
				word.Reset()
				inWord = false
			}
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated quote in %q", line)
	}
	if inWord {
		words = append(words, word.String())
	}
	return words, nil
}
