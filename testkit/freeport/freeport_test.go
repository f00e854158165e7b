package freeport

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAddrIsFreeUniqueAndBelowTheEphemeralRange(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 200 {
		addr, err := Addr()
		require.NoError(t, err)
		require.False(t, seen[addr], "%s handed out twice", addr)
		seen[addr] = true
		_, p, err := net.SplitHostPort(addr)
		require.NoError(t, err)
		port, err := strconv.Atoi(p)
		require.NoError(t, err)
		require.GreaterOrEqual(t, port, lowest)
		require.Less(t, port, ephemeralLow(), "outgoing connections take ports from the ephemeral range")
		ln, err := net.Listen("tcp", addr)
		require.NoError(t, err, "the port is free")
		require.NoError(t, ln.Close())
	}
}

// TestBlock: n consecutive ports, each free, and never handed out twice.
func TestBlock(t *testing.T) {
	t.Parallel()
	base, err := Block(8)
	require.NoError(t, err)
	for port := base; port < base+8; port++ {
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		require.NoError(t, err, "port %d", port)
		require.NoError(t, ln.Close())
	}
	again, err := Block(8)
	require.NoError(t, err)
	require.True(t, again >= base+8 || again+8 <= base, "blocks %d and %d overlap", base, again)
}
