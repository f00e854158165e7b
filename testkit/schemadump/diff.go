package schemadump

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
)

// maxDiffLines bounds the changed lines Diff shows: a snapshot made
// against a very different schema should not fill a test log.
const maxDiffLines = 60

// Diff returns "" when the committed snapshot and the fresh one are the
// same; otherwise where they first differ (by line number in the
// committed file) and a diff of the lines around every change, "-" for a
// committed line the fresh snapshot lacks and "+" for a new one.
func Diff(committed, fresh []byte) string {
	if bytes.Equal(committed, fresh) {
		return ""
	}
	a := strings.Split(string(committed), "\n")
	b := strings.Split(string(fresh), "\n")
	first := 0
	for first < len(a) && first < len(b) && a[first] == b[first] {
		first++
	}
	var out strings.Builder
	switch {
	case first < len(a) && first < len(b):
		fmt.Fprintf(&out, "first difference at line %d:\n  committed: %s\n  fresh:     %s\n", first+1, a[first], b[first])
	case first < len(a):
		fmt.Fprintf(&out, "first difference at line %d: the fresh snapshot ends before %q\n", first+1, a[first])
	default:
		fmt.Fprintf(&out, "first difference at line %d: the fresh snapshot goes on with %q\n", first+1, b[first])
	}
	out.WriteString("--- committed\n+++ fresh\n")
	out.WriteString(lineDiff(a, b))
	return out.String()
}

// lineDiff is a diff of a and b by their longest common subsequence of
// lines, with up to three unchanged lines around each change.
func lineDiff(a, b []string) string {
	// lcs[i][j] is the length of the longest common subsequence of a[i:]
	// and b[j:]. Snapshots are a few hundred lines, so the table is small.
	lcs := make([][]int, len(a)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(b)+1)
	}
	for i := range slices.Backward(a) {
		for j := range slices.Backward(b) {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	type op struct {
		kind byte // ' ', '-' or '+'
		line string
		at   int // the committed line it stands at (or before, for '+')
	}
	var ops []op
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && j < len(b) && a[i] == b[j]:
			ops = append(ops, op{' ', a[i], i + 1})
			i++
			j++
		case i < len(a) && (j == len(b) || lcs[i+1][j] >= lcs[i][j+1]):
			// A committed line goes before the fresh one replacing it.
			ops = append(ops, op{'-', a[i], i + 1})
			i++
		default:
			ops = append(ops, op{'+', b[j], i + 1})
			j++
		}
	}
	const around = 3
	show := make([]bool, len(ops))
	for k, o := range ops {
		if o.kind != ' ' {
			for c := max(0, k-around); c <= min(len(ops)-1, k+around); c++ {
				show[c] = true
			}
		}
	}
	var out strings.Builder
	changed := 0
	for k, o := range ops {
		if !show[k] {
			continue
		}
		if k == 0 || !show[k-1] {
			fmt.Fprintf(&out, "@@ committed line %d @@\n", o.at)
		}
		if o.kind != ' ' {
			changed++
			if changed > maxDiffLines {
				out.WriteString("... (more changes left out)\n")
				break
			}
		}
		fmt.Fprintf(&out, "%c%s\n", o.kind, o.line)
	}
	return out.String()
}
