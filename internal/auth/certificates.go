package auth

import "net/http"

// Certificates names the caller by the client certificate that the TLS
// handshake verified: the mutual-TLS replacement for Tokens. The server's
// tls.Config sets ClientAuth to tls.RequireAndVerifyClientCert and
// ClientCAs to the CA that issues the callers' certificates, so a request
// reaches Caller only over a connection whose client proved it holds a
// key the CA certified. Caller then maps a name in that certificate to a
// caller: a URI SAN (such as a SPIFFE ID, spiffe://example.org/outbox-sender)
// or a DNS SAN, looked up in Callers.
//
// The binaries use Tokens; docs/contract.md says how to switch. The caller names,
// and so the inbox's per-caller scopes, stay what they were.
type Certificates struct {
	// Callers maps a certificate's URI or DNS name to a caller's name.
	Callers map[string]string
}

// Caller returns the caller named by the first of the verified leaf
// certificate's URI SANs, then DNS SANs, that Callers knows.
func (c Certificates) Caller(r *http.Request) (string, error) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return "", &CredentialsError{Missing: true, Detail: "connect with a client certificate"}
	}
	leaf := r.TLS.VerifiedChains[0][0]
	for _, u := range leaf.URIs {
		if caller, ok := c.Callers[u.String()]; ok {
			return caller, nil
		}
	}
	for _, name := range leaf.DNSNames {
		if caller, ok := c.Callers[name]; ok {
			return caller, nil
		}
	}
	return "", &CredentialsError{Detail: "the client certificate names no known caller"}
}
