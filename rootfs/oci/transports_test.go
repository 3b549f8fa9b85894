package oci

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// countPings wraps a registry handler, counting the pings (GET /v2/) it
// serves into n.
func countPings(n *atomic.Int64) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v2/" {
				n.Add(1)
			}
			h.ServeHTTP(w, r)
		})
	}
}

func TestResolveReusesTransport(t *testing.T) {
	var pings atomic.Int64
	reg := newTestRegistry(t, countPings(&pings))
	img := testImage(t, 1, 1024)
	push(t, reg.host+"/team/app:v1", img)
	push(t, reg.host+"/team/other:v1", img)
	p := newTestPuller(t, Options{})
	ctx := context.Background()
	resolve := func(src Source) {
		t.Helper()
		got, err := p.Resolve(ctx, src)
		if err != nil {
			t.Fatalf("Resolve(%s): %v", src.Ref, err)
		}
		if got.ManifestDigest != mustDigest(t, img) {
			t.Errorf("Resolve(%s) = %s, want %s", src.Ref, got.ManifestDigest, mustDigest(t, img))
		}
	}
	ref := reg.host + "/team/app:v1"

	before := pings.Load() // the pushes pinged too
	resolve(Source{Ref: ref})
	first := pings.Load() - before
	if first == 0 {
		t.Fatal("the first Resolve did not ping the registry")
	}
	before = pings.Load()
	resolve(Source{Ref: ref})
	if got := pings.Load() - before; got != 0 {
		t.Errorf("a second Resolve of the same repository pinged %d times, want 0", got)
	}

	// Another repository has a token scope of its own.
	before = pings.Load()
	resolve(Source{Ref: reg.host + "/team/other:v1"})
	if got := pings.Load() - before; got != first {
		t.Errorf("Resolve of another repository pinged %d times, want %d", got, first)
	}

	// A request's own credentials never share a transport.
	before = pings.Load()
	for range 2 {
		resolve(Source{Ref: ref, Username: "u", Password: "p"})
	}
	if got := pings.Load() - before; got != 2*first {
		t.Errorf("two Resolves with the request's credentials pinged %d times, want %d", got, 2*first)
	}

	// A failed resolve forgets the transport: the next one pings afresh.
	if _, err := p.Resolve(ctx, Source{Ref: reg.host + "/team/app:missing"}); err == nil {
		t.Fatal("Resolve of a missing tag succeeded")
	}
	before = pings.Load()
	resolve(Source{Ref: ref})
	if got := pings.Load() - before; got != first {
		t.Errorf("Resolve after a failed one pinged %d times, want %d", got, first)
	}
}

func TestTransportCacheExpires(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	c := newTransportCache()
	c.now = func() time.Time { return now }
	rt := &http.Transport{}
	c.put("k", rt)
	if got := c.get("k"); got != rt {
		t.Fatalf("get = %v, want the transport put", got)
	}
	now = now.Add(transportTTL)
	if got := c.get("k"); got != nil {
		t.Errorf("get after transportTTL = %v, want nil", got)
	}

	c.put("k", rt)
	c.drop("k", &http.Transport{})
	if c.get("k") != rt {
		t.Error("drop of another transport removed the one kept")
	}
	c.drop("k", rt)
	if c.get("k") != nil {
		t.Error("drop left the transport")
	}

	for i := range maxTransports + 10 {
		c.put(string(rune('a'+i%26))+time.Duration(i).String(), rt)
	}
	if n := len(c.m); n > maxTransports {
		t.Errorf("%d transports kept, want at most %d", n, maxTransports)
	}
}

// TestResolveKeepsConfig: a resolve whose manifest names the config the
// repository's shared transport read last does not read it again; a
// request's own credentials, another repository and a transport dropped
// after a failure read it from the registry.
func TestResolveKeepsConfig(t *testing.T) {
	reg := newTestRegistry(t, nil)
	img := testImage(t, 1, 1024)
	push(t, reg.host+"/team/app:v1", img)
	push(t, reg.host+"/team/other:v1", img)
	cfg, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	p := newTestPuller(t, Options{})
	ctx := context.Background()
	ref := reg.host + "/team/app:v1"
	reads := func(src Source) int {
		t.Helper()
		before := reg.blobGets(cfg)
		got, err := p.Resolve(ctx, src)
		if err != nil {
			t.Fatalf("Resolve(%s): %v", src.Ref, err)
		}
		if got.ManifestDigest != mustDigest(t, img) {
			t.Errorf("Resolve(%s) = %s, want %s", src.Ref, got.ManifestDigest, mustDigest(t, img))
		}
		return reg.blobGets(cfg) - before
	}
	for i, c := range []struct {
		what string
		src  Source
		want int
	}{
		{"first resolve", Source{Ref: ref}, 1},
		{"second resolve", Source{Ref: ref}, 0},
		{"third resolve", Source{Ref: ref}, 0},
		{"another repository", Source{Ref: reg.host + "/team/other:v1"}, 1},
		{"the request's own credentials", Source{Ref: ref, Username: "u", Password: "p"}, 1},
		{"the request's own credentials again", Source{Ref: ref, Username: "u", Password: "p"}, 1},
	} {
		if got := reads(c.src); got != c.want {
			t.Errorf("%d: %s read the config %d times, want %d", i, c.what, got, c.want)
		}
	}
	if _, err := p.Resolve(ctx, Source{Ref: reg.host + "/team/app:missing"}); err == nil {
		t.Fatal("Resolve of a missing tag succeeded")
	}
	if got := reads(Source{Ref: ref}); got != 1 {
		t.Errorf("a resolve after a failed one read the config %d times, want 1 (a new transport keeps nothing yet)", got)
	}
}

func TestTransportCacheKeepsOneVerifiedConfig(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	c := newTransportCache()
	c.now = func() time.Time { return now }
	rt := &http.Transport{}
	a, b := []byte(`{"a":1}`), []byte(`{"b":2}`)
	digest := func(raw []byte) string { return "sha256:" + fmt.Sprintf("%x", sha256.Sum256(raw)) }
	c.keepConfig("k", rt, a) // no transport kept under k: nothing
	if got := c.config("k", rt, digest(a)); got != nil {
		t.Fatalf("config kept without its transport: %s", got)
	}
	c.put("k", rt)
	c.keepConfig("k", rt, a)
	if got := c.config("k", rt, digest(a)); string(got) != string(a) {
		t.Errorf("config(a) = %s, want %s", got, a)
	}
	// Kept under the digest of its bytes, whatever a manifest claims.
	if got := c.config("k", rt, digest(b)); got != nil {
		t.Errorf("config(digest of b) = %s, want none", got)
	}
	c.keepConfig("k", rt, b)
	if c.config("k", rt, digest(a)) != nil || string(c.config("k", rt, digest(b))) != string(b) {
		t.Error("keeping b did not replace a")
	}
	if got := c.config("k", &http.Transport{}, digest(b)); got != nil {
		t.Error("config given to another transport")
	}
	c.keepConfig("k", rt, make([]byte, maxKeptConfig+1))
	if c.config("k", rt, digest(b)) == nil {
		t.Error("a config over maxKeptConfig replaced the one kept")
	}
	now = now.Add(transportTTL)
	if got := c.config("k", rt, digest(b)); got != nil {
		t.Error("config outlived its transport")
	}
}
