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
