package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// With -baseline REF the bench answers one question: what does a change
// cost? It builds the binaries a second time from the commit REF names and
// measures the two builds in the same run, measure by measure in turn (the
// first alternating from round to round), so that both meet the same
// machine: on shared cores a figure from another hour says little. It
// measures only the costs, with the polling source: the burndown, and the
// latency runs at 200 and 500 students/s with their CPU per student split
// by process. "this" is the checkout the bench runs from, uncommitted
// changes included, so `-baseline HEAD` measures what is not committed yet.

// build is one set of binaries the comparison runs.
type build struct {
	name string   // "baseline" or "this"
	bins string   // the directory the binaries are in
	env  []string // more variables for its processes (-env, this build's)
}

// buildFigures are one build's results, a value per round for each measure.
type buildFigures struct {
	intake       []float64
	burndown     []float64
	burndownCPU  []time.Duration
	burndownWork []dbWork
	latency      map[float64][]latencyResult
}

// buildBaseline builds the three binaries of commit ref into dir/baseline,
// from a copy of its tree (git archive: nothing is left in the checkout's
// worktree list if the bench dies), and says which commit that was.
func buildBaseline(ctx context.Context, root, ref, dir string) (build, string, error) {
	out, err := exec.CommandContext(ctx, "git", "-C", root, "rev-parse", "--verify", "--end-of-options", ref+"^{commit}").Output()
	if err != nil {
		return build{}, "", fmt.Errorf("-baseline %q: not a commit of this checkout: %w", ref, err)
	}
	sha := strings.TrimSpace(string(out))
	src := filepath.Join(dir, "baseline-src")
	if err := os.MkdirAll(src, 0o700); err != nil {
		return build{}, "", err
	}
	defer os.RemoveAll(src)
	archive := exec.CommandContext(ctx, "sh", "-c", `git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`, "sh", root, sha, src)
	if out, err := archive.CombinedOutput(); err != nil {
		return build{}, "", fmt.Errorf("-baseline %q: copy its tree: %w\n%s", ref, err, out)
	}
	bins := filepath.Join(dir, "baseline")
	if err := buildBinaries(ctx, src, bins); err != nil {
		return build{}, "", fmt.Errorf("-baseline %q: %w", ref, err)
	}
	return build{name: "baseline", bins: bins}, fmt.Sprintf("%s (%.10s)", ref, sha), nil
}

// compare measures the baseline and this build in turn and reports them
// side by side.
func (b *bench) compare(ctx context.Context, o options, builds []build, baseline string) error {
	b.printf("bench: this checkout beside the baseline %s: %d rounds; intake %d clients for %s after %s; burndown %d rows; latency %s after %s at %v/s, after a history of %d students; poll; shipped defaults\n",
		baseline, o.rounds, o.clients, o.duration, o.warmup, o.rows, o.latencyDuration, o.latencyWarmup, o.latencyRates(), o.history)
	f := map[string]*buildFigures{}
	for _, bd := range builds {
		f[bd.name] = &buildFigures{latency: map[float64][]latencyResult{}}
	}
	icfg := intakeConfig{clients: o.clients, warmup: o.warmup, duration: o.duration}
	for r := 1; r <= o.rounds; r++ {
		order := rotated(builds, r)
		// Intake first: Student alone, with no other process of the
		// system on the cores. Its bound is the same for both builds, so
		// the rates compare as they are.
		for _, bd := range order {
			tag := fmt.Sprintf("round %d/%d, %s", r, o.rounds, bd.name)
			b.bins, b.env = bd.bins, bd.env
			b.printf("%s  intake ...\n", tag)
			got, err := b.intakeReal(ctx, icfg)
			if err != nil {
				return fmt.Errorf("%s, intake: %w", tag, err)
			}
			f[bd.name].intake = append(f[bd.name].intake, got)
			b.printf("%s  intake    %8.0f students/s\n", tag, got)
		}
		for _, bd := range order {
			tag := fmt.Sprintf("round %d/%d, %s", r, o.rounds, bd.name)
			b.bins, b.env = bd.bins, bd.env
			b.printf("%s  burndown of %d ...\n", tag, o.rows)
			rate, cpu, work, err := b.burndownReal(ctx, o.rows, sourcePoll)
			if err != nil {
				return fmt.Errorf("%s, burndown: %w", tag, err)
			}
			f[bd.name].burndown = append(f[bd.name].burndown, rate)
			f[bd.name].burndownCPU = append(f[bd.name].burndownCPU, cpu)
			f[bd.name].burndownWork = append(f[bd.name].burndownWork, work)
			b.printf("%s  burndown  %8.0f linked/s, CPU ms per student %.2f; per student %s\n", tag, rate, msFloat(cpu), work)
		}
		for _, rate := range o.latencyRates() {
			for _, bd := range order {
				tag := fmt.Sprintf("round %d/%d, %s", r, o.rounds, bd.name)
				b.bins, b.env = bd.bins, bd.env
				b.printf("%s  latency at %.0f/s ...\n", tag, rate)
				b.perfName = fmt.Sprintf("round%d-%s", r, bd.name)
				res, err := b.latency(ctx, rate, sourcePoll, o.latencyWarmup, o.latencyDuration, nil)
				if err != nil {
					return fmt.Errorf("%s, latency: %w", tag, err)
				}
				f[bd.name].latency[rate] = append(f[bd.name].latency[rate], res)
				b.printf("%s  latency at %.0f/s: p50 %s  p90 %s  p99 %s  (%d students)\n", tag, rate, ms(res.p50), ms(res.p90), ms(res.p99), res.students)
				b.printf("%s    %s\n", tag, res.costs())
				if split := res.serverSplit(); split != "" {
					b.printf("%s    %s\n", tag, split)
				}
				if sleeps := res.sleeps(); sleeps != "" {
					b.printf("%s    %s\n", tag, sleeps)
				}
				if res.tail != nil {
					b.printf("%s    %s\n", tag, res.tail)
				}
			}
		}
	}
	b.compareReport(o, f["baseline"], f["this"], baseline)
	return nil
}

// rotated is xs turned by one place per round r (from 1), so that no
// item is always first on a machine that drifts.
func rotated[T any](xs []T, r int) []T {
	k := (r - 1) % len(xs)
	return append(append([]T(nil), xs[k:]...), xs[:k]...)
}

// compareReport prints the two builds in columns, medians with the rounds'
// range, and the median of the rounds' ratios (this over baseline, each
// round's pair measured minutes apart); then the name-value lines, this
// build's as the bench always names them and the baseline's prefixed.
func (b *bench) compareReport(o options, base, this *buildFigures, baseline string) {
	b.printf("\nthis checkout beside the baseline %s (poll; medians of %d rounds, the rounds' range in brackets;\n", baseline, o.rounds)
	b.printf("this/baseline is the median of each round's ratio)\n")
	w := tabwriter.NewWriter(b.out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "measure\tbaseline\tthis\tthis/baseline\t\n")
	row := func(name, format string, get func(*buildFigures) []float64) {
		bv, tv := get(base), get(this)
		ratios := make([]float64, 0, len(tv))
		for i := range min(len(bv), len(tv)) {
			if bv[i] > 0 && tv[i] >= 0 {
				ratios = append(ratios, tv[i]/bv[i])
			}
		}
		// A round that did not measure (-1) is left out of the cells, as
		// it is of the ratios; a build with none shows "-".
		cell := func(xs []float64) string {
			xs = slices.DeleteFunc(slices.Clone(xs), func(x float64) bool { return x < 0 })
			if len(xs) == 0 {
				return "-"
			}
			return fmt.Sprintf(format+" ["+spread(xs, format)+"]", median(xs))
		}
		ratio := "-"
		if len(ratios) > 0 {
			ratio = fmt.Sprintf("%.2f", median(ratios))
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t\n", name, cell(bv), cell(tv), ratio)
	}
	msOf := func(ds []time.Duration) []float64 {
		out := make([]float64, len(ds))
		for i, d := range ds {
			out[i] = msFloat(d)
		}
		return out
	}
	perRun := func(rate float64, f func(latencyResult) float64) func(*buildFigures) []float64 {
		return func(bf *buildFigures) []float64 {
			out := make([]float64, 0, len(bf.latency[rate]))
			for _, r := range bf.latency[rate] {
				out = append(out, f(r))
			}
			return out
		}
	}
	lat := func(rate float64, f func(latencyResult) time.Duration) func(*buildFigures) []float64 {
		return perRun(rate, func(r latencyResult) float64 { return msFloat(f(r)) })
	}
	row(fmt.Sprintf("intake, students/s (%d clients)", o.clients), "%.0f", func(bf *buildFigures) []float64 { return bf.intake })
	row("burndown, linked/s", "%.0f", func(bf *buildFigures) []float64 { return bf.burndown })
	row("CPU ms per student, burndown", "%.2f", func(bf *buildFigures) []float64 { return msOf(bf.burndownCPU) })
	work := func(f func(dbWork) float64) func(*buildFigures) []float64 {
		return func(bf *buildFigures) []float64 {
			out := make([]float64, len(bf.burndownWork))
			for i, w := range bf.burndownWork {
				out[i] = f(w)
			}
			return out
		}
	}
	row("  statements per student, burndown", "%.2f", work(func(w dbWork) float64 { return w.statements }))
	row("  commits per student, burndown", "%.2f", work(func(w dbWork) float64 { return w.commits }))
	row("  WAL kB per student, burndown", "%.2f", work(func(w dbWork) float64 {
		if w.walBytes < 0 {
			return -1
		}
		return w.walBytes / 1024
	}))
	for _, rate := range o.latencyRates() {
		row(fmt.Sprintf("latency at %.0f/s, p50 ms", rate), "%.1f", lat(rate, func(r latencyResult) time.Duration { return r.p50 }))
		row(fmt.Sprintf("latency at %.0f/s, p99 ms", rate), "%.1f", lat(rate, func(r latencyResult) time.Duration { return r.p99 }))
		row(fmt.Sprintf("CPU ms per student at %.0f/s", rate), "%.2f", lat(rate, func(r latencyResult) time.Duration { return r.cpuPerStudent }))
		for _, p := range []struct{ name, key string }{
			{"Student", studentBin}, {"Users", usersBin}, {"sender", senderBin}, {"PostgreSQL", postgresName},
		} {
			row("  "+p.name, "%.2f", lat(rate, func(r latencyResult) time.Duration { return r.perStudent[p.key] }))
		}
		for _, p := range []struct{ name, key string }{
			{"Student", studentBin}, {"Users", usersBin}, {"sender", senderBin}, {"PostgreSQL", postgresName},
		} {
			row(fmt.Sprintf("  sleeps per student at %.0f/s, %s", rate, p.name), "%.1f", perRun(rate, func(r latencyResult) float64 {
				if v, ok := r.sleepsPerStudent[p.key]; ok {
					return v
				}
				return -1
			}))
		}
		row(fmt.Sprintf("  rows per claim at %.0f/s", rate), "%.1f", perRun(rate, func(r latencyResult) float64 { return r.claimRows }))
		row(fmt.Sprintf("  rows per recording at %.0f/s", rate), "%.1f", perRun(rate, func(r latencyResult) float64 { return r.recordRows }))
	}
	w.Flush()
	b.printf("CPU per student: Student, Users, the sender and PostgreSQL's processes, not the load generator, over the run,\n")
	b.printf("per student sent (burndown: per row, from the sender's start; no Student). PostgreSQL's include the bench's own\n")
	b.printf("sessions (seeding, watching for links), named %q in each run's split. PostgreSQL: %s.\n\n", benchAdmin, b.durability)

	for _, side := range []struct {
		prefix string
		f      *buildFigures
	}{{"", this}, {"baseline_", base}} {
		sf := &sourceFigures{latency: side.f.latency, burndownCPU: side.f.burndownCPU}
		fmt.Fprintf(b.out, "%sp99_ms_at_200 %.1f\n", side.prefix, msFloat(sf.p99(200)))
		fmt.Fprintf(b.out, "%sp99_ms_at_500 %.1f\n", side.prefix, msFloat(sf.p99(500)))
		sf.printCosts(b.out, side.prefix)
	}
}
