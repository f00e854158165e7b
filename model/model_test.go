package model

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestModel runs the whole suite, as `make model` does: every property
// holds on the model as it is, and every mutation breaks the property it
// names, with a story to show how. SPIN is not optional: without it the
// test fails and says what to install.
func TestModel(t *testing.T) {
	t.Parallel()
	require.NoError(t, Tools())
	// About four minutes on two quiet cores, the broker's liveness check
	// under fairness the longest; the bound leaves room for a machine busy
	// with other work, inside make test's 15 minutes.
	ctx, cancel := context.WithTimeout(t.Context(), 14*time.Minute)
	defer cancel()
	for d := range RunSuite(ctx, t.TempDir(), Suite(), runtime.NumCPU()) {
		t.Log(d.Line())
		if len(d.Result.Story) > 0 {
			// A mutation's counterexample, or a property's: how the
			// pattern breaks, one step a line (go test -v shows it).
			t.Log("\n" + Numbered(d.Result.Story))
		}
		require.NoError(t, d.Err, d.Job.Label())
		if d.Job.Mutation == nil {
			require.Truef(t, d.Result.Holds, "%s: SPIN found a counterexample:\n%s", d.Job.Label(), Numbered(d.Result.Story))
			continue
		}
		require.Falsef(t, d.Result.Holds, "%s slipped through: %s still holds without that piece", d.Job.Label(), d.Job.Property.Name)
		require.NotEmpty(t, d.Result.Story, "%s: the counterexample tells no story", d.Job.Label())
	}
}

// TestEverySwitchIsUsed: each mutation's switches are in the model, and
// each switch in the model's header belongs to a mutation, so that a
// renamed switch cannot silently leave the model unchanged.
func TestEverySwitchIsUsed(t *testing.T) {
	t.Parallel()
	for _, model := range Models {
		src, err := os.ReadFile(filepath.Join(".", model.File))
		require.NoError(t, err)
		require.Equal(t, string(src), string(model.Spec()), "%s is the file embedded", model.File)
		used := map[string]bool{}
		for _, m := range model.Mutations {
			for _, d := range m.Defines {
				require.Truef(t, strings.Contains(string(src), "#ifdef "+d+"\n") || strings.Contains(string(src), "#ifndef "+d+"\n"),
					"%s mutation %s: the model has no #ifdef %s", model.Name, m.Name, d)
				used[d] = true
			}
		}
		for _, line := range switchLine.FindAllStringSubmatch(string(src), -1) {
			require.Truef(t, used[line[1]], "%s: the model's switch %s belongs to no mutation", model.File, line[1])
		}
		for _, p := range model.Properties {
			require.Containsf(t, string(src), "ltl "+p.Name+" {", "%s has the property %s", model.File, p.Name)
		}
	}
}

// TestParse: pan's report gives the verdict and the size, and a search
// cut short is an error, never a pass.
func TestParse(t *testing.T) {
	t.Parallel()
	var r Result
	require.NoError(t, parse("State-vector 160 byte, depth reached 355, errors: 0\n  3353339 states, stored\n", &r))
	require.True(t, r.Holds)
	require.EqualValues(t, 3353339, r.States)
	require.Equal(t, 355, r.Depth)
	require.NoError(t, parse("State-vector 160 byte, depth reached 97, errors: 1\n  25 states, stored\n", &r))
	require.False(t, r.Holds)
	require.Error(t, parse("pan: reached -DMEMLIM bound\nState-vector 160 byte, depth reached 97, errors: 0\n 25 states, stored\n", &r))
	require.Error(t, parse("nothing useful", &r))
}
