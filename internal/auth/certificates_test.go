package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// issue makes a certificate for uri signed by parent (self-signed as a CA
// when parent is nil).
func issue(t *testing.T, uri string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: uri},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
	}
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage = x509.KeyUsageCertSign
		parent, parentKey = tmpl, key
	} else {
		u, err := url.Parse(uri)
		require.NoError(t, err)
		tmpl.URIs = []*url.URL{u}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return cert, key
}

// TestCertificatesCaller: over mutual TLS the verified client certificate
// names the caller, as a token does over plain bearer authentication.
func TestCertificatesCaller(t *testing.T) {
	t.Parallel()
	ca, caKey := issue(t, "test-ca", nil, nil)
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	a := Certificates{Callers: map[string]string{"spiffe://outboxref/outbox-sender": "outbox-sender"}}

	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		caller, err := a.Caller(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		_, _ = io.WriteString(w, caller)
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: roots, MinVersion: tls.VersionTLS13}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	get := func(uri string) (int, string) {
		cert, key := issue(t, uri, ca, caKey)
		tr := srv.Client().Transport.(*http.Transport).Clone()
		tr.TLSClientConfig.Certificates = []tls.Certificate{{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}}
		c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		defer c.CloseIdleConnections()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL, nil)
		require.NoError(t, err)
		res, err := c.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(b)
	}
	status, body := get("spiffe://outboxref/outbox-sender")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "outbox-sender", body)

	status, body = get("spiffe://outboxref/somebody-else")
	require.Equal(t, http.StatusUnauthorized, status)
	require.Contains(t, body, "names no known caller")

	// A request that did not come over verified TLS names no one.
	_, err := a.Caller(httptest.NewRequest(http.MethodGet, "/", nil))
	var ce *CredentialsError
	require.ErrorAs(t, err, &ce)
	require.True(t, ce.Missing)
}
