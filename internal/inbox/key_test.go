package inbox

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, header, want, err string
	}{
		{name: "bare uuid", header: "8e03978e-40d5-43e8-bc93-6894a57f9324", want: "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{name: "quoted uuid", header: `"8e03978e-40d5-43e8-bc93-6894a57f9324"`, want: "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{name: "surrounding whitespace", header: "  abc\t", want: "abc"},
		{name: "token characters", header: "a:b/c.d_e~f+g", want: "a:b/c.d_e~f+g"},
		{name: "quoted with space", header: `"order 42"`, want: "order 42"},
		{name: "quoted escapes", header: `"a\"b\\c"`, want: `a"b\c`},
		{name: "missing", header: "", err: "required"},
		{name: "blank", header: "   ", err: "required"},
		{name: "empty quoted", header: `""`, err: "must not be empty"},
		{name: "bare with space", header: "a b", err: "bare key"},
		{name: "bare with comma", header: "a,b", err: "bare key"},
		{name: "bare with quote inside", header: `a"b`, err: "bare key"},
		{name: "unterminated quote", header: `"abc`, err: "no closing quote"},
		{name: "parameters after string", header: `"abc";x=1`, err: "after the closing quote"},
		{name: "bad escape", header: `"a\nb"`, err: "only escape"},
		{name: "non-ascii quoted", header: "\"caf\u00e9\"", err: "printable ASCII"},
		{name: "non-ascii bare", header: "caf\u00e9", err: "bare key"},
		{name: "control char quoted", header: "\"a\x01b\"", err: "printable ASCII"},
		{name: "longest allowed", header: strings.Repeat("k", MaxKeyLen), want: strings.Repeat("k", MaxKeyLen)},
		{name: "too long", header: strings.Repeat("k", MaxKeyLen+1), err: "longer than 255"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseKey(tt.header)
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

// FuzzParseKey checks the parser's promises on any input: it never panics,
// an accepted key is 1 to 255 printable ASCII characters, and quoting an
// accepted key as a structured-field string yields the same key.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, `"`, `""`, "a b", "\"\\", strings.Repeat("x", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, header string) {
		key, err := ParseKey(header)
		if err != nil {
			return
		}
		if key == "" || len(key) > MaxKeyLen {
			t.Fatalf("accepted key of length %d", len(key))
		}
		for i := range len(key) {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("accepted non-printable byte %#x", key[i])
			}
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		again, err := ParseKey(quoted)
		if err != nil || again != key {
			t.Fatalf("quoted form %q parsed to %q, %v; want %q", quoted, again, err, key)
		}
	})
}

func TestDifferingFields(t *testing.T) {
	t.Parallel()
	stored := Request{"name": "Ada", "email": "ada@example.com", "document_number": "123"}.canonical()
	tests := []struct {
		name string
		req  Request
		want []string
	}{
		{name: "same", req: Request{"name": "Ada", "email": "ada@example.com", "document_number": "123"}},
		{name: "one differs", req: Request{"name": "Ada", "email": "ada@example.org", "document_number": "123"}, want: []string{"email"}},
		{name: "two differ, sorted", req: Request{"name": "Bob", "email": "ada@example.com", "document_number": "9"}, want: []string{"document_number", "name"}},
		{name: "field missing", req: Request{"name": "Ada", "email": "ada@example.com"}, want: []string{"document_number"}},
		{name: "field added", req: Request{"name": "Ada", "email": "ada@example.com", "document_number": "123", "x": ""}, want: []string{"x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := DifferingFields(stored, tt.req)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestFingerprintIgnoresMapOrder(t *testing.T) {
	t.Parallel()
	a := Request{"name": "Ada", "email": "a@b.c"}
	b := Request{"email": "a@b.c", "name": "Ada"}
	require.Equal(t, a.Fingerprint(), b.Fingerprint())
	require.NotEqual(t, a.Fingerprint(), Request{"name": "Ada", "email": "a@b.d"}.Fingerprint())
}
