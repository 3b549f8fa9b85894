package oci

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// TestDefaultDenyLift: the defaults apply whatever DenyNetworks adds; only
// LiftDefaultDeny takes one out, and only one of them, as written there.
// 169.254.169.254 stays denied when link-local is lifted.
func TestDefaultDenyLift(t *testing.T) {
	policy := func(deny, lift []netip.Prefix) *netPolicy {
		t.Helper()
		p, err := newNetPolicy(deny, nil, lift, nil)
		if err != nil {
			t.Fatalf("newNetPolicy(deny %v, lift %v): %v", deny, lift, err)
		}
		p.local = notLocal
		return p
	}
	check := func(p *netPolicy, addr, want string) {
		t.Helper()
		err := p.check("h:80", netip.MustParseAddr(addr))
		switch {
		case want == "" && err != nil:
			t.Errorf("check(%s) = %v, want allowed", addr, err)
		case want != "" && (!errors.Is(err, ErrNetworkDenied) || !strings.Contains(err.Error(), want)):
			t.Errorf("check(%s) = %v, want a refusal with %q", addr, err, want)
		}
	}
	for _, p := range []*netPolicy{policy(nil, nil), policy([]netip.Prefix{}, nil), policy(prefixes(t, "10.0.0.0/8"), nil)} {
		check(p, "169.254.169.254", "is in 169.254.169.254/32 (cloud metadata), denied by default")
		check(p, "169.254.1.1", "is in 169.254.0.0/16 (link-local), denied by default")
		check(p, "fe80::1", "is in fe80::/10 (link-local), denied by default")
		check(p, "fd00:ec2::254", "is in fd00:ec2::254/128 (cloud metadata, AWS), denied by default")
		check(p, "fd00:ec2::23", "is in fd00:ec2::23/128 (cloud metadata, AWS), denied by default")
		check(p, "fd20:ce::254", "is in fd20:ce::254/128 (cloud metadata, GCP), denied by default")
		check(p, "100.100.100.200", "is in 100.100.100.200/32 (cloud metadata, Alibaba Cloud), denied by default")
		check(p, "192.168.1.1", "")
	}
	check(policy(prefixes(t, "10.0.0.0/8"), nil), "10.1.2.3", "registry address 10.1.2.3 (of h) is in registry.deny_networks 10.0.0.0/8")
	check(policy(nil, nil), "10.1.2.3", "")

	linkLocal := policy(nil, prefixes(t, "169.254.0.0/16"))
	check(linkLocal, "169.254.1.1", "")
	check(linkLocal, "169.254.169.254", "is in 169.254.169.254/32 (cloud metadata)")
	check(linkLocal, "fe80::1", "is in fe80::/10")
	both := policy(nil, prefixes(t, "169.254.0.0/16", "169.254.169.254/32"))
	check(both, "169.254.169.254", "")

	for _, bad := range []string{"10.0.0.0/8", "169.254.0.0/17", "169.254.169.0/24"} {
		if _, err := newNetPolicy(nil, nil, prefixes(t, bad), nil); err == nil || !strings.Contains(err.Error(), "is not one of the default denied networks") {
			t.Errorf("lift %s: error %v, want a refusal", bad, err)
		}
	}
	// New refuses it too.
	if _, err := New(Options{CacheDir: t.TempDir(), LiftDefaultDeny: prefixes(t, "10.0.0.0/8")}); err == nil || !strings.Contains(err.Error(), "LiftDefaultDeny") {
		t.Errorf("New with a lift that is no default: %v, want a refusal naming LiftDefaultDeny", err)
	}
}
