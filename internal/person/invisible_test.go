package person

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestValidateRefusesInvisibleCharacters: control, format (bidi overrides
// and isolates, zero-width spaces, the byte order mark…) and line
// separator characters are refused in a name and an email, naming the
// field; joiners pass only between two letters of a name.
func TestValidateRefusesInvisibleCharacters(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, value string
		field       string // "" when the input is valid
	}{
		{name: "NUL", value: "Ada\u0000Lovelace", field: "name"},
		{name: "bell", value: "Ada\u0007", field: "name"},
		{name: "newline inside", value: "Ada\nLovelace", field: "name"},
		{name: "DEL", value: "Ada\u007f", field: "name"},
		{name: "C1 control", value: "Ada\u0085Lovelace", field: "name"},
		{name: "right-to-left override", value: "Ada \u202egnp.exe", field: "name"},
		{name: "left-to-right embedding", value: "Ada\u202aLovelace", field: "name"},
		{name: "pop directional formatting", value: "Ada\u202cLovelace", field: "name"},
		{name: "left-to-right isolate", value: "Ada\u2066Lovelace", field: "name"},
		{name: "right-to-left isolate", value: "Ada\u2067Lovelace", field: "name"},
		{name: "first strong isolate", value: "Ada\u2068Lovelace", field: "name"},
		{name: "pop directional isolate", value: "Ada\u2069Lovelace", field: "name"},
		{name: "right-to-left mark", value: "Ada\u200fLovelace", field: "name"},
		{name: "arabic letter mark", value: "Ada\u061cLovelace", field: "name"},
		{name: "zero-width space", value: "Ada\u200bLovelace", field: "name"},
		{name: "word joiner", value: "Ada\u2060Lovelace", field: "name"},
		{name: "byte order mark", value: "\ufeffAda Lovelace", field: "name"},
		{name: "soft hyphen", value: "Love\u00adlace", field: "name"},
		{name: "interlinear annotation", value: "Ada\ufff9x\ufffbLovelace", field: "name"},
		{name: "tag character", value: "Ada\U000e0041", field: "name"},
		{name: "line separator inside", value: "Ada\u2028Lovelace", field: "name"},
		{name: "paragraph separator inside", value: "Ada\u2029Lovelace", field: "name"},
		{name: "joiner at the start", value: "\u200dAda", field: "name"},
		{name: "joiner at the end", value: "Ada\u200c", field: "name"},
		{name: "joiner beside a space", value: "Ada \u200cLovelace", field: "name"},
		{name: "two joiners", value: "Ada\u200c\u200dLovelace", field: "name"},
		{name: "non-joiner in a Persian name", value: "\u0645\u0647\u200c\u0631\u062e"},
		{name: "joiner in a Malayalam name", value: "\u0d28\u0d4d\u200d\u0d31"},
		{name: "accents and other scripts", value: "Zoë Ñúñez 李小龍 Ольга"},
		{name: "right-to-left text without controls", value: "\u05d3\u05d5\u05d3"},
		{name: "Hangul filler alone", value: "\u3164", field: "name"},
		{name: "Hangul fillers and a space", value: "\u3164 \u3164", field: "name"},
		{name: "halfwidth Hangul filler", value: "Ada\uffa0Lovelace", field: "name"},
		{name: "blank braille pattern alone", value: "\u2800\u2800", field: "name"},
		{name: "blank braille pattern inside", value: "Ada\u2800Lovelace", field: "name"},
		{name: "combining grapheme joiner alone", value: "\u034f", field: "name"},
		{name: "combining grapheme joiner inside", value: "Ad\u034fa", field: "name"},
		{name: "Mongolian variation selector", value: "Ada\u180bLovelace", field: "name"},
		{name: "marks alone", value: "\u0301\u0301", field: "name"},
		{name: "digits alone", value: "12345", field: "name"},
		{name: "Hangul name", value: "\ud64d\uae38\ub3d9"},
		{name: "braille with dots", value: "Ada \u2801"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Input{Name: new(tt.value), Email: new("ada@example.com"), DocumentNumber: new("123")}.Validate()
			if tt.field == "" {
				require.NoError(t, err)
				return
			}
			var invalid *InvalidError
			require.ErrorAs(t, err, &invalid)
			require.Len(t, invalid.Fields, 1)
			require.Equal(t, tt.field, invalid.Fields[0].Field)
		})
	}
}

func TestValidateRefusesInvisibleCharactersInEmail(t *testing.T) {
	t.Parallel()
	for _, email := range []string{"ada\u200b@example.com", "ad\u202ea@example.com", "ada@exa\u200dmple.com", "\ufeffada@example.com", "a\u200cda@example.com"} {
		_, err := Input{Name: new("Ada"), Email: new(email), DocumentNumber: new("123")}.Validate()
		var invalid *InvalidError
		require.ErrorAs(t, err, &invalid, "%q", email)
		require.Equal(t, []FieldError{{Field: "email", Detail: invalid.Fields[0].Detail}}, invalid.Fields, "%q", email)
		require.Contains(t, invalid.Fields[0].Detail, "U+", "the detail names the invisible character")
	}
}
