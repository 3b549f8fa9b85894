package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// These tests run in network namespaces of their own (inNetns): every
// address they use, public-looking or private, is on the namespace's lo.

// pushPlain writes img to ref over plain HTTP, whatever its host.
func pushPlain(t *testing.T, ref string, img v1.Image) {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatalf("parse %s: %v", ref, err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

func portOf(t *testing.T, hostport string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// bearerRegistry is a registry that, once on, answers every request
// without a bearer token with a 401 naming realm, and records the
// Authorization headers it was sent.
type bearerRegistry struct {
	*trap
	on atomic.Bool

	mu    sync.Mutex
	auths []string
}

func newBearerRegistry(t *testing.T, addr, realm string) *bearerRegistry {
	t.Helper()
	br := &bearerRegistry{}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	br.trap = newServerAt(t, addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if br.on.Load() {
			a := r.Header.Get("Authorization")
			br.mu.Lock()
			br.auths = append(br.auths, a)
			br.mu.Unlock()
			if !strings.HasPrefix(a, "Bearer ") {
				w.Header().Set("WWW-Authenticate", `Bearer realm="`+realm+`",service="registry"`)
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
		}
		h.ServeHTTP(w, r)
	}))
	return br
}

// sent reports whether the registry was sent "Bearer <token>".
func (br *bearerRegistry) sent(token string) bool {
	br.mu.Lock()
	defer br.mu.Unlock()
	for _, a := range br.auths {
		if a == "Bearer "+token {
			return true
		}
	}
	return false
}

// newTokenService is a GET endpoint whose JSON answer has a token field:
// an internal service of that kind is what a token realm into private
// networks reads, one field at a time.
func newTokenService(t *testing.T, addr, token string) *trap {
	t.Helper()
	return newServerAt(t, addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"token":"`+token+`","access_token":"`+token+`"}`)
	}))
}

// reachNet holds an internal service (internal-name, 10.99.0.1), a
// registry at a private address (private-reg.example, 10.99.0.2) and two
// at public ones (attacker.example, 203.0.113.10; auth.example,
// 203.0.113.11).
var reachNet = netns{
	addrs: []string{"10.99.0.1/32", "10.99.0.2/32", "203.0.113.10/32", "203.0.113.11/32"},
	hosts: map[string]string{"internal-name": "10.99.0.1", "private-reg.example": "10.99.0.2",
		"attacker.example": "203.0.113.10", "auth.example": "203.0.113.11"},
}

// reachAllowed lets the pulls reach reachNet's addresses, which are all
// the host's own in the namespace.
func reachAllowed(t *testing.T) []netip.Prefix { return prefixes(t, "10.99.0.0/16", "203.0.113.0/24") }

// TestNoEscalationFromPublicRegistry: a registry at a public address
// cannot lead the agent into a private network, by token realm or by
// redirect, even when the name it names resolves there; a registry at a
// private address may, and a public one may lead to other public hosts.
func TestNoEscalationFromPublicRegistry(t *testing.T) {
	if !inNetns(t, reachNet) {
		return
	}
	img := testImage(t, 1, 512)
	want := compressedLayers(t, img)
	layer := layerDigests(t, img)[0]
	ctx := context.Background()
	const secret = "INTERNAL-SECRET"
	svc := newTokenService(t, "10.99.0.1:0", secret)
	internalRealm := "http://internal-name:" + portOf(t, svc.host) + "/token"
	escalation := "registry address 10.99.0.1 (of internal-name) is internal (private, loopback, link-local or unique-local), and a token realm or redirect of the registry attacker.example, at a public address, may not lead there"

	t.Run("TokenRealm", func(t *testing.T) {
		before := svc.counts()
		reg := newBearerRegistry(t, "203.0.113.10:0", internalRealm)
		pushPlain(t, reg.host+"/app:v1", img)
		reg.on.Store(true)
		p := newStrictPuller(t, Options{AllowNetworks: reachAllowed(t)})
		_, err := p.Resolve(ctx, Source{Ref: "http://attacker.example:" + portOf(t, reg.host) + "/app:v1"})
		wantDenied(t, err, escalation)
		svc.untouchedSince(t, before)
		if reg.sent(secret) {
			t.Errorf("the public registry was sent the internal service's answer as its token")
		}
	})
	for _, c := range []struct {
		name  string
		hit   func(r *http.Request) bool
		fetch bool
	}{
		{"BlobRedirect", func(r *http.Request) bool { return strings.HasSuffix(r.URL.Path, "/blobs/"+layer.String()) }, true},
		{"ManifestRedirect", func(r *http.Request) bool { return strings.Contains(r.URL.Path, "/manifests/") }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := svc.counts()
			reg, on := redirectingRegistry(t, "203.0.113.10:0", c.hit, "http://internal-name:"+portOf(t, svc.host))
			pushPlain(t, reg.host+"/app:v1", img)
			on.Store(true)
			p := newStrictPuller(t, Options{AllowNetworks: reachAllowed(t)})
			resolved, err := p.Resolve(ctx, Source{Ref: "http://attacker.example:" + portOf(t, reg.host) + "/app:v1"})
			if c.fetch {
				if err != nil {
					t.Fatalf("Resolve: %v", err)
				}
				_, err = p.Fetch(ctx, resolved, nil)
			}
			wantDenied(t, err, escalation)
			svc.untouchedSince(t, before)
		})
	}
	t.Run("PrivateRegistryPrivateRealm", func(t *testing.T) {
		before := svc.counts()
		reg := newBearerRegistry(t, "10.99.0.2:0", internalRealm)
		pushPlain(t, reg.host+"/app:v1", img)
		reg.on.Store(true)
		p := newStrictPuller(t, Options{AllowNetworks: reachAllowed(t)})
		fetchAll(t, p, Source{Ref: "http://private-reg.example:" + portOf(t, reg.host) + "/app:v1"}, want)
		if svc.counts().requests == before.requests || !reg.sent(secret) {
			t.Errorf("the private registry's private realm was not used")
		}
	})
	t.Run("PublicRegistryPublicRealm", func(t *testing.T) {
		auth := newTokenService(t, "203.0.113.11:0", "PUBLIC-TOKEN")
		reg := newBearerRegistry(t, "203.0.113.10:0", "http://auth.example:"+portOf(t, auth.host)+"/token")
		pushPlain(t, reg.host+"/app:v1", img)
		reg.on.Store(true)
		p := newStrictPuller(t, Options{AllowNetworks: reachAllowed(t)})
		fetchAll(t, p, Source{Ref: "http://attacker.example:" + portOf(t, reg.host) + "/app:v1"}, want)
		if !reg.sent("PUBLIC-TOKEN") {
			t.Errorf("the public realm's token was not used")
		}
	})
	t.Run("PublicRegistryPublicRedirect", func(t *testing.T) {
		store := newTrap(t, "203.0.113.11:0")
		pushPlain(t, store.host+"/app:v1", img)
		blobs := func(r *http.Request) bool { return strings.Contains(r.URL.Path, "/blobs/sha256:") }
		reg, on := redirectingRegistry(t, "203.0.113.10:0", blobs, "http://auth.example:"+portOf(t, store.host))
		// The manifests come from the registry, the blobs from the store;
		// both hold the image.
		pushPlain(t, reg.host+"/app:v1", img)
		on.Store(true)
		p := newStrictPuller(t, Options{AllowNetworks: reachAllowed(t)})
		fetchAll(t, p, Source{Ref: "http://attacker.example:" + portOf(t, reg.host) + "/app:v1"}, want)
	})
}

// redirectingRegistry is a registry at addr that, once on is set, answers
// the GETs hit matches with a redirect to the same path at base.
func redirectingRegistry(t *testing.T, addr string, hit func(*http.Request) bool, base string) (*trap, *atomic.Bool) {
	t.Helper()
	on := new(atomic.Bool)
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	reg := newServerAt(t, addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if on.Load() && r.Method == http.MethodGet && hit(r) {
			http.Redirect(w, r, base+r.URL.Path, http.StatusTemporaryRedirect)
			return
		}
		h.ServeHTTP(w, r)
	}))
	return reg, on
}

// TestNoCrossingAfterPrivateRealm: a registry name that answers with a
// private address, and so may use a private realm, cannot then move to a
// public address (DNS rebinding) and carry the token fetched inside to
// the outside.
func TestNoCrossingAfterPrivateRealm(t *testing.T) {
	ns := netns{addrs: reachNet.addrs, hosts: map[string]string{"internal-name": "10.99.0.1", "flip.example": "10.99.0.2"}}
	if !inNetns(t, ns) {
		return
	}
	img := testImage(t, 1, 512)
	ctx := context.Background()
	const secret = "INTERNAL-SECRET"
	svc := newTokenService(t, "10.99.0.1:0", secret)
	// The image on both addresses, on one port, with connections closed
	// after each answer: each request dials, and resolves, anew.
	inside := newBearerRegistry(t, "10.99.0.2:0", "http://internal-name:"+portOf(t, svc.host)+"/token")
	outside := newBearerRegistry(t, "203.0.113.10:"+portOf(t, inside.host), "http://internal-name:"+portOf(t, svc.host)+"/token")
	push(t, inside.side+"/app:v1", img)
	push(t, outside.side+"/app:v1", img)
	inside.on.Store(true)
	outside.on.Store(true)
	before := outside.counts()
	p := newStrictPuller(t, Options{AllowNetworks: reachAllowed(t), Transport: &http.Transport{DisableKeepAlives: true}})
	ref := "http://flip.example:" + portOf(t, inside.host) + "/app:v1"
	resolved, err := p.Resolve(ctx, Source{Ref: ref})
	if err != nil {
		t.Fatalf("Resolve(%s) inside: %v", ref, err)
	}
	if !inside.sent(secret) {
		t.Fatalf("the private registry's realm was not used")
	}
	rehost(t, "flip.example", "203.0.113.10")
	_, err = p.Fetch(ctx, resolved, nil)
	wantDenied(t, err, "registry address 203.0.113.10 (of flip.example) is public, but registry flip.example was reached at an internal address before")
	if outside.sent(secret) {
		t.Errorf("the internal realm's token was sent to the public address")
	}
	outside.untouchedSince(t, before)
}

// TestHostAddressDenied: an address of the host that is not loopback
// (192.0.2.7 and 2001:db8::7 on lo, in the test's own namespace) reaches
// every service bound to 0.0.0.0, as the node's eth0 address does: a
// reference to it is refused like loopback, by address or by name, with no
// connection made; listing the registry or allowing the address lets it
// be reached.
func TestHostAddressDenied(t *testing.T) {
	if !inNetns(t, netns{addrs: []string{"192.0.2.7/32", "2001:db8::7/128"},
		hosts: map[string]string{"node.example": "192.0.2.7", "node6.example": "2001:db8::7"}}) {
		return
	}
	img := testImage(t, 1, 512)
	want := compressedLayers(t, img)
	ctx := context.Background()
	// An IPv6 literal is no valid image reference: the IPv6 address is
	// named.
	for _, c := range []struct{ listen, host, addr, net string }{
		{"192.0.2.7:0", "192.0.2.7", "192.0.2.7", "192.0.2.7/32"},
		{"192.0.2.7:0", "node.example", "192.0.2.7", "192.0.2.7/32"},
		{"[2001:db8::7]:0", "node6.example", "2001:db8::7", "2001:db8::7/128"},
	} {
		reg := newTrap(t, c.listen)
		push(t, reg.side+"/app:v1", img)
		before := reg.counts()
		host := c.host + ":" + portOf(t, reg.host)
		t.Run(host, func(t *testing.T) {
			p := newStrictPuller(t, Options{})
			_, err := p.Resolve(ctx, Source{Ref: "http://" + host + "/app:v1"})
			wantDenied(t, err, "registry address "+c.addr+" (of "+host+") is an address of this host, denied by default; list the registry in registry.insecure or registry.mirrors, or add "+c.net+" to registry.allow_networks")
			reg.untouchedSince(t, before)
			fetchAll(t, newStrictPuller(t, Options{Insecure: []string{host}}), Source{Ref: host + "/app:v1"}, want)
			fetchAll(t, newStrictPuller(t, Options{AllowNetworks: prefixes(t, c.net)}), Source{Ref: "http://" + host + "/app:v1"}, want)
		})
	}
}

// TestDefaultDenyAlwaysApplies: setting DenyNetworks adds to the default
// deny (link-local, cloud metadata) instead of replacing it, and the
// metadata addresses of GCP and AWS over IPv6 are in it.
func TestDefaultDenyAlwaysApplies(t *testing.T) {
	metadata := []string{"169.254.169.254", "100.100.100.200", "fd00:ec2::254", "fd00:ec2::23", "fd20:ce::254"}
	// Each by name too (an IPv6 literal is no valid image reference).
	ns := netns{hosts: map[string]string{}}
	for i, a := range metadata {
		ns.addrs = append(ns.addrs, netip.PrefixFrom(netip.MustParseAddr(a), netip.MustParseAddr(a).BitLen()).String())
		ns.hosts[fmt.Sprintf("md%d.example", i)] = a
	}
	if !inNetns(t, ns) {
		return
	}
	ctx := context.Background()
	// Allowed, and so not refused as the host's own addresses they are in
	// the namespace: only the deny can refuse them.
	allow := prefixes(t, "169.254.0.0/16", "100.64.0.0/10", "fd00::/8")
	for _, c := range []struct {
		name string
		deny []netip.Prefix
	}{{"Unset", nil}, {"Empty", []netip.Prefix{}}, {"Set", prefixes(t, "10.0.0.0/8")}} {
		t.Run(c.name, func(t *testing.T) {
			p := newStrictPuller(t, Options{DenyNetworks: c.deny, AllowNetworks: allow})
			for i, a := range metadata {
				trap := newTrap(t, net.JoinHostPort(a, "0"))
				hosts := []string{fmt.Sprintf("md%d.example:%s", i, portOf(t, trap.host))}
				if netip.MustParseAddr(a).Is4() {
					hosts = append(hosts, trap.host)
				}
				for _, host := range hosts {
					_, err := p.Resolve(ctx, Source{Ref: "http://" + host + "/x:y"})
					wantDenied(t, err, "registry address "+a+" ")
					wantDenied(t, err, "denied by default")
				}
				trap.untouched(t)
			}
		})
	}
}

// forwardProxy is an HTTP proxy that serves registry.test itself and
// records the host of every other request it is sent (answering 502):
// a request for any other host is one the agent should not have sent it.
type forwardProxy struct {
	url *url.URL

	mu    sync.Mutex
	hosts []string
}

func newForwardProxy(t *testing.T, reg http.Handler) *forwardProxy {
	t.Helper()
	fp := &forwardProxy{}
	srv := newServerAt(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.URL.Hostname()
		if r.Method == http.MethodConnect {
			host = hostOnly(r.Host)
		}
		// registry.test, and requests sent to the proxy as a server
		// (the test's push), are the registry's; it speaks plain HTTP
		// only, so the CONNECT of an https ping fails.
		if host == "registry.test" || r.URL.Host == "" {
			if r.Method == http.MethodConnect {
				w.WriteHeader(http.StatusMethodNotAllowed)
				return
			}
			reg.ServeHTTP(w, r)
			return
		}
		fp.mu.Lock()
		fp.hosts = append(fp.hosts, host)
		fp.mu.Unlock()
		w.WriteHeader(http.StatusBadGateway)
	}))
	fp.url = &url.URL{Scheme: "http", Host: srv.host}
	return fp
}

// sentFor lists the hosts other than registry.test the proxy was sent.
func (fp *forwardProxy) sentFor() []string {
	fp.mu.Lock()
	defer fp.mu.Unlock()
	return append([]string(nil), fp.hosts...)
}

// proxied is a Puller whose registry traffic all goes to fp, with
// registry.test spoken to over plain HTTP.
func proxied(t *testing.T, fp *forwardProxy, opts Options) *Puller {
	t.Helper()
	opts.Transport = &http.Transport{Proxy: http.ProxyURL(fp.url)}
	opts.Insecure = append(opts.Insecure, "registry.test")
	return newStrictPuller(t, opts)
}

// TestProxyAddressSpellings: behind a proxy, which resolves hosts itself
// (with inet_aton, for many), a loopback address in another spelling is
// refused before the request goes to the proxy, in a reference and in a
// redirect.
func TestProxyAddressSpellings(t *testing.T) {
	img := testImage(t, 1, 512)
	layer := layerDigests(t, img)[0]
	var redirectTo atomic.Value
	redirectTo.Store("")
	reg := newTestRegistry(t, blobWrapper([]v1.Hash{layer}, func(w http.ResponseWriter, r *http.Request, h http.Handler) {
		if to := redirectTo.Load().(string); to != "" {
			http.Redirect(w, r, to, http.StatusTemporaryRedirect)
			return
		}
		h.ServeHTTP(w, r)
	}))
	push(t, reg.host+"/app:v1", img)
	fp := newForwardProxy(t, reg.srv.Config.Handler)
	ctx := context.Background()
	p := proxied(t, fp, Options{})
	port := portOf(t, reg.host)
	spellings := []string{"2130706433", "0x7f.1", "127.1", "0x7f000001", "017700000001", "127.0.1", "0177.0.0.1", "127.0.0.1."}
	for _, h := range spellings {
		_, err := p.Resolve(ctx, Source{Ref: "http://" + h + ":" + port + "/x:y"})
		if !errors.Is(err, ErrNetworkDenied) {
			t.Errorf("Resolve(http://%s:%s/x:y) = %v, want ErrNetworkDenied", h, port, err)
		}
	}
	// A redirect of the registry behind the proxy.
	img2, err := p.Resolve(ctx, Source{Ref: "registry.test/app:v1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range spellings {
		redirectTo.Store("http://" + h + ":" + port + "/v2/app/blobs/" + layer.String())
		if _, err := p.Fetch(ctx, img2, nil); !errors.Is(err, ErrNetworkDenied) {
			t.Errorf("Fetch redirected to %s: %v, want ErrNetworkDenied", h, err)
		}
	}
	if got := fp.sentFor(); len(got) != 0 {
		t.Errorf("the proxy was sent requests for %q", got)
	}
}

// TestProxyNamesResolvedFirst: behind a proxy, a name the node's own
// resolver (here /etc/hosts) maps to a denied address is refused before
// the request goes to the proxy, and so is a token realm into a private
// network from a registry the node cannot place (public, then); a name the
// node does not resolve, and one resolving to a private address, go to the
// proxy.
func TestProxyNamesResolvedFirst(t *testing.T) {
	if !inNetns(t, netns{addrs: []string{"192.0.2.7/32"}, hosts: map[string]string{
		"meta.example": "169.254.169.254", "self.example": "127.0.0.1", "node.example": "192.0.2.7",
		"internal.example": "10.99.0.1"}}) {
		return
	}
	img := testImage(t, 1, 512)
	want := compressedLayers(t, img)
	ctx := context.Background()
	var realm atomic.Value
	realm.Store("")
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	fp := newForwardProxy(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rl := realm.Load().(string); rl != "" && r.Header.Get("Authorization") == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="`+rl+`",service="registry"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	pushPlain(t, "127.0.0.1:"+fp.url.Port()+"/app:v1", img)
	p := proxied(t, fp, Options{})
	for _, host := range []string{"meta.example", "self.example", "node.example"} {
		if _, err := p.Resolve(ctx, Source{Ref: "http://" + host + ":5000/x:y"}); !errors.Is(err, ErrNetworkDenied) {
			t.Errorf("Resolve(http://%s:5000/x:y) = %v, want ErrNetworkDenied", host, err)
		}
	}
	if got := fp.sentFor(); len(got) != 0 {
		t.Errorf("the proxy was sent requests for %q", got)
	}
	// Names the node cannot place, or places in a private network, are
	// the proxy's.
	fetchAll(t, p, Source{Ref: "registry.test/app:v1"}, want)
	if _, err := p.Resolve(ctx, Source{Ref: "http://internal.example:5000/x:y"}); errors.Is(err, ErrNetworkDenied) {
		t.Errorf("Resolve(http://internal.example:5000/x:y) = %v, want it left to the proxy", err)
	}
	if got := fp.sentFor(); len(got) == 0 || slices.ContainsFunc(got, func(h string) bool { return h != "internal.example" }) {
		t.Errorf("the proxy was sent requests for %q, want internal.example alone", got)
	}
	// registry.test, which the node cannot resolve, counts as public: its
	// realm may not lead into a private network.
	realm.Store("http://internal.example:5000/token")
	sent := len(fp.sentFor())
	_, err := newStrictPuller(t, Options{Transport: &http.Transport{Proxy: http.ProxyURL(fp.url)}, Insecure: []string{"registry.test"}}).
		Resolve(ctx, Source{Ref: "registry.test/app:v1"})
	wantDenied(t, err, "registry address 10.99.0.1 (of internal.example) is internal")
	if got := fp.sentFor(); len(got) != sent {
		t.Errorf("the proxy was sent requests for %q", got[sent:])
	}
}
