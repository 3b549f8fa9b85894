package oci

import (
	"crypto/sha256"
	"encoding/hex"
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

// maxKeptConfig bounds the image config kept with a transport: configs
// are a few KiB; a larger one is read from the registry every time, and
// the cache holds at most maxTransports × maxKeptConfig.
const maxKeptConfig = 64 << 10

// transportCache keeps the authenticated transports (ping, token exchange
// done) of endpoints whose credentials come from the node, not from the
// build request, between resolves. Without it every resolve pings the
// registry (for an insecure registry a TLS attempt and a plain HTTP ping)
// and, behind a token server, fetches a token before it reads the manifest:
// two to four round trips more on the path of a reuse, whose resolve is
// most of its work. A request's own credentials never share a transport.
//
// With each transport it keeps the last image config read through it, by
// the sha256 of its bytes: a resolve whose manifest names that digest (a
// reuse, a rebuild of the same tag) reads it from here, one round trip
// less. Being content-addressed it cannot be stale, and it is only ever
// given to resolves of the same repository with the same credentials, as
// the registry itself would.
type transportCache struct {
	now func() time.Time

	mu sync.Mutex
	m  map[string]cachedTransport
}

type cachedTransport struct {
	rt   http.RoundTripper
	made time.Time
	// configDigest ("sha256:<hex>" of config) and config are the last
	// image config read through rt.
	configDigest string
	config       []byte
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

// config returns the image config kept with key's transport rt whose
// digest is digest, nil when none is (or the transport expired or was
// replaced).
func (c *transportCache) config(key string, rt http.RoundTripper, digest string) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || e.rt != rt || e.configDigest != digest || c.now().Sub(e.made) >= transportTTL {
		return nil
	}
	return e.config
}

// keepConfig keeps raw, an image config read through key's transport rt,
// under the digest of its bytes, in place of the one kept before.
func (c *transportCache) keepConfig(key string, rt http.RoundTripper, raw []byte) {
	if len(raw) > maxKeptConfig {
		return
	}
	sum := sha256.Sum256(raw)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[key]; ok && e.rt == rt {
		e.configDigest, e.config = "sha256:"+hex.EncodeToString(sum[:]), raw
		c.m[key] = e
	}
}
