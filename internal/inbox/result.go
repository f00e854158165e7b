package inbox

import "errors"

// Result names how a call of Do ended, as the services' metrics count it.
type Result string

// Do's results. Failures that store nothing and say nothing about the key
// (the database down, a conflicting request's lock) have none.
const (
	// ResultNew: the key was new; the operation ran and its outcome (a
	// creation or a business refusal) committed with the key.
	ResultNew Result = "new"
	// ResultReplayed: a repeat got the stored outcome back.
	ResultReplayed Result = "replayed"
	// ResultMismatch: the key came back with a different request.
	ResultMismatch Result = "mismatch"
	// ResultInProgress: another request with the key outlasted the wait.
	ResultInProgress Result = "in_progress"
)

// ResultOf is the Result of Do's replayed and err; ok is false for a
// failure that has none.
func ResultOf(replayed bool, err error) (r Result, ok bool) {
	var mismatch *MismatchError
	switch {
	case err == nil && replayed:
		return ResultReplayed, true
	case err == nil:
		return ResultNew, true
	case errors.As(err, &mismatch):
		return ResultMismatch, true
	case errors.Is(err, ErrKeyInProgress):
		return ResultInProgress, true
	}
	return "", false
}
