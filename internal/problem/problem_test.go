package problem

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestWrite(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	r := httptest.NewRequest(http.MethodPost, "/students", nil)

	w := httptest.NewRecorder()
	Write(w, r, log, fmt.Errorf("insert student: %w", errors.New(`pq: relation "students" secret detail`)))
	require.Equal(t, http.StatusInternalServerError, w.Code)
	require.Equal(t, ContentType, w.Header().Get("Content-Type"))
	require.JSONEq(t, `{"type":"/problems/internal","title":"Internal server error","status":500}`, w.Body.String())
	require.Contains(t, logs.String(), "secret detail", "the cause is logged")

	w = httptest.NewRecorder()
	wrapped := fmt.Errorf("handler: %w", &Error{Type: TypeIdempotencyBusy, Title: "Busy", Status: 409, RetryAfter: 1500 * time.Millisecond})
	Write(w, r, log, wrapped)
	require.Equal(t, http.StatusConflict, w.Code)
	require.Equal(t, "2", w.Header().Get("Retry-After"), "rounded up to whole seconds")

	w = httptest.NewRecorder()
	Write(w, r, log, Field("document_number", "may hold only letters & digits"))
	require.Equal(t, http.StatusBadRequest, w.Code)
	require.Contains(t, w.Body.String(), "letters & digits", "no HTML escaping in JSON for APIs")
	require.JSONEq(t, `{"type":"/problems/validation","title":"Invalid request","status":400,
		"detail":"document_number: may hold only letters & digits",
		"errors":[{"field":"document_number","detail":"may hold only letters & digits"}]}`, w.Body.String())
}
