package oci

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// linkModel serves blob bodies as a link in front of a registry would:
// each response at most perConn bytes per second (a CDN's per-connection
// cap), all together at most shared (the node's link; 0 is unlimited),
// and a new connection's first answer delayed by connDelay. It records
// the blob requests: their Range headers and the connections they came
// on.
type linkModel struct {
	perConn, shared int64
	connDelay       time.Duration
	// tamper, if not nil, may change the answer to the k-th (from 0)
	// GET of a blob before it is sent.
	tamper func(q blobReq, k int, a *answer)
	// blobs, if not nil, serves the blobs it holds (by digest) itself,
	// with Range, instead of the registry: no copy of a large blob per
	// request. tamper does not apply to them.
	blobs map[string][]byte

	mu sync.Mutex
	// next is when the shared link is free again.
	next     time.Time
	seen     map[string]bool // connections (remote addresses) seen
	blobReqs []blobReq
}

// blobReq is one GET of a blob the link served.
type blobReq struct {
	digest, rng, conn string
}

// offset returns where the request's Range starts (0 without one).
func (q blobReq) offset() int64 {
	var first, last int64
	if _, err := fmt.Sscanf(q.rng, "bytes=%d-%d", &first, &last); err != nil {
		return 0
	}
	return first
}

// answer is a recorded registry answer about to go through the link.
type answer struct {
	status int
	header http.Header
	body   []byte
	// cutAfter, when at least 0, drops the connection after that many
	// body bytes; stallAfter, when at least 0, sends that many and then
	// nothing until the client leaves; noLength sends no Content-Length.
	cutAfter, stallAfter int
	noLength             bool
}

// pieceSize is what a response writes at a time.
const pieceSize = 32 << 10

// linkCredit is how far the shared clock may lag the wall clock, so that a
// sleeper woken late gets its overshoot back instead of the link losing
// it; linkSlack is the debt a writer runs up before it sleeps.
const (
	linkCredit = 5 * time.Millisecond
	linkSlack  = 2 * time.Millisecond
)

func newLinkModel(perConn, shared int64, connDelay time.Duration) *linkModel {
	return &linkModel{perConn: perConn, shared: shared, connDelay: connDelay, seen: make(map[string]bool)}
}

// wrap serves every blob GET through the link; other requests pass.
func (m *linkModel) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := strings.Index(r.URL.Path, "/blobs/sha256:")
		if r.Method != http.MethodGet || i < 0 {
			next.ServeHTTP(w, r)
			return
		}
		q := blobReq{digest: r.URL.Path[i+len("/blobs/"):], rng: r.Header.Get("Range"), conn: r.RemoteAddr}
		m.mu.Lock()
		fresh := !m.seen[r.RemoteAddr]
		m.seen[r.RemoteAddr] = true
		k := 0
		for _, o := range m.blobReqs {
			if o.digest == q.digest {
				k++
			}
		}
		m.blobReqs = append(m.blobReqs, q)
		m.mu.Unlock()
		if fresh && m.connDelay > 0 {
			time.Sleep(m.connDelay)
		}
		if blob, ok := m.blobs[q.digest]; ok {
			http.ServeContent(m.pace(w, r), r, "", time.Time{}, bytes.NewReader(blob))
			return
		}
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		a := &answer{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes(), cutAfter: -1, stallAfter: -1}
		if m.tamper != nil {
			m.tamper(q, k, a)
		}
		m.send(w, r, a)
	})
}

// send writes an answer through the link.
func (m *linkModel) send(w http.ResponseWriter, r *http.Request, a *answer) {
	for k, v := range a.header {
		w.Header()[k] = v
	}
	body := a.body
	if a.noLength {
		w.Header().Del("Content-Length")
	} else {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(a.status)
	w.(http.Flusher).Flush()
	pw := m.pace(w, r)
	switch {
	case a.cutAfter >= 0 && a.cutAfter < len(body):
		pw.Write(body[:a.cutAfter])
		panic(http.ErrAbortHandler) // the connection drops mid-body
	case a.stallAfter >= 0 && a.stallAfter < len(body):
		pw.Write(body[:a.stallAfter])
		<-r.Context().Done()
	default:
		pw.Write(body)
	}
}

// pace returns a writer sending a response body through the link.
func (m *linkModel) pace(w http.ResponseWriter, r *http.Request) *pacedWriter {
	return &pacedWriter{ResponseWriter: w, m: m, ctx: r.Context()}
}

// pacedWriter writes a body in pieces, each when the link lets it go,
// flushing each.
type pacedWriter struct {
	http.ResponseWriter
	m   *linkModel
	ctx context.Context
	// next is when the connection's cap lets its next byte go.
	next time.Time
}

func (w *pacedWriter) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		piece := b[:min(pieceSize, len(b))]
		b = b[len(piece):]
		wait := w.m.reserve(len(piece))
		if w.m.perConn > 0 {
			// The connection's own clock, with the same credit.
			if floor := time.Now().Add(-linkCredit); w.next.Before(floor) {
				w.next = floor
			}
			w.next = w.next.Add(time.Duration(float64(len(piece)) / float64(w.m.perConn) * float64(time.Second)))
			wait = max(wait, time.Until(w.next))
		}
		if wait > linkSlack {
			select {
			case <-time.After(wait):
			case <-w.ctx.Done():
				return n, w.ctx.Err()
			}
		}
		k, err := w.ResponseWriter.Write(piece)
		n += k
		if err != nil {
			return n, err
		}
		w.ResponseWriter.(http.Flusher).Flush()
	}
	return n, nil
}

// reserve books n bytes on the shared link and returns how long to wait
// before sending them.
func (m *linkModel) reserve(n int) time.Duration {
	if m.shared <= 0 {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if floor := time.Now().Add(-linkCredit); m.next.Before(floor) {
		m.next = floor
	}
	m.next = m.next.Add(time.Duration(float64(n) / float64(m.shared) * float64(time.Second)))
	return time.Until(m.next)
}

// requests returns the blob GETs of d.
func (m *linkModel) requests(d v1.Hash) []blobReq {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []blobReq
	for _, q := range m.blobReqs {
		if q.digest == d.String() {
			out = append(out, q)
		}
	}
	return out
}

// connections counts the connections blob d was requested on.
func (m *linkModel) connections(d v1.Hash) int {
	conns := make(map[string]bool)
	for _, q := range m.requests(d) {
		conns[q.conn] = true
	}
	return len(conns)
}

// testChunking is the chunking of the tests: small blobs in small chunks,
// so that a few MiB show what production does with hundreds.
var testChunking = chunking{
	minBlob:    1 << 20,
	first:      256 << 10,
	minChunk:   128 << 10,
	maxChunk:   1 << 20,
	chunkTime:  100 * time.Millisecond,
	roundTrips: 8,
	tail:       64 << 10,
}

// newChunkingPuller is newTestPuller with testChunking.
func newChunkingPuller(t testing.TB, opts Options) *Puller {
	t.Helper()
	p := newTestPuller(t, opts)
	p.chunks = testChunking
	return p
}
