package oci

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"syscall"
	"time"
)

// DefaultDenyNetworks lists the networks registry connections may not reach
// when Options.DenyNetworks is nil: link-local addresses and the cloud
// metadata services (AWS IPv6, Alibaba Cloud). Loopback and private ranges
// stay reachable, for local mirrors.
func DefaultDenyNetworks() []netip.Prefix {
	return []netip.Prefix{
		netip.MustParsePrefix("169.254.0.0/16"),
		netip.MustParsePrefix("fe80::/10"),
		netip.MustParsePrefix("fd00:ec2::254/128"),
		netip.MustParsePrefix("100.100.100.200/32"),
	}
}

// ErrNetworkDenied marks a registry connection the network policy refused
// (Options.DenyNetworks, Options.AllowNetworks).
var ErrNetworkDenied = errors.New("registry address refused by the network policy")

// NetworkDeniedError says which address a registry connection would have
// reached and which rule refused it. errors.Is(err, ErrNetworkDenied) holds.
type NetworkDeniedError struct {
	// Host is the name or address the connection was made for.
	Host string
	// Addr is the address the connection would have reached.
	Addr netip.Addr
	// Rule is the registry.deny_networks entry Addr is in; the zero Prefix
	// when Addr is outside every registry.allow_networks entry.
	Rule netip.Prefix
	// Allow lists registry.allow_networks when it refused Addr.
	Allow []netip.Prefix
}

// Error names the address, its host and the rule that refused it.
func (e *NetworkDeniedError) Error() string {
	who := "registry address " + e.Addr.String()
	if e.Host != "" && e.Host != e.Addr.String() {
		who += " (of " + e.Host + ")"
	}
	if e.Rule.IsValid() {
		return fmt.Sprintf("%s is in registry.deny_networks %s", who, e.Rule)
	}
	allow := make([]string, len(e.Allow))
	for i, p := range e.Allow {
		allow[i] = p.String()
	}
	return fmt.Sprintf("%s is not in registry.allow_networks (%s)", who, strings.Join(allow, ", "))
}

// Is reports ErrNetworkDenied.
func (e *NetworkDeniedError) Is(target error) bool { return target == ErrNetworkDenied }

// netPolicy decides which addresses registry connections may reach: none in
// deny, and, when allow is not empty, only those in allow.
type netPolicy struct {
	deny, allow []netip.Prefix
}

// newNetPolicy normalises the prefixes: masked, IPv4-mapped IPv6 prefixes
// as IPv4. nil deny means DefaultDenyNetworks.
func newNetPolicy(deny, allow []netip.Prefix) (*netPolicy, error) {
	if deny == nil {
		deny = DefaultDenyNetworks()
	}
	p := &netPolicy{}
	for _, l := range []struct {
		key  string
		in   []netip.Prefix
		into *[]netip.Prefix
	}{{"DenyNetworks", deny, &p.deny}, {"AllowNetworks", allow, &p.allow}} {
		for _, pr := range l.in {
			if !pr.IsValid() {
				return nil, fmt.Errorf("%s: invalid prefix %v", l.key, pr)
			}
			*l.into = append(*l.into, normPrefix(pr))
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

// check refuses addr when the policy does; host names the connection's
// target for the message.
func (p *netPolicy) check(host string, addr netip.Addr) error {
	addr = addr.Unmap().WithZone("")
	for _, pr := range p.deny {
		if pr.Contains(addr) {
			return &NetworkDeniedError{Host: host, Addr: addr, Rule: pr}
		}
	}
	if len(p.allow) == 0 {
		return nil
	}
	for _, pr := range p.allow {
		if pr.Contains(addr) {
			return nil
		}
	}
	return &NetworkDeniedError{Host: host, Addr: addr, Allow: p.allow}
}

// checkAddr checks a "host:port" or net.Addr string whose host is an IP
// address; anything else is refused, since the policy cannot place it.
func (p *netPolicy) checkAddr(host, hostport string) error {
	ap, err := netip.ParseAddrPort(hostport)
	if err != nil {
		return fmt.Errorf("registry connection to %s: address %q is not an IP address the network policy can check", host, hostport)
	}
	return p.check(host, ap.Addr())
}

// dialer returns a DialContext that checks each resolved address in the
// socket's Control hook, before connecting: a name cannot resolve its way
// around the policy, and a refused address sees no connection attempt.
func (p *netPolicy) dialer() func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		d := &net.Dialer{
			Timeout:   30 * time.Second,
			KeepAlive: 30 * time.Second,
			Control: func(_, address string, _ syscall.RawConn) error {
				return p.checkAddr(host, address)
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
		host, _, serr := net.SplitHostPort(addr)
		if serr != nil {
			host = addr
		}
		if err := p.checkAddr(host, conn.RemoteAddr().String()); err != nil {
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
	if tr.Dial != nil || tr.DialTLS != nil { // deprecated hooks the policy cannot wrap
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
	return p.check(h, a)
}
