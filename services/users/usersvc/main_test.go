package usersvc

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine a test started is
// still running after they all finished: every loop, server and pool the
// tests start must stop.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
