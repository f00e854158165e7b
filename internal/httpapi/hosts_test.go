package httpapi

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAllowHosts: loopback names and the listed ones pass; any other name,
// such as one a rebinding page points at 127.0.0.1, is 403 naming the
// variable to list it in, before the handler runs.
func TestAllowHosts(t *testing.T) {
	t.Parallel()
	ran := false
	h := AllowHosts("X_ALLOWED_HOSTS", []string{"metrics.internal"})(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		ran = true
		w.WriteHeader(http.StatusOK)
	}))
	for host, want := range map[string]int{
		"localhost": 200, "localhost:8082": 200, "127.0.0.1:8082": 200, "127.9.9.9": 200, "[::1]:8082": 200,
		"METRICS.internal:9": 200, "metrics.internal": 200,
		"evil.example": 403, "evil.example:8082": 403, "localhost.evil.example": 403, "10.0.0.1:8082": 403,
		"[::ffff:10.0.0.1]": 403, "": 403, "metrics.internal.evil.example": 403,
	} {
		ran = false
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/healthz", nil)
		req.Host = host
		h.ServeHTTP(rec, req)
		require.Equal(t, want, rec.Code, "Host %q", host)
		require.Equal(t, want == 200, ran, "Host %q", host)
		if want == 403 {
			require.Contains(t, rec.Body.String(), "X_ALLOWED_HOSTS", "the answer says where to allow the name")
		}
	}
}
