// Package linkproxy is an HTTP reverse proxy on loopback that models a
// network link in front of a registry (or any HTTP server): one bandwidth
// shared by all connections, a cap on each connection's own rate, a delay
// on each new connection, and injected faults (Range requests ignored,
// connections cut mid-body).
//
// The model: response bodies go to the client in chunks of at most 32 KiB.
// Each chunk of n bytes reserves n·8/BitsPerSecond on one clock shared by
// every connection (the link) and n·8/ConnBitsPerSecond on its own
// connection's clock (a server or CDN that serves one stream at most that
// fast), first come first served, and is released when the later of its
// two slots ends. A clock that fell behind the wall clock starts again
// from at most 5 ms in the past, so a sleeper woken late gets its
// overshoot back without an idle link banking more than 5 ms of bytes.
// One connection thus gets min(ConnBitsPerSecond, BitsPerSecond), N busy
// connections together min(N·ConnBitsPerSecond, BitsPerSecond). Requests
// on a kept-alive connection share its clock; request and header bytes
// are not counted. ConnDelay holds each new connection's first read (a
// TCP handshake's round trip).
package linkproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Options configure a Proxy.
type Options struct {
	// Target is the upstream base URL, e.g. "http://127.0.0.1:5000".
	Target string
	// BitsPerSecond is one bandwidth shared by all connections, applied
	// to response bodies; 0 is unlimited.
	BitsPerSecond int64
	// ConnBitsPerSecond caps each client connection's response bodies,
	// within the shared bandwidth; 0 is no cap.
	ConnBitsPerSecond int64
	// ConnDelay is added to each new client TCP connection before its
	// first request is read (a round trip for the TCP handshake), not to
	// later requests on a kept-alive connection.
	ConnDelay time.Duration
	// IgnoreRange strips Range and If-Range from requests: the upstream
	// answers 200 with the whole body, as a registry without range
	// support does.
	IgnoreRange bool
}

// Stats counts what went through a Proxy.
type Stats struct {
	// Requests counts client requests; RangeRequests those carrying a
	// Range header (counted before IgnoreRange strips it).
	Requests      int
	RangeRequests int
	// Cuts counts responses cut by CutAfter.
	Cuts int
	// Connections counts accepted client connections.
	Connections int
	// BodyBytes counts response body bytes passed to clients.
	BodyBytes int64
}

// maxChunk bounds the body bytes released per reservation, so that
// concurrent responses interleave finely on the shared clock.
const maxChunk = 32 << 10

// maxCredit is how far the shared clock may lag behind the wall clock:
// a sleeper woken late gets its overshoot back instead of the link
// losing it, at the price of a burst of at most this much idle time's
// worth of bytes.
const maxCredit = 5 * time.Millisecond

// Proxy is a running link model; New starts it, Close stops it.
type Proxy struct {
	addr      string
	srv       *http.Server
	transport *http.Transport
	done      chan struct{}
	closeOnce sync.Once

	mu          sync.Mutex
	ignoreRange bool
	cuts        []cutRule
	stats       Stats
	link        schedule
}

// schedule is the link model's clocks (see the package comment).
type schedule struct {
	bps, connBps int64
	// next is the shared clock: when the link is free again.
	next time.Time
}

// connClock is one client connection's clock: when it may send again.
type connClock struct{ next time.Time }

// reserve books n body bytes of conn (nil: a connection unknown to the
// model, only the link applies) at now and returns how long to hold them.
func (s *schedule) reserve(now time.Time, n int, conn *connClock) time.Duration {
	var wait time.Duration
	if s.bps > 0 {
		wait = book(&s.next, now, n, s.bps)
	}
	if s.connBps > 0 && conn != nil {
		wait = max(wait, book(&conn.next, now, n, s.connBps))
	}
	return wait
}

// book reserves n bytes at bps on the clock next, from at most maxCredit
// before now, and returns the wait until the reservation ends.
func book(next *time.Time, now time.Time, n int, bps int64) time.Duration {
	if floor := now.Add(-maxCredit); next.Before(floor) {
		*next = floor
	}
	*next = next.Add(time.Duration(float64(n) * 8 * float64(time.Second) / float64(bps)))
	return next.Sub(now)
}

// cutRule is a CutAfter request not yet used up.
type cutRule struct {
	pathPart string
	after    int64
	times    int
}

// New starts a proxy to opts.Target listening on 127.0.0.1:0.
func New(opts Options) (*Proxy, error) {
	target, err := url.Parse(opts.Target)
	if err != nil {
		return nil, fmt.Errorf("linkproxy: target %q: %w", opts.Target, err)
	}
	if target.Scheme != "http" && target.Scheme != "https" || target.Host == "" {
		return nil, fmt.Errorf("linkproxy: target %q: want an http(s) base URL", opts.Target)
	}
	if opts.BitsPerSecond < 0 || opts.ConnBitsPerSecond < 0 || opts.ConnDelay < 0 {
		return nil, errors.New("linkproxy: negative bandwidth or delay")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("linkproxy: listen: %w", err)
	}
	p := &Proxy{addr: ln.Addr().String(), link: schedule{bps: opts.BitsPerSecond, connBps: opts.ConnBitsPerSecond},
		ignoreRange: opts.IgnoreRange, done: make(chan struct{}),
		// No transparent gzip: the client must see the upstream's bytes
		// and Content-Length.
		transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second}}
	discard := log.New(io.Discard, "", 0)
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			if p.countRequest(r.In) {
				r.Out.Header.Del("Range")
				r.Out.Header.Del("If-Range")
			}
		},
		Transport:      p.transport,
		ModifyResponse: p.wrapBody,
		// Flush every write: bytes reach the client when the link
		// releases them, and a cut delivers exactly what was released.
		FlushInterval: -1,
		// A cut is a read error by design; do not log it.
		ErrorLog: discard,
	}
	p.srv = &http.Server{Handler: rp, ReadHeaderTimeout: 30 * time.Second, ErrorLog: discard,
		// The connection's clock travels with each of its requests, to
		// the response body (the outgoing request keeps the context).
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if dc, ok := c.(*delayConn); ok {
				return context.WithValue(ctx, connClockKey{}, &dc.clock)
			}
			return ctx
		}}
	go p.srv.Serve(&delayListener{Listener: ln, p: p, delay: opts.ConnDelay})
	return p, nil
}

// Addr is the proxy's "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.addr }

// URL is the proxy's "http://127.0.0.1:port".
func (p *Proxy) URL() string { return "http://" + p.addr }

// Close stops the proxy and drops its connections.
func (p *Proxy) Close() error {
	p.closeOnce.Do(func() { close(p.done) })
	err := p.srv.Close()
	p.transport.CloseIdleConnections()
	if err != nil {
		return fmt.Errorf("linkproxy: close: %w", err)
	}
	return nil
}

// SetIgnoreRange switches the stripping of Range and If-Range from later
// requests.
func (p *Proxy) SetIgnoreRange(ignore bool) {
	p.mu.Lock()
	p.ignoreRange = ignore
	p.mu.Unlock()
}

// CutAfter makes the next `times` responses whose request path contains
// pathPart close the client connection abruptly (no clean end of body)
// after `after` body bytes. Only 200 and 206 responses to GET count (a
// HEAD has no body to cut); one whose Content-Length is at most `after`
// is delivered whole and still uses up one of the times.
func (p *Proxy) CutAfter(pathPart string, after int64, times int) {
	if times <= 0 {
		return
	}
	p.mu.Lock()
	p.cuts = append(p.cuts, cutRule{pathPart: pathPart, after: max(after, 0), times: times})
	p.mu.Unlock()
}

// Stats counts what went through.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// countRequest counts r and says whether its Range headers go.
func (p *Proxy) countRequest(r *http.Request) (stripRange bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats.Requests++
	if r.Header.Get("Range") != "" {
		p.stats.RangeRequests++
	}
	return p.ignoreRange
}

// wrapBody puts the link (and a pending cut) between the upstream's
// response body and the client.
func (p *Proxy) wrapBody(resp *http.Response) error {
	cut := int64(-1)
	if resp.Request.Method == http.MethodGet && (resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusPartialContent) {
		p.mu.Lock()
		for i := range p.cuts {
			if c := &p.cuts[i]; strings.Contains(resp.Request.URL.Path, c.pathPart) {
				cut = c.after
				if c.times--; c.times == 0 {
					p.cuts = append(p.cuts[:i], p.cuts[i+1:]...)
				}
				break
			}
		}
		p.mu.Unlock()
	}
	if cut >= 0 && resp.ContentLength >= 0 && cut >= resp.ContentLength {
		cut = -1
	}
	clock, _ := resp.Request.Context().Value(connClockKey{}).(*connClock)
	resp.Body = &linkBody{body: resp.Body, p: p, ctx: resp.Request.Context(), conn: clock, left: cut}
	return nil
}

// connClockKey finds a request's connection clock in its context.
type connClockKey struct{}

// errCut ends a cut body; the reverse proxy then aborts the client's
// connection (http.ErrAbortHandler) instead of ending the body.
var errCut = errors.New("linkproxy: connection cut")

// linkBody releases a response body at the link's pace.
type linkBody struct {
	body io.ReadCloser
	p    *Proxy
	ctx  context.Context
	conn *connClock
	// left is how many bytes remain before the cut; negative for none.
	left int64
}

func (b *linkBody) Read(buf []byte) (int, error) {
	if b.left == 0 {
		b.p.mu.Lock()
		b.p.stats.Cuts++
		b.p.mu.Unlock()
		return 0, errCut
	}
	if len(buf) > maxChunk {
		buf = buf[:maxChunk]
	}
	if b.left > 0 && int64(len(buf)) > b.left {
		buf = buf[:b.left]
	}
	n, err := b.body.Read(buf)
	if n > 0 {
		if b.left > 0 {
			b.left -= int64(n)
		}
		if werr := b.p.transmit(b.ctx, b.conn, n); werr != nil {
			return 0, werr
		}
	}
	return n, err
}

func (b *linkBody) Close() error { return b.body.Close() }

// transmit reserves n bytes' time on the link's and conn's clocks and
// waits until both have carried them.
func (p *Proxy) transmit(ctx context.Context, conn *connClock, n int) error {
	p.mu.Lock()
	p.stats.BodyBytes += int64(n)
	wait := p.link.reserve(time.Now(), n, conn)
	p.mu.Unlock()
	if wait <= 0 {
		return nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-p.done:
		return errors.New("linkproxy: closed")
	}
}

// delayListener counts client connections and delays each one's first
// read by delay.
type delayListener struct {
	net.Listener
	p     *Proxy
	delay time.Duration
}

func (l *delayListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.p.mu.Lock()
	l.p.stats.Connections++
	l.p.mu.Unlock()
	return &delayConn{Conn: c, delay: l.delay, done: l.p.done}, nil
}

// delayConn sleeps once, before its first read, and keeps the
// connection's clock (guarded by Proxy.mu).
type delayConn struct {
	net.Conn
	delay time.Duration
	done  <-chan struct{}
	once  sync.Once
	clock connClock
}

func (c *delayConn) Read(b []byte) (int, error) {
	c.once.Do(func() {
		if c.delay <= 0 {
			return
		}
		t := time.NewTimer(c.delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-c.done:
		}
	})
	return c.Conn.Read(b)
}
