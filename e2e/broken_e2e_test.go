//go:build e2e

package e2e

import (
	"strings"
	"testing"
)

// expectation is what a scenario must do to a broken build.
type expectation int

const (
	// mustFail: the scenario provokes the broken path every time, so the
	// checker must report it.
	mustFail expectation = iota
	// mayFail: the broken path is hit only if a random kill or a fault
	// lands on a request in flight; the outcome is reported, not judged.
	mayFail
	// mustPass: the scenario never takes the broken path, so it must stay
	// green: the checker blames the right scenarios, not all of them.
	mustPass
)

func (e expectation) String() string {
	return [...]string{"must fail", "may fail", "must pass"}[e]
}

// brokenExpectations says, for each broken variant in testdata/broken,
// which scenarios must catch it.
var brokenExpectations = map[string]map[string]expectation{
	// A row acknowledged before Users answers is lost whenever the answer
	// does not come: every scenario with a lost answer, a failed request
	// or a refusal fails. Only the bursts, which bypass the sender, pass.
	"sender-early-ack": {
		"01-response-lost":       mustFail,
		"02-sender-crash-point":  mustFail,
		"03-sender-random-kills": mayFail,
		"04-users-kills":         mustFail,
		"05-users-5xx-and-slow":  mustFail,
		"06-partition":           mustFail,
		"07-database-restarts":   mustFail,
		"08-three-senders":       mayFail,
		"09-poison-row":          mustFail,
		"10-idempotent-bursts":   mustPass,
		// The requests Users held or froze time out after the row was
		// acknowledged; in 11 and 12 the early acknowledgement itself may
		// hang on a frozen connection.
		"11-frozen-record": mayFail,
		"12-frozen-claim":  mayFail,
		"13-frozen-inbox":  mustFail,
	},
	// A Users that ignores the key goes wrong whenever an operation it
	// performed is asked for again: after a lost answer, a crash, a
	// replaced answer, and in the bursts. Without redeliveries (the
	// poison row) it looks fine.
	"users-no-inbox": {
		"01-response-lost":       mustFail,
		"02-sender-crash-point":  mustFail,
		"03-sender-random-kills": mayFail,
		"04-users-kills":         mustFail,
		"05-users-5xx-and-slow":  mustFail,
		"06-partition":           mayFail,
		"07-database-restarts":   mayFail,
		"08-three-senders":       mayFail,
		"09-poison-row":          mustPass,
		"10-idempotent-bursts":   mustFail,
		// Redelivered only if a lease runs out while a frozen transaction
		// holds the row.
		"11-frozen-record": mayFail,
		"12-frozen-claim":  mayFail,
		"13-frozen-inbox":  mayFail,
	},
	// Pools without bounded waits go wrong only when a connection freezes:
	// inside a transaction, the server keeps the session and its locks, and
	// the rows behind them never drain (11: the recording transaction's
	// outbox rows and students; 13: the key's inbox row); on a claim (12),
	// the sender waits for the answer for ever and claims nothing more.
	// None of the first ten freezes a database connection; they must pass.
	"no-wait-limits": {
		"01-response-lost":       mustPass,
		"02-sender-crash-point":  mustPass,
		"03-sender-random-kills": mustPass,
		"04-users-kills":         mustPass,
		"05-users-5xx-and-slow":  mustPass,
		"06-partition":           mustPass,
		"07-database-restarts":   mustPass,
		"08-three-senders":       mustPass,
		"09-poison-row":          mustPass,
		"10-idempotent-bursts":   mustPass,
		"11-frozen-record":       mustFail,
		"12-frozen-claim":        mustFail,
		"13-frozen-inbox":        mustFail,
	},
}

// TestBrokenBuild runs every scenario against a deliberately broken build
// and checks that the checker fails the right ones. It runs only when
// E2E_BROKEN names variants (comma-separated), for example:
//
//	E2E_BROKEN=sender-early-ack go test -tags e2e -count=1 -v -run TestBrokenBuild ./e2e/
func TestBrokenBuild(t *testing.T) {
	variants := brokenVariants()
	if len(variants) == 0 {
		t.Skip("set E2E_BROKEN to one or more of sender-early-ack, users-no-inbox, no-wait-limits (comma-separated) to run the suite against a broken build")
	}
	for _, variant := range variants {
		t.Run(variant, func(t *testing.T) {
			expect, ok := brokenExpectations[variant]
			if !ok {
				t.Fatalf("no expectations for broken variant %q", variant)
			}
			var caught, missed []string
			for _, def := range scenarios {
				t.Run(def.id, func(t *testing.T) {
					e, ok := expect[def.id]
					if !ok {
						t.Fatalf("brokenExpectations[%q] says nothing about %s", variant, def.id)
					}
					out := runScenario(t, def, suite.broken[variant])
					failed := len(out.violations) > 0
					t.Logf("%s against %s: %s (%s); violations:\n  %s", def.id, variant, verdictWord(failed), e, strings.Join(out.violations, "\n  "))
					if failed {
						caught = append(caught, def.id)
					} else {
						missed = append(missed, def.id)
					}
					switch {
					case e == mustFail && !failed:
						t.Errorf("%s passed against the broken build %s: the checker missed it", def.id, variant)
					case e == mustPass && failed:
						t.Errorf("%s failed against %s although the scenario never takes its broken path", def.id, variant)
					}
				})
			}
			t.Logf("%s: the checker failed %v and passed %v", variant, caught, missed)
		})
	}
}

func verdictWord(failed bool) string {
	if failed {
		return "checker FAILED it"
	}
	return "checker passed it"
}
