package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Listener is a connection listening on one channel, as a test's stand-in
// for a process that waits for notifications.
type Listener struct{ conn *pgx.Conn }

// Listen connects to dbURL's database as role and listens on channel; the
// connection is closed at cleanup.
func Listen(t testing.TB, dbURL, role, channel string) *Listener {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, RoleURL(t, dbURL, role))
	if err != nil {
		t.Fatalf("connect to test database: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatalf("listen on %s: %v", channel, err)
	}
	return &Listener{conn: conn}
}

// Count returns how many notifications arrive until quiet passes with
// none.
func (l *Listener) Count(quiet time.Duration) int {
	n := 0
	for {
		ctx, cancel := context.WithTimeout(context.Background(), quiet)
		_, err := l.conn.WaitForNotification(ctx)
		cancel()
		if err != nil {
			return n
		}
		n++
	}
}
