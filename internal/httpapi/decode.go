package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"slices"
	"strings"
)

// MaxBodyBytes bounds every request body; the services accept small JSON
// objects only.
const MaxBodyBytes = 16 << 10

// DecodeJSON reads one JSON object from the body into dst, a pointer to a
// struct. Unknown fields (including a known name in another case, which
// encoding/json would quietly accept), repeated fields, trailing data, wrong
// types and oversized bodies are problems naming the field (or "body" when
// no field is to blame).
func DecodeJSON(w http.ResponseWriter, r *http.Request, dst any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" {
			return &Problem{
				Type: TypeUnsupportedMediaType, Title: "Unsupported media type",
				Status: http.StatusUnsupportedMediaType, Detail: "send the body as application/json",
			}
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		return decodeProblem(err)
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

func decodeProblem(err error) error {
	var (
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
		maxErr    *http.MaxBytesError
	)
	switch {
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
