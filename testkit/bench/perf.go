package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// profileRate is the rate whose latency runs -perf profiles: the rate
// the CPU per student goal is set at.
const profileRate = 200

// profile records a whole-machine CPU profile with Linux perf (every
// process: the services, PostgreSQL's, the bench's own and the kernel's
// work for each) for d, after a wait of after, into b.perfDir/name.data,
// and writes b.perfDir/name.txt: the samples by process, by process and
// object, and the hottest functions. The function it returns waits for the
// recording and the report; it may be called again, and gives the same
// error.
func (b *bench) profile(ctx context.Context, name string, after, d time.Duration) (wait func() error) {
	done := make(chan error, 1)
	go func() { done <- b.recordProfile(ctx, name, after, d) }()
	return sync.OnceValue(func() error { return <-done })
}

func (b *bench) recordProfile(ctx context.Context, name string, after, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(after):
	}
	data := filepath.Join(b.perfDir, name+".data")
	// perf stops at the end of the command it runs: sleep for d. Flat
	// samples, without call graphs: PostgreSQL's binaries have no frame
	// pointers to walk, and which functions are hot is the question.
	rec := exec.CommandContext(ctx, "perf", "record", "--all-cpus", "--freq", "499", "--output", data,
		"--", "sleep", fmt.Sprintf("%.3f", d.Seconds()))
	if out, err := rec.CombinedOutput(); err != nil {
		return fmt.Errorf("perf record: %w: %s", err, strings.TrimSpace(string(out)))
	}
	var report strings.Builder
	for _, sort := range []struct{ keys, limit string }{{"comm", "0.1"}, {"comm,dso", "0.5"}, {"comm,dso,sym", "0.3"}} {
		rep := exec.CommandContext(ctx, "perf", "report", "--input", data, "--stdio", "--no-children",
			"--sort", sort.keys, "--percent-limit", sort.limit)
		out, err := rep.Output()
		if err != nil {
			return fmt.Errorf("perf report --sort %s: %w", sort.keys, err)
		}
		fmt.Fprintf(&report, "== samples by %s (at least %s%%)\n", sort.keys, sort.limit)
		for line := range strings.Lines(string(out)) {
			if strings.TrimSpace(line) != "" && !strings.HasPrefix(line, "#") {
				report.WriteString(line)
			}
		}
	}
	if err := os.WriteFile(filepath.Join(b.perfDir, name+".txt"), []byte(report.String()), 0o644); err != nil {
		return fmt.Errorf("perf: %w", err)
	}
	return nil
}

// checkPerf fails unless perf can record every CPU here.
func checkPerf(ctx context.Context, dir string) error {
	if _, err := exec.LookPath("perf"); err != nil {
		return errors.New("-perf needs Linux perf (Debian: apt-get install linux-perf)")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("-perf: %w", err)
	}
	probe := filepath.Join(dir, "probe.data")
	defer func() { _ = os.Remove(probe) }()
	out, err := exec.CommandContext(ctx, "perf", "record", "--all-cpus", "--output", probe, "--", "true").CombinedOutput()
	if err != nil {
		return fmt.Errorf("-perf: perf cannot record every CPU here (root, or kernel.perf_event_paranoid at most 0): %w: %s",
			err, strings.TrimSpace(string(out)))
	}
	return nil
}
