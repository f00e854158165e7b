package httpapi

import (
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// AllowHosts returns a middleware that answers only requests whose Host
// names this machine's loopback (localhost, 127.0.0.1, ::1) or one of
// allowed; any other gets 403, naming the variable (allowedVar) to add it
// to.
//
// It is for listeners a browser may reach but no web page should: the
// admin ports and the fault lab. A page on another site can point a name
// of its own at 127.0.0.1 (DNS rebinding), after which the browser treats
// the listener as that site's and lets the page read the answers; the
// name it asks for is then the page's own, which is not allowed. The check
// is on the name asked for, not on who asks: anything that reaches the
// port can send an allowed name. So the listeners also bind loopback by
// default, and a deployment that opens them names the hosts its scrapers
// and health checks use.
func AllowHosts(allowedVar string, allowed []string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			host := HostName(r.Host)
			ip := net.ParseIP(host)
			if host != "localhost" && (ip == nil || !ip.IsLoopback()) && !slices.Contains(allowed, host) {
				Render(w, r, NewProblem(TypeForbidden,
					"this listener does not answer to the host name "+strconv.Quote(host)+"; add it to "+allowedVar))
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// HostName is a Host header's name, without its port and brackets, in
// lower case.
func HostName(hostport string) string {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	return strings.ToLower(strings.Trim(host, "[]"))
}
