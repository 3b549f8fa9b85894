package oci

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// defaultDeny is DefaultDenyNetworks, each with what it is.
var defaultDeny = []struct{ prefix, what string }{
	{"169.254.0.0/16", "link-local"},
	{"fe80::/10", "link-local"},
	{"169.254.169.254/32", "cloud metadata"},
	{"fd00:ec2::254/128", "cloud metadata, AWS"},
	{"fd00:ec2::23/128", "cloud metadata, AWS"},
	{"fd20:ce::254/128", "cloud metadata, GCP"},
	{"100.100.100.200/32", "cloud metadata, Alibaba Cloud"},
}

// DefaultDenyNetworks lists the networks no registry connection may
// reach whatever Options.DenyNetworks adds: link-local addresses and the
// cloud metadata services. Only Options.LiftDefaultDeny takes one out.
// 169.254.169.254 is listed apart from 169.254.0.0/16, so that lifting
// link-local does not open the metadata service. Private ranges stay
// reachable, for local registries and mirrors; the host's own addresses
// (LoopbackNetworks, and every address of its interfaces) are denied apart
// from this list.
func DefaultDenyNetworks() []netip.Prefix {
	out := make([]netip.Prefix, len(defaultDeny))
	for i, d := range defaultDeny {
		out[i] = netip.MustParsePrefix(d.prefix)
	}
	return out
}

// LoopbackNetworks lists the addresses that reach the agent's own host
// whatever its interfaces: loopback, and the unspecified addresses, which
// Linux connects to the host as well. Registry connections may not reach
// them, nor any other address the kernel delivers to this host (an
// interface's address), unless the operator named the registry
// (Options.Insecure, a mirror in Options.Mirrors) or allowed the address
// (Options.AllowNetworks): an image reference or a registry's redirect
// would otherwise reach any service of the host, on any path, and the
// error would tell a port scan what is there.
func LoopbackNetworks() []netip.Prefix {
	return []netip.Prefix{
		netip.MustParsePrefix("127.0.0.0/8"),
		netip.MustParsePrefix("::1/128"),
		netip.MustParsePrefix("0.0.0.0/8"),
		netip.MustParsePrefix("::/128"),
	}
}

// ErrNetworkDenied marks a registry connection the network policy refused
// (Options.DenyNetworks, Options.AllowNetworks).
var ErrNetworkDenied = errors.New("registry address refused by the network policy")

// DenyReason says which rule of the network policy refused an address.
type DenyReason int

// The rules of the network policy.
const (
	// DenyRule: the address is in a denied network, a default one or
	// one of Options.DenyNetworks.
	DenyRule DenyReason = iota + 1
	// DenyNotAllowed: Options.AllowNetworks is set and the address is
	// outside it.
	DenyNotAllowed
	// DenyLoopback: a loopback or unspecified address (LoopbackNetworks)
	// nothing the operator configured lets the connection reach.
	DenyLoopback
	// DenyLocal: another address the kernel delivers to this host (an
	// interface's), which nothing the operator configured allows.
	DenyLocal
)

// NetworkDeniedError says which address a registry connection would have
// reached and which rule refused it. errors.Is(err, ErrNetworkDenied) holds.
type NetworkDeniedError struct {
	// Reason is the rule that refused the address.
	Reason DenyReason
	// Host is the name or address the connection was made for, with the
	// port when known.
	Host string
	// Addr is the address the connection would have reached; for
	// DenySpelling the address the host reads as, if it reads as one.
	Addr netip.Addr
	// Rule is the denied network Addr is in (DenyRule), and Default says
	// whether it is one of DefaultDenyNetworks.
	Rule    netip.Prefix
	Default bool
	// Allow lists registry.allow_networks (DenyNotAllowed).
	Allow []netip.Prefix
	// err is why a check could not be made (DenyLocal).
	err error
}

// Error names the address, its host and the rule that refused it, and for
// the host's own addresses the settings that allow them. Names and hosts
// that come from a reference or a registry's answer are cut to a bounded
// length.
func (e *NetworkDeniedError) Error() string {
	// The host's own addresses are named with the port, which is what
	// the settings that allow them list.
	of := hostOnly(e.Host)
	if e.Reason == DenyLoopback || e.Reason == DenyLocal {
		of = e.Host
	}
	who := "registry address " + e.Addr.String()
	if of != "" && of != e.Addr.String() {
		who += " (of " + bound(of) + ")"
	}
	switch e.Reason {
	case DenyLoopback:
		net := "127.0.0.0/8"
		if e.Addr.Is6() {
			net = "::1/128"
		}
		return fmt.Sprintf("%s is loopback, denied by default; list the registry in registry.insecure or registry.mirrors, or add %s to registry.allow_networks", who, net)
	case DenyLocal:
		if e.err != nil {
			return fmt.Sprintf("%s refused: cannot tell whether it is an address of this host: %v", who, e.err)
		}
		return fmt.Sprintf("%s is an address of this host, denied by default; list the registry in registry.insecure or registry.mirrors, or add %s to registry.allow_networks",
			who, netip.PrefixFrom(e.Addr, e.Addr.BitLen()))
	case DenyRule:
		if e.Default {
			return fmt.Sprintf("%s is in %s (%s), denied by default", who, e.Rule, defaultWhat(e.Rule))
		}
		return fmt.Sprintf("%s is in registry.deny_networks %s", who, e.Rule)
	case DenyNotAllowed:
		allow := make([]string, len(e.Allow))
		for i, p := range e.Allow {
			allow[i] = p.String()
		}
		return fmt.Sprintf("%s is not in registry.allow_networks (%s)", who, strings.Join(allow, ", "))
	}
	return who + " is refused by the network policy"
}

// Is reports ErrNetworkDenied.
func (e *NetworkDeniedError) Is(target error) bool { return target == ErrNetworkDenied }

// Unwrap returns why a check could not be made, if that refused the
// address.
func (e *NetworkDeniedError) Unwrap() error { return e.err }

// defaultWhat says what a default denied network is.
func defaultWhat(p netip.Prefix) string {
	for _, d := range defaultDeny {
		if netip.MustParsePrefix(d.prefix) == p {
			return d.what
		}
	}
	return "default"
}

// maxShown caps the bytes of a name or URL from a reference or a
// registry's answer that an error message shows.
const maxShown = safetext.NameMax

// bound cuts text that came from a reference or a registry's answer (a
// realm, a redirect's Location, a host name) to maxShown bytes, marking
// the cut, before an error message shows it. It does not quote: the
// messages name hosts as upstream's do, and url.Parse leaves no space or
// control character in a host.
func bound(s string) string { return safetext.Clip(s, maxShown) }

// hostOnly strips the port from host:port, and the brackets of an IPv6
// literal.
func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]")
}

// denyRule is one denied network; what is set for the defaults.
type denyRule struct {
	net  netip.Prefix
	what string
}

// netPolicy decides which addresses registry connections may reach: none in
// deny; when allow is not empty, only those in allow; none of the host's
// own (LoopbackNetworks, the interfaces' addresses) unless allow holds the
// address or the connection is for a host the operator listed.
type netPolicy struct {
	deny  []denyRule
	allow []netip.Prefix
	// listed holds the operator's registry hosts, lower case, as
	// "host:port", or as "host" for an entry without a port (any port).
	listed map[string]bool
	// local reports whether the kernel delivers an address to this host.
	local func(netip.Addr) (bool, error)
}

// newNetPolicy normalises the prefixes: masked, IPv4-mapped IPv6 prefixes
// as IPv4. The defaults (DefaultDenyNetworks) apply but for those in lift,
// each of which must be one of them; deny adds to them. listed names the
// registry hosts ("host[:port]") that may be on the host's own addresses.
func newNetPolicy(deny, allow, lift []netip.Prefix, listed []string) (*netPolicy, error) {
	p := &netPolicy{listed: make(map[string]bool), local: hostAddress}
	p.list(listed...)
	defaults := DefaultDenyNetworks()
	for _, l := range lift {
		if !l.IsValid() || !slices.Contains(defaults, normPrefix(l)) {
			list := make([]string, len(defaults))
			for i, d := range defaults {
				list[i] = d.String()
			}
			return nil, fmt.Errorf("LiftDefaultDeny: %v is not one of the default denied networks (%s)", l, strings.Join(list, ", "))
		}
	}
	for i, d := range defaults {
		if !slices.ContainsFunc(lift, func(l netip.Prefix) bool { return normPrefix(l) == d }) {
			p.deny = append(p.deny, denyRule{net: d, what: defaultDeny[i].what})
		}
	}
	for _, l := range []struct {
		key string
		in  []netip.Prefix
		add func(netip.Prefix)
	}{
		{"DenyNetworks", deny, func(pr netip.Prefix) { p.deny = append(p.deny, denyRule{net: pr}) }},
		{"AllowNetworks", allow, func(pr netip.Prefix) { p.allow = append(p.allow, pr) }},
	} {
		for _, pr := range l.in {
			if !pr.IsValid() {
				return nil, fmt.Errorf("%s: invalid prefix %v", l.key, pr)
			}
			l.add(normPrefix(pr))
		}
	}
	return p, nil
}

func normPrefix(p netip.Prefix) netip.Prefix {
	if a := p.Addr(); a.Is4In6() {
		bits := max(p.Bits()-96, 0)
		p = netip.PrefixFrom(a.Unmap(), bits)
	}
	return p.Masked()
}

// denied returns the narrowest denied network holding addr.
func (p *netPolicy) denied(addr netip.Addr) (denyRule, bool) {
	var best denyRule
	found := false
	for _, r := range p.deny {
		if r.net.Contains(addr) && (!found || r.net.Bits() > best.net.Bits()) {
			best, found = r, true
		}
	}
	return best, found
}

// check refuses addr when the policy does; target is the "host:port" the
// connection is for: it is matched against the listed hosts, and named in
// the message.
func (p *netPolicy) check(target string, addr netip.Addr) error {
	addr = addr.Unmap().WithZone("")
	if r, ok := p.denied(addr); ok {
		return &NetworkDeniedError{Reason: DenyRule, Host: target, Addr: addr, Rule: r.net, Default: r.what != ""}
	}
	allowed := false
	for _, pr := range p.allow {
		if pr.Contains(addr) {
			allowed = true
			break
		}
	}
	if len(p.allow) > 0 && !allowed {
		return &NetworkDeniedError{Reason: DenyNotAllowed, Host: target, Addr: addr, Allow: p.allow}
	}
	if allowed || p.isListed(target) {
		return nil
	}
	for _, pr := range LoopbackNetworks() {
		if pr.Contains(addr) {
			return &NetworkDeniedError{Reason: DenyLoopback, Host: target, Addr: addr}
		}
	}
	local, err := p.local(addr)
	if err != nil || local {
		return &NetworkDeniedError{Reason: DenyLocal, Host: target, Addr: addr, err: err}
	}
	return nil
}

// list adds registry hosts the operator named; only before the policy is
// in use.
func (p *netPolicy) list(hosts ...string) {
	for _, h := range hosts {
		p.listed[strings.ToLower(h)] = true
	}
}

// isListed reports whether target ("host:port") is a registry the operator
// named, with its port or without one.
func (p *netPolicy) isListed(target string) bool {
	t := strings.ToLower(target)
	return p.listed[t] || p.listed[hostOnly(t)]
}

// checkAddr checks a "host:port" or net.Addr string whose host is an IP
// address; anything else is refused, since the policy cannot place it.
func (p *netPolicy) checkAddr(target, hostport string) error {
	ap, err := netip.ParseAddrPort(hostport)
	if err != nil {
		return fmt.Errorf("registry connection to %s: address %q is not an IP address the network policy can check", bound(target), bound(hostport))
	}
	return p.check(target, ap.Addr())
}

// dialer returns a DialContext that checks each resolved address in the
// socket's Control hook, before connecting: a name cannot resolve its way
// around the policy, and a refused address sees no connection attempt.
func (p *netPolicy) dialer() func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := &net.Dialer{
			Timeout:   30 * time.Second,
			KeepAlive: 30 * time.Second,
			Control: func(_, address string, _ syscall.RawConn) error {
				return p.checkAddr(addr, address)
			},
		}
		return d.DialContext(ctx, network, addr)
	}
}

// wrapDial keeps a transport's own dial function and checks the address
// each connection reached before any byte is sent on it.
func (p *netPolicy) wrapDial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if err := p.checkAddr(addr, conn.RemoteAddr().String()); err != nil {
			conn.Close()
			return nil, &net.OpError{Op: "dial", Net: network, Err: err}
		}
		return conn, nil
	}
}

// policyTransport installs the policy on a clone of base: its dialers go
// through the policy (see dialer and wrapDial). base must be an
// *http.Transport (nil means remote's default settings), so that nothing
// dials around the policy.
func (p *netPolicy) policyTransport(base http.RoundTripper, def *http.Transport) (*http.Transport, error) {
	var tr *http.Transport
	switch b := base.(type) {
	case nil:
		tr = def.Clone()
		tr.DialContext = p.dialer()
		return tr, nil
	case *http.Transport:
		tr = b.Clone()
	default:
		return nil, fmt.Errorf("the Transport is a %T, not an *http.Transport: the registry network policy cannot be applied to it", base)
	}
	// The deprecated hooks are read only to refuse them: the policy cannot
	// wrap a dial that takes no context.
	//lint:ignore SA1019 checking that the deprecated hooks are unset
	if tr.Dial != nil || tr.DialTLS != nil {
		return nil, errors.New("the Transport sets the deprecated Dial or DialTLS: use DialContext or DialTLSContext")
	}
	if tr.DialContext == nil {
		tr.DialContext = p.dialer()
	} else {
		tr.DialContext = p.wrapDial(tr.DialContext)
	}
	if tr.DialTLSContext != nil {
		tr.DialTLSContext = p.wrapDial(tr.DialTLSContext)
	}
	return tr, nil
}

// checkURL refuses a request whose URL names a refused address literal.
// It matters when a proxy dials for us: the dialer then sees the proxy's
// address, not the registry's.
func (p *netPolicy) checkURL(req *http.Request) error {
	h := req.URL.Hostname()
	a, err := netip.ParseAddr(h)
	if err != nil {
		return nil // a name: checked when dialled (without a proxy)
	}
	return p.check(urlTarget(req.URL), a)
}

// urlTarget is the "host:port" a URL connects to.
func urlTarget(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "443"
		if u.Scheme == "http" {
			port = "80"
		}
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// proxyTargets lists the "host:port" of the proxies tr sends registry
// requests through: the operator chose them, so the loopback rule lets
// them be reached (a local proxy is common). The URL-level check still
// applies to the registries behind them.
func proxyTargets(tr *http.Transport) []string {
	if tr.Proxy == nil {
		return nil
	}
	var out []string
	for _, scheme := range []string{"https", "http"} {
		req := &http.Request{Method: http.MethodGet, URL: &url.URL{Scheme: scheme, Host: "registry.invalid"}, Header: http.Header{}}
		if u, err := tr.Proxy(req); err == nil && u != nil && u.Host != "" {
			out = append(out, urlTarget(u))
		}
	}
	return out
}
