package httpapi

import (
	"bytes"
	"html/template"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
)

// ProblemType is one kind of problem: what its type URI says, and the page
// the URI resolves to.
type ProblemType struct {
	URI    string // the problem's "type", such as /problems/validation
	Title  string // the problem's "title"; the same for every occurrence (RFC 9457 §3.1.4)
	Status int    // the status it is sent with
	About  string // what happened
	Action string // what the client should do about it
}

// problemTypes is every problem type the project sends. A type is added
// here, with its page, before any code may send it: NewProblem panics on a
// type it does not know, and TestEveryProblemTypeResolves fails on a type
// URI written anywhere in the code without an entry.
var problemTypes = []ProblemType{
	{
		URI: TypeValidation, Title: "Invalid request", Status: http.StatusBadRequest,
		About: "The request cannot be carried out as sent: a field of the body, a query parameter, a path " +
			"segment or a header is missing, malformed, repeated or out of range. The problem's errors list " +
			"names each one (field) and says what is wrong (detail); body means the body as a whole. " +
			"Nothing was written and an Idempotency-Key sent with the request was not used.",
		Action: "Correct the fields named in errors and send the request again; sending it unchanged will fail the same way.",
	},
	{
		URI: TypeUnauthorized, Title: "Unauthorized", Status: http.StatusUnauthorized,
		About: "The request's credentials are missing or were not accepted; the WWW-Authenticate header says " +
			"which scheme the service expects. Nothing was read or written.",
		Action: "Send the request with credentials the service accepts, in the scheme WWW-Authenticate names.",
	},
	{
		URI: TypeForbidden, Title: "Forbidden", Status: http.StatusForbidden,
		About: "The request came in a way the service does not take: the fault lab answers only to the host names " +
			"it was told (loopback and LAB_ALLOWED_HOSTS), and changes nothing for another site's page. Nothing was read or written.",
		Action: "Open the page through an allowed name, such as http://localhost:8084, or add the name to LAB_ALLOWED_HOSTS.",
	},
	{
		URI: TypeNotFound, Title: "Not found", Status: http.StatusNotFound,
		About:  "No route matches the request's path, or the resource the path names does not exist.",
		Action: "Check the path and the id in it; an id the service handed out stays valid.",
	},
	{
		URI: TypeMethodNotAllowed, Title: "Method not allowed", Status: http.StatusMethodNotAllowed,
		About:  "The path exists, but not with the request's method. The Allow header lists the methods it has.",
		Action: "Use one of the methods in the Allow header.",
	},
	{
		URI: TypeRequestTimeout, Title: "Request timeout", Status: http.StatusRequestTimeout,
		About: "The request's body did not arrive in time: the server gives a request " + ReadTimeout.String() +
			" from its first byte to its last. The connection is closed. Nothing was written, and an Idempotency-Key " +
			"sent with the request was not used.",
		Action: "Send the request again, whole; if it keeps happening, look at what slows the client or the network.",
	},
	{
		URI: TypeUnsupportedMediaType, Title: "Unsupported media type", Status: http.StatusUnsupportedMediaType,
		About:  "The request's body was sent as something other than JSON (its Content-Type).",
		Action: "Send the body as JSON with Content-Type: application/json.",
	},
	{
		URI: TypeIdempotencyMismatch, Title: "Idempotency key reused with a different request", Status: http.StatusUnprocessableEntity,
		About: "The Idempotency-Key was first used with a request whose fields differ from this one's; errors names " +
			"the fields that differ (never their values). Nothing changed.",
		Action: "Use a new key for a new request. To repeat the first request, send it exactly as before.",
	},
	{
		URI: TypeIdempotencyBusy, Title: "Idempotency key in use", Status: http.StatusConflict,
		About:  "Another request with the same Idempotency-Key is still being processed.",
		Action: "Retry after the Retry-After header's seconds, with the same key: you get the first request's answer.",
	},
	{
		URI: TypeDocumentTaken, Title: "Document number already in use", Status: http.StatusConflict,
		About: "Another record already has this document number, and the business rule allows one. With an " +
			"Idempotency-Key the refusal is stored: a repeat of the key gets it again.",
		Action: "Do not retry: correct the document number or resolve the other record first, then send with a new key.",
	},
	{
		URI: TypeInternal, Title: "Internal server error", Status: http.StatusInternalServerError,
		About: "The service failed in a way it did not expect. The cause is in the service's log, " +
			"on the request's line; it is never sent.",
		Action: "Retrying with the same Idempotency-Key is safe. If it persists, report it with the time of the request.",
	},
	{
		URI: TypeUnavailable, Title: "Service unavailable", Status: http.StatusServiceUnavailable,
		About: "Something the answer needs is down or did not answer in time (the detail says what, such as the " +
			"database), or a conflicting request still holds a lock. Nothing was stored and an Idempotency-Key " +
			"sent with the request was not used.",
		Action: "Retry after the Retry-After header's seconds, with the same Idempotency-Key.",
	},
	{
		URI: TypeOutboxRowNotDead, Title: "Outbox row is not dead", Status: http.StatusConflict,
		About:  "Only a dead-lettered outbox row can be redriven; this one is pending, published (its command waits in the broker) or delivered.",
		Action: "Nothing to do: the sender is still working on the row, or already delivered it.",
	},
	{
		URI: TypeNewKeyUnsafe, Title: "A new key could create a second user", Status: http.StatusConflict,
		About: "The row's old idempotency key may already have created a user (its answer was lost or never " +
			"judged), so redriving it with a new key could create a second one.",
		Action: "Redrive with retry, or look the row's keys up in Users' inbox and, when none created a user, " +
			"send \"force\": true.",
	},
	{
		URI: TypeKeyMayBeForgotten, Title: "The key may be forgotten before a retry ends", Status: http.StatusConflict,
		About: "A retry sends the row's idempotency key again, for another SENDER_MAX_AGE. This key was minted " +
			"longer ago than USERS_INBOX_RETENTION minus SENDER_MAX_AGE, so Users may forget it before the retry " +
			"ends, and a key Users forgot looks new: if it created the user, the retry would create a second one.",
		Action: "Look in Users for a user with the student's name, email and document number: if one exists, the " +
			"operation happened (link it by hand; no redrive does). If no user holds the document number, redrive " +
			"with \"force\": true.",
	},
	{
		URI: TypeRedriveLimit, Title: "Redrive limit reached", Status: http.StatusConflict,
		About: "The row has been redriven as many times as SENDER_MAX_REDRIVES allows, and stays dead. Each " +
			"redrive with a new key leaves one more key in Users' inbox; a row that keeps dying has a cause " +
			"a redrive does not fix.",
		Action: "Read the row's history (GET /outbox/{id}) and fix the cause. To try again after that, raise " +
			"SENDER_MAX_REDRIVES.",
	},
	{
		URI: TypeOutboxRowBusy, Title: "Outbox row is busy", Status: http.StatusConflict,
		About:  "Another transaction holds the row's lock (another redrive, or a session of an operator's), so it was left as it was.",
		Action: "Retry after the Retry-After header's seconds.",
	},
}

// LookupProblemType returns the registered type with the given URI.
func LookupProblemType(uri string) (ProblemType, bool) {
	for _, pt := range problemTypes {
		if pt.URI == uri {
			return pt, true
		}
	}
	return ProblemType{}, false
}

// ProblemTypes lists every registered problem type.
func ProblemTypes() []ProblemType {
	return append([]ProblemType(nil), problemTypes...)
}

// NewProblem returns a problem of a registered type, with its title and
// status. An unregistered type is a programming error: it panics, and the
// package's tests make sure no such call is left.
func NewProblem(typ, detail string) *Problem {
	pt, ok := LookupProblemType(typ)
	if !ok {
		panic("httpapi: problem type " + typ + " is not registered in problemTypes")
	}
	return &Problem{Type: pt.URI, Title: pt.Title, Status: pt.Status, Detail: detail}
}

var problemPage = template.Must(template.New("problem").Parse(`<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>{{.Title}}</title></head>
<body>
<h1>{{.Title}}</h1>
<p>Problem type <code>{{.URI}}</code>, sent with HTTP status <code>{{.Status}}</code> as <code>application/problem+json</code> (RFC 9457).</p>
<h2>What happened</h2>
<p>{{.About}}</p>
<h2>What to do</h2>
<p>{{.Action}}</p>
<p><a href="/problems">Every problem type</a></p>
</body>
</html>
`))

var problemIndex = template.Must(template.New("index").Parse(`<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Problem types</title></head>
<body>
<h1>Problem types</h1>
<p>Every error answer is <code>application/problem+json</code> (RFC 9457); its <code>type</code> is one of these.</p>
<ul>
{{range .}}<li><a href="{{.URI}}">{{.URI}}</a>: {{.Status}} {{.Title}}</li>
{{end}}</ul>
</body>
</html>
`))

// problemPages serves /problems, the list of types, and /problems/{slug},
// the page of one type, so that a problem's type URI, resolved against the
// URL of the request that got it, leads to what it means.
func problemPages(r chi.Router) {
	r.Get("/problems", Handle(func(w http.ResponseWriter, _ *http.Request) error {
		return writePage(w, problemIndex, problemTypes)
	}))
	r.Get("/problems/{slug}", Handle(func(w http.ResponseWriter, r *http.Request) error {
		slug := chi.URLParam(r, "slug")
		pt, ok := LookupProblemType("/problems/" + slug)
		if !ok || strings.Contains(slug, "/") {
			return NewProblem(TypeNotFound, "no problem type /problems/"+slug)
		}
		return writePage(w, problemPage, pt)
	}))
}

// writePage renders a static page. The pages hold no script and load
// nothing, and the headers say so to the browser.
func writePage(w http.ResponseWriter, t *template.Template, data any) error {
	var b bytes.Buffer
	if err := t.Execute(&b, data); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "public, max-age=3600")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b.Bytes())
	return nil
}
