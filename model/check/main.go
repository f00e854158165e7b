// Command check runs `make model`: every property of the protocol's model
// on the model as it is, and every mutation against the property it must
// break, one line each. It exits non-zero when a property fails, a
// mutation slips through, or SPIN cannot run.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"time"

	"github.com/outboxref/outboxref/model"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "model:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, stdout io.Writer) error {
	if err := model.Tools(); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "outboxref-model-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	start := time.Now()
	jobs := model.Suite()
	failed := 0
	for d := range model.RunSuite(ctx, work, jobs, runtime.NumCPU()) {
		fmt.Fprintln(stdout, d.Line())
		switch {
		case d.Err != nil:
			failed++
		case !d.Job.Passed(d.Result):
			failed++
			if len(d.Result.Story) > 0 {
				fmt.Fprint(stdout, model.Numbered(d.Result.Story))
			}
		case d.Job.Mutation != nil && os.Getenv("MODEL_STORIES") != "":
			fmt.Fprint(stdout, model.Numbered(d.Result.Story))
		}
	}
	fmt.Fprintf(stdout, "%d checks in %.0fs\n", len(jobs), time.Since(start).Seconds())
	if failed > 0 {
		return fmt.Errorf("%d of %d checks did not come out as they must", failed, len(jobs))
	}
	return nil
}
