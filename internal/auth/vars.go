package auth

import "github.com/outboxref/outboxref/internal/envconfig"

// TokenVar reads the bearer token a binary sends to another, from the
// variable name or the file name_FILE names; "" when neither is set. A
// token the other could never accept is a mistake better caught at start
// than by every request's 401. The error never shows the token.
func TokenVar(e *envconfig.Reader, name string) Secret {
	tok := e.Secret(name)
	if tok == "" {
		return ""
	}
	err := CheckToken(tok)
	e.Check(err == nil, "%s: %w", name, err)
	return Secret(tok)
}

// CallersVar reads the callers a listener answers, as pairs such as
// "caller:token" (ParseTokens), from the variable name or the file
// name_FILE names; nil when neither is set. A list of blank entries is an
// error: it would start a listener that refuses everyone. Errors name
// callers (noun: "caller", "operator"), never tokens.
func CallersVar(e *envconfig.Reader, name, noun, pair string) []Credential {
	tokens := e.Secret(name)
	if tokens == "" {
		return nil
	}
	callers, err := ParseTokens(tokens)
	e.Check(err == nil, "%s: %w", name, err)
	e.Check(err != nil || len(callers) > 0, "%s: lists no %s; list each as %s", name, noun, pair)
	return callers
}
