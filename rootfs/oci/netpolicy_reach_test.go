package oci

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
)

// These tests run in network namespaces of their own (inNetns): every
// address they use, public-looking or private, is on the namespace's lo.

func portOf(t *testing.T, hostport string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Fatal(err)
	}
	return port
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
