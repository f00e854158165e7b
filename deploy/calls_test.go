package deploy

// This file checks how the services reach each other: the URLs they call
// each other by, the sender's token against those Users accepts, and Users'
// waits and retention against the sender's.

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/compose-spec/compose-go/v2/types"

	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/lab/faultlab"
	"github.com/outboxref/outboxref/outbox-sender/sender"
	"github.com/outboxref/outboxref/services/student/studentsvc"
	"github.com/outboxref/outboxref/services/users/usersvc"
)

// resolvedCall is where a call's URL leads: the service it names, the
// listener (by variable) it must reach there, and whether that service
// is a proxy standing in for the binary called.
type resolvedCall struct {
	url     *url.URL
	target  types.ServiceConfig
	addrVar string
	proxied bool
}

// resolveCall reads the URL of s's call c as s's binary sees it, and
// checks that it names a serving service running the binary called (or,
// where c allows, a proxy to it). It returns nil and why when not.
func (d *deployment) resolveCall(s types.ServiceConfig, c call) (*resolvedCall, string) {
	cfg, _ := config(s)
	raw := cfg.urls[c.urlVar]
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Sprintf("%q: %s: %v", s.Name, c.urlVar, err)
	}
	target, ok := d.project.Services[u.Hostname()]
	name, b, isGo := binaryOf(target)
	switch {
	case ok && isGo && !isMigration(target) && name == c.binary:
		return &resolvedCall{url: u, target: target, addrVar: c.addrVar}, ""
	case ok && isGo && !isMigration(target) && c.viaProxy && b.proxiesTo(c.binary):
		return &resolvedCall{url: u, target: target, addrVar: b.proxy.addrVar, proxied: true}, ""
	}
	want := c.binary
	if c.viaProxy {
		var proxies []string
		for _, pname := range slices.Sorted(maps.Keys(binaries)) {
			if binaries[pname].proxiesTo(c.binary) {
				proxies = append(proxies, pname)
			}
		}
		want += fmt.Sprintf(" or a proxy to it (%s)", strings.Join(proxies, ", "))
	}
	return nil, fmt.Sprintf("%q: %s=%s: %q is not a service running %s", s.Name, c.urlVar, raw, u.Hostname(), want)
}

// urlPort is the port a URL reaches, its scheme's when it names none.
func urlPort(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	return map[string]string{"http": "80", "https": "443"}[u.Scheme]
}

// checkServiceURLs: every URL a Go service calls another by names a
// service running that binary, on the port the listener it means listens
// on there (the API, or the admin port). The sender's SENDER_USERS_URL
// may name the lab instead, on its fault proxy's port, not its page's; the
// lab's LAB_USERS_URL then names Users. A proxy must be called through,
// or its faults break nothing and its page shows no delivery. The URLs
// one service uses for another binary (the lab's for Student's API and
// Student's admin port) name the same service, or the page would show one
// Student's readiness and create students in another.
func checkServiceURLs(d *deployment) []string {
	var problems []string
	calledProxies := map[string]bool{} // services whose proxy some service calls, on its port
	for _, s := range d.servingGoServices() {
		_, b, _ := binaryOf(s)
		named := map[string]map[string][]string{} // binary → service named → the variables naming it
		for _, c := range b.calls {
			r, problem := d.resolveCall(s, c)
			if r == nil {
				problems = append(problems, problem)
				continue
			}
			if !r.proxied {
				if named[c.binary] == nil {
					named[c.binary] = map[string][]string{}
				}
				named[c.binary][r.target.Name] = append(named[c.binary][r.target.Name], c.urlVar)
			}
			_, tb, _ := binaryOf(r.target)
			tcfg, _ := config(r.target)
			want, err := portOf(tcfg.listens[r.addrVar])
			if err != nil {
				continue // checkPorts reports it
			}
			got := urlPort(r.url)
			if got == strconv.Itoa(int(want)) {
				if r.proxied {
					calledProxies[r.target.Name] = true
				}
				continue
			}
			other := ""
			for _, v := range tb.listenVars() {
				if p, err := portOf(tcfg.listens[v]); err == nil && strconv.Itoa(int(p)) == got {
					other = v
				}
			}
			if other != "" {
				problems = append(problems, fmt.Sprintf("%q: %s=%s uses port %s, where %q serves %s, not %s (%d)", s.Name, c.urlVar, r.url, got, r.target.Name, other, r.addrVar, want))
			} else {
				problems = append(problems, fmt.Sprintf("%q: %s=%s uses port %s, but %q listens on %d (%s)", s.Name, c.urlVar, r.url, got, r.target.Name, want, r.addrVar))
			}
		}
		for _, bin := range slices.Sorted(maps.Keys(named)) {
			if svcs := named[bin]; len(svcs) > 1 {
				problems = append(problems, fmt.Sprintf("%q: its URLs name different services running %s, %v: they must name one", s.Name, bin, svcs))
			}
		}
	}
	for _, s := range d.servingGoServices() {
		_, b, _ := binaryOf(s)
		if b.proxy.addrVar != "" && !calledProxies[s.Name] {
			problems = append(problems, fmt.Sprintf("%q: no service calls its proxy (%s): its faults would break nothing", s.Name, b.proxy.addrVar))
		}
	}
	return problems
}

// calledService is the service a call reaches in the end: the one its URL
// names, or the one behind a proxy it names. "" when it names none.
func (d *deployment) calledService(s types.ServiceConfig, c call) string {
	r, _ := d.resolveCall(s, c)
	if r == nil {
		return ""
	}
	if !r.proxied {
		return r.target.Name
	}
	_, pb, _ := binaryOf(r.target)
	for _, up := range pb.calls {
		if up.urlVar == pb.proxy.upstreamVar {
			return d.calledService(r.target, up)
		}
	}
	return ""
}

// checkRetention ties the two sides of the idempotency key together. The
// sender retries an operation with the same Idempotency-Key until
// SENDER_MAX_AGE after the outbox row was written; Users recognises a
// repeated key only while the key's inbox row is younger than
// USERS_INBOX_RETENTION. A retry arriving after the inbox forgot its key is
// treated as new and creates a second user. The inbox row is written after
// the outbox row, so retention equal to max age would almost suffice;
// strictly longer leaves room for the request in flight when max age ran out
// and for the two databases' clocks disagreeing.
func checkRetention(d *deployment) []string {
	var problems []string
	for _, u := range d.goServices() {
		if name, _, _ := binaryOf(u); name != "users" || isMigration(u) {
			continue
		}
		uc, _, _ := usersvc.LoadConfig(getenvOf(u.Environment))
		for _, s := range d.goServices() {
			if name, _, _ := binaryOf(s); name != "outbox-sender" {
				continue
			}
			sc, _, _ := sender.LoadConfig(getenvOf(s.Environment))
			if uc.InboxRetention <= sc.MaxAge {
				problems = append(problems, fmt.Sprintf("USERS_INBOX_RETENTION=%s (%q) must be longer than SENDER_MAX_AGE=%s (%q): a retry after Users forgot its key would create a second user",
					uc.InboxRetention, u.Name, sc.MaxAge, s.Name))
			}
			// The sender refuses a retry redrive of a key Users may forget
			// before the retry ends, by its own copy of the retention: a
			// copy longer than the real one lets such a retry through.
			if sc.UsersInboxRetention > uc.InboxRetention {
				problems = append(problems, fmt.Sprintf("SENDER_USERS_INBOX_RETENTION=%s (%q) must not be longer than USERS_INBOX_RETENTION=%s (%q): the sender would retry keys Users has forgotten",
					sc.UsersInboxRetention, s.Name, uc.InboxRetention, u.Name))
			}
		}
	}
	return problems
}

// checkWaitsNest ties Users' waits to the sender's. A delivery waits at most
// SENDER_REQUEST_TIMEOUT for Users' answer. Users may wait
// USERS_IDEMPOTENCY_WAIT for a key another request holds, then answers 409
// with Retry-After, and ends any request by USERS_DATABASE_TIMEOUT, then
// answers 503. Both must come first: a sender that gives up before Users
// answers never sees the 409 or the Retry-After, and records a timeout for a
// request Users was still working on. Each binary checks its own waits at
// start; only the deployment sees both.
func checkWaitsNest(d *deployment) []string {
	var problems []string
	for _, u := range d.goServices() {
		if name, _, _ := binaryOf(u); name != "users" || isMigration(u) {
			continue
		}
		uc, _, _ := usersvc.LoadConfig(getenvOf(u.Environment))
		for _, s := range d.goServices() {
			if name, _, _ := binaryOf(s); name != "outbox-sender" {
				continue
			}
			sc, _, _ := sender.LoadConfig(getenvOf(s.Environment))
			if uc.KeyWait >= sc.RequestTimeout {
				problems = append(problems, fmt.Sprintf("USERS_IDEMPOTENCY_WAIT=%s (%q) must be shorter than SENDER_REQUEST_TIMEOUT=%s (%q): the sender would give up before Users answers 409 with Retry-After",
					uc.KeyWait, u.Name, sc.RequestTimeout, s.Name))
			}
			if uc.DatabaseTimeout >= sc.RequestTimeout {
				problems = append(problems, fmt.Sprintf("USERS_DATABASE_TIMEOUT=%s (%q) must be shorter than SENDER_REQUEST_TIMEOUT=%s (%q): the sender would give up before Users answers 503 with Retry-After",
					uc.DatabaseTimeout, u.Name, sc.RequestTimeout, s.Name))
			}
		}
	}
	return problems
}

// checkCallers ties each caller's token to the callee's list. Users serves
// only the callers in USERS_API_TOKENS, and the sender authenticates with
// SENDER_USERS_TOKEN: a token Users does not list gets every delivery
// refused (401), which the sender retries for ever and says so, but
// delivers nothing. Likewise the lab's tokens on Student's API and the
// sender's admin port. Each binary checks its own variable at start; only
// the deployment sees both. Migrations serve no one, so they are not
// handed the tokens.
func checkCallers(d *deployment) []string {
	// Users and Student serve their callers only; the sender calls Users,
	// and the lab's page calls Student, each as one of them.
	users, problems := servedCallers(d, "users", "USERS_API_TOKENS", "Users",
		func(env func(string) string) ([]auth.Credential, error) {
			c, _, err := usersvc.LoadConfig(env)
			return c.Callers, err
		})
	students, more := servedCallers(d, "student", "STUDENT_API_TOKENS", "Student",
		func(env func(string) string) ([]auth.Credential, error) {
			c, _, err := studentsvc.LoadConfig(env)
			return c.Callers, err
		})
	problems = append(problems, more...)
	for _, s := range d.goServices() {
		if name, _, _ := binaryOf(s); name != "outbox-sender" {
			continue
		}
		sc, _, err := sender.LoadConfig(getenvOf(s.Environment))
		if err != nil {
			continue // checkEnvironment reports it
		}
		// The token must be one the Users the sender calls accepts, not
		// merely some Users of the project: the one SENDER_USERS_URL
		// names, or the one behind the lab it names (the lab passes the
		// token on).
		_, b, _ := binaryOf(s)
		problems = append(problems, tokenAmong(s.Name, "SENDER_USERS_TOKEN", sc.UsersToken, d.calledService(s, b.call("SENDER_USERS_URL")),
			"USERS_API_TOKENS", users, "the sender refuses to start without it", "Users would refuse every delivery")...)
	}
	for _, l := range d.goServices() {
		name, b, _ := binaryOf(l)
		if name != "lab" {
			continue
		}
		lc, _, err := faultlab.LoadConfig(getenvOf(l.Environment))
		if err != nil {
			continue // checkEnvironment reports it
		}
		problems = append(problems, tokenAmong(l.Name, "LAB_STUDENT_TOKEN", lc.StudentToken, d.calledService(l, b.call("LAB_STUDENT_URL")),
			"STUDENT_API_TOKENS", students, "Student would refuse the page's students (401)", "Student would refuse the page's students (401)")...)
		// The redrive button calls the sender's admin port as an operator.
		operators := map[string][]auth.Credential{}
		called := d.calledService(l, b.call("LAB_SENDER_ADMIN_URL"))
		if called != "" {
			if sc, _, err := sender.LoadConfig(getenvOf(d.project.Services[called].Environment)); err == nil {
				operators[called] = sc.Operators
			}
		}
		problems = append(problems, tokenAmong(l.Name, "LAB_SENDER_ADMIN_TOKEN", lc.SenderAdminToken, called,
			"SENDER_ADMIN_TOKENS", operators, "the page's redrive button would be refused (401)", "the page's redrive button would be refused (401)")...)
	}
	return problems
}

// servedCallers reads the callers each serving service of binary accepts
// (tokensVar, through callersOf), by service name. A serving one without
// callers refuses to start; a migration serves no one and is not handed
// the tokens.
func servedCallers(d *deployment, binary, tokensVar, who string,
	callersOf func(env func(string) string) ([]auth.Credential, error)) (map[string][]auth.Credential, []string) {
	accepts := map[string][]auth.Credential{}
	var problems []string
	for _, s := range d.goServices() {
		if name, _, _ := binaryOf(s); name != binary {
			continue
		}
		callers, err := callersOf(getenvOf(s.Environment))
		if err != nil {
			continue // checkEnvironment reports it
		}
		switch {
		case isMigration(s) && len(callers) > 0:
			problems = append(problems, fmt.Sprintf("%q: %s is set, but a migration serves no one: keep the tokens out of it", s.Name, tokensVar))
		case !isMigration(s) && len(callers) == 0:
			problems = append(problems, fmt.Sprintf("%q: %s is not set: %s refuses to serve without callers", s.Name, tokensVar, who))
		case !isMigration(s):
			accepts[s.Name] = callers
		}
	}
	return accepts, problems
}

// tokenAmong checks that service's token (in tokenVar) is one the service
// it calls, called, accepts (accepts, from its tokensVar); called is ""
// when the URL names no such service, which checkServiceURLs reports.
// unset and refused say what follows when the token is missing or not
// accepted.
func tokenAmong(service, tokenVar string, token auth.Secret, called, tokensVar string, accepts map[string][]auth.Credential, unset, refused string) []string {
	switch {
	case token == "":
		return []string{fmt.Sprintf("%q: %s is not set: %s", service, tokenVar, unset)}
	case called == "":
		return nil
	case !slices.ContainsFunc(accepts[called], func(c auth.Credential) bool { return c.Token == token }):
		return []string{fmt.Sprintf("%q: %s is not among the tokens %q accepts (%s): %s", service, tokenVar, called, tokensVar, refused)}
	}
	return nil
}
