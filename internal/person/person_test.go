package person

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestValidateTrimsAndAccepts(t *testing.T) {
	t.Parallel()
	p, err := Input{Name: new(" Ada Lovelace "), Email: new("ada@example.com"), DocumentNumber: new("123.456-7")}.Validate()
	require.NoError(t, err)
	require.Equal(t, Person{Name: "Ada Lovelace", Email: "ada@example.com", DocumentNumber: "123.456-7"}, p)
	require.Equal(t, map[string]string{"name": "Ada Lovelace", "email": "ada@example.com", "document_number": "123.456-7"}, p.Fields())
}

// TestValidateNamesEveryField: one error lists every field at fault, in the
// order of Person's fields, each with its own reason.
func TestValidateNamesEveryField(t *testing.T) {
	t.Parallel()
	_, err := Input{Name: new("A\u0007"), DocumentNumber: new("12")}.Validate()
	var invalid *InvalidError
	require.ErrorAs(t, err, &invalid, "got %v", err)
	require.Equal(t, []FieldError{
		{Field: "name", Detail: "must not contain control characters (U+0007)"},
		{Field: "email", Detail: "required"},
		{Field: "document_number", Detail: "must be 3 to 32 characters"},
	}, invalid.Fields)
	require.Contains(t, err.Error(), "email required")
}
