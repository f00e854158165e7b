package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxBodyBytes bounds every request body; the services accept small JSON
// objects only.
const MaxBodyBytes = 16 << 10

// DecodeJSON reads one JSON object from the body into dst, a pointer to a
// struct. Unknown fields (including a known name in another case, which
// encoding/json would quietly accept), repeated fields, text that is not
// valid UTF-8, trailing data, wrong types and oversized bodies are problems
// naming the field (or "body" when no field is to blame). A body that stops
// arriving before the server's ReadTimeout is a 408.
func DecodeJSON(w http.ResponseWriter, r *http.Request, dst any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return NewProblem(TypeUnsupportedMediaType, "send the body as application/json")
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		return decodeProblem(err)
	}
	return DecodeBody(body, dst)
}

// DecodeBody is DecodeJSON for a body that came another way than HTTP (a
// command on the broker), with the same rules and the same problems.
func DecodeBody(body []byte, dst any) error {
	if len(body) > MaxBodyBytes {
		return decodeProblem(&http.MaxBytesError{Limit: MaxBodyBytes})
	}
	if err := checkText(body); err != nil {
		return err
	}
	if err := checkKeys(body, jsonNames(dst)); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(dst); err != nil {
		return decodeProblem(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Field("body", "unexpected data after the JSON object")
	}
	return nil
}

// checkKeys walks the top level of a JSON object and rejects any key that
// is not exactly one of names, and any key given twice. Anything that is not
// an object is left to the decoder, which reports it precisely.
func checkKeys(body []byte, names []string) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		key, _ := tok.(string)
		switch {
		case !slices.Contains(names, key):
			return Field(key, "unknown field")
		case seen[key]:
			return Field(key, "given more than once")
		}
		seen[key] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	return nil
}

// jsonNames lists the JSON names of the fields of the struct dst points to.
func jsonNames(dst any) []string {
	t := reflect.TypeOf(dst).Elem()
	names := make([]string, 0, t.NumField())
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			name = f.Name
		}
		if name != "-" {
			names = append(names, name)
		}
	}
	return names
}

// checkText refuses a body that is not valid UTF-8, or that escapes half a
// UTF-16 surrogate pair (such as "\udc00"): encoding/json would quietly
// turn either into U+FFFD, and the service would store text the client
// never sent. It names the top-level field whose value is at fault, or
// "body" when the fault is in a key or outside any field.
func checkText(body []byte) error {
	if validText(body) {
		return nil
	}
	return Field(badTextField(body), "not valid UTF-8 text")
}

func validText(b []byte) bool {
	return utf8.Valid(b) && !hasLoneSurrogate(b)
}

// hasLoneSurrogate reports whether b holds a \u escape of a surrogate that
// is not the high half of a pair followed by its low half.
func hasLoneSurrogate(b []byte) bool {
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' || i+1 == len(b) {
			continue
		}
		if b[i+1] != 'u' {
			i++ // skip the escaped character, which may be a backslash
			continue
		}
		r, ok := hex4(b, i+2)
		switch {
		case !ok || r < 0xd800 || r > 0xdfff:
			i += 5 // not a surrogate: skip the escape
		case r >= 0xdc00:
			return true // a low half with no high half before it
		default:
			if i+8 > len(b) || b[i+6] != '\\' || b[i+7] != 'u' {
				return true
			}
			if low, ok := hex4(b, i+8); !ok || low < 0xdc00 || low > 0xdfff {
				return true
			}
			i += 11
		}
	}
	return false
}

// hex4 reads the four hex digits of a \u escape at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b[i:i+4]), 16, 16)
	return rune(n), err == nil
}

// badTextField names the top-level field whose value holds the invalid
// text, or "body".
func badTextField(body []byte) string {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "body"
	}
	for dec.More() {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return "body"
		}
		key, ok := tok.(string)
		// The span holds the key and the comma and spaces before it: the
		// key is valid exactly when the span is.
		if !ok || !validText(body[start:dec.InputOffset()]) {
			return "body"
		}
		var raw json.RawMessage // the value's bytes, as sent
		if err := dec.Decode(&raw); err != nil {
			return "body"
		}
		if !validText(raw) {
			return key
		}
	}
	return "body"
}

// RequestTimeout is the 408 of a request body that stopped arriving.
func RequestTimeout() *Problem {
	return NewProblem(TypeRequestTimeout, fmt.Sprintf("the request body did not arrive within %s; send the request again", ReadTimeout))
}

func decodeProblem(err error) error {
	var (
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
		maxErr    *http.MaxBytesError
		netErr    net.Error
	)
	switch {
	// The server's read deadline passed while the body was still on its
	// way: the client is slow or stuck, and the JSON is not at fault.
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return RequestTimeout()
	case errors.As(err, &maxErr):
		return Field("body", fmt.Sprintf("larger than %d bytes", maxErr.Limit))
	case errors.Is(err, io.EOF):
		return Field("body", "empty; want a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return Field("body", "malformed JSON: ends too early")
	case errors.As(err, &syntaxErr):
		return Field("body", fmt.Sprintf("malformed JSON at byte %d", syntaxErr.Offset))
	case errors.As(err, &typeErr):
		if typeErr.Field == "" {
			return Field("body", "want a JSON object")
		}
		return Field(typeErr.Field, "want a "+jsonKind(typeErr.Type.Kind().String()))
	}
	return Field("body", "malformed JSON")
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "string"
	case "bool":
		return "boolean"
	case "struct", "map":
		return "object"
	case "slice", "array":
		return "array"
	}
	return "number"
}
