package oci

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

// internalNetworks are the addresses a registry at a public address may
// not lead the agent to by a token realm or a redirect: private,
// unique-local, shared (carrier-grade NAT, where some cloud services
// live), benchmarking, site-local, link-local, loopback and unspecified.
var internalNetworks = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("::/128"),
	netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("fc00::/7"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("fec0::/10"),
}

// isInternal reports whether a is in internalNetworks.
func isInternal(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	for _, p := range internalNetworks {
		if p.Contains(a) {
			return true
		}
	}
	return false
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
	// DenyEscalation: an internal address (private, link-local,
	// unique-local, loopback) reached through a token realm or a redirect
	// of a registry at a public address.
	DenyEscalation
	// DenyCrossing: a registry's own connections reached a public address
	// and now an internal one, or the other way round, while its
	// credentials and tokens were in use.
	DenyCrossing
	// DenySpelling: a host written as an IPv4 address in another spelling
	// than four decimal parts (2130706433, 0x7f.1, 127.1), or a name whose
	// last label is a number: resolvers and proxies read those
	// differently, so none is trusted.
	DenySpelling
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
	// Registry is the registry host a token realm or redirect came from
	// (DenyEscalation), or whose connections crossed (DenyCrossing).
	Registry string
	// err is why a check could not be made (DenyLocal).
	err error
}

// Error names the address, its host and the rule that refused it, and for
// the host's own addresses the settings that allow them. Names and hosts
// that come from a reference or a registry's answer are cut to a bounded
// length.
func (e *NetworkDeniedError) Error() string {
	host := bound(e.Host)
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
	case DenyEscalation:
		return fmt.Sprintf("%s is internal (private, loopback, link-local or unique-local), and a token realm or redirect of the registry %s, at a public address, may not lead there",
			who, bound(e.Registry))
	case DenyCrossing:
		side, before := "internal", "a public"
		if !isInternal(e.Addr) {
			side, before = "public", "an internal"
		}
		return fmt.Sprintf("%s is %s, but registry %s was reached at %s address before: a registry may not cross between public and internal addresses while its token is in use",
			who, side, bound(e.Registry), before)
	case DenySpelling:
		if e.Addr.IsValid() {
			return fmt.Sprintf("registry host %s reads as the IPv4 address %s in a non-standard spelling, which resolvers and proxies read differently: refused; write %s", host, e.Addr, e.Addr)
		}
		return fmt.Sprintf("registry host %s ends in a number but is not an IPv4 address: refused, as resolvers and proxies may read it as one", host)
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
// address or the connection is for a host the operator listed. On top of
// that, reach (below) keeps a registry at a public address from leading
// the agent into internal networks.
type netPolicy struct {
	deny  []denyRule
	allow []netip.Prefix
	// listed holds the operator's registry hosts, lower case, as
	// "host:port", or as "host" for an entry without a port (any port).
	listed map[string]bool
	// local reports whether the kernel delivers an address to this host.
	local func(netip.Addr) (bool, error)
	// resolver looks up the names of requests that go through a proxy,
	// before the proxy does (nil: net.DefaultResolver).
	resolver *net.Resolver
	names    nameCache
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

// need is what a connection pool asks of an address besides the policy:
// the side (public or internal) a registry's connections keep to.
type need int

const (
	needAny      need = iota // the policy alone
	needPublic               // and a public address
	needInternal             // and an internal one
)

// dialKey is the context key of the dialInfo of a request.
type dialKey struct{}

// dialInfo is what reach tells the dialers about the request a connection
// is made for: it names the registry in refusals, and a connection to the
// proxy is not held to the side of the registry behind it.
type dialInfo struct {
	// registry is the host of the registry the request is for.
	registry string
	// derived is set when the request's host is not the registry's: a
	// token realm or a redirect.
	derived bool
	// proxied is set when the connection goes to the proxy.
	proxied bool
}

// checkNeed refuses addr when it is not on the side n asks for.
func checkNeed(n need, info dialInfo, target string, addr netip.Addr) error {
	if n == needAny || info.proxied {
		return nil
	}
	addr = addr.Unmap().WithZone("")
	if internal := isInternal(addr); internal == (n == needInternal) {
		return nil
	}
	reason := DenyCrossing
	if info.derived {
		reason = DenyEscalation
	}
	return &NetworkDeniedError{Reason: reason, Host: target, Addr: addr, Registry: info.registry}
}

// checkDial checks the address a connection for target (host:port) is
// about to reach, or reached: hostport is "ip:port".
func (p *netPolicy) checkDial(ctx context.Context, n need, target, hostport string) error {
	ap, err := netip.ParseAddrPort(hostport)
	if err != nil {
		return fmt.Errorf("registry connection to %s: address %q is not an IP address the network policy can check", bound(target), bound(hostport))
	}
	if err := p.check(target, ap.Addr()); err != nil {
		return err
	}
	info, _ := ctx.Value(dialKey{}).(dialInfo)
	return checkNeed(n, info, target, ap.Addr())
}

// dialer returns a DialContext that checks each resolved address in the
// socket's ControlContext hook, before connecting: a name cannot resolve
// its way around the policy, and a refused address sees no connection
// attempt.
func (p *netPolicy) dialer(n need) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := &net.Dialer{
			Timeout:   30 * time.Second,
			KeepAlive: 30 * time.Second,
			ControlContext: func(ctx context.Context, _, address string, _ syscall.RawConn) error {
				return p.checkDial(ctx, n, addr, address)
			},
		}
		return d.DialContext(ctx, network, addr)
	}
}

// wrapDial keeps a transport's own dial function and checks the address
// each connection reached before any byte is sent on it.
func (p *netPolicy) wrapDial(n need, dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if err := p.checkDial(ctx, n, addr, conn.RemoteAddr().String()); err != nil {
			conn.Close()
			return nil, &net.OpError{Op: "dial", Net: network, Err: err}
		}
		return conn, nil
	}
}

// pools are the clones of the registry transport, one per need: a
// connection in a pool was checked for that pool's need when it was
// dialled, so a request reusing it gets what it needs.
type pools struct {
	any, public, internal *http.Transport
}

func (ps *pools) of(n need) *http.Transport {
	switch n {
	case needPublic:
		return ps.public
	case needInternal:
		return ps.internal
	}
	return ps.any
}

// policyTransports installs the policy on clones of base: their dialers go
// through the policy (see dialer and wrapDial). base must be an
// *http.Transport (nil means remote's default settings), so that nothing
// dials around the policy.
func (p *netPolicy) policyTransports(base http.RoundTripper, def *http.Transport) (*pools, error) {
	var tr *http.Transport
	switch b := base.(type) {
	case nil:
		tr = def.Clone()
		tr.DialContext, tr.DialTLSContext = nil, nil
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
	make1 := func(n need) *http.Transport {
		c := tr.Clone()
		if tr.DialContext == nil {
			c.DialContext = p.dialer(n)
		} else {
			c.DialContext = p.wrapDial(n, tr.DialContext)
		}
		if tr.DialTLSContext != nil {
			c.DialTLSContext = p.wrapDial(n, tr.DialTLSContext)
		}
		return c
	}
	return &pools{any: make1(needAny), public: make1(needPublic), internal: make1(needInternal)}, nil
}

// checkURL refuses a request whose URL host is an address the policy
// refuses, or an address in a spelling resolvers and proxies read
// differently. It matters most when a proxy dials for us: the dialer then
// sees the proxy's address, not the registry's.
func (p *netPolicy) checkURL(req *http.Request) error {
	target := urlTarget(req.URL)
	a, ok, err := hostAddr(req.URL.Hostname(), target)
	if err != nil || !ok {
		return err
	}
	return p.check(target, a)
}

// hostAddr reads host (a URL's host name) as an IP address: ok is false
// for a name. A host whose last label is a number but that is not an
// address in the standard spelling (four decimal parts for IPv4) is
// refused: inet_aton reads 2130706433, 0x7f.1, 127.1 and 017700000001 as
// 127.0.0.1, so a proxy may connect there while a parser that does not
// know those forms takes them for names. target names the request in the
// refusal.
func hostAddr(host, target string) (addr netip.Addr, ok bool, err error) {
	h := strings.TrimSuffix(host, ".")
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Unmap().WithZone(""), true, nil
	}
	if !numericLabel(h[strings.LastIndexByte(h, '.')+1:]) {
		return netip.Addr{}, false, nil
	}
	a, _ := parseInetAton(h)
	return netip.Addr{}, false, &NetworkDeniedError{Reason: DenySpelling, Host: target, Addr: a}
}

// numericLabel reports whether a label is a number as inet_aton reads
// one: decimal digits, or 0x and hex digits (0x alone included).
func numericLabel(l string) bool {
	if len(l) >= 2 && l[0] == '0' && (l[1] == 'x' || l[1] == 'X') {
		return strings.Trim(l[2:], "0123456789abcdefABCDEF") == ""
	}
	return l != "" && strings.Trim(l, "0123456789") == ""
}

// parseInetAton reads s as glibc's inet_aton does: one to four parts
// separated by dots, each decimal, octal (leading 0) or hex (leading 0x),
// the last filling the bytes the others left (127.1 is 127.0.0.1,
// 2130706433 is 127.0.0.1). Unlike inet_aton it accepts nothing after the
// last part: a URL host has no whitespace.
func parseInetAton(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	vals := make([]uint64, len(parts))
	for i, part := range parts {
		v, ok := parseAtonPart(part)
		if !ok {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	var n uint64
	for i, v := range vals[:len(vals)-1] {
		if v > 0xff {
			return netip.Addr{}, false
		}
		n |= v << (8 * (3 - i))
	}
	last := vals[len(vals)-1]
	if last >= 1<<(8*(5-len(vals))) {
		return netip.Addr{}, false
	}
	n |= last
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), true
}

// parseAtonPart reads one part of an inet_aton address: 0x and hex digits
// (at least one), 0 and octal digits, or decimal digits; values past 32
// bits are refused.
func parseAtonPart(p string) (uint64, bool) {
	base, digits := uint64(10), p
	switch {
	case len(p) >= 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X'):
		base, digits = 16, p[2:]
	case len(p) >= 2 && p[0] == '0':
		base, digits = 8, p[1:]
	}
	if digits == "" {
		return 0, false
	}
	var v uint64
	for i := 0; i < len(digits); i++ {
		c := digits[i]
		var d uint64
		switch {
		case c >= '0' && c <= '9':
			d = uint64(c - '0')
		case c >= 'a' && c <= 'f':
			d = uint64(c-'a') + 10
		case c >= 'A' && c <= 'F':
			d = uint64(c-'A') + 10
		default:
			return 0, false
		}
		if d >= base {
			return 0, false
		}
		if v = v*base + d; v > 0xffffffff {
			return 0, false
		}
	}
	return v, true
}

// nameLookupTimeout bounds the lookup of a name a request sends to a
// proxy; a name the node cannot resolve by then is left to the proxy.
const nameLookupTimeout = 2 * time.Second

// nameTTL is how long a lookup's answer (or its failure) is kept: a proxy
// setup whose node cannot resolve names would otherwise wait
// nameLookupTimeout on every request.
const nameTTL = 10 * time.Second

// maxNames bounds the names kept.
const maxNames = 256

// nameCache keeps the node's answers for the names of proxied requests.
type nameCache struct {
	mu sync.Mutex
	m  map[string]nameEntry
}

type nameEntry struct {
	addrs []netip.Addr
	at    time.Time
}

// lookupName returns the addresses the node's own resolver gives host, or
// nil when it gives none within nameLookupTimeout.
func (p *netPolicy) lookupName(ctx context.Context, host string) []netip.Addr {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	now := time.Now()
	p.names.mu.Lock()
	if e, ok := p.names.m[host]; ok && now.Sub(e.at) < nameTTL {
		p.names.mu.Unlock()
		return e.addrs
	}
	p.names.mu.Unlock()
	r := p.resolver
	if r == nil {
		r = net.DefaultResolver
	}
	lctx, cancel := context.WithTimeout(ctx, nameLookupTimeout)
	addrs, err := r.LookupNetIP(lctx, "ip", host)
	cancel()
	if ctx.Err() != nil {
		return nil // the request ends anyway; its failure says nothing of the name
	}
	if err != nil {
		addrs = nil
	}
	for i, a := range addrs {
		addrs[i] = a.Unmap().WithZone("")
	}
	p.names.mu.Lock()
	defer p.names.mu.Unlock()
	if p.names.m == nil || len(p.names.m) >= maxNames {
		for k, e := range p.names.m {
			if now.Sub(e.at) >= nameTTL {
				delete(p.names.m, k)
			}
		}
		if p.names.m == nil || len(p.names.m) >= maxNames {
			p.names.m = make(map[string]nameEntry)
		}
	}
	p.names.m[host] = nameEntry{addrs: addrs, at: now}
	return addrs
}

// reach keeps a registry endpoint's connections on one side while its
// authenticated transport (and the token it holds) is in use: its first
// connection tells whether the registry is at a public or an internal
// address. A registry at a public address may not lead the agent into
// internal networks by a token realm or a redirect (a realm's answer
// becomes the token sent back to the registry: one field of any internal
// GET endpoint would be read); a registry at an internal address may. And
// a registry's own connections may not cross sides, or a name that
// answers internal first and public later would carry a token fetched
// inside to the outside.
type reach struct {
	policy *netPolicy
	pools  *pools
	// registry is the registry's host name, lower case; requests for
	// another host are derived (realms, redirects).
	registry string
	// side is unknown (0) until the first connection, then sidePublic
	// or sideInternal for good.
	side atomic.Int32
}

const (
	sidePublic   = 1
	sideInternal = 2
)

var _ http.RoundTripper = (*reach)(nil)

func newReach(policy *netPolicy, ps *pools, registry string) *reach {
	return &reach{policy: policy, pools: ps, registry: normHost(hostOnly(registry))}
}

func normHost(h string) string { return strings.ToLower(strings.TrimSuffix(h, ".")) }

// settle records the side of the registry's first connection: public if
// any of addrs is public.
func (r *reach) settle(addrs ...netip.Addr) {
	side := int32(sideInternal)
	if len(addrs) == 0 || slices.ContainsFunc(addrs, func(a netip.Addr) bool { return !isInternal(a) }) {
		side = sidePublic
	}
	r.side.CompareAndSwap(0, side)
}

// RoundTrip sends req through the pool its registry's side asks for.
// Behind a proxy, the dialers see the proxy's address: the host is then
// checked here, as an address or by the node's own lookup of the name
// (a name the node cannot resolve is the proxy's to place).
func (r *reach) RoundTrip(req *http.Request) (*http.Response, error) {
	target := urlTarget(req.URL)
	host := normHost(req.URL.Hostname())
	proxied := false
	if r.pools.any.Proxy != nil {
		u, err := r.pools.any.Proxy(req)
		if err != nil {
			return nil, err
		}
		proxied = u != nil
	}
	var addrs []netip.Addr
	a, isAddr, err := hostAddr(host, target)
	switch {
	case err != nil:
		return nil, err
	case isAddr:
		addrs = []netip.Addr{a}
	case proxied:
		addrs = r.policy.lookupName(req.Context(), host)
	}
	for _, a := range addrs {
		if err := r.policy.check(target, a); err != nil {
			return nil, err
		}
	}
	info := dialInfo{registry: r.registry, derived: host != r.registry, proxied: proxied}
	ctx := req.Context()
	if !info.derived && r.side.Load() == 0 {
		switch {
		case len(addrs) > 0 || proxied:
			r.settle(addrs...) // a name the node cannot resolve counts as public
		default:
			ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) {
				if ap, err := netip.ParseAddrPort(ci.Conn.RemoteAddr().String()); err == nil {
					r.settle(ap.Addr())
				}
			}})
		}
	}
	n := needAny
	switch side := r.side.Load(); {
	case info.derived && side != sideInternal:
		n = needPublic // unknown counts as public
	case info.derived:
	case side == sidePublic:
		n = needPublic
	case side == sideInternal:
		n = needInternal
	}
	for _, a := range addrs {
		// The dialers check the same when there is no proxy; behind one
		// only this does.
		info := info
		info.proxied = false
		if err := checkNeed(n, info, target, a); err != nil {
			return nil, err
		}
	}
	return r.pools.of(n).RoundTrip(req.WithContext(context.WithValue(ctx, dialKey{}, info)))
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
