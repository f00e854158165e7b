package inbox

import (
	"errors"
	"strings"
)

// MaxKeyLen bounds an idempotency key. UUIDs (36) and ULIDs (26) fit with
// room to spare; anything longer is more likely a mistake than a key.
const MaxKeyLen = 255

// ErrNoKey is returned by ParseKey for an empty value.
var ErrNoKey = errors.New("the Idempotency-Key header is required")

// ParseKey reads an Idempotency-Key header value. It accepts the form the
// IETF draft specifies, a structured-field string ("8e03978e-..."), and the
// bare token most clients actually send (8e03978e-...). The key is the
// string's content, so both forms of the same key are the same key.
func ParseKey(header string) (string, error) {
	v := strings.Trim(header, " \t")
	if v == "" {
		return "", ErrNoKey
	}
	var key string
	if v[0] == '"' {
		k, err := parseSFString(v)
		if err != nil {
			return "", err
		}
		key = k
	} else {
		for i := range len(v) {
			if !isTokenChar(v[i]) {
				return "", errors.New(`a bare key may hold letters, digits and !#$%&'*+-.^_|~:/` + "`" + `; quote any other key as a structured-field string ("...")`)
			}
		}
		key = v
	}
	if key == "" {
		return "", errors.New("the key must not be empty")
	}
	if len(key) > MaxKeyLen {
		return "", errors.New("the key is longer than 255 characters")
	}
	return key, nil
}

// parseSFString parses an RFC 8941 sf-string: printable ASCII between double
// quotes, where only \" and \\ are escapes. Nothing may follow the closing
// quote (no parameters: the draft defines none).
func parseSFString(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i >= len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", errors.New(`a quoted key may only escape " and \`)
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", errors.New("unexpected characters after the closing quote")
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", errors.New("a quoted key may only hold printable ASCII characters")
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("the quoted key has no closing quote")
}

// isTokenChar is RFC 9110's tchar plus ':' and '/', the characters of an
// RFC 8941 token.
func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}
