package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHistogramMeans(t *testing.T) {
	t.Parallel()
	text := `# HELP outbox_sender_claim_size_rows Rows per claim.
# TYPE outbox_sender_claim_size_rows histogram
outbox_sender_claim_size_rows_bucket{le="1"} 2
outbox_sender_claim_size_rows_bucket{le="+Inf"} 4
outbox_sender_claim_size_rows_sum 30
outbox_sender_claim_size_rows_count 4
# TYPE outbox_sender_record_size_rows histogram
outbox_sender_record_size_rows_bucket{le="+Inf"} 0
outbox_sender_record_size_rows_sum 0
outbox_sender_record_size_rows_count 0
`
	means, err := histogramMeans(strings.NewReader(text), "outbox_sender_claim_size_rows", "outbox_sender_record_size_rows")
	require.NoError(t, err)
	require.Equal(t, []float64{7.5, 0}, means, "sum over count; zero before any observation")

	_, err = histogramMeans(strings.NewReader(text), "outbox_sender_claim_size")
	require.ErrorContains(t, err, "no histogram outbox_sender_claim_size", "a renamed metric is an error, not a zero")
}
