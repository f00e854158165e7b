// Package model runs SPIN on outbox.pml, the model of the create-user
// protocol, and turns what SPIN finds into something a reader can follow:
// a verdict with the size of the search, and for a counterexample its
// steps as a numbered story. docs/model.md says what the model covers and
// maps each of its steps to the code.
//
// Nothing shipped imports it: `make model` (./model/check) and the
// package's tests do.
package model

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

var (
	//go:embed outbox.pml
	httpSpec []byte
	//go:embed broker.pml
	brokerSpec []byte
)

// A Model is one Promela model with its properties and mutations: the
// HTTP hop (outbox.pml) and the broker's (broker.pml).
type Model struct {
	Name       string // "http" or "broker", in job labels
	File       string // the .pml file
	spec       []byte
	Properties []Property
	Mutations  []Mutation
}

// A Property is one of the model's ltl formulas.
type Property struct {
	Name     string // the ltl's name in the model's file
	Says     string // what it means, in a line
	Liveness bool   // checked for acceptance cycles, not for a bad state
	// Fair: checked under weak fairness (every process that stays able
	// to move eventually moves). The broker's hold on an unread command
	// does not count as an attempt, so a run in which Users never takes
	// its turn loops for ever; the real Users is scheduled.
	Fair bool
}

// Properties are what the protocol must keep over HTTP.
var Properties = []Property{
	{Name: "one_user", Says: "at most one user per operation"},
	{Name: "right_user", Says: "a linked student holds a user created under its own key"},
	{Name: "no_orphan", Says: "no row is settled while a user made for its student is someone else's or nobody's"},
	{Name: "settles", Says: "every row ends linked or dead once the faults are spent", Liveness: true},
}

// A Mutation removes one piece of the pattern; SPIN must then find a
// counterexample to Breaks.
type Mutation struct {
	Name    string
	Says    string
	Defines []string // the switches in outbox.pml
	Breaks  string   // the property it must break
	// Broken is the e2e broken build (e2e/testdata/broken) that does the
	// same to the real binaries, if one does.
	Broken string
}

// Mutations are the pieces of the HTTP pattern, each shown to matter.
var Mutations = []Mutation{
	{Name: "new-key-each-attempt", Says: "the sender mints a new idempotency key for each attempt",
		Defines: []string{"NEW_KEY_EACH_ATTEMPT"}, Breaks: "no_orphan"},
	{Name: "new-key-each-attempt-no-rule", Says: "a new key for each attempt, and no document-number rule to catch it",
		Defines: []string{"NEW_KEY_EACH_ATTEMPT", "NO_DOCUMENT_RULE"}, Breaks: "one_user"},
	{Name: "inbox-outside-tx", Says: "Users commits the user, then stores the key's answer in another transaction",
		Defines: []string{"INBOX_OUTSIDE_TX"}, Breaks: "no_orphan", Broken: "users-no-inbox"},
	{Name: "mark-before-link", Says: "the row is marked delivered before the user id is recorded",
		Defines: []string{"MARK_BEFORE_LINK"}, Breaks: "settles", Broken: "sender-early-ack"},
	{Name: "stale-record", Says: "a sender whose lease was taken over still records its failure",
		Defines: []string{"STALE_RECORD"}, Breaks: "no_orphan"},
	{Name: "new-operation-unsafe", Says: "new-operation allowed after a key Users may have acted on",
		Defines: []string{"NEWOP_UNSAFE"}, Breaks: "no_orphan"},
	{Name: "short-retention", Says: "Users forgets a key while the sender may still send it",
		Defines: []string{"SHORT_RETENTION"}, Breaks: "no_orphan"},
	{Name: "no-key-age-check", Says: "a retry redrive sends a key Users may have forgotten",
		Defines: []string{"NO_KEY_AGE_CHECK"}, Breaks: "no_orphan"},
	{Name: "dedupe-by-document", Says: "Users answers a taken document number with its holder's user",
		Defines: []string{"DEDUPE_BY_DOCUMENT"}, Breaks: "right_user"},
	{Name: "no-lease-expiry", Says: "a claim never runs out, so a crashed sender's row waits for ever",
		Defines: []string{"NO_LEASE_EXPIRY"}, Breaks: "settles"},
	{Name: "send-after-lease", Says: "a sender sends a row whose lease ran out before the send",
		Defines: []string{"SEND_AFTER_LEASE"}, Breaks: "no_orphan"},
}

// BrokerProperties are what the protocol must keep over the broker: the
// HTTP hop's, and what the broker's own steps promise.
var BrokerProperties = []Property{
	{Name: "one_user", Says: "at most one user per operation"},
	{Name: "right_user", Says: "a linked student holds a user created under its own key"},
	{Name: "no_orphan", Says: "no row is settled while a user made for its student is someone else's or nobody's"},
	{Name: "settles", Says: "every row ends linked or dead once the faults are spent", Liveness: true, Fair: true},
	{Name: "redrive_reaches", Says: "a redrive reaches Users: no publish after it is dropped as a copy of one before it"},
	{Name: "no_lost_command", Says: "a row waits as published only for a command held unread, or whose answer Users committed"},
	{Name: "reply_once", Says: "a reply settles its row once, however often the broker delivers it"},
}

// BrokerMutations are the pieces of the broker's hop, each shown to matter.
var BrokerMutations = []Mutation{
	{Name: "ack-before-commit", Says: "Users acknowledges a command before its commit",
		Defines: []string{"ACK_BEFORE_COMMIT"}, Breaks: "no_lost_command"},
	{Name: "answer-outside-tx", Says: "Users writes the answer row outside the user's transaction, before it",
		Defines: []string{"ANSWER_OUTSIDE_TX"}, Breaks: "right_user"},
	{Name: "reply-twice", Says: "a reply is applied however often it comes, and overwrites the link",
		Defines: []string{"REPLY_TWICE"}, Breaks: "reply_once"},
	{Name: "record-before-ack", Says: "the sender records a publish as done before the broker acknowledges it",
		Defines: []string{"RECORD_BEFORE_ACK"}, Breaks: "no_lost_command"},
	{Name: "fixed-message-id", Says: "the message id is the key alone, the same for the row's whole life",
		Defines: []string{"FIXED_MSG_ID"}, Breaks: "redrive_reaches"},
}

// Models are both models, the HTTP hop's first.
var Models = []*Model{
	{Name: "http", File: "outbox.pml", spec: httpSpec, Properties: Properties, Mutations: Mutations},
	{Name: "broker", File: "broker.pml", spec: brokerSpec, Properties: BrokerProperties, Mutations: BrokerMutations},
}

// Spec is the model's Promela text.
func (m *Model) Spec() []byte { return m.spec }

// PropertyNamed returns the model's property called name.
func (m *Model) PropertyNamed(name string) (Property, bool) {
	for _, p := range m.Properties {
		if p.Name == name {
			return p, true
		}
	}
	return Property{}, false
}

// Result is what one SPIN run found.
type Result struct {
	Property Property
	Defines  []string
	Holds    bool
	States   int64         // states stored
	Depth    int           // the deepest step reached
	Took     time.Duration // compiling the verifier and searching
	// Story is the counterexample, one step a line, when Holds is false.
	Story []string
	// Output is the verifier's own report, for when something looks wrong.
	Output string
}

// ErrNoSpin says what to install when SPIN or a C compiler is missing.
var ErrNoSpin = errors.New("model: SPIN and a C compiler are needed: apt-get install spin gcc")

// Tools reports whether spin and gcc can be found.
func Tools() error {
	for _, tool := range []string{"spin", "gcc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%w (%s: %w)", ErrNoSpin, tool, err)
		}
	}
	return nil
}

// Check runs SPIN on the model with defines switched on and checks p. A
// safety property is searched depth-first without defines (the full
// check) and, with them, shortened until no shorter counterexample is
// found. work is a directory of its own for this run.
func Check(ctx context.Context, work string, m *Model, p Property, defines ...string) (Result, error) {
	start := time.Now()
	res := Result{Property: p, Defines: defines}
	if err := os.WriteFile(filepath.Join(work, m.File), m.spec, 0o600); err != nil {
		return res, err
	}
	var flags []string
	for _, d := range defines {
		flags = append(flags, "-D"+d)
	}
	if _, err := run(ctx, work, "spin", append(append([]string{"-a"}, flags...), m.File)...); err != nil {
		return res, fmt.Errorf("spin -a: %w", err)
	}
	// MEMLIM bounds the search at 8 GiB: past it pan stops and says so,
	// which is a failure here, never a pass.
	// -w: gcc cannot see that a process number indexes its own arrays
	// within bounds, and says so at length.
	cc := []string{"-O2", "-w", "-DMEMLIM=8192", "-o", "pan", "pan.c"}
	pan := []string{"-N", p.Name}
	switch {
	case p.Liveness:
		// No fairness assumption: the full check holds for every run, fair
		// or not, which is more than under weak fairness, and costs a sixth
		// of the search with it. A mutation's counterexample is then a run
		// that ends (every process waits for ever) with the row unsettled,
		// which its story shows.
		pan = append(pan, "-a")
		if p.Fair {
			// Weak fairness keeps a copy of the state per process it
			// tracks: NFAIR sizes that table for the broker model's seven.
			cc = append(cc, "-DNFAIR=3")
			pan = append(pan, "-f")
		}
	case len(defines) > 0:
		// Depth-first, then shorter and shorter counterexamples (-i):
		// the story a reader gets is a short one, at a fraction of what a
		// breadth-first search for the shortest costs.
		cc = append(cc, "-DSAFETY")
		pan = append(pan, "-i")
	default:
		cc = append(cc, "-DSAFETY")
	}
	if _, err := run(ctx, work, "gcc", cc...); err != nil {
		return res, fmt.Errorf("compile the verifier: %w", err)
	}
	out, err := run(ctx, work, "./pan", pan...)
	res.Output = out
	if err != nil {
		return res, fmt.Errorf("pan: %w", err)
	}
	res.Took = time.Since(start)
	if err := parse(out, &res); err != nil {
		return res, err
	}
	if !res.Holds {
		// The trail names the claim it broke.
		trail, err := run(ctx, work, "spin", append(append([]string{"-t"}, flags...), m.File)...)
		if err != nil {
			return res, fmt.Errorf("replay the counterexample: %w", err)
		}
		res.Story = story(trail, p.Liveness)
	}
	return res, nil
}

var (
	// switchLine finds the mutation switches the model's header lists.
	switchLine = regexp.MustCompile(`(?m)^ \*   ([A-Z_]+) +\S`)
	errorsLine = regexp.MustCompile(`depth reached (\d+), errors: (\d+)`)
	statesLine = regexp.MustCompile(`(?m)^\s*(\d+) states, stored`)
)

// parse reads the verdict and the size of the search from pan's report. A
// search cut short by the memory limit or the depth bound is no verdict.
func parse(out string, res *Result) error {
	for _, cut := range []string{"pan: reached -DMEMLIM bound", "error: max search depth too small", "pan: out of memory"} {
		if strings.Contains(out, cut) {
			return fmt.Errorf("the search was cut short (%s)", cut)
		}
	}
	m := errorsLine.FindStringSubmatch(out)
	s := statesLine.FindStringSubmatch(out)
	if m == nil || s == nil {
		return errors.New("pan's report has no verdict")
	}
	res.Depth, _ = strconv.Atoi(m[1])
	res.States, _ = strconv.ParseInt(s[1], 10, 64)
	res.Holds = m[2] == "0"
	return nil
}

// story keeps the model's own account of each step (its printf lines
// that start with "MSG: "), in order. A liveness counterexample ends in a
// cycle: the story says where it starts, or that nothing happens any more.
func story(trail string, liveness bool) []string {
	var steps []string
	cycle := -1
	for line := range strings.SplitSeq(trail, "\n") {
		if strings.Contains(line, "START OF CYCLE") {
			cycle = len(steps)
		}
		if _, step, ok := strings.Cut(line, "MSG: "); ok {
			steps = append(steps, strings.TrimSpace(step))
		}
	}
	switch {
	case !liveness:
	case cycle >= 0 && cycle < len(steps):
		steps = append(steps, fmt.Sprintf("from step %d on, the same steps repeat for ever", cycle+1))
	default:
		steps = append(steps, "nothing more can happen: every process waits for ever, the row unsettled")
	}
	return steps
}

// Numbered renders a story one numbered step a line.
func Numbered(steps []string) string {
	var b strings.Builder
	for i, s := range steps {
		fmt.Fprintf(&b, "%3d. %s\n", i+1, s)
	}
	return b.String()
}

// run runs a tool at the ordinary priority. It once ran at nice 19, so as
// not to slow tests that timed themselves; none does now, and on a machine
// busy with other work a niced search got a few percent of a core and ran
// out of its time (TestModel took 500s and was killed beside two busy
// loops). A search takes its fair share like any test.
func run(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s: %w\n%s", name, err, tail(out.String(), 20))
	}
	return out.String(), nil
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// A Job is one SPIN run of the suite: a property of the model as it is,
// or a mutation with the property it must break.
type Job struct {
	Model    *Model
	Property Property
	Mutation *Mutation // nil for the model as it is
}

// Label names the job in output: the model, and the property or mutation.
func (j Job) Label() string {
	if j.Mutation == nil {
		return j.Model.Name + " property " + j.Property.Name
	}
	return j.Model.Name + " mutation " + j.Mutation.Name
}

// Passed says whether the result is what the job wants: the property
// holds, or the mutation breaks it.
func (j Job) Passed(r Result) bool { return r.Holds == (j.Mutation == nil) }

// Suite is every job: each property on the model as it is, then each
// mutation against the property it must break.
func Suite() []Job {
	var jobs []Job
	for _, model := range Models {
		for _, p := range model.Properties {
			jobs = append(jobs, Job{Model: model, Property: p})
		}
		for i := range model.Mutations {
			m := &model.Mutations[i]
			p, ok := model.PropertyNamed(m.Breaks)
			if !ok {
				panic("model: mutation " + m.Name + " breaks an unknown property " + m.Breaks)
			}
			jobs = append(jobs, Job{Model: model, Property: p, Mutation: m})
		}
	}
	// The longest first: the broker's liveness check under fairness takes
	// minutes, the rest seconds, and begun last it would end the suite
	// alone on one core.
	slices.SortStableFunc(jobs, func(a, b Job) int {
		switch {
		case a.Property.Fair && a.Mutation == nil && !(b.Property.Fair && b.Mutation == nil):
			return -1
		case b.Property.Fair && b.Mutation == nil && !(a.Property.Fair && a.Mutation == nil):
			return 1
		}
		return 0
	})
	return jobs
}

// Done is a finished job.
type Done struct {
	Job    Job
	Result Result
	Err    error
}

// RunSuite runs jobs, parallel at a time, each in a directory of its own
// under work, and sends each as it finishes. It closes the channel when
// all are done.
func RunSuite(ctx context.Context, work string, jobs []Job, parallel int) <-chan Done {
	out := make(chan Done)
	slots := make(chan struct{}, max(parallel, 1))
	go func() {
		defer close(out)
		done := make(chan Done)
		for i, j := range jobs {
			go func() {
				slots <- struct{}{}
				defer func() { <-slots }()
				dir := filepath.Join(work, fmt.Sprintf("%02d", i))
				d := Done{Job: j}
				if d.Err = os.MkdirAll(dir, 0o700); d.Err == nil {
					var defines []string
					if j.Mutation != nil {
						defines = j.Mutation.Defines
					}
					d.Result, d.Err = Check(ctx, dir, j.Model, j.Property, defines...)
				}
				done <- d
			}()
		}
		for range jobs {
			out <- <-done
		}
	}()
	return out
}

// Line is the one-line report of a finished job, ending in "holds" or
// "counterexample found".
func (d Done) Line() string {
	if d.Err != nil {
		return fmt.Sprintf("%-45s error: %v", d.Job.Label(), d.Err)
	}
	verdict := "holds"
	if !d.Result.Holds {
		verdict = "counterexample found"
	}
	what := d.Job.Property.Says
	if d.Job.Mutation != nil {
		what = d.Job.Mutation.Says + " (" + d.Job.Property.Name + ")"
	}
	return fmt.Sprintf("%-45s %9d states, depth %4d, %5.1fs  %s: %s",
		d.Job.Label(), d.Result.States, d.Result.Depth, d.Result.Took.Seconds(), what, verdict)
}
