package e2e

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/outbox-sender/sender"
	"github.com/outboxref/outboxref/services/student/studentsvc"
)

// TestStudentReasonClassesMatchSender: Student shows the sender's reason
// class of a student's outbox row as its own API vocabulary, from a copy of
// the list (Student must not import the sender). A class the sender adds
// and Student does not know would reach clients only as "unknown"; a class
// Student keeps after the sender dropped it is documentation of nothing.
func TestStudentReasonClassesMatchSender(t *testing.T) {
	t.Parallel()
	require.Equal(t, slices.Sorted(slices.Values(sender.ReasonClasses)), studentsvc.ReasonClasses())
}
