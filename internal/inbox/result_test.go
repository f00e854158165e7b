package inbox

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestResultOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		replayed bool
		err      error
		want     Result
		ok       bool
	}{
		{name: "new", want: ResultNew, ok: true},
		{name: "replayed", replayed: true, want: ResultReplayed, ok: true},
		{name: "mismatch, wrapped", err: fmt.Errorf("create: %w", &MismatchError{Fields: []string{"name"}}), want: ResultMismatch, ok: true},
		{name: "in progress, wrapped", err: fmt.Errorf("create: %w", ErrKeyInProgress), want: ResultInProgress, ok: true},
		{name: "conflicting lock", err: ErrConflictInProgress},
		{name: "database", err: context.DeadlineExceeded},
		{name: "other", err: errors.New("boom")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := ResultOf(tt.replayed, tt.err)
			require.Equal(t, tt.ok, ok)
			require.Equal(t, tt.want, got)
		})
	}
}
