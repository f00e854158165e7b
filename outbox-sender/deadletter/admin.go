package deadletter

import (
	"encoding/base64"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/outboxref/outboxref/internal/auth"
	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/outbox"
)

// Page sizes and the bulk limit of the admin API.
const (
	DefaultPage = 50
	MaxPage     = 200
	MaxBulk     = 1000
)

// redriveModeDetail says what a redrive's mode may be.
const redriveModeDetail = "want retry (same idempotency key) or new-operation (a new key)"

// Realm is the WWW-Authenticate challenge of the operator's routes.
const Realm = `Bearer realm="outbox-sender-admin"`

// Routes adds the operator's outbox routes to the admin router, for the
// callers a names only (SENDER_ADMIN_TOKENS); a redrive is recorded as the
// caller's:
//
//	GET  /outbox?state=dead     rows, newest first, paged and filtered
//	GET  /outbox/{id}           one row, its student, keys and history
//	POST /outbox/{id}/redrive   {"mode":"retry"} or {"mode":"new-operation"}
//	POST /outbox/redrive        the same for every dead row a filter matches
//
// They show students' names and Users' errors and change rows: unlike
// /metrics and the health checks, no caller may use them unnamed.
func Routes(r chi.Router, o *Operator, a auth.Authenticator) {
	r.Group(func(r chi.Router) {
		r.Use(httpapi.Authenticate(a, Realm))
		r.Get("/outbox", httpapi.Handle(o.listHandler))
		r.Get("/outbox/{id}", httpapi.Handle(o.getHandler))
		r.Post("/outbox/{id}/redrive", httpapi.Handle(o.redriveHandler))
		r.Post("/outbox/redrive", httpapi.Handle(o.bulkHandler))
	})
}

// RowPage is one page of GET /outbox.
type RowPage struct {
	Items      []Row   `json:"items"`
	NextCursor *string `json:"next_cursor"`
}

func (o *Operator) listHandler(w http.ResponseWriter, r *http.Request) error {
	f, err := parseFilter(r.URL.RawQuery)
	if err != nil {
		return err
	}
	rows, next, err := o.List(r.Context(), f)
	if err != nil {
		return err
	}
	page := RowPage{Items: rows}
	if next != nil {
		c := formatCursor(*next)
		page.NextCursor = &c
	}
	return httpapi.WriteJSON(w, http.StatusOK, page)
}

// parseFilter reads GET /outbox's query. Every parameter may be given once;
// anything unknown is refused rather than ignored, since a mistyped filter
// would otherwise list rows the operator did not ask for.
func parseFilter(raw string) (Filter, error) {
	q, err := url.ParseQuery(raw)
	if err != nil {
		return Filter{}, httpapi.Field("query", "malformed query string")
	}
	known := []string{"state", "reason_class", "since", "until", "limit", "cursor"}
	for name, values := range q {
		if !slices.Contains(known, name) {
			return Filter{}, httpapi.Field(name, "unknown parameter; want one of "+strings.Join(known, ", "))
		}
		if len(values) > 1 {
			return Filter{}, httpapi.Field(name, "given more than once")
		}
	}
	f := Filter{State: q.Get("state"), ReasonClass: q.Get("reason_class"), Limit: DefaultPage}
	var errs []httpapi.FieldError
	bad := func(field, detail string) { errs = append(errs, httpapi.FieldError{Field: field, Detail: detail}) }
	if !slices.Contains(outbox.States, f.State) {
		bad("state", "required: one of "+strings.Join(outbox.States, ", "))
	}
	if f.ReasonClass != "" && !slices.Contains(outbox.ReasonClasses, f.ReasonClass) {
		bad("reason_class", "want one of "+strings.Join(outbox.ReasonClasses, ", "))
	}
	errs = append(errs, parseTimes(&f.Since, &f.Until, "since", q.Get("since"), "until", q.Get("until"))...)
	if v, ok := q["limit"]; ok {
		n, ok := httpapi.ParseCount(v[0])
		if !ok || n > MaxPage {
			bad("limit", fmt.Sprintf("must be a whole number from 1 to %d, written without sign or leading zeros", MaxPage))
		}
		f.Limit = int(n)
	}
	if v := q.Get("cursor"); v != "" {
		c, err := parseCursor(v)
		if err != nil {
			bad("cursor", "not a cursor returned by this API")
		}
		f.After = c
	}
	if len(errs) > 0 {
		slices.SortFunc(errs, func(a, b httpapi.FieldError) int { return strings.Compare(a.Field, b.Field) })
		return Filter{}, httpapi.Validation(errs...)
	}
	return f, nil
}

// A cursor travels as opaque base64 so clients do not come to depend on its
// form.
func formatCursor(c Cursor) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.At.UnixMicro(), 10) + "," + strconv.FormatInt(c.ID, 10)))
}

func parseCursor(s string) (Cursor, error) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return Cursor{}, err
	}
	at, id, ok := strings.Cut(string(raw), ",")
	if !ok {
		return Cursor{}, errors.New("no separator")
	}
	micros, err := strconv.ParseInt(at, 10, 64)
	if err != nil || micros < 0 || micros >= 253402300800000000 { // times we issue are 1970 to 9999
		return Cursor{}, errors.New("bad time")
	}
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil || n < 1 {
		return Cursor{}, errors.New("bad id")
	}
	return Cursor{At: time.UnixMicro(micros), ID: n}, nil
}

// rowID reads the row id in the path in its canonical form only: decimal
// digits without sign or leading zeros, as the API writes it. ParseInt
// alone would also take "+7" and "007", giving one row several URLs (see
// httpapi.ParseUUID for the services' ids).
func rowID(r *http.Request) (int64, error) {
	id, ok := httpapi.ParseCount(chi.URLParam(r, "id"))
	if !ok {
		return 0, httpapi.Field("id", "must be a positive whole number, written without sign or leading zeros")
	}
	return id, nil
}

// answer turns the operator's errors into problems.
func answer(err error, id int64) error {
	switch {
	case errors.Is(err, ErrNotFound):
		return httpapi.NotFound(fmt.Sprintf("outbox row %d", id))
	case errors.Is(err, ErrNotDead):
		return httpapi.NewProblem(httpapi.TypeOutboxRowNotDead, fmt.Sprintf("outbox row %d cannot be redriven: %v", id, err))
	case errors.Is(err, ErrNewKeyUnsafe):
		return httpapi.NewProblem(httpapi.TypeNewKeyUnsafe,
			fmt.Sprintf("outbox row %d: %v; redrive with retry, or check Users for the row's keys and send \"force\": true", id, err))
	case errors.Is(err, ErrKeyMayBeForgotten):
		return httpapi.NewProblem(httpapi.TypeKeyMayBeForgotten,
			fmt.Sprintf("outbox row %d: %v; look in Users for the student's user, and when no user holds its document number send \"force\": true", id, err))
	case errors.Is(err, ErrRedriveLimit):
		return httpapi.NewProblem(httpapi.TypeRedriveLimit,
			fmt.Sprintf("outbox row %d stays dead: %v; read its history for the cause", id, err))
	case errors.Is(err, ErrRowBusy):
		p := httpapi.NewProblem(httpapi.TypeOutboxRowBusy, fmt.Sprintf("outbox row %d is locked by another transaction; nothing changed", id))
		p.RetryAfter = time.Second
		return p
	}
	return err
}

// requireJSON refuses a body sent as anything but JSON. The admin routes
// change state, and a browser can send a cross-site POST of another type
// without asking first.
func requireJSON(r *http.Request) error {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return httpapi.NewProblem(httpapi.TypeUnsupportedMediaType, "send the body as application/json")
	}
	return nil
}

func (o *Operator) getHandler(w http.ResponseWriter, r *http.Request) error {
	id, err := rowID(r)
	if err != nil {
		return err
	}
	row, err := o.Get(r.Context(), id)
	if err != nil {
		return answer(err, id)
	}
	return httpapi.WriteJSON(w, http.StatusOK, row)
}

// redriveRequest is the body of POST /outbox/{id}/redrive.
type redriveRequest struct {
	Mode  *string `json:"mode"`
	Force bool    `json:"force"`
}

func checkMode(mode *string) *httpapi.FieldError {
	switch {
	case mode == nil:
		return &httpapi.FieldError{Field: "mode", Detail: "required: " + redriveModeDetail}
	case *mode != outbox.RedriveRetry && *mode != outbox.RedriveNewOperation:
		return &httpapi.FieldError{Field: "mode", Detail: redriveModeDetail}
	}
	return nil
}

func (o *Operator) redriveHandler(w http.ResponseWriter, r *http.Request) error {
	id, err := rowID(r)
	if err != nil {
		return err
	}
	if err := requireJSON(r); err != nil {
		return err
	}
	var req redriveRequest
	if err := httpapi.DecodeJSON(w, r, &req); err != nil {
		return err
	}
	if fe := checkMode(req.Mode); fe != nil {
		return httpapi.Validation(*fe)
	}
	done, err := o.Redrive(r.Context(), id, *req.Mode, req.Force)
	if err != nil {
		return answer(err, id)
	}
	return httpapi.WriteJSON(w, http.StatusOK, done)
}

// bulkRequest is the body of POST /outbox/redrive.
type bulkRequest struct {
	Mode        *string `json:"mode"`
	ReasonClass string  `json:"reason_class"`
	DeadSince   string  `json:"dead_since"`
	DeadUntil   string  `json:"dead_until"`
	Max         *int    `json:"max"`
	DryRun      bool    `json:"dry_run"`
	Force       bool    `json:"force"`
}

func (o *Operator) bulkHandler(w http.ResponseWriter, r *http.Request) error {
	if err := requireJSON(r); err != nil {
		return err
	}
	var req bulkRequest
	if err := httpapi.DecodeJSON(w, r, &req); err != nil {
		return err
	}
	f := BulkFilter{ReasonClass: req.ReasonClass, Max: 100, DryRun: req.DryRun, Force: req.Force}
	var errs []httpapi.FieldError
	if fe := checkMode(req.Mode); fe != nil {
		errs = append(errs, *fe)
	} else {
		f.Mode = *req.Mode
	}
	if f.ReasonClass != "" && !slices.Contains(outbox.ReasonClasses, f.ReasonClass) {
		errs = append(errs, httpapi.FieldError{Field: "reason_class", Detail: "want one of " + strings.Join(outbox.ReasonClasses, ", ")})
	}
	errs = append(errs, parseTimes(&f.DeadSince, &f.DeadUntil, "dead_since", req.DeadSince, "dead_until", req.DeadUntil)...)
	if req.Max != nil {
		if *req.Max < 1 || *req.Max > MaxBulk {
			errs = append(errs, httpapi.FieldError{Field: "max", Detail: fmt.Sprintf("must be from 1 to %d", MaxBulk)})
		}
		f.Max = *req.Max
	}
	if len(errs) > 0 {
		return httpapi.Validation(errs...)
	}
	res, err := o.RedriveMatching(r.Context(), f)
	if err != nil {
		return err
	}
	return httpapi.WriteJSON(w, http.StatusOK, res)
}

// parseTimes reads an optional RFC 3339 time range; since must come before
// until.
func parseTimes(since, until *time.Time, sinceName, sinceValue, untilName, untilValue string) []httpapi.FieldError {
	var errs []httpapi.FieldError
	for _, t := range []struct {
		name, value string
		dst         *time.Time
	}{{sinceName, sinceValue, since}, {untilName, untilValue, until}} {
		if t.value == "" {
			continue
		}
		v, err := time.Parse(time.RFC3339, t.value)
		if err != nil {
			errs = append(errs, httpapi.FieldError{Field: t.name, Detail: "want an RFC 3339 time such as 2026-12-03T08:00:00Z"})
			continue
		}
		*t.dst = v
	}
	if len(errs) == 0 && !since.IsZero() && !until.IsZero() && !since.Before(*until) {
		errs = append(errs, httpapi.FieldError{Field: untilName, Detail: "must be after " + sinceName})
	}
	return errs
}
