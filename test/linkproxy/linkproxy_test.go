package linkproxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// upstream serves /blob/N (N bytes, Range supported through
// http.ServeContent) and records the Range headers it saw.
type upstream struct {
	*httptest.Server
	mu     sync.Mutex
	ranges []string
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{}
	mux := http.NewServeMux()
	mux.HandleFunc("/blob/{n}", func(w http.ResponseWriter, r *http.Request) {
		var n int
		if _, err := fmt.Sscan(r.PathValue("n"), &n); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		u.mu.Lock()
		u.ranges = append(u.ranges, r.Header.Get("Range")+"|"+r.Header.Get("If-Range"))
		u.mu.Unlock()
		http.ServeContent(w, r, "blob", time.Unix(1e9, 0), bytes.NewReader(content(n)))
	})
	u.Server = httptest.NewServer(mux)
	t.Cleanup(u.Close)
	return u
}

// content is the body of /blob/n.
func content(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return b
}

func newProxy(t *testing.T, opts Options) *Proxy {
	t.Helper()
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

// get fetches url with client and returns the response (empty when the
// request failed) and its body read to the end (or to the read error).
func get(t *testing.T, client *http.Client, url string, header http.Header) (*http.Response, []byte, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return &http.Response{}, nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := client.Do(req)
	if err != nil {
		return &http.Response{}, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

func TestBandwidth(t *testing.T) {
	const bps = 32_000_000 // 4 MB/s
	const total = 2 << 20
	for _, conns := range []int{1, 4} {
		t.Run(fmt.Sprintf("Connections%d", conns), func(t *testing.T) {
			u := newUpstream(t)
			p := newProxy(t, Options{Target: u.URL, BitsPerSecond: bps})
			modelled := time.Duration(float64(total) * 8 / bps * float64(time.Second))
			start := time.Now()
			took := make([]time.Duration, conns)
			var wg sync.WaitGroup
			for i := range conns {
				wg.Go(func() {
					client := &http.Client{Transport: &http.Transport{}}
					_, body, err := get(t, client, fmt.Sprintf("%s/blob/%d", p.URL(), total/conns), nil)
					if err != nil || len(body) != total/conns {
						t.Errorf("download %d: %d bytes, %v", i, len(body), err)
					}
					took[i] = time.Since(start)
				})
			}
			wg.Wait()
			// Shared fairly, every download ends near the end of the
			// whole transfer; each connection with the full bandwidth
			// would end at a quarter of it.
			for i, d := range took {
				if d < modelled*8/10 {
					t.Errorf("download %d of %d took %v; the link model says %v for all %d bytes", i, conns, d, modelled, total)
				}
			}
			if got := p.Stats(); got.BodyBytes != total || got.Requests != conns || got.Connections != conns {
				t.Errorf("Stats = %+v, want %d body bytes, %d requests and connections", got, total, conns)
			}
		})
	}
}

func TestConnDelayPerConnection(t *testing.T) {
	const delay = 300 * time.Millisecond
	u := newUpstream(t)
	p := newProxy(t, Options{Target: u.URL, ConnDelay: delay})
	fetch := func(client *http.Client) time.Duration {
		start := time.Now()
		if _, body, err := get(t, client, p.URL()+"/blob/100", nil); err != nil || len(body) != 100 {
			t.Fatalf("GET: %d bytes, %v", len(body), err)
		}
		return time.Since(start)
	}
	kept := &http.Client{Transport: &http.Transport{}}
	if d := fetch(kept); d < delay {
		t.Errorf("first request on a new connection took %v, want at least %v", d, delay)
	}
	for i := range 3 {
		if d := fetch(kept); d >= delay {
			t.Errorf("request %d on the kept-alive connection took %v: the delay applies per connection, not per request", i+2, d)
		}
	}
	if d := fetch(&http.Client{Transport: &http.Transport{}}); d < delay {
		t.Errorf("request on a second connection took %v, want at least %v", d, delay)
	}
	if got := p.Stats(); got.Connections != 2 || got.Requests != 5 {
		t.Errorf("Stats = %+v, want 2 connections and 5 requests", got)
	}
}

func TestIgnoreRange(t *testing.T) {
	u := newUpstream(t)
	p := newProxy(t, Options{Target: u.URL})
	client := &http.Client{}
	want := content(1000)
	rangeHeader := http.Header{"Range": {"bytes=100-199"}}

	resp, body, err := get(t, client, p.URL()+"/blob/1000", rangeHeader)
	if err != nil || resp.StatusCode != http.StatusPartialContent || !bytes.Equal(body, want[100:200]) {
		t.Fatalf("ranged GET through the proxy: %d, %d bytes, %v; want 206 and bytes 100-199", resp.StatusCode, len(body), err)
	}
	p.SetIgnoreRange(true)
	rangeHeader.Set("If-Range", resp.Header.Get("Last-Modified"))
	resp, body, err = get(t, client, p.URL()+"/blob/1000", rangeHeader)
	if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(body, want) {
		t.Fatalf("ranged GET with IgnoreRange: %d, %d bytes, %v; want 200 and the whole body", resp.StatusCode, len(body), err)
	}
	p.SetIgnoreRange(false)
	if resp, _, _ := get(t, client, p.URL()+"/blob/1000", rangeHeader); resp.StatusCode != http.StatusPartialContent {
		t.Errorf("ranged GET after SetIgnoreRange(false): %d, want 206", resp.StatusCode)
	}
	u.mu.Lock()
	seen := u.ranges
	u.mu.Unlock()
	if len(seen) != 3 || seen[0] != "bytes=100-199|" || seen[1] != "|" || seen[2] == "|" {
		t.Errorf("upstream saw Range|If-Range %q; want the middle request stripped", seen)
	}
	if got := p.Stats(); got.RangeRequests != 3 || got.Requests != 3 {
		t.Errorf("Stats = %+v, want 3 requests, all with Range", got)
	}
}

func TestCutAfter(t *testing.T) {
	const size, after = 200_000, 70_001
	u := newUpstream(t)
	p := newProxy(t, Options{Target: u.URL, BitsPerSecond: 1_000_000_000})
	client := &http.Client{}
	want := content(size)
	p.CutAfter("/blob/200000", after, 2)

	// Another path neither gets cut nor uses up a cut, nor does a HEAD
	// (no body) of the path.
	if _, body, err := get(t, client, p.URL()+"/blob/1000", nil); err != nil || len(body) != 1000 {
		t.Fatalf("GET of another path: %d bytes, %v", len(body), err)
	}
	if resp, err := client.Head(p.URL() + "/blob/200000"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("HEAD: %v, %v", resp, err)
	}
	for i := range 2 {
		resp, body, err := get(t, client, p.URL()+"/blob/200000", nil)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("cut response %d: read error %v, want unexpected EOF", i, err)
		}
		if resp.ContentLength != size {
			t.Errorf("cut response %d: Content-Length %d, want the upstream's %d", i, resp.ContentLength, size)
		}
		if len(body) != after || !bytes.Equal(body, want[:after]) {
			t.Errorf("cut response %d: %d bytes before the cut, want the first %d", i, len(body), after)
		}
	}
	resp, body, err := get(t, client, p.URL()+"/blob/200000", nil)
	if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(body, want) {
		t.Errorf("third response: %d, %d bytes, %v; want it whole", resp.StatusCode, len(body), err)
	}
	// A body no longer than the cut point arrives whole, and uses up the
	// cut: the next matching path ("/blob/10000" contains "/blob/1000")
	// arrives whole too.
	p.CutAfter("/blob/1000", 1000, 1)
	if _, body, err := get(t, client, p.URL()+"/blob/1000", nil); err != nil || len(body) != 1000 {
		t.Errorf("GET of a body as long as the cut point: %d bytes, %v; want it whole", len(body), err)
	}
	if _, body, err := get(t, client, p.URL()+"/blob/10000", nil); err != nil || len(body) != 10000 {
		t.Errorf("GET after the cut was used up: %d bytes, %v; want it whole", len(body), err)
	}
	if got := p.Stats(); got.Cuts != 2 || got.Requests != 7 || got.BodyBytes != 2*1000+10000+2*after+size {
		t.Errorf("Stats = %+v, want 2 cuts, 7 requests, %d body bytes", got, 2*1000+10000+2*after+size)
	}
}

func TestNewRejects(t *testing.T) {
	for _, o := range []Options{{Target: "127.0.0.1:5000"}, {Target: "ftp://x"}, {Target: "http://x", BitsPerSecond: -1}} {
		if p, err := New(o); err == nil {
			p.Close()
			t.Errorf("New(%+v): no error", o)
		}
	}
}

// simulate runs the link model on a virtual clock: each of conns
// connections reads total bytes in maxChunk chunks, asking for the next
// one when the last is released, plus late when it slept for it (a
// timer's overshoot). It
// returns when each connection had all its bytes.
func simulate(s *schedule, conns int, total int64, late time.Duration) []time.Duration {
	start := time.Unix(1e9, 0)
	clocks := make([]connClock, conns)
	at := make([]time.Time, conns) // when each connection asks next
	left := make([]int64, conns)
	ended := make([]time.Duration, conns)
	for i := range conns {
		at[i], left[i] = start, total
	}
	for {
		next := -1
		for i := range conns {
			if left[i] > 0 && (next < 0 || at[i].Before(at[next])) {
				next = i
			}
		}
		if next < 0 {
			return ended
		}
		n := int(min(left[next], maxChunk))
		wait := s.reserve(at[next], n, &clocks[next])
		left[next] -= int64(n)
		if wait > 0 {
			at[next] = at[next].Add(wait)
		}
		if left[next] == 0 {
			ended[next] = at[next].Sub(start)
		}
		if wait > 0 {
			at[next] = at[next].Add(late) // only a sleeper wakes late
		}
	}
}

// TestModelSharesLinkAndCapsEachConnection: on the model's own clock, one
// connection gets its cap, N connections together min(N·cap, link), and
// a timer that wakes late costs no rate.
func TestModelSharesLinkAndCapsEachConnection(t *testing.T) {
	const link, capped = 1_000_000_000, 200_000_000
	const total = 64 << 20 // bytes per connection
	for _, c := range []struct {
		conns         int
		link, connCap int64
		want          float64 // bits per second of each connection
	}{
		{1, link, capped, capped},
		{3, link, capped, capped},
		{5, link, capped, capped},
		{8, link, capped, link / 8},
		{1, link, 0, link},
		{4, link, 0, link / 4},
		{2, 0, capped, capped},
	} {
		for _, late := range []time.Duration{0, 300 * time.Microsecond} {
			t.Run(fmt.Sprintf("%d-conns-link%d-cap%d-late%v", c.conns, c.link/1e6, c.connCap/1e6, late), func(t *testing.T) {
				ended := simulate(&schedule{bps: c.link, connBps: c.connCap}, c.conns, total, late)
				for i, d := range ended {
					got := float64(total) * 8 / d.Seconds()
					if got < c.want*0.97 || got > c.want*1.03 {
						t.Errorf("connection %d of %d: %.0f Mbit/s, want %.0f", i, c.conns, got/1e6, c.want/1e6)
					}
				}
			})
		}
	}
}

// TestConnectionCap: through the proxy, one connection gets its cap
// however fast the link is, requests on a kept-alive connection share
// it, and connections of a link slower than their caps share the link.
func TestConnectionCap(t *testing.T) {
	const connCap = 16_000_000 // 2 MB/s
	const size = 1 << 20
	seconds := func(bytes int, bps float64) time.Duration {
		return time.Duration(float64(bytes) * 8 / bps * float64(time.Second))
	}
	fetch := func(t *testing.T, client *http.Client, url string) {
		t.Helper()
		if _, body, err := get(t, client, url, nil); err != nil || len(body) != size {
			t.Errorf("GET %s: %d bytes, %v", url, len(body), err)
		}
	}
	u := newUpstream(t)
	url := fmt.Sprintf("%s/blob/%d", "%s", size)

	t.Run("OneConnection", func(t *testing.T) {
		p := newProxy(t, Options{Target: u.URL, BitsPerSecond: 1_000_000_000, ConnBitsPerSecond: connCap})
		client := &http.Client{Transport: &http.Transport{}}
		start := time.Now()
		fetch(t, client, fmt.Sprintf(url, p.URL()))
		one := time.Since(start)
		fetch(t, client, fmt.Sprintf(url, p.URL()))
		both := time.Since(start)
		if want := seconds(size, connCap); one < want*8/10 || one > want*3 {
			t.Errorf("one body on one connection took %v; its cap allows %v", one, want)
		}
		if want := seconds(2*size, connCap); both < want*8/10 {
			t.Errorf("two bodies on one kept-alive connection took %v; its cap allows %v for both", both, want)
		}
		if st := p.Stats(); st.Connections != 1 {
			t.Errorf("%d connections, want the kept-alive one", st.Connections)
		}
	})
	t.Run("LinkSlowerThanCaps", func(t *testing.T) {
		const link = 24_000_000 // 1.5 caps
		p := newProxy(t, Options{Target: u.URL, BitsPerSecond: link, ConnBitsPerSecond: connCap})
		start := time.Now()
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() { fetch(t, &http.Client{Transport: &http.Transport{}}, fmt.Sprintf(url, p.URL())) })
		}
		wg.Wait()
		if took, want := time.Since(start), seconds(3*size, link); took < want*8/10 || took > want*3 {
			t.Errorf("three connections took %v; the link allows %v for all, their caps %v", took, want, seconds(size, connCap))
		}
	})
}
