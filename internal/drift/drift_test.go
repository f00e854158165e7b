package drift

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/outbox"
)

func some(id uuid.UUID) uuid.NullUUID { return uuid.NullUUID{UUID: id, Valid: true} }

// TestJudge walks every case of the definition, each on a student that
// differs from a linked one in one thing.
func TestJudge(t *testing.T) {
	t.Parallel()
	sid, uid, other := uuid.New(), uuid.New(), uuid.New()
	const doc = "DOC-1"
	user := User{ID: uid, DocumentNumber: doc, Enabled: true}
	linked := func() Facts {
		return Facts{
			Student: Student{ID: sid, DocumentNumber: doc, UserID: some(uid)},
			Outbox:  &Outbox{Key: "k", State: outbox.StateDelivered},
			Answer:  &Answer{StatusCode: 201, UserID: some(uid)},
			Users:   map[uuid.UUID]User{uid: user},
		}
	}
	unlinked := func(state string) Facts {
		f := linked()
		f.Student.UserID = uuid.NullUUID{}
		f.Outbox.State = state
		f.Answer = nil
		return f
	}
	tests := []struct {
		name   string
		facts  func() Facts
		rules  Rules
		want   Verdict
		purged Verdict // the verdict with MayBePurged; "" when the same
	}{
		{name: "linked", facts: linked, want: Linked},
		{name: "pending", facts: func() Facts { return unlinked(outbox.StatePending) }, want: Pending},
		{
			// The broker took the command and Users' answer has not come:
			// on its way, never lost.
			name: "published", facts: func() Facts { return unlinked(outbox.StatePublished) }, want: Pending,
		},
		{
			name: "pending with the answer already stored", want: Pending,
			facts: func() Facts { f := unlinked(outbox.StatePending); f.Answer = &Answer{201, some(uid)}; return f },
		},
		{
			name: "dead with a reason", want: Dead,
			facts: func() Facts { f := unlinked(outbox.StateDead); f.Outbox.ReasonClass = outbox.ReasonRefused; return f },
		},
		{
			name: "dead with a message only", want: Dead,
			facts: func() Facts { f := unlinked(outbox.StateDead); f.Outbox.LastError = "Users answered 409"; return f },
		},
		{name: "dead without a reason", facts: func() Facts { return unlinked(outbox.StateDead) }, want: Lost},
		{
			name: "dead although Users created the user", want: Lost,
			facts: func() Facts {
				f := unlinked(outbox.StateDead)
				f.Outbox.ReasonClass, f.Answer = outbox.ReasonExpired, &Answer{201, some(uid)}
				return f
			},
		},
		{
			name: "dead, and the user was made after Student was read", want: Pending,
			rules: Rules{Recent: func(id uuid.UUID) bool { return id == uid }},
			facts: func() Facts {
				f := unlinked(outbox.StateDead)
				f.Outbox.ReasonClass, f.Answer = outbox.ReasonExpired, &Answer{201, some(uid)}
				return f
			},
		},
		{name: "delivered without a link", facts: func() Facts { return unlinked(outbox.StateDelivered) }, want: Lost},
		{
			name: "delivered without a link, the user made", want: Lost,
			facts: func() Facts { f := unlinked(outbox.StateDelivered); f.Answer = &Answer{201, some(uid)}; return f },
		},
		{name: "no outbox row", facts: func() Facts { f := unlinked(""); f.Outbox = nil; return f }, want: Lost},
		{
			name: "linked without an outbox row", want: Mislinked, purged: Linked,
			facts: func() Facts { f := linked(); f.Outbox = nil; return f },
		},
		{
			name: "linked without an answer", want: Mislinked, purged: Linked,
			facts: func() Facts { f := linked(); f.Answer = nil; return f },
		},
		{
			name: "linked although the answer made no user", want: Mislinked,
			facts: func() Facts { f := linked(); f.Answer = &Answer{409, uuid.NullUUID{}}; return f },
		},
		{
			name: "linked to another user than the answer's", want: Mislinked,
			facts: func() Facts { f := linked(); f.Answer.UserID = some(other); return f },
		},
		{
			name: "linked to a user Users does not have", want: MissingUser,
			facts: func() Facts { f := linked(); f.Users = nil; return f },
		},
		{
			// Whatever the answer says: the user it is linked to is gone.
			name: "linked to a user id that does not exist, not the answer's", want: MissingUser,
			facts: func() Facts { f := linked(); f.Student.UserID = some(other); return f },
		},
		{
			name: "linked, rows purged, user gone", want: MissingUser,
			facts: func() Facts { f := linked(); f.Outbox, f.Answer, f.Users = nil, nil, nil; return f },
		},
		{
			name: "linked to a user with another document number", want: Mislinked,
			facts: func() Facts {
				f := linked()
				f.Users = map[uuid.UUID]User{uid: {ID: uid, DocumentNumber: "DOC-2", Enabled: true}}
				return f
			},
		},
		{
			name: "linked, rows purged, user has another document number", want: Mislinked,
			facts: func() Facts {
				f := linked()
				f.Outbox, f.Answer = nil, nil
				f.Users = map[uuid.UUID]User{uid: {ID: uid, DocumentNumber: "DOC-2", Enabled: true}}
				return f
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			j := Judge(tt.facts(), tt.rules)
			require.Equal(t, tt.want, j.Verdict)
			if tt.want != Linked && tt.want != Pending && tt.want != Dead {
				require.Contains(t, j.Why, sid.String(), "a problem names its student")
				require.NotContains(t, j.Why, doc, "a reason names ids, never a document number")
			}
			purged := tt.rules
			purged.MayBePurged = true
			want := tt.want
			if tt.purged != "" {
				want = tt.purged
			}
			require.Equal(t, want, Judge(tt.facts(), purged).Verdict, "with rows that may be purged")
		})
	}
}

func TestUsersAndAnswers(t *testing.T) {
	t.Parallel()
	a, b := User{ID: uuid.New(), Enabled: true}, User{ID: uuid.New(), Enabled: true}
	off := User{ID: uuid.New()}
	require.False(t, Duplicated([]User{a}))
	require.False(t, Duplicated([]User{a, off}), "a disabled user is not a second one")
	require.True(t, Duplicated([]User{a, off, b}))

	require.True(t, Orphan(a, false, false, false))
	require.False(t, Orphan(a, true, false, false))
	require.False(t, Orphan(a, false, true, false), "another caller's user is theirs")
	require.False(t, Orphan(a, false, false, true), "a recent user may belong to a student not read yet")
	require.False(t, Orphan(off, false, false, false), "a disabled user was taken out of use on purpose")

	made := Answer{StatusCode: 201, UserID: some(a.ID)}
	require.True(t, Unrecorded(made, false, 4*time.Hour, 3*time.Hour))
	require.False(t, Unrecorded(made, true, 4*time.Hour, 3*time.Hour), "recorded")
	require.False(t, Unrecorded(made, false, 2*time.Hour, 3*time.Hour), "the sender may still record it")
	require.False(t, Unrecorded(Answer{StatusCode: 409}, false, 4*time.Hour, 3*time.Hour), "no user made")
}

func TestClasses(t *testing.T) {
	t.Parallel()
	var drift []Class
	for _, c := range Classes {
		require.NotEmpty(t, c.Explanation(), c)
		if c.Invariant() {
			drift = append(drift, c)
		}
	}
	require.Len(t, drift, 6)
	_, ok := StudentClass(Pending, time.Minute, time.Hour)
	require.False(t, ok, "pending, not yet stuck")
	c, ok := StudentClass(Pending, 2*time.Hour, time.Hour)
	require.True(t, ok)
	require.Equal(t, ClassStuck, c)
	_, ok = StudentClass(Linked, 2*time.Hour, time.Hour)
	require.False(t, ok)
	c, _ = StudentClass(MissingUser, 0, time.Hour)
	require.Equal(t, ClassMissingUser, c)
}
