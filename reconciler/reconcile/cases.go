package reconcile

import (
	"crypto/sha256"
	"maps"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/outboxref/outboxref/internal/drift"
)

// maxExamples is how many cases of a class a report names: enough to start
// from, few enough to read.
const maxExamples = 5

// caseInfo is one case of a class: a student, a user, or the users of one
// document number.
type caseInfo struct {
	since time.Time   // when the case began: the report's oldest age counts from it
	ids   []uuid.UUID // what the report shows for it: ids, never a document number
	// reason is what a stuck or dead row waits on: its state and reason
	// class ("pending/users-unreachable"), or its reason class.
	reason string
}

// cases are the cases found, by class, each keyed by what it is about: the
// student's id, the user's, or for a document number a key derived from it
// (documentKey), so that a later pass that judges the same thing again
// replaces it.
type cases map[drift.Class]map[uuid.UUID]caseInfo

func newCases() cases {
	c := cases{}
	for _, class := range drift.Classes {
		c[class] = map[uuid.UUID]caseInfo{}
	}
	return c
}

func (c cases) add(class drift.Class, key uuid.UUID, info caseInfo) { c[class][key] = info }

// merge takes an incremental pass's findings into c, the cases known from
// the passes before: whatever the pass judged (students, users, document
// numbers) it judged afresh, so their old cases go and its own come in;
// and the classes it read whole (complete) it replaces.
func (c cases) merge(p *pass) cases {
	out := cases{}
	for class, known := range c {
		if slices.Contains(p.complete, class) {
			out[class] = p.found[class]
			continue
		}
		m := make(map[uuid.UUID]caseInfo, len(known))
		for key, info := range known {
			if !p.judged[key] {
				m[key] = info
			}
		}
		maps.Copy(m, p.found[class])
		out[class] = m
	}
	return out
}

// documentKey is the key of a document number's case: derived from the
// number, which stays in memory only, never in a report.
func documentKey(document string) uuid.UUID {
	sum := sha256.Sum256([]byte("document:" + document))
	id, _ := uuid.FromBytes(sum[:16])
	return id
}

// ClassReport is one class in a report.
type ClassReport struct {
	Count int `json:"count"`
	// Invariant says a case breaks the invariant (drift), rather than
	// waiting for an operator.
	Invariant bool `json:"invariant"`
	// OldestAgeSeconds is the age of the oldest case, 0 when there is none.
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	// Examples are the ids of the oldest few cases: students, or users.
	Examples []string `json:"examples"`
	// ByReason counts stuck and dead rows by what they wait on.
	ByReason map[string]int `json:"by_reason,omitempty"`
}

// classReports sums the cases up, ages counted at now.
func (c cases) classReports(now time.Time) map[drift.Class]ClassReport {
	out := make(map[drift.Class]ClassReport, len(drift.Classes))
	for _, class := range drift.Classes {
		infos := make([]caseInfo, 0, len(c[class]))
		for _, info := range c[class] {
			infos = append(infos, info)
		}
		slices.SortFunc(infos, func(a, b caseInfo) int {
			if d := a.since.Compare(b.since); d != 0 {
				return d
			}
			return slices.CompareFunc(a.ids, b.ids, func(x, y uuid.UUID) int { return slices.Compare(x[:], y[:]) })
		})
		r := ClassReport{Count: len(infos), Invariant: class.Invariant(), Examples: []string{}}
		if len(infos) > 0 {
			r.OldestAgeSeconds = max(now.Sub(infos[0].since), 0).Seconds()
		}
		for i, info := range infos {
			if i < maxExamples {
				for _, id := range info.ids {
					r.Examples = append(r.Examples, id.String())
				}
			}
			if info.reason != "" {
				if r.ByReason == nil {
					r.ByReason = map[string]int{}
				}
				r.ByReason[info.reason]++
			}
		}
		out[class] = r
	}
	return out
}
