package reconcile

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxref/outboxref/internal/drift"
)

// Report is a pass's report: `reconciler once` prints it, and `reconciler
// serve` answers the last one on /report. Every count is of cases, and
// every example is an id: never a document number or a name.
type Report struct {
	Kind            string    `json:"kind"` // full or incremental
	StartedAt       time.Time `json:"started_at"`
	FinishedAt      time.Time `json:"finished_at"`
	DurationSeconds float64   `json:"duration_seconds"`
	// Drift says a case of the invariant's classes was found.
	Drift bool `json:"drift"`
	// Classes are every class, by its name. After an incremental pass
	// they are what the last full pass found, brought up to date with
	// what the incremental passes since judged again.
	Classes map[drift.Class]ClassReport `json:"classes"`
	// Judged counts what this pass judged: every student and user in a
	// full pass, those that changed in an incremental one.
	Judged Judged `json:"judged"`
	// Read is the load this pass put on each database.
	Read ReadLoad `json:"read"`
}

// Judged counts students and users judged.
type Judged struct {
	Students int `json:"students"`
	Users    int `json:"users"`
}

// ReadLoad is a pass's reads, by database.
type ReadLoad struct {
	Student ReadStats `json:"student"`
	Users   ReadStats `json:"users"`
}

// report sums up a pass that ended at finished, with the cases known after
// it.
func (p *pass) report(known cases, finished time.Time) Report {
	r := Report{
		Kind: p.kind, StartedAt: p.started.UTC(), FinishedAt: finished.UTC(),
		DurationSeconds: finished.Sub(p.started).Seconds(),
		Classes:         known.classReports(finished),
		Judged:          Judged{Students: p.students, Users: p.users},
		Read:            ReadLoad{Student: p.studentStats, Users: p.usersStats},
	}
	for class, c := range r.Classes {
		if class.Invariant() && c.Count > 0 {
			r.Drift = true
		}
	}
	return r
}

// WriteText writes the report for a person: what was read, then a line per
// class, then what the cases found mean.
func (r Report) WriteText(w io.Writer) error {
	var b strings.Builder
	verdict := "no drift"
	if r.Drift {
		var found []string
		for _, class := range drift.Classes {
			if c := r.Classes[class]; class.Invariant() && c.Count > 0 {
				found = append(found, fmt.Sprintf("%s %d", class, c.Count))
			}
		}
		verdict = "DRIFT: " + strings.Join(found, ", ")
	}
	fmt.Fprintf(&b, "reconciler: %s pass at %s, %s: %s\n", r.Kind, r.StartedAt.Format(time.RFC3339),
		time.Duration(r.DurationSeconds*float64(time.Second)).Round(time.Millisecond), verdict)
	fmt.Fprintf(&b, "judged students: %d, users: %d; read from Student's database: %s; from Users': %s\n\n",
		r.Judged.Students, r.Judged.Users, r.Read.Student.text(), r.Read.Users.text())

	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "class\tcount\toldest\texamples")
	for _, class := range drift.Classes {
		c := r.Classes[class]
		oldest, examples := "-", strings.Join(c.Examples, " ")
		if c.Count > 0 {
			oldest = time.Duration(c.OldestAgeSeconds * float64(time.Second)).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", class, c.Count, oldest, examples)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, class := range drift.Classes {
		c := r.Classes[class]
		if c.Count == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n%s: %s\n", class, class.Explanation())
		reasons := make([]string, 0, len(c.ByReason))
		for reason, n := range c.ByReason {
			reasons = append(reasons, fmt.Sprintf("  %d %s", n, reason))
		}
		slices.Sort(reasons)
		if len(reasons) > 0 {
			b.WriteString(strings.Join(reasons, "\n") + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (s ReadStats) text() string {
	return strconv.Itoa(s.Rows) + " rows in " + strconv.Itoa(s.Statements) + " statements, the longest " +
		s.Longest.Round(time.Microsecond*100).String()
}
