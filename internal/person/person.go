// Package person owns the fields both services accept for a person (name,
// email, document number): the validation rules, and the canonical form used
// to fingerprint a request. It is a leaf: it knows nothing of HTTP, the
// database or the inbox. Student and Users apply the same rules
// so that anything Student accepts, Users accepts too: a row the sender could
// never deliver would otherwise sit in the outbox until it dead-letters.
package person

import (
	"fmt"
	"net/mail"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits on each field, in characters.
const (
	MaxName     = 200
	MaxEmail    = 254 // RFC 5321's limit on a forward path
	MinDocument = 3
	MaxDocument = 32
)

// Person is a validated set of fields.
type Person struct {
	Name           string `json:"name"`
	Email          string `json:"email"`
	DocumentNumber string `json:"document_number"`
}

// Input is a person as a client sent it; a nil field was missing, which is
// told apart from an empty one.
type Input struct {
	Name           *string `json:"name"`
	Email          *string `json:"email"`
	DocumentNumber *string `json:"document_number"`
}

// FieldError names one field and what is wrong with it.
type FieldError struct {
	Field, Detail string
}

// InvalidError lists every field at fault, in the order of Person's fields.
type InvalidError struct{ Fields []FieldError }

func (e *InvalidError) Error() string {
	parts := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		parts[i] = f.Field + " " + f.Detail
	}
	return "invalid person: " + strings.Join(parts, "; ")
}

// Validate trims the fields and checks them. Every field at fault is named
// in one *InvalidError.
func (in Input) Validate() (Person, error) {
	var (
		p    Person
		errs []FieldError
	)
	field := func(name string, v *string, check func(string) string) string {
		if v == nil {
			errs = append(errs, FieldError{Field: name, Detail: "required"})
			return ""
		}
		s := strings.TrimSpace(*v)
		if s == "" {
			errs = append(errs, FieldError{Field: name, Detail: "must not be empty"})
			return ""
		}
		if why := check(s); why != "" {
			errs = append(errs, FieldError{Field: name, Detail: why})
		}
		return s
	}
	p.Name = field("name", in.Name, checkName)
	p.Email = field("email", in.Email, checkEmail)
	p.DocumentNumber = field("document_number", in.DocumentNumber, checkDocument)
	if len(errs) > 0 {
		return Person{}, &InvalidError{Fields: errs}
	}
	return p, nil
}

func checkName(s string) string {
	if utf8.RuneCountInString(s) > MaxName {
		return "must be at most 200 characters"
	}
	if why := checkInvisible(s, true); why != "" {
		return why
	}
	for _, r := range s {
		if unicode.Is(blank, r) {
			return fmt.Sprintf("must not contain characters that display as blank (U+%04X)", r)
		}
	}
	// What is left shows something; a name also needs something to read.
	if !strings.ContainsFunc(s, unicode.IsLetter) {
		return "must contain a letter"
	}
	return ""
}

// blank are the characters that display as nothing, or as a space, but
// are neither format characters (Cf) nor spaces, so the rules above let
// them through: the Hangul fillers (letters, U+115F, U+1160, U+3164,
// U+FFA0), the blank braille pattern (a symbol, U+2800), the combining
// grapheme joiner (a mark, U+034F), the Khmer inherent vowels (U+17B4,
// U+17B5) and the Mongolian variation selectors (U+180B to U+180D,
// U+180F). A name of them alone would look empty, and inside a name they
// make two names that look the same differ.
var blank = &unicode.RangeTable{
	R16: []unicode.Range16{
		{Lo: 0x034f, Hi: 0x034f, Stride: 1},
		{Lo: 0x115f, Hi: 0x1160, Stride: 1},
		{Lo: 0x17b4, Hi: 0x17b5, Stride: 1},
		{Lo: 0x180b, Hi: 0x180d, Stride: 1},
		{Lo: 0x180f, Hi: 0x180f, Stride: 1},
		{Lo: 0x2800, Hi: 0x2800, Stride: 1},
		{Lo: 0x3164, Hi: 0x3164, Stride: 1},
		{Lo: 0xffa0, Hi: 0xffa0, Stride: 1},
	},
}

// checkInvisible refuses control characters (category Cc), line and
// paragraph separators (a name is one line), and format characters (Cf):
// bidirectional overrides and isolates such as U+202E, which make text
// display in another order than it is stored, zero-width spaces (U+200B),
// the byte order mark (U+FEFF), the soft hyphen. They are invisible or
// rearrange what is shown, so two names that look the same could differ,
// and a name could disguise what follows it in a log or a list.
//
// With joiners, a name keeps the zero-width non-joiner and joiner (U+200C,
// U+200D) between two letters or marks, where Persian and several Indic
// scripts need them to spell a name; elsewhere (leading, trailing, doubled,
// beside a space) they only hide something. RFC 5892's CONTEXTJ rule for
// domain names is the model, simplified.
func checkInvisible(s string, joiners bool) string {
	runes := []rune(s)
	for i, r := range runes {
		switch {
		case unicode.IsControl(r):
			return fmt.Sprintf("must not contain control characters (U+%04X)", r)
		case unicode.In(r, unicode.Zl, unicode.Zp):
			return fmt.Sprintf("must not contain line or paragraph separators (U+%04X)", r)
		case unicode.Is(unicode.Cf, r):
			if joiners && (r == zwnj || r == zwj) && i > 0 && i+1 < len(runes) && letterOrMark(runes[i-1]) && letterOrMark(runes[i+1]) {
				continue
			}
			return fmt.Sprintf("must not contain invisible formatting characters (U+%04X)", r)
		}
	}
	return ""
}

const (
	zwnj = '\u200c' // zero-width non-joiner
	zwj  = '\u200d' // zero-width joiner
)

func letterOrMark(r rune) bool { return unicode.IsLetter(r) || unicode.IsMark(r) }

func checkEmail(s string) string {
	if len(s) > MaxEmail {
		return "must be at most 254 characters"
	}
	// net/mail takes any non-ASCII character in an address (RFC 6532);
	// an invisible one would make two addresses that look the same.
	if why := checkInvisible(s, false); why != "" {
		return why
	}
	a, err := mail.ParseAddress(s)
	if err != nil || a.Address != s || a.Name != "" {
		return "must be a plain address such as ada@example.com"
	}
	return ""
}

func checkDocument(s string) string {
	if len(s) < MinDocument || len(s) > MaxDocument {
		return "must be 3 to 32 characters"
	}
	for i := range len(s) {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c == '.' || c == '-' || c == '/') {
			return "may hold only letters, digits, '.', '-' and '/'"
		}
	}
	return ""
}

// Fields is the canonical form of the person, field name to value: what
// an idempotency key's fingerprint is taken of.
func (p Person) Fields() map[string]string {
	return map[string]string{"name": p.Name, "email": p.Email, "document_number": p.DocumentNumber}
}
