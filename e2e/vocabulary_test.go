package e2e

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStudentDoesNotImportSender: Student's binary is built without the
// sender's code; the words both speak come from internal/outbox.
func TestStudentDoesNotImportSender(t *testing.T) {
	t.Parallel()
	deps := goList(t, "-deps", "./services/student")
	require.Contains(t, deps, module+"/services/student/studentsvc")
	for _, d := range deps {
		require.False(t, strings.HasPrefix(d, module+"/outbox-sender"), "Student imports %s", d)
	}
}
