package main

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// portRow is a row of the port table in docs/running-without-docker.md:
// | +offset | port | what |
var portRow = regexp.MustCompile(`(?m)^\| \+(\d+) \| (\d+) \| (.+) \|$`)

// TestPortTableIsTheCode: the page's table of make run's ports has one row
// for each port make run may take, in order, at the default base, and
// each row names what config.go says listens there.
func TestPortTableIsTheCode(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile("../../docs/running-without-docker.md")
	require.NoError(t, err)
	cfg, err := loadConfig(func(string) string { return "" })
	require.NoError(t, err)

	var got, want []string
	for _, m := range portRow.FindAllStringSubmatch(string(page), -1) {
		offset, _ := strconv.Atoi(m[1])
		name := "(no port at this offset)"
		if offset < portCount {
			name = portNames[offset]
		}
		if !strings.Contains(m[3], name) {
			name = fmt.Sprintf("%s (the page says %q)", name, m[3])
		}
		got = append(got, fmt.Sprintf("+%s %s %s", m[1], m[2], name))
	}
	for offset, name := range portNames {
		want = append(want, fmt.Sprintf("+%d %d %s", offset, cfg.port(offset), name))
	}
	require.Equal(t, want, got, "docs/running-without-docker.md's port table against testkit/run/config.go")
}
