// Package crashpoint lets the end-to-end suite kill a process at an exact
// step, such as after Users commits but before it answers, or hold it there
// for a moment. It is compiled in only with the build tag "crashpoints",
// which the suite uses; the shipped binaries are built without it, and there
// Hit and Pause do nothing and CRASH_POINT and PAUSE_POINT mean nothing.
package crashpoint

// The crash points, by the step after which the process dies.
const (
	// UsersAfterCommit: the user and its inbox row are committed, the answer
	// is not yet written. The sender sees a dropped connection.
	UsersAfterCommit = "users-after-commit"
	// SenderAfterResponse: Users has answered (and committed), the answers
	// are not yet recorded in Student's database.
	SenderAfterResponse = "sender-after-response"
	// SenderBeforeConfirm: with SENDER_SOURCE=cdc, the answers of streamed
	// rows are recorded and the sender is about to confirm their position
	// in the write-ahead log to PostgreSQL. The slot replays them.
	SenderBeforeConfirm = "sender-before-confirm"
	// UsersCommandAfterCommit: with the broker transport, a command's user
	// and its answer row are committed, the command is not yet acked. The
	// broker delivers it again, to this Users or another one, and the
	// inbox replays it.
	UsersCommandAfterCommit = "users-command-after-commit"
)

// The pause points, by the step at which the process holds still. The
// suite freezes the network to the database while a process is held there,
// so that a connection is caught in exactly that state.
const (
	// SenderBeforeRecord: just before the sender sends a recording's one
	// batch (the links, retries, dead letters, events and, at its end, the
	// commit): the batch goes into the freeze. The sender has no moment
	// inside that transaction to pause in.
	SenderBeforeRecord = "sender-before-record"
	// SenderBeforeClaim: just before the claim statement is sent.
	SenderBeforeClaim = "sender-before-claim"
	// UsersBeforeInbox: just before Users sends a create-user's one batch
	// (the key with its answer, and the user): the batch goes into the
	// freeze. Users has no moment inside that transaction to pause in:
	// the server has the whole of it, its end included, at once.
	UsersBeforeInbox = "users-before-inbox"
)

// Hit kills the process if name is the crash point CRASH_POINT names and
// this is the hit it names; see on.go.
func Hit(name string) { hit(name) }

// Pause holds the calling goroutine still for a moment (PAUSE_FOR, 2s by
// default) if name is the pause point PAUSE_POINT names and this is the hit
// it names, after printing "pausepoint: NAME reached" to stderr. It pauses
// once per process; see on.go.
func Pause(name string) { pause(name) }
