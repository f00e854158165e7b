// Package crashpoint lets the end-to-end suite kill a process at an exact
// step, such as after Users commits but before it answers. It is compiled in
// only with the build tag "crashpoints", which the suite uses; the shipped
// binaries are built without it, and there Hit does nothing and CRASH_POINT
// means nothing.
package crashpoint

// The crash points, by the step after which the process dies.
const (
	// UsersAfterCommit: the user and its inbox row are committed, the answer
	// is not yet written. The sender sees a dropped connection.
	UsersAfterCommit = "users-after-commit"
	// SenderAfterResponse: Users has answered (and committed), the answers
	// are not yet recorded in Student's database.
	SenderAfterResponse = "sender-after-response"
)

// Hit kills the process if name is the crash point CRASH_POINT names and
// this is the hit it names; see on.go.
func Hit(name string) { hit(name) }
