package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultStallTimeout ends a registry response that delivers no data for
// this long, when Options.StallTimeout is 0.
const DefaultStallTimeout = 5 * time.Minute

// Caps on documents read whole into memory from a registry.
const (
	// MaxManifestBytes caps a manifest or index.
	MaxManifestBytes = 4 << 20
	// MaxConfigBytes caps an image config blob.
	MaxConfigBytes = 8 << 20
	// maxErrorBody is what is read of an error answer's body.
	maxErrorBody = 16 << 10
)

// ErrStalled marks a registry response that delivered no data for
// Options.StallTimeout.
var ErrStalled = errors.New("download stalled")

// ErrTooLarge marks a manifest, index or config larger than its cap.
var ErrTooLarge = errors.New("too large")

// StallError is a registry request or response body that made no progress
// for Timeout. errors.Is(err, ErrStalled) holds.
type StallError struct {
	Timeout time.Duration
}

// Error says how long nothing came and which setting bounds it.
func (e *StallError) Error() string {
	return fmt.Sprintf("download stalled: no data for %s (build.stall_timeout)", e.Timeout)
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
	return fmt.Errorf("%s: %w: larger than the %d MiB cap", c.what, ErrTooLarge, c.limit>>20)
}

// guardTransport is the registry transport's outer layer: it refuses
// requests to denied address literals, ends requests and bodies that make
// no progress for stall, and caps bodies the request context asks it to.
type guardTransport struct {
	inner  http.RoundTripper
	policy *netPolicy
	stall  time.Duration
}

func (g *guardTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := g.policy.checkURL(req); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	ctx, cancel := context.WithCancel(req.Context())
	w := newWatchdog(g.stall, cancel)
	w.arm()
	resp, err := g.inner.RoundTrip(req.WithContext(ctx))
	w.disarm()
	if err != nil {
		cancel()
		if w.fired.Load() {
			return nil, &StallError{Timeout: g.stall}
		}
		return nil, err
	}
	if resp.StatusCode >= 400 {
		// An error answer is read for its status and registry error codes
		// only: a longer body is cut (and then fails to parse) rather than
		// making the whole answer an unreadable "body exceeds" error.
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.LimitReader(resp.Body, maxErrorBody), resp.Body}
		resp.ContentLength = -1
	} else if c, ok := req.Context().Value(capKey{}).(bodyCap); ok {
		if resp.ContentLength > c.limit {
			resp.Body.Close()
			cancel()
			return nil, c.err()
		}
		resp.Body = &cappedBody{ReadCloser: resp.Body, c: c, left: c.limit}
	}
	resp.Body = &watchedBody{rc: resp.Body, w: w, cancel: cancel}
	return resp, nil
}

// watchdog cancels a request when one wait (for the response headers or
// inside one body Read) lasts longer than timeout. Time between Reads does
// not count: a slow reader is not a stalled registry.
type watchdog struct {
	timeout time.Duration
	fired   atomic.Bool

	once  sync.Once
	fire  func()
	timer *time.Timer
}

func newWatchdog(timeout time.Duration, cancel context.CancelFunc) *watchdog {
	w := &watchdog{timeout: timeout}
	w.fire = func() {
		w.fired.Store(true)
		cancel()
	}
	return w
}

func (w *watchdog) arm() {
	w.once.Do(func() { w.timer = time.AfterFunc(w.timeout, w.fire) })
	w.timer.Reset(w.timeout)
}

func (w *watchdog) disarm() { w.timer.Stop() }

// watchedBody runs the watchdog around each Read.
type watchedBody struct {
	rc     io.ReadCloser
	w      *watchdog
	cancel context.CancelFunc
}

func (b *watchedBody) Read(p []byte) (int, error) {
	if b.w.fired.Load() {
		return 0, &StallError{Timeout: b.w.timeout}
	}
	b.w.arm()
	n, err := b.rc.Read(p)
	b.w.disarm()
	if err != nil && err != io.EOF && b.w.fired.Load() {
		return n, &StallError{Timeout: b.w.timeout}
	}
	return n, err
}

func (b *watchedBody) Close() error {
	b.w.disarm()
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
