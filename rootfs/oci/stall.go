package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// DefaultStallTimeout ends a registry response that delivers no data for
// this long, when Options.StallTimeout is 0.
const DefaultStallTimeout = 5 * time.Minute

// DefaultMinTransferRate is the slowest a registry response may deliver,
// in bytes per second averaged over the stall timeout, when
// Options.MinTransferRate is 0: 1 KiB/s, 300 KiB per default window. It is
// far below any working link, and far above a registry that trickles a byte
// now and then to keep a build slot.
const DefaultMinTransferRate = 1 << 10

// documentDeadlineFactor times the stall timeout bounds a whole request for
// a small document (ping, token, manifest, config): those are a few KiB, so
// a registry that has not sent one in full by then is holding the slot.
const documentDeadlineFactor = 2

// Caps on documents read whole into memory from a registry.
const (
	// MaxManifestBytes caps a manifest or index.
	MaxManifestBytes = 4 << 20
	// MaxConfigBytes caps an image config blob.
	MaxConfigBytes = 8 << 20
	// maxDocumentBytes caps any other small document (a token answer).
	maxDocumentBytes = 1 << 20
	// maxErrorBody is what is read of an error answer's body, and of the
	// body of a ping (GET /v2/), which go-containerregistry drains whole
	// and ignores.
	maxErrorBody = 16 << 10
)

// ErrStalled marks a registry response that delivered no data, or too
// little, for Options.StallTimeout, or a small document that took longer
// than twice that in all.
var ErrStalled = errors.New("download stalled")

// ErrTooLarge marks a manifest, index or config larger than its cap.
var ErrTooLarge = errors.New("too large")

// StallError is a registry request or response body that made too little
// progress. errors.Is(err, ErrStalled) holds.
type StallError struct {
	// Timeout is the stall window (build.stall_timeout).
	Timeout time.Duration
	// Got and MinBytes, when Got is not 0, are the bytes a window of
	// Timeout brought and the bytes build.min_transfer_rate asks of it.
	Got, MinBytes int64
	// Deadline, when not 0, is the whole-request bound a small document
	// (ping, token, manifest, config) exceeded.
	Deadline time.Duration
}

// Error says what was too slow and which setting bounds it.
func (e *StallError) Error() string {
	switch {
	case e.Deadline > 0:
		return fmt.Sprintf("download stalled: a registry document (ping, token, manifest or config) was not complete after %s (twice build.stall_timeout)", e.Deadline)
	case e.Got > 0:
		return fmt.Sprintf("download stalled: %d bytes in %s, below the %d that build.min_transfer_rate asks over build.stall_timeout", e.Got, e.Timeout, e.MinBytes)
	default:
		return fmt.Sprintf("download stalled: no data for %s (build.stall_timeout)", e.Timeout)
	}
}

// Is reports ErrStalled.
func (e *StallError) Is(target error) bool { return target == ErrStalled }

// capKey is the context key of the size cap of a response body.
type capKey struct{}

// bodyCap is the size cap withBodyCap attaches to requests.
type bodyCap struct {
	what  string
	limit int64
}

// withBodyCap caps the response bodies of the requests made under ctx at
// limit bytes; what names the document in the error.
func withBodyCap(ctx context.Context, what string, limit int64) context.Context {
	return context.WithValue(ctx, capKey{}, bodyCap{what: what, limit: limit})
}

func (c bodyCap) err() error {
	return fmt.Errorf("%s: %w: larger than the %s cap", c.what, ErrTooLarge, sizeString(c.limit))
}

func sizeString(n int64) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

// streamKey is the context key of the URL of a layer download.
type streamKey struct{}

// withStream marks the GET of url under ctx as a layer download: no
// whole-request deadline (layers are large), only the minimum rate. The
// other requests under ctx (a token fetched on the way) stay documents.
func withStream(ctx context.Context, url string) context.Context {
	return context.WithValue(ctx, streamKey{}, url)
}

// isStream reports whether req is the layer download its context marks,
// or a redirect of it.
func isStream(req *http.Request) bool {
	u, ok := req.Context().Value(streamKey{}).(string)
	if !ok {
		return false
	}
	first := req
	for first.Response != nil && first.Response.Request != nil {
		first = first.Response.Request
	}
	return first.Method == http.MethodGet && first.URL.String() == u
}

// guardTransport is the registry transport's outer layer: it refuses
// requests to denied address literals, ends requests and bodies that bring
// less than minBytes per stall of waiting, bounds small documents to
// documentDeadlineFactor × stall in all, and caps bodies.
type guardTransport struct {
	inner    http.RoundTripper
	policy   *netPolicy
	stall    time.Duration
	minBytes int64
}

func (g *guardTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := g.policy.checkURL(req); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	ctx, cancel := context.WithCancel(req.Context())
	w := newWatchdog(g.stall, g.minBytes, cancel)
	stream := isStream(req)
	if !stream {
		w.deadline(documentDeadlineFactor * g.stall)
	}
	w.arm()
	resp, err := g.inner.RoundTrip(req.WithContext(ctx))
	w.disarm()
	if err != nil {
		w.stop()
		cancel()
		if serr := w.err(); serr != nil {
			return nil, serr
		}
		return nil, err
	}
	c, capped := req.Context().Value(capKey{}).(bodyCap)
	if !capped && !stream {
		c, capped = bodyCap{what: "registry answer to " + req.URL.Path, limit: maxDocumentBytes}, true
	}
	switch {
	case resp.StatusCode >= 400, req.Method == http.MethodGet && req.URL.Path == "/v2/":
		// An error answer is read for its status and registry error codes
		// only: a longer body is cut (and then fails to parse) rather than
		// making the whole answer an unreadable "body exceeds" error. A
		// ping's body is drained and ignored: cut, it cannot hold the slot.
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.LimitReader(resp.Body, maxErrorBody), resp.Body}
		resp.ContentLength = -1
	case capped:
		if resp.ContentLength > c.limit {
			resp.Body.Close()
			w.stop()
			cancel()
			return nil, c.err()
		}
		resp.Body = &cappedBody{ReadCloser: resp.Body, c: c, left: c.limit}
	}
	resp.Body = &watchedBody{rc: resp.Body, w: w, cancel: cancel}
	return resp, nil
}

// watchdog cancels a request that waits too long for too little: the
// response headers for longer than timeout, or a body that brings fewer
// than minBytes in a window of timeout spent waiting inside Read. Time
// between Reads does not count: a slow reader is not a stalled registry.
// A window ends, and the next begins, when it has brought minBytes. A
// document's whole request is also bounded by a deadline.
type watchdog struct {
	timeout  time.Duration
	minBytes int64
	cancel   context.CancelFunc

	mu      sync.Mutex
	fired   *StallError // the verdict, once the watchdog fired
	pending *StallError // what the armed timer reports if it fires
	timer   *time.Timer
	whole   *time.Timer

	// The current window: wait time left, bytes brought. Touched only by
	// the reading goroutine.
	left time.Duration
	got  int64
}

func newWatchdog(timeout time.Duration, minBytes int64, cancel context.CancelFunc) *watchdog {
	return &watchdog{timeout: timeout, minBytes: minBytes, cancel: cancel, left: timeout}
}

func (w *watchdog) trip(e *StallError) {
	w.mu.Lock()
	if w.fired == nil {
		w.fired = e
	}
	w.mu.Unlock()
	w.cancel()
}

// err returns the verdict, or nil when the watchdog has not fired.
func (w *watchdog) err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fired == nil {
		return nil
	}
	return w.fired
}

// deadline bounds the whole request, body included, to d.
func (w *watchdog) deadline(d time.Duration) {
	e := &StallError{Timeout: w.timeout, Deadline: d}
	w.whole = time.AfterFunc(d, func() { w.trip(e) })
}

// arm starts the timer for one wait: what is left of the window.
func (w *watchdog) arm() {
	e := &StallError{Timeout: w.timeout}
	if w.got > 0 {
		e.Got, e.MinBytes = w.got, w.minBytes
	}
	w.mu.Lock()
	w.pending = e
	if w.timer == nil {
		w.timer = time.AfterFunc(w.left, w.firePending)
	} else {
		w.timer.Reset(w.left)
	}
	w.mu.Unlock()
}

func (w *watchdog) firePending() {
	w.mu.Lock()
	e := w.pending
	w.mu.Unlock()
	w.trip(e)
}

func (w *watchdog) disarm() {
	w.mu.Lock()
	w.timer.Stop()
	w.mu.Unlock()
}

// account counts a Read that brought n bytes after waiting waited: a window
// that has brought minBytes starts the next; one that ran out of time short
// of it fires (when the timer lost the race to the Read's return).
func (w *watchdog) account(n int, waited time.Duration, eof bool) {
	w.got += int64(n)
	w.left -= waited
	switch {
	case n > 0 && w.got >= w.minBytes:
		w.got, w.left = 0, w.timeout
	case w.left <= 0 && !eof:
		e := &StallError{Timeout: w.timeout}
		if w.got > 0 {
			e.Got, e.MinBytes = w.got, w.minBytes
		}
		w.trip(e)
	}
}

// stop releases the timers.
func (w *watchdog) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.timer != nil {
		w.timer.Stop()
	}
	if w.whole != nil {
		w.whole.Stop()
	}
}

// watchedBody runs the watchdog around each Read.
type watchedBody struct {
	rc     io.ReadCloser
	w      *watchdog
	cancel context.CancelFunc
}

func (b *watchedBody) Read(p []byte) (int, error) {
	if err := b.w.err(); err != nil {
		return 0, err
	}
	start := time.Now()
	b.w.arm()
	n, err := b.rc.Read(p)
	b.w.disarm()
	b.w.account(n, time.Since(start), err == io.EOF)
	if err != nil && err != io.EOF {
		if serr := b.w.err(); serr != nil {
			return n, serr
		}
	}
	return n, err
}

func (b *watchedBody) Close() error {
	b.w.stop()
	err := b.rc.Close()
	b.cancel()
	return err
}

// cappedBody fails a body longer than its cap.
type cappedBody struct {
	io.ReadCloser
	c    bodyCap
	left int64
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more than the cap tells a body at the cap from a longer one.
		var one [1]byte
		n, err := b.ReadCloser.Read(one[:])
		if n > 0 {
			return 0, b.c.err()
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}
