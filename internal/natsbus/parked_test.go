package natsbus

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// parkable is a message as a consumer reads it, for ParkedOf.
type parkable struct {
	jetstream.Msg
	data    []byte
	headers nats.Header
}

func (m parkable) Data() []byte         { return m.data }
func (m parkable) Headers() nats.Header { return m.headers }
func (m parkable) Subject() string      { return CreateUserSubject }

// TestParkedKeepsTheStartOfABigMessage: a message as big as the broker
// takes (1 MB) is parked as its first ParkedKeep bytes with its whole size,
// and its headers as valid JSON within their bound, each value cut, so a
// stream of unreadable messages cannot fill a database.
func TestParkedKeepsTheStartOfABigMessage(t *testing.T) {
	t.Parallel()
	data := bytes.Repeat([]byte("x"), 1<<20)
	h := nats.Header{}
	h.Set(HeaderKey, "k-1")
	h.Set("A-Huge", strings.Repeat("é", 2000)) // multi-byte: cut on a rune
	for i := range 100 {
		h.Set("Filler-"+strings.Repeat("f", 40)+string(rune('a'+i%26))+string(rune('a'+i/26)), strings.Repeat("v", 200))
	}
	meta := &jetstream.MsgMetadata{Stream: CommandStream, Sequence: jetstream.SequencePair{Stream: 7}, NumDelivered: 5, Timestamp: time.Now()}
	p := ParkedOf(parkable{data: data, headers: h}, meta, "not a command")
	require.Equal(t, data[:ParkedKeep], p.Data)
	require.Equal(t, 1<<20, p.Size)
	require.LessOrEqual(t, len(p.Headers), parkedHeaders)
	var kept map[string][]string
	require.NoError(t, json.Unmarshal(p.Headers, &kept), "%s", p.Headers)
	require.Equal(t, []string{"k-1"}, kept[HeaderKey], "the key, among the first headers by name, is kept whole")
	require.Contains(t, kept, "A-Huge")
	require.LessOrEqual(t, len(kept["A-Huge"][0]), ParkedHeaderValue+len("…"))
	require.True(t, utf8.ValidString(kept["A-Huge"][0]))
	require.Less(t, len(kept), len(h), "headers past the bound are left out")

	small := ParkedOf(parkable{data: []byte(`{"a":1}`), headers: nats.Header{HeaderKey: {"k-2"}}}, meta, "r")
	require.JSONEq(t, `{"a":1}`, string(small.Data))
	require.Equal(t, 7, small.Size)
	require.JSONEq(t, `{"Idempotency-Key":["k-2"]}`, string(small.Headers))
}
