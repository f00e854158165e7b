package database

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/outboxref/outboxref/testkit/pgtest"
)

// TestClientSocketOptions: the client end of a pooled connection probes a
// silent server (keepalives) and gives up on unacknowledged data
// (TCP_USER_TIMEOUT), as the server end does.
func TestClientSocketOptions(t *testing.T) {
	t.Parallel()
	pool := open(t, pgtest.EmptyURL(t), Limits{})
	conn, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	defer conn.Release()
	tcp, ok := conn.Conn().PgConn().Conn().(*net.TCPConn)
	require.True(t, ok, "the test server is reached over TCP, got %T", conn.Conn().PgConn().Conn())
	raw, err := tcp.SyscallConn()
	require.NoError(t, err)

	opts := map[string]struct {
		level, opt, want int
	}{
		"SO_KEEPALIVE":     {unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
		"TCP_KEEPIDLE":     {unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, int(KeepAliveIdle.Seconds())},
		"TCP_KEEPINTVL":    {unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, int(KeepAliveInterval.Seconds())},
		"TCP_KEEPCNT":      {unix.IPPROTO_TCP, unix.TCP_KEEPCNT, KeepAliveCount},
		"TCP_USER_TIMEOUT": {unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(UserTimeout.Milliseconds())},
	}
	for name, o := range opts {
		var (
			got  int
			gerr error
		)
		require.NoError(t, raw.Control(func(fd uintptr) { got, gerr = unix.GetsockoptInt(int(fd), o.level, o.opt) }))
		require.NoError(t, gerr, name)
		require.Equal(t, o.want, got, name)
	}
}
