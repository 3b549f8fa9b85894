package oci

import (
	"net/netip"
	"testing"
)

// TestHostAddressKernelAnswers: the kernel's route lookup (netlink) and
// the UDP probe that answers where netlink is refused (a unit's
// RestrictAddressFamilies=) agree on which addresses are the host's own:
// interface addresses, v4 and v6, and a local route for a whole range
// (AnyIP); not an address routed elsewhere, nor one without a route.
func TestHostAddressKernelAnswers(t *testing.T) {
	if !inNetns(t, netns{addrs: []string{"192.0.2.7/32", "10.99.0.1/32", "2001:db8::7/128"},
		routes: []string{"local 198.51.100.0/24 dev lo", "203.0.113.0/24 dev lo"}}) {
		return
	}
	want := map[string]bool{
		"127.0.0.1": true, "::1": true, "192.0.2.7": true, "10.99.0.1": true, "2001:db8::7": true,
		"198.51.100.5": true, "203.0.113.5": false, "10.99.0.2": false, "2001:db8::8": false, "8.8.8.8": false,
	}
	for s, local := range want {
		a := netip.MustParseAddr(s)
		if got, ok := routeLocal(a); !ok || got != local {
			t.Errorf("routeLocal(%s) = %v, %v; want %v", s, got, ok, local)
		}
		if got, err := probeLocal(a); err != nil || got != local {
			t.Errorf("probeLocal(%s) = %v, %v; want %v", s, got, err, local)
		}
	}
	// Without netlink, hostAddress asks the probe.
	noNetlink.Store(true)
	defer noNetlink.Store(false)
	for s, local := range want {
		if got, err := hostAddress(netip.MustParseAddr(s)); err != nil || got != local {
			t.Errorf("hostAddress(%s) without netlink = %v, %v; want %v", s, got, err, local)
		}
	}
}
