package natsbus

import (
	"context"
	"errors"
	"maps"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A Message is one outbox row on its way to a stream. Both relays, the
// sender's (commands from Student's outbox) and Users' (answers from its
// own), hand their rows to Publish as Messages, so both keep one key
// discipline.
type Message struct {
	Subject string
	// ID is sent as Nats-Msg-Id: the same for every copy of one publish
	// (sent again because its outcome is unknown), so that JetStream
	// drops the copies within its de-duplication window, and new for a
	// publish meant to reach the reader again.
	ID string
	// Key is the operation's idempotency key, sent as HeaderKey: the
	// receiver's inbox decides by it, also past the window.
	Key  string
	Data []byte
	// Header holds further headers (HeaderAttempt, HeaderExpires, trace
	// context); nil for none.
	Header nats.Header
}

// An Ack is the broker's answer to one publish. Err nil means the stream
// holds the message: only then may the relay mark its row published.
type Ack struct {
	// Seq is where the stream put the message.
	Seq uint64
	// Duplicate: the stream already held a message with this ID (a
	// republish within the window) and kept the first.
	Duplicate bool
	Err       error
}

// Publish publishes msgs to stream all at once and waits for each
// acknowledgement, until ctx ends; acks[i] answers msgs[i]. It never
// retries beyond what the client does for a stream without a leader: a
// row that is not acknowledged stays in its outbox, and its relay
// publishes it again later under the same ID.
func Publish(ctx context.Context, js jetstream.JetStream, stream string, msgs []Message) []Ack {
	acks := make([]Ack, len(msgs))
	futures := make([]jetstream.PubAckFuture, len(msgs))
	for i, m := range msgs {
		msg := nats.NewMsg(m.Subject)
		msg.Data = m.Data
		maps.Copy(msg.Header, m.Header)
		msg.Header.Set(HeaderKey, m.Key)
		f, err := js.PublishMsgAsync(msg, jetstream.WithMsgID(m.ID), jetstream.WithExpectStream(stream))
		if err != nil {
			// Too many publishes in flight, or the connection is closed:
			// the rest would fail alike.
			for j := i; j < len(msgs); j++ {
				acks[j].Err = err
			}
			break
		}
		futures[i] = f
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		// An answer already in counts even once ctx has ended: select
		// alone would pick at random between the two.
		select {
		case a := <-f.Ok():
			acks[i] = Ack{Seq: a.Sequence, Duplicate: a.Duplicate}
			continue
		case err := <-f.Err():
			acks[i].Err = err
			continue
		default:
		}
		select {
		case a := <-f.Ok():
			acks[i] = Ack{Seq: a.Sequence, Duplicate: a.Duplicate}
		case err := <-f.Err():
			acks[i].Err = err
		case <-ctx.Done():
			acks[i].Err = ctx.Err()
		}
	}
	return acks
}

// errStoreFailed is JetStream's error code for a message its stream would
// not store; a full stream (discard new) says why in the description.
const errStoreFailed = 10077

// StreamFull says whether the broker refused a publish because the stream
// is at its byte (or message) limit, as opposed to being out of reach.
func StreamFull(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && api.ErrorCode == errStoreFailed && strings.HasPrefix(api.Description, "maximum ")
}
