package studentsvc

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/outboxref/internal/outbox"
	"github.com/outboxref/outboxref/testkit/apitest"
)

// TestProvisioningShowsNoInternals: the sender's full error names Users'
// address and the IP it dialled; Student's clients get only the class and
// its fixed sentence, on both routes that show a student.
func TestProvisioningShowsNoInternals(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	res := e.create(t, ada)
	require.Equal(t, http.StatusCreated, res.Status, "%s", res.Body)
	var st Student
	res.JSON(t, &st)
	_, err := e.pool.Exec(context.Background(),
		`UPDATE outbox SET attempts = 2, reason_class = 'users-unreachable',
		        last_error = 'POST /users: Post "http://users:8081/users": dial tcp 10.0.0.5:8081: connect: connection refused'`)
	require.NoError(t, err)

	one := apitest.Do(t, http.MethodGet, e.url+"/students/"+st.ID.String(), "")
	all := apitest.Do(t, http.MethodGet, e.url+"/students", "")
	for _, res := range []apitest.Response{one, all} {
		require.Equal(t, http.StatusOK, res.Status, "%s", res.Body)
		body := string(res.Body)
		for _, internal := range []string{"http://users:8081", "dial tcp 10.0.0.5", "10.0.0.5", "connection refused", "last_error"} {
			require.NotContains(t, body, internal)
		}
		require.Contains(t, body, `"reason":{"class":"users-unreachable","message":"Users unreachable, retrying"}`)
	}
}

// TestReasonForUnknownClass: a class this build does not know (a newer
// sender's) is shown as the generic sentence, never as the stored word.
func TestReasonForUnknownClass(t *testing.T) {
	t.Parallel()
	require.Nil(t, reasonFor(""), "no class, no reason")
	require.Equal(t, &Reason{Class: ReasonUnknown, Message: unknownMessage}, reasonFor("dns-hiccup"))
	for _, class := range outbox.ReasonClasses {
		r := reasonFor(class)
		require.Equal(t, class, r.Class, "every reason class has its sentence")
		require.NotEmpty(t, r.Message, class)
	}
	require.Len(t, reasonMessages, len(outbox.ReasonClasses), "a sentence for a class the outbox does not have")
	require.NotContains(t, outbox.ReasonClasses, ReasonUnknown, "the generic class must not shadow a real one")
}
