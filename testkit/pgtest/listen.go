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

// Count waits for a first notification, as long as a loaded machine may
// take to deliver one (30s), then counts it and those that follow until
// quiet passes with none. It is 0 only when none came in that time.
func (l *Listener) Count(quiet time.Duration) int {
	if !l.next(30 * time.Second) {
		return 0
	}
	n := 1
	for l.next(quiet) {
		n++
	}
	return n
}

// Quiet says whether no notification arrives within d. A short d can
// only miss a notification that comes late, never see one that did not
// come.
func (l *Listener) Quiet(d time.Duration) bool {
	return !l.next(d)
}

// next says whether a notification arrives within d.
func (l *Listener) next(d time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_, err := l.conn.WaitForNotification(ctx)
	return err == nil
}
