package oci

import (
	"net/http"
	"sync"
	"time"
)

// transportTTL is how long an authenticated registry transport is reused
// by later resolves of the same repository. Long enough for a rebuild or a
// reuse submitted right after a build, or a burst of them; short enough
// that a changed keychain or registry setup is picked up soon. A bearer
// token that expires meanwhile is refreshed by the transport itself (on
// the registry's 401).
const transportTTL = time.Minute

// maxTransports bounds the transports kept: one per repository recently
// resolved.
const maxTransports = 256

// transportCache keeps the authenticated transports (ping, token exchange
// done) of endpoints whose credentials come from the node, not from the
// build request, between resolves. Without it every resolve pings the
// registry (for an insecure registry a TLS attempt and a plain HTTP ping)
// and, behind a token server, fetches a token before it reads the manifest:
// two to four round trips more on the path of a reuse, whose resolve is
// most of its work. A request's own credentials never share a transport.
type transportCache struct {
	now func() time.Time

	mu sync.Mutex
	m  map[string]cachedTransport
}

type cachedTransport struct {
	rt   http.RoundTripper
	made time.Time
}

func newTransportCache() *transportCache {
	return &transportCache{now: time.Now, m: make(map[string]cachedTransport)}
}

// get returns the transport kept for key, if it is younger than
// transportTTL.
func (c *transportCache) get(key string) http.RoundTripper {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok {
		return nil
	}
	if c.now().Sub(e.made) >= transportTTL {
		delete(c.m, key)
		return nil
	}
	return e.rt
}

// put keeps rt for key, first dropping expired entries (and, when still
// full, all of them: a node resolving hundreds of repositories a minute
// loses only a round trip per resolve).
func (c *transportCache) put(key string, rt http.RoundTripper) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= maxTransports {
		now := c.now()
		for k, e := range c.m {
			if now.Sub(e.made) >= transportTTL {
				delete(c.m, k)
			}
		}
		if len(c.m) >= maxTransports {
			clear(c.m)
		}
	}
	c.m[key] = cachedTransport{rt: rt, made: c.now()}
}

// drop forgets the transport kept for key only if it is still rt, so that
// a failure seen through an old transport does not drop a newer one.
func (c *transportCache) drop(key string, rt http.RoundTripper) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[key]; ok && e.rt == rt {
		delete(c.m, key)
	}
}
