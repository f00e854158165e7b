package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// The limits of every HTTP server of the project (the Limits table of docs/operating.md
// table lists them with what a client gets past each). They keep a slow,
// stuck or hostile client from holding a connection, a goroutine or memory.
const (
	// ReadHeaderTimeout bounds the request line and headers. A client that
	// has not sent them in time gets no answer: net/http closes the
	// connection before any handler runs.
	ReadHeaderTimeout = 5 * time.Second
	// ReadTimeout bounds the whole request, headers and body, from its
	// first byte. A body that stops arriving makes the body read fail here,
	// and DecodeJSON answers 408.
	ReadTimeout = 15 * time.Second
	// UnreadBodyGrace is how long the rest of a body nobody reads, such
	// as a refused request's, may take to arrive once the answer is sent
	// (closeUnreadBodies). It is read and dropped, so that a client still
	// sending it reads its answer rather than a reset; then the connection
	// closes.
	UnreadBodyGrace = time.Second
	// WriteTimeout bounds the answer, from the end of the headers. It is
	// longer than the default database deadlines (at most 8s), so that a
	// slow database ends in a 503, not in a cut connection.
	WriteTimeout = 30 * time.Second
	// IdleTimeout is how long a kept-alive connection waits for its next
	// request.
	IdleTimeout = 2 * time.Minute
	// MaxHeaderBytes bounds the request line and headers; the APIs need a
	// few hundred bytes. net/http allows 4 KiB more than this before it
	// answers 431 on its own.
	MaxHeaderBytes = 16 << 10
	// ShutdownGrace is how long requests in flight may run once the
	// server starts to stop.
	ShutdownGrace = 10 * time.Second
)

// NewServer returns the http.Server every listener of the project uses,
// with the limits above.
func NewServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}

// ListenAndServe listens on addr and serves h until ctx ends (see Serve),
// with at most maxConns connections open at once (see LimitConns).
func ListenAndServe(ctx context.Context, log *slog.Logger, addr string, maxConns int, h http.Handler) error {
	ln, err := new(net.ListenConfig).Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := NewServer(h)
	return Serve(ctx, log, srv, LimitConns(srv, ln, maxConns), ShutdownGrace)
}

// Serve runs srv on ln until ctx ends, then shuts down gracefully: the
// listener closes at once and requests in flight get up to grace to finish.
func Serve(ctx context.Context, log *slog.Logger, srv *http.Server, ln net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("listening", slog.String("addr", ln.Addr().String()))
	select {
	case err := <-errc:
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down", slog.String("addr", ln.Addr().String()))
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("shutdown http: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve http: %w", err)
	}
	return nil
}
