package oci

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"
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

// TestNetPolicySides: checkNeed keeps a registry's connections to its
// side, and names a derived host's refusal as an escalation.
func TestNetPolicySides(t *testing.T) {
	pub, internal := netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("10.1.2.3")
	for _, c := range []struct {
		n    need
		info dialInfo
		addr netip.Addr
		want DenyReason
	}{
		{needAny, dialInfo{}, internal, 0},
		{needPublic, dialInfo{registry: "r"}, pub, 0},
		{needPublic, dialInfo{registry: "r", derived: true}, internal, DenyEscalation},
		{needPublic, dialInfo{registry: "r"}, internal, DenyCrossing},
		{needInternal, dialInfo{registry: "r"}, pub, DenyCrossing},
		{needInternal, dialInfo{registry: "r"}, internal, 0},
		{needPublic, dialInfo{registry: "r", derived: true, proxied: true}, internal, 0}, // the proxy's own connection
	} {
		err := checkNeed(c.n, c.info, "x:80", c.addr)
		var nd *NetworkDeniedError
		if got := DenyReason(0); errors.As(err, &nd) {
			got = nd.Reason
			if got != c.want {
				t.Errorf("checkNeed(%v, %+v, %s) = %v, want reason %v", c.n, c.info, c.addr, err, c.want)
			}
		} else if err != nil || c.want != 0 {
			t.Errorf("checkNeed(%v, %+v, %s) = %v, want reason %v", c.n, c.info, c.addr, err, c.want)
		}
	}
	for _, a := range []string{"10.0.0.1", "172.16.0.1", "192.168.0.1", "100.64.0.1", "127.0.0.1", "169.254.169.254",
		"0.0.0.0", "::1", "::", "fd00::1", "fe80::1", "::ffff:10.0.0.1"} {
		if !isInternal(netip.MustParseAddr(a)) {
			t.Errorf("isInternal(%s) = false", a)
		}
	}
	for _, a := range []string{"203.0.113.10", "8.8.8.8", "2001:db8::1", "2600::1", "::ffff:8.8.8.8"} {
		if isInternal(netip.MustParseAddr(a)) {
			t.Errorf("isInternal(%s) = true", a)
		}
	}
}

// TestRefusalsBounded: a refusal shows at most maxShown bytes of any name
// or URL part a reference or a registry's answer chose.
func TestRefusalsBounded(t *testing.T) {
	long := strings.Repeat("a", 5000) + ".example"
	errs := []error{
		&NetworkDeniedError{Reason: DenyEscalation, Host: long + ":80", Addr: netip.MustParseAddr("10.0.0.1"), Registry: long},
		&NetworkDeniedError{Reason: DenyCrossing, Host: long + ":80", Addr: netip.MustParseAddr("10.0.0.1"), Registry: long},
		&NetworkDeniedError{Reason: DenyLoopback, Host: long + ":80", Addr: netip.MustParseAddr("127.0.0.1")},
		&NetworkDeniedError{Reason: DenyLocal, Host: long + ":80", Addr: netip.MustParseAddr("192.0.2.7")},
		&NetworkDeniedError{Reason: DenyRule, Host: long + ":80", Addr: netip.MustParseAddr("10.0.0.1"), Rule: netip.MustParsePrefix("10.0.0.0/8")},
		&NetworkDeniedError{Reason: DenySpelling, Host: strings.Repeat("1.", 3000) + "1:80"},
	}
	p, err := newNetPolicy(nil, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	errs = append(errs, p.checkDial(context.Background(), needAny, long+":80", long))
	u := &url.URL{Scheme: strings.Repeat("x", 5000), Host: "h"}
	errs = append(errs, checkRedirect(&http.Request{URL: u}, []*http.Request{{URL: u}}))
	for _, err := range errs {
		if msg := err.Error(); len(msg) > 3*maxShown+300 || !strings.Contains(msg, "…") {
			t.Errorf("a refusal of %d bytes, want it cut: %.120s…", len(msg), msg)
		}
	}
	if got := bound(strings.Repeat("é", 200)); len(got) > maxShown || !utf8.ValidString(got) || !strings.Contains(got, "…") {
		t.Errorf("bound cut a multi-byte name to %d bytes: %q", len(got), got)
	}
}
