package httpapi

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/person"
)

// decode is what both services do with a person's body: decode it strictly,
// then validate it. Errors come back as the problem Render would send.
func decode(body, contentType string) (person.Person, *Problem) {
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	var in person.Input
	if err := DecodeJSON(httptest.NewRecorder(), r, &in); err != nil {
		return person.Person{}, asProblem(err)
	}
	p, err := in.Validate()
	if err != nil {
		return person.Person{}, asProblem(err)
	}
	return p, nil
}

// TestDecodePerson: every malformed or invalid body is a 4xx problem naming
// the fields at fault, in order.
func TestDecodePerson(t *testing.T) {
	t.Parallel()
	ok := `{"name":"Ada Lovelace","email":"ada@example.com","document_number":"123.456-7"}`
	tests := []struct {
		name        string
		body        string
		contentType string
		status      int
		fields      []string // fields the problem must name, in order
	}{
		{name: "valid", body: ok},
		{name: "valid with charset", body: ok, contentType: "application/json; charset=utf-8"},
		{name: "surrounding spaces trimmed", body: `{"name":" Ada ","email":"ada@example.com","document_number":"123"}`},
		{name: "wrong content type", body: ok, contentType: "text/plain", status: 415},
		{name: "empty body", body: "", status: 400, fields: []string{"body"}},
		{name: "malformed", body: `{"name":`, status: 400, fields: []string{"body"}},
		{name: "syntax error", body: `{"name" "x"}`, status: 400, fields: []string{"body"}},
		{name: "not an object", body: `[1,2]`, status: 400, fields: []string{"body"}},
		{name: "trailing data", body: ok + `{}`, status: 400, fields: []string{"body"}},
		{name: "unknown field", body: `{"name":"A","email":"a@b.co","document_number":"123","admin":true}`, status: 400, fields: []string{"admin"}},
		{name: "known name in another case", body: `{"NAME":"A","email":"a@b.co","document_number":"123"}`, status: 400, fields: []string{"NAME"}},
		{name: "field given twice", body: `{"name":"A","email":"a@b.co","document_number":"123","name":"B"}`, status: 400, fields: []string{"name"}},
		{name: "wrong type", body: `{"name":42,"email":"a@b.co","document_number":"123"}`, status: 400, fields: []string{"name"}},
		{name: "all missing", body: `{}`, status: 400, fields: []string{"name", "email", "document_number"}},
		{name: "null is missing", body: `{"name":null,"email":"a@b.co","document_number":"123"}`, status: 400, fields: []string{"name"}},
		{name: "empty strings", body: `{"name":"","email":" ","document_number":""}`, status: 400, fields: []string{"name", "email", "document_number"}},
		{name: "name too long", body: `{"name":"` + strings.Repeat("é", person.MaxName+1) + `","email":"a@b.co","document_number":"123"}`, status: 400, fields: []string{"name"}},
		{name: "name at limit", body: `{"name":"` + strings.Repeat("é", person.MaxName) + `","email":"a@b.co","document_number":"123"}`},
		{name: "control character", body: `{"name":"A\u0007","email":"a@b.co","document_number":"123"}`, status: 400, fields: []string{"name"}},
		{name: "bad email", body: `{"name":"A","email":"not-an-email","document_number":"123"}`, status: 400, fields: []string{"email"}},
		{name: "email with display name", body: `{"name":"A","email":"Ada <a@b.co>","document_number":"123"}`, status: 400, fields: []string{"email"}},
		{name: "email too long", body: `{"name":"A","email":"` + strings.Repeat("a", 250) + `@b.co","document_number":"123"}`, status: 400, fields: []string{"email"}},
		{name: "document too short", body: `{"name":"A","email":"a@b.co","document_number":"12"}`, status: 400, fields: []string{"document_number"}},
		{name: "document bad characters", body: `{"name":"A","email":"a@b.co","document_number":"12 34"}`, status: 400, fields: []string{"document_number"}},
		{name: "oversized body", body: `{"name":"` + strings.Repeat("a", MaxBodyBytes) + `"}`, status: 400, fields: []string{"body"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, pe := decode(tt.body, tt.contentType)
			if tt.status == 0 {
				require.Nil(t, pe)
				require.Equal(t, strings.TrimSpace(p.Name), p.Name)
				require.NotEmpty(t, p.Email)
				return
			}
			require.NotNil(t, pe, "want a problem")
			require.Equal(t, tt.status, pe.Status)
			var named []string
			for _, f := range pe.Errors {
				named = append(named, f.Field)
			}
			if tt.fields != nil {
				require.Equal(t, tt.fields, named)
			}
		})
	}
}

// FuzzDecode feeds arbitrary bodies to the decoder: it must never panic, and
// it must either accept a body as a Person that passes validation again, or
// reject it with a 4xx problem that names at least one field.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"name":"Ada","email":"ada@example.com","document_number":"123"}`,
		`{}`, `[]`, `null`, `{"name":1}`, `{"x":"y"}`, `{"name":"a"}{"b":1}`, "\xff",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		p, pe := decode(body, "application/json")
		if pe == nil {
			_, again := person.Input{Name: &p.Name, Email: &p.Email, DocumentNumber: &p.DocumentNumber}.Validate()
			if again != nil {
				t.Fatalf("accepted %+v, which fails validation: %v", p, again)
			}
			return
		}
		if pe.Status < 400 || pe.Status > 499 || len(pe.Errors) == 0 {
			t.Fatalf("want a 4xx problem naming a field, got %v", pe)
		}
	})
}
