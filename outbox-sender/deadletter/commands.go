package deadletter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/outboxref/internal/httpapi"
	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/internal/service"
)

// deadUsage is the help of the "dead" subcommands: the admin API's routes
// for a person inside `docker compose exec outbox-sender`, working on the
// database directly, so they work while no sender runs.
const deadUsage = `usage:
  outbox-sender dead list [--state dead|pending|published|delivered] [--reason-class C] [--since T] [--until T] [--limit N] [--cursor C]
  outbox-sender dead show ID
  outbox-sender dead redrive ID --mode retry|new-operation [--force]
  outbox-sender dead redrive-all --mode retry|new-operation [--reason-class C] [--since T] [--until T] [--max N] [--dry-run] [--force]
Times are RFC 3339 (2026-12-03T08:00:00Z); reason classes: ` + "%s"

// Command runs "outbox-sender dead ...", on the database directly, each
// call's work bounded by timeout (SENDER_DATABASE_TIMEOUT). Redrives are
// recorded as the person at this host's command line.
func Command(timeout time.Duration, maxRedrives int, keyWindow time.Duration) service.Command {
	run := command(timeout, maxRedrives, keyWindow)
	return func(ctx context.Context, pool *pgxpool.Pool, args []string, stdout io.Writer) error {
		if err := run(ctx, pool, args, stdout); err != nil {
			return inertError{dialled(pool, err)}
		}
		return nil
	}
}

// dialled adds to a failure to connect which database the command dialled,
// as whom, and where that came from. Without it, the default URL reaching
// some other server on localhost:5432 reads as a problem with the role:
// `role "outbox_sender" does not exist`. The password is never shown.
func dialled(pool *pgxpool.Pool, err error) error {
	if _, ok := errors.AsType[*pgconn.ConnectError](err); !ok {
		return err
	}
	cc := pool.Config().ConnConfig
	u := url.URL{Scheme: "postgres", User: url.User(cc.User), Host: net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))), Path: "/" + cc.Database}
	password := "no password"
	if cc.Password != "" {
		u.User, password = url.UserPassword(cc.User, "xxxxx"), "a password"
	}
	return fmt.Errorf("%w\ndialled %s, with %s: the database and login come from SENDER_DATABASE_URL, the password from it or SENDER_DATABASE_PASSWORD (make run prints the URL as SDB)",
		err, u.String(), password)
}

// inertError is an error of the command's as the terminal will show it:
// its messages quote the arguments, which may hold escape sequences.
type inertError struct{ err error }

func (e inertError) Error() string { return escapeControls(e.err.Error(), true) }
func (e inertError) Unwrap() error { return e.err }

func command(timeout time.Duration, maxRedrives int, keyWindow time.Duration) service.Command {
	return func(ctx context.Context, pool *pgxpool.Pool, args []string, stdout io.Writer) error {
		o := New(pool, cliActor(), timeout)
		o.MaxRedrives = maxRedrives
		o.KeyWindow = keyWindow
		usage := fmt.Errorf(deadUsage, strings.Join(outbox.ReasonClasses, ", "))
		if len(args) == 0 {
			return usage
		}
		// Asked for, the usage is the answer, on stdout; an error anywhere
		// below adds it to the message instead.
		if slices.ContainsFunc(args, isHelp) {
			_, err := fmt.Fprintln(stdout, usage.Error())
			return err
		}
		switch args[0] {
		case "list":
			return o.listCommand(ctx, args[1:], stdout)
		case "show":
			id, rest, err := idArg(args[1:])
			if err == nil && len(rest) > 0 {
				err = fmt.Errorf("unexpected arguments %q", rest)
			}
			if err != nil {
				return errors.Join(err, usage)
			}
			row, err := o.Get(ctx, id)
			if err != nil {
				return err
			}
			return printJSON(stdout, row)
		case "redrive":
			id, rest, err := idArg(args[1:])
			if err != nil {
				return errors.Join(err, usage)
			}
			fs := newFlags("dead redrive")
			mode := fs.String("mode", "", "retry or new-operation")
			force := fs.Bool("force", false, "new-operation even where the old key may have created a user; retry even where Users may forget the key")
			if err := parseFlags(fs, rest); err != nil {
				return errors.Join(err, usage)
			}
			if fe := checkMode(mode); fe != nil {
				return flagError(*fe)
			}
			done, err := o.Redrive(ctx, id, *mode, *force)
			if err != nil {
				return err
			}
			return printJSON(stdout, done)
		case "redrive-all":
			return o.bulkCommand(ctx, args[1:], stdout)
		}
		return usage
	}
}

// isHelp says whether arg asks for the usage.
func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

// idArg reads the row id in the form the API writes it, as GET
// /outbox/{id} does: "007" and "+7" are not ids.
func idArg(args []string) (int64, []string, error) {
	if len(args) == 0 {
		return 0, nil, errors.New("the outbox row's id is missing")
	}
	id, ok := httpapi.ParseCount(args[0])
	if !ok {
		return 0, nil, fmt.Errorf("outbox row id %q: want a positive whole number, written without sign or leading zeros", args[0])
	}
	return id, args[1:], nil
}

func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// once is a flag that may be given once. The flag package lets a later
// value replace an earlier one, so "--reason-class a --reason-class b"
// would quietly act on b: for a command that redrives rows, a typo's
// guess is worse than a refusal.
type once struct {
	flag.Value
	set bool
}

func (o *once) Set(v string) error {
	if o.set {
		return errors.New("given twice; give each flag once")
	}
	o.set = true
	return o.Value.Set(v)
}

// IsBoolFlag keeps "--force" and "--dry-run" working without a value.
func (o *once) IsBoolFlag() bool {
	b, ok := o.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// parseFlags parses args, which must hold flags only, each at most once.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.VisitAll(func(f *flag.Flag) { f.Value = &once{Value: f.Value} })
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%s: %w", fs.Name(), err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected arguments %q", fs.Name(), fs.Args())
	}
	return nil
}

// flagError says what the admin API would say of a field, naming the flag.
func flagError(fields ...httpapi.FieldError) error {
	errs := make([]error, len(fields))
	for i, f := range fields {
		errs[i] = fmt.Errorf("--%s: %s", strings.ReplaceAll(f.Field, "_", "-"), f.Detail)
	}
	return errors.Join(errs...)
}

// fieldErrors turns a validation problem into flag errors; other errors
// pass through.
func fieldErrors(err error) error {
	var p *httpapi.Problem
	if errors.As(err, &p) && len(p.Errors) > 0 {
		return flagError(p.Errors...)
	}
	return err
}

// listCommand checks its flags with the admin API's own parser, so the
// command line and GET /outbox accept exactly the same filters.
func (o *Operator) listCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("dead list")
	q := url.Values{}
	for _, f := range []struct{ flag, param, def, usage string }{
		{"state", "state", "dead", "the rows in this state: " + strings.Join(outbox.States, ", ")},
		{"reason-class", "reason_class", "", "only rows of this reason class"},
		{"since", "since", "", "state reached at or after this time"},
		{"until", "until", "", "state reached before this time"},
		{"limit", "limit", strconv.Itoa(DefaultPage), "at most this many rows"},
		{"cursor", "cursor", "", "the next page, as the previous page printed it"},
	} {
		fs.Func(f.flag, f.usage, func(v string) error { q.Set(f.param, v); return nil })
		if f.def != "" {
			q.Set(f.param, f.def)
		}
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	filter, err := parseFilter(q.Encode())
	if err != nil {
		return fieldErrors(err)
	}
	rows, next, err := o.List(ctx, filter)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tSINCE\tATTEMPTS\tREDRIVES\tREASON\tSTUDENT\tLAST ERROR")
	for _, r := range rows {
		since := r.CreatedAt
		switch {
		case r.DeadAt != nil:
			since = *r.DeadAt
		case r.DeliveredAt != nil:
			since = *r.DeliveredAt
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", r.ID, r.State, since.UTC().Format(time.RFC3339),
			r.Attempts, r.Redrives, deref(r.ReasonClass), r.Student.ID, shorten(escapeControls(deref(r.LastError), false), 80))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if next != nil {
		fmt.Fprintf(stdout, "more rows: add --cursor %s\n", formatCursor(*next))
	}
	return nil
}

func (o *Operator) bulkCommand(ctx context.Context, args []string, stdout io.Writer) error {
	f := BulkFilter{}
	fs := newFlags("dead redrive-all")
	mode := fs.String("mode", "", "retry or new-operation")
	fs.StringVar(&f.ReasonClass, "reason-class", "", "only rows of this reason class")
	since := fs.String("since", "", "dead at or after this time")
	until := fs.String("until", "", "dead before this time")
	fs.IntVar(&f.Max, "max", 100, "at most this many rows, oldest death first")
	fs.BoolVar(&f.DryRun, "dry-run", false, "say what would be redriven, change nothing")
	fs.BoolVar(&f.Force, "force", false, "new-operation even where the old key may have created a user; retry even where Users may forget the key")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var errs []httpapi.FieldError
	if fe := checkMode(mode); fe != nil {
		errs = append(errs, *fe)
	} else {
		f.Mode = *mode
	}
	if f.ReasonClass != "" && !slices.Contains(outbox.ReasonClasses, f.ReasonClass) {
		errs = append(errs, httpapi.FieldError{Field: "reason_class", Detail: "want one of " + strings.Join(outbox.ReasonClasses, ", ")})
	}
	errs = append(errs, parseTimes(&f.DeadSince, &f.DeadUntil, "since", *since, "until", *until)...)
	if f.Max < 1 || f.Max > MaxBulk {
		errs = append(errs, httpapi.FieldError{Field: "max", Detail: fmt.Sprintf("must be from 1 to %d", MaxBulk)})
	}
	if len(errs) > 0 {
		return flagError(errs...)
	}
	res, err := o.RedriveMatching(ctx, f)
	if err != nil {
		return err
	}
	if err := printJSON(stdout, res); err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, o.skippedLine(res))
	return err
}

// skippedLine says what a bulk redrive passed by, and what the operator
// can do about each: the reasons of the mode it ran in (the other mode's
// reason never holds).
func (o *Operator) skippedLine(b Bulk) string {
	guard := fmt.Sprintf("%d whose key Users may forget before a retry ends (minted over %s ago: "+
		"look in Users for the student's user; if none holds the document number, --force)", b.Skipped.KeyMayBeForgotten, o.KeyWindow)
	if b.Mode == outbox.RedriveNewOperation {
		guard = fmt.Sprintf("%d whose old key may have created a user (--mode retry, or check Users for the row's keys, then --force)",
			b.Skipped.NewKeyUnsafe)
	}
	return fmt.Sprintf("skipped: %d at the redrive limit (SENDER_MAX_REDRIVES=%d: read the row's history with dead show, fix the cause, raise the limit), "+
		"%s, %d busy (locked by another transaction: run again)", b.Skipped.RedriveLimit, o.MaxRedrives, guard, b.Skipped.Busy)
}

// printJSON prints v as indented JSON. encoding/json escapes C0 controls
// but writes DEL, the C1 controls (U+0080 to U+009F) and format characters
// as they are; a terminal takes U+009B as the start of an escape sequence,
// and a bidi override reorders what follows it. So those are escaped too. last_error holds what Users (or whatever answered in its
// place) sent: it must not reach the operator's terminal raw.
func printJSON(w io.Writer, v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	var out strings.Builder
	for _, r := range b.String() {
		if r == 0x7f || (r >= 0x80 && r <= 0x9f) || unicode.Is(unicode.Cf, r) {
			fmt.Fprintf(&out, `\u%04x`, r)
			continue
		}
		out.WriteRune(r)
	}
	_, err := io.WriteString(w, out.String())
	return err
}

// escapeControls writes the characters of s a terminal would act on rather
// than show (controls, such as ESC and line breaks, and format characters)
// as Go escapes, so that a line of the list stays one line of text. With
// lines, line breaks and tabs are kept (a multi-line usage message).
func escapeControls(s string, lines bool) string {
	var out strings.Builder
	for _, r := range s {
		switch {
		case lines && (r == '\n' || r == '\t'):
			out.WriteRune(r)
		case r == utf8.RuneError:
			out.WriteString(`\ufffd`)
		case unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029':
			q := strconv.QuoteRune(r)
			out.WriteString(q[1 : len(q)-1])
		default:
			out.WriteRune(r)
		}
	}
	return out.String()
}

func shorten(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// cliActor names a person at the command line in the rows' histories.
func cliActor() string {
	host, _ := os.Hostname()
	return "cli@" + host
}
