package httpapi

import (
	"errors"
	"io"
	"net/http"
	"time"
)

// closeUnreadBodies closes the connection of a request whose body the
// handler did not read to its end, once the answer is sent.
//
// To keep a connection open for the next request, net/http reads what is
// left of a body nobody read (up to 256 KiB) before it sends the answer,
// and again after it. A client that declares a body and sends it a byte
// every few seconds would thus hold its connection, and the connection's
// slot (LimitConns), for the whole ReadTimeout, though it was refused at
// its first line: a 401, 403, 404, 405 or 415, or any answer that needs no
// body, such as /healthz's. Connection: close stops the read before the
// answer, so the client has its answer at once. The read after it, which
// lets a client still sending its body read the answer rather than a
// reset, gets UnreadBodyGrace, and the connection counts as idle for
// LimitConns meanwhile. A body read to its end, as every route that takes
// one reads a request it accepts, keeps the connection open.
func closeUnreadBodies(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength == 0 { // no body
			next.ServeHTTP(w, r)
			return
		}
		// Close, unless the handler reads the body to its end before it
		// writes the answer, whose headers net/http takes then.
		w.Header().Set("Connection", "close")
		body := &watchedBody{ReadCloser: r.Body, w: w}
		r = r.WithContext(r.Context()) // a copy: a handler must not change the request it is given
		r.Body = body
		next.ServeHTTP(w, r)
		if !body.ended {
			// The deadline first: once marked, LimitConns may end the
			// wait sooner, with a deadline of its own.
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(UnreadBodyGrace))
			markAnswered(r)
		}
	})
}

// watchedBody is a request body that notes when it has been read to its
// end, and then lets its connection stay open.
type watchedBody struct {
	io.ReadCloser
	w     http.ResponseWriter
	ended bool
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) && !b.ended {
		b.ended = true
		b.w.Header().Del("Connection")
	}
	return n, err
}
