//go:build !e2e

package e2e

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain of the plain build (make test): the in-process flow tests start
// senders and servers, and every one of them must stop. The fault suite's
// own TestMain (main_test.go, -tags e2e) kills processes instead.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
