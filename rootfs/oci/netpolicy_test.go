package oci

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// countingListener counts the connections a server accepted.
type countingListener struct {
	net.Listener
	accepts atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepts.Add(1)
	}
	return c, err
}

// trap is a registry on addr (e.g. 127.0.0.2:0) that counts connections
// and requests: the place a refused connection must never reach.
type trap struct {
	ln       *countingListener
	host     string
	requests atomic.Int64
	// side is the host of another listener of the same server, on
	// 127.0.0.1, whose connections and requests are not counted: a test
	// fills the registry through it.
	side string
}

func newTrap(t *testing.T, addr string) *trap {
	t.Helper()
	return newServerAt(t, addr, registry.New(registry.Logger(log.New(io.Discard, "", 0))))
}

// newServerAt serves h on addr, counting connections and requests.
func newServerAt(t *testing.T, addr string, h http.Handler) *trap {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	tr := &trap{ln: &countingListener{Listener: ln}, host: ln.Addr().String()}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Context().Value(http.LocalAddrContextKey).(net.Addr).String() == tr.host {
			tr.requests.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	srv.Listener = tr.ln
	srv.Start()
	t.Cleanup(srv.Close)
	side, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr.side = side.Addr().String()
	go srv.Config.Serve(side)
	t.Cleanup(func() { side.Close() })
	return tr
}

func (tr *trap) untouched(t *testing.T) {
	t.Helper()
	tr.untouchedSince(t, trapCounts{})
}

// trapCounts are a trap's connections and requests at one time.
type trapCounts struct{ accepts, requests int64 }

func (tr *trap) counts() trapCounts {
	return trapCounts{tr.ln.accepts.Load(), tr.requests.Load()}
}

// untouchedSince checks the trap saw no connection since c.
func (tr *trap) untouchedSince(t *testing.T, c trapCounts) {
	t.Helper()
	if n := tr.ln.accepts.Load() - c.accepts; n != 0 {
		t.Errorf("the refused server accepted %d connections", n)
	}
	if n := tr.requests.Load() - c.requests; n != 0 {
		t.Errorf("the refused server saw %d requests", n)
	}
}

func prefixes(t *testing.T, ss ...string) []netip.Prefix {
	t.Helper()
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// wantDenied checks err is the policy's refusal with msg in its text.
func wantDenied(t *testing.T, err error, msg string) {
	t.Helper()
	if !errors.Is(err, ErrNetworkDenied) {
		t.Fatalf("error = %v, want ErrNetworkDenied", err)
	}
	if !strings.Contains(err.Error(), msg) {
		t.Errorf("error %q does not contain %q", err, msg)
	}
}

func TestNetworkPolicy(t *testing.T) {
	img := testImage(t, 2, 1024)
	want := compressedLayers(t, img)
	good := newTestRegistry(t, nil) // on 127.0.0.1
	push(t, good.host+"/ok/app:v1", img)
	ctx := context.Background()

	t.Run("DenyLoopbackAlias", func(t *testing.T) {
		bad := newTrap(t, "127.0.0.2:0")
		p := newTestPuller(t, Options{DenyNetworks: append(DefaultDenyNetworks(), prefixes(t, "127.0.0.2/32")...)})
		_, err := p.Resolve(ctx, Source{Ref: "http://" + bad.host + "/x:y"})
		wantDenied(t, err, "registry address 127.0.0.2 is in registry.deny_networks 127.0.0.2/32")
		bad.untouched(t)
		fetchAll(t, p, Source{Ref: good.host + "/ok/app:v1"}, want)
	})
	t.Run("AllowList", func(t *testing.T) {
		bad := newTrap(t, "127.0.0.2:0")
		p := newTestPuller(t, Options{AllowNetworks: prefixes(t, "127.0.0.1/32")})
		_, err := p.Resolve(ctx, Source{Ref: "http://" + bad.host + "/x:y"})
		wantDenied(t, err, "registry address 127.0.0.2 is not in registry.allow_networks (127.0.0.1/32)")
		bad.untouched(t)
		fetchAll(t, p, Source{Ref: good.host + "/ok/app:v1"}, want)
	})
	t.Run("NameResolvingToDenied", func(t *testing.T) {
		addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", "localhost")
		if err != nil {
			t.Fatalf("resolve localhost: %v", err)
		}
		for _, a := range addrs {
			if a = a.Unmap(); a != netip.MustParseAddr("127.0.0.1") && a != netip.IPv6Loopback() {
				t.Skipf("localhost resolves to %v here, not to loopback alone", addrs)
			}
		}
		trap := newTrap(t, "127.0.0.1:0")
		_, port, _ := net.SplitHostPort(trap.host)
		p := newTestPuller(t, Options{DenyNetworks: prefixes(t, "127.0.0.1/32", "::1/128")})
		_, err = p.Resolve(ctx, Source{Ref: "http://localhost:" + port + "/x:y"})
		wantDenied(t, err, "(of localhost) is in registry.deny_networks")
		trap.untouched(t)
	})
	t.Run("RedirectToDenied", func(t *testing.T) {
		bad := newTrap(t, "127.0.0.2:0")
		d := layerDigests(t, img)[0]
		reg := newTestRegistry(t, blobWrapper([]v1.Hash{d}, func(w http.ResponseWriter, r *http.Request, _ http.Handler) {
			http.Redirect(w, r, "http://"+bad.host+"/blob", http.StatusTemporaryRedirect)
		}))
		push(t, reg.host+"/redir/app:v1", img)
		p := newTestPuller(t, Options{DenyNetworks: prefixes(t, "127.0.0.2/32")})
		resolved, err := p.Resolve(ctx, Source{Ref: reg.host + "/redir/app:v1"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Fetch(ctx, resolved, nil)
		wantDenied(t, err, "registry address 127.0.0.2 is in registry.deny_networks 127.0.0.2/32")
		bad.untouched(t)
	})
	t.Run("OwnDialerStillChecked", func(t *testing.T) {
		// A Transport with its own DialContext (here: every connection to
		// the trap) keeps it, but the address it reached is checked before
		// a request is sent.
		bad := newTrap(t, "127.0.0.2:0")
		p := newTestPuller(t, Options{Transport: fakeHostTransport(bad.host), DenyNetworks: prefixes(t, "127.0.0.2/32")})
		_, err := p.Resolve(ctx, Source{Ref: "http://registry.test/x:y"})
		wantDenied(t, err, "registry address 127.0.0.2 (of registry.test) is in registry.deny_networks 127.0.0.2/32")
		if n := bad.requests.Load(); n != 0 {
			t.Errorf("the refused server saw %d requests", n)
		}
	})
	t.Run("OtherRoundTripperRefused", func(t *testing.T) {
		_, err := New(Options{CacheDir: t.TempDir(), Transport: roundTripperFunc(http.DefaultTransport.RoundTrip)})
		if err == nil || !strings.Contains(err.Error(), "network policy") {
			t.Fatalf("New with a non-*http.Transport: error = %v, want a refusal naming the network policy", err)
		}
	})
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// notLocal stands in for the kernel's answer in tests of the rules: no
// address is one of the host's own but loopback.
func notLocal(netip.Addr) (bool, error) { return false, nil }

func TestNetPolicyCheck(t *testing.T) {
	p, err := newNetPolicy(nil, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.local = notLocal
	for addr, denied := range map[string]bool{
		"169.254.169.254":        true,
		"::ffff:169.254.169.254": true,
		"fe80::1%eth0":           true,
		"fd00:ec2::254":          true,
		"100.100.100.200":        true,
		"127.0.0.1":              true,
		"127.1.2.3":              true,
		"::ffff:127.0.0.1":       true,
		"::1":                    true,
		"0.0.0.0":                true,
		"::":                     true,
		"10.1.2.3":               false,
		"192.168.0.1":            false,
		"172.16.0.1":             false,
		"100.100.100.201":        false,
	} {
		err := p.check("h", netip.MustParseAddr(addr))
		if got := errors.Is(err, ErrNetworkDenied); got != denied {
			t.Errorf("check(%s) = %v, want denied=%v", addr, err, denied)
		}
	}
	// The dialer's Control hook sees "ip:port", IPv4-mapped or not.
	if err := p.checkDial(context.Background(), needAny, "h", "[::ffff:169.254.169.254]:80"); !errors.Is(err, ErrNetworkDenied) || !strings.Contains(err.Error(), "169.254.169.254 (of h) is in 169.254.169.254/32 (cloud metadata), denied by default") {
		t.Errorf("checkDial of an IPv4-mapped metadata address = %v, want denied", err)
	}
	// An IPv4-mapped rule covers the IPv4 address.
	p, err = newNetPolicy(prefixes(t, "::ffff:10.0.0.0/104"), nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.local = notLocal
	if err := p.check("h", netip.MustParseAddr("10.9.8.7")); !errors.Is(err, ErrNetworkDenied) || !strings.Contains(err.Error(), "10.0.0.0/8") {
		t.Errorf("check(10.9.8.7) under ::ffff:10.0.0.0/104 = %v, want denied by 10.0.0.0/8", err)
	}
}

// loopbackDenied is the refusal of a loopback registry address nothing
// allowed, for host (host:port).
func loopbackDenied(addr, host string) string {
	return "registry address " + addr + " (of " + host + ") is loopback, denied by default; list the registry in registry.insecure or registry.mirrors, or add 127.0.0.0/8 to registry.allow_networks"
}

// TestLoopbackDeniedByDefault: with the default policy an image reference,
// a redirect or a token realm cannot reach a service on the agent's own
// host; the operator lifts it for the registries it names.
func TestLoopbackDeniedByDefault(t *testing.T) {
	img := testImage(t, 1, 512)
	want := compressedLayers(t, img)
	ctx := context.Background()

	t.Run("Ref", func(t *testing.T) {
		trap := newTrap(t, "127.0.0.1:0")
		p := newStrictPuller(t, Options{})
		_, err := p.Resolve(ctx, Source{Ref: trap.host + "/x:y"})
		wantDenied(t, err, loopbackDenied("127.0.0.1", trap.host))
		_, port, _ := net.SplitHostPort(trap.host)
		for _, host := range []string{"127.0.0.1:" + port, "127.9.9.9:" + port, "0.0.0.0:" + port, "localhost:" + port} {
			_, err := p.Resolve(ctx, Source{Ref: "http://" + host + "/x:y"})
			if !errors.Is(err, ErrNetworkDenied) || !strings.Contains(err.Error(), "is loopback, denied by default") {
				t.Errorf("Resolve(%s): %v, want the loopback refusal", host, err)
			}
		}
		trap.untouched(t)
	})
	t.Run("ListedInsecure", func(t *testing.T) {
		reg := newTestRegistry(t, nil)
		push(t, reg.host+"/app:v1", img)
		fetchAll(t, newStrictPuller(t, Options{Insecure: []string{reg.host}}), Source{Ref: reg.host + "/app:v1"}, want)
	})
	t.Run("ListedMirror", func(t *testing.T) {
		reg := newTestRegistry(t, nil)
		push(t, reg.host+"/library/app:v1", img)
		p := newStrictPuller(t, Options{Mirrors: map[string][]string{"docker.io": {"http://" + reg.host}}})
		fetchAll(t, p, Source{Ref: "docker.io/library/app:v1"}, want)
	})
	t.Run("AllowNetworks", func(t *testing.T) {
		reg := newTestRegistry(t, nil)
		push(t, reg.host+"/app:v1", img)
		p := newStrictPuller(t, Options{AllowNetworks: prefixes(t, "127.0.0.0/8")})
		fetchAll(t, p, Source{Ref: reg.host + "/app:v1"}, want)
	})
	// A listed registry still cannot send the agent to another port of
	// its host: not by a blob or manifest redirect, not by a token realm
	// (go-containerregistry refuses a realm on a private address literal,
	// not a name: the realm is localhost).
	layer := layerDigests(t, img)[0]
	for _, c := range []struct {
		name  string
		hit   func(r *http.Request) bool
		fetch bool
	}{
		{"BlobRedirect", func(r *http.Request) bool { return strings.HasSuffix(r.URL.Path, "/blobs/"+layer.String()) }, true},
		{"ManifestRedirect", func(r *http.Request) bool { return strings.Contains(r.URL.Path, "/manifests/") }, false},
		{"TokenRealm", func(r *http.Request) bool { return r.URL.Path == "/v2/" }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			trap := newTrap(t, "127.0.0.1:0")
			_, trapPort, _ := net.SplitHostPort(trap.host)
			var on atomic.Bool // after the push
			reg := newTestRegistry(t, func(h http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if !on.Load() || r.Method != http.MethodGet || !c.hit(r) {
						h.ServeHTTP(w, r)
						return
					}
					if c.name == "TokenRealm" {
						w.Header().Set("WWW-Authenticate", `Bearer realm="http://localhost:`+trapPort+`/token",service="x"`)
						w.WriteHeader(http.StatusUnauthorized)
						return
					}
					http.Redirect(w, r, "http://"+trap.host+r.URL.Path, http.StatusTemporaryRedirect)
				})
			})
			push(t, reg.host+"/app:v1", img)
			on.Store(true)
			p := newStrictPuller(t, Options{Insecure: []string{reg.host}})
			resolved, err := p.Resolve(ctx, Source{Ref: reg.host + "/app:v1"})
			if c.fetch {
				if err != nil {
					t.Fatalf("Resolve: %v", err)
				}
				_, err = p.Fetch(ctx, resolved, nil)
			}
			if c.name == "TokenRealm" {
				wantDenied(t, err, "(of localhost:"+trapPort+") is loopback, denied by default")
			} else {
				wantDenied(t, err, loopbackDenied("127.0.0.1", trap.host))
			}
			trap.untouched(t)
		})
	}
}

// TestLoopbackProxyAllowed: the operator's proxy may listen on loopback
// (the test registry serves as one: it answers absolute-URL requests, and
// refuses the CONNECT of the https ping).
func TestLoopbackProxyAllowed(t *testing.T) {
	img := testImage(t, 1, 512)
	reg := newTestRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodConnect {
				w.WriteHeader(http.StatusMethodNotAllowed)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	push(t, reg.host+"/app:v1", img)
	proxy, err := url.Parse("http://" + reg.host)
	if err != nil {
		t.Fatal(err)
	}
	p := newStrictPuller(t, Options{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}, Insecure: []string{"registry.test"}})
	fetchAll(t, p, Source{Ref: "registry.test/app:v1"}, compressedLayers(t, img))
	if reg.requestCount() == 0 {
		t.Errorf("the proxy saw no request")
	}
}
