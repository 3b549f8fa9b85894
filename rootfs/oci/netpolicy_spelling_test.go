package oci

import (
	"errors"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func TestParseInetAton(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string // "" when inet_aton refuses it
	}{
		{"127.0.0.1", "127.0.0.1"},
		{"2130706433", "127.0.0.1"},
		{"0x7f000001", "127.0.0.1"},
		{"0X7F000001", "127.0.0.1"},
		{"017700000001", "127.0.0.1"},
		{"0x7f.1", "127.0.0.1"},
		{"127.1", "127.0.0.1"},
		{"127.0.1", "127.0.0.1"},
		{"0177.0.0.1", "127.0.0.1"},
		{"0x7f.0.0.0x1", "127.0.0.1"},
		{"00000000000000000000000000177.1", "127.0.0.1"},
		{"0x000000000000000000000007f.1", "127.0.0.1"},
		{"169.254.43518", "169.254.169.254"},
		{"0xa9fea9fe", "169.254.169.254"},
		{"10.0.0.010", "10.0.0.8"}, // octal, not decimal ten
		{"0", "0.0.0.0"},
		{"00", "0.0.0.0"},
		{"4294967295", "255.255.255.255"},
		{"1.16777215", "1.255.255.255"},
		{"1.2.65535", "1.2.255.255"},
		{"4294967296", ""},
		{"0x100000000", ""},
		{"1.16777216", ""},
		{"1.2.65536", ""},
		{"1.2.3.256", ""},
		{"256.1", ""},
		{"1.2.3.4.5", ""},
		{"1..2", ""},
		{"1.2.3.", ""},
		{".1", ""},
		{"", ""},
		{"0x", ""},
		{"0x.1", ""},
		{"08", ""},
		{"09.1", ""},
		{"0x1g", ""},
		{"-1", ""},
		{"+1", ""},
		{" 1", ""},
		{"1 ", ""},
		{"1e3", ""},
		{"1_000", ""},
		{"99999999999999999999999999", ""},
		{"localhost", ""},
	} {
		got, ok := parseInetAton(c.in)
		if c.want == "" {
			if ok {
				t.Errorf("parseInetAton(%q) = %s, want a refusal", c.in, got)
			}
			continue
		}
		if !ok || got != netip.MustParseAddr(c.want) {
			t.Errorf("parseInetAton(%q) = %v, %v; want %s", c.in, got, ok, c.want)
		}
	}
}

func TestHostAddr(t *testing.T) {
	for _, c := range []struct {
		host string
		addr string // the address, or what a refused spelling reads as
		name bool   // a name: neither an address nor refused
		bad  bool   // refused as a spelling
	}{
		{host: "127.0.0.1", addr: "127.0.0.1"},
		{host: "127.0.0.1.", addr: "127.0.0.1"},
		{host: "10.1.2.3", addr: "10.1.2.3"},
		{host: "::1", addr: "::1"},
		{host: "::ffff:127.0.0.1", addr: "127.0.0.1"},
		{host: "::ffff:7f00:1", addr: "127.0.0.1"},
		{host: "fe80::1%eth0", addr: "fe80::1"},
		{host: "2130706433", addr: "127.0.0.1", bad: true},
		{host: "0x7f.1", addr: "127.0.0.1", bad: true},
		{host: "0x7f.1.", addr: "127.0.0.1", bad: true},
		{host: "127.1", addr: "127.0.0.1", bad: true},
		{host: "0x7f000001", addr: "127.0.0.1", bad: true},
		{host: "017700000001", addr: "127.0.0.1", bad: true},
		{host: "010.0.0.1", addr: "8.0.0.1", bad: true},
		{host: "1.2.3.4.5", bad: true},
		{host: "example.123", bad: true},
		{host: "0x", bad: true},
		{host: "08.1", bad: true},
		{host: "registry.example", name: true},
		{host: "docker.io", name: true},
		{host: "1e100.net", name: true},
		{host: "x0", name: true},
		{host: "0xg", name: true},
		{host: "", name: true},
	} {
		a, isAddr, err := hostAddr(c.host, c.host+":80")
		var nd *NetworkDeniedError
		switch {
		case c.bad:
			if !errors.As(err, &nd) || nd.Reason != DenySpelling || !errors.Is(err, ErrNetworkDenied) {
				t.Errorf("hostAddr(%q) = %v, %v, %v; want a refused spelling", c.host, a, isAddr, err)
				continue
			}
			if c.addr != "" && nd.Addr != netip.MustParseAddr(c.addr) {
				t.Errorf("hostAddr(%q): refusal names %v, want %s", c.host, nd.Addr, c.addr)
			}
			if c.addr != "" && !strings.Contains(err.Error(), "reads as the IPv4 address "+c.addr) {
				t.Errorf("hostAddr(%q): %v, want it to name %s", c.host, err, c.addr)
			}
		case c.name:
			if err != nil || isAddr {
				t.Errorf("hostAddr(%q) = %v, %v, %v; want a name", c.host, a, isAddr, err)
			}
		default:
			if err != nil || !isAddr || a != netip.MustParseAddr(c.addr) {
				t.Errorf("hostAddr(%q) = %v, %v, %v; want %s", c.host, a, isAddr, err, c.addr)
			}
		}
	}
}

// atonPart is one part of an inet_aton address, as glibc's strtoul with
// base 0 reads it to the end: hex with at least one digit, octal, decimal.
var atonPart = regexp.MustCompile(`^(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)$`)

// refInetAton is inet_aton written another way, for FuzzParseInetAton
// to compare with.
func refInetAton(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	var vals []uint64
	for _, p := range parts {
		if !atonPart.MatchString(p) {
			return netip.Addr{}, false
		}
		base, digits := 10, p
		if strings.HasPrefix(p, "0x") || strings.HasPrefix(p, "0X") {
			base, digits = 16, p[2:]
		} else if strings.HasPrefix(p, "0") {
			base = 8
		}
		v, err := strconv.ParseUint(digits, base, 32)
		if err != nil {
			return netip.Addr{}, false
		}
		vals = append(vals, v)
	}
	// The last part fills 4-(parts-1) bytes; the others one each.
	var b [4]byte
	for i, v := range vals[:len(vals)-1] {
		if v > 255 {
			return netip.Addr{}, false
		}
		b[i] = byte(v)
	}
	last, room := vals[len(vals)-1], 5-len(vals)
	if room < 4 && last>>(8*room) != 0 {
		return netip.Addr{}, false
	}
	for i := 3; i >= 4-room; i-- {
		b[i] = byte(last)
		last >>= 8
	}
	return netip.AddrFrom4(b), true
}

// FuzzParseInetAton checks parseInetAton against refInetAton, and that
// whatever inet_aton reads as an address hostAddr never takes for a name:
// a proxy that resolves with inet_aton would connect there.
func FuzzParseInetAton(f *testing.F) {
	for _, s := range []string{"127.0.0.1", "2130706433", "0x7f.1", "127.1", "017700000001", "0x7f000001",
		"1.2.3.4.5", "0x", "08", "4294967296", "10.0.0.010", "registry.example", "0x7f.1.", "::1", "1.2.65535"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := parseInetAton(s)
		want, wok := refInetAton(s)
		if ok != wok || got != want {
			t.Fatalf("parseInetAton(%q) = %v, %v; the reference reads %v, %v", s, got, ok, want, wok)
		}
		if !ok {
			return
		}
		if back, bok := parseInetAton(got.String()); !bok || back != got {
			t.Fatalf("parseInetAton(%q) = %v, which reads back as %v, %v", s, got, back, bok)
		}
		for _, h := range []string{s, s + "."} {
			a, isAddr, err := hostAddr(h, "t")
			var nd *NetworkDeniedError
			switch {
			case isAddr && a != got:
				t.Fatalf("hostAddr(%q) = %v, inet_aton reads %v", h, a, got)
			case !isAddr && !(errors.As(err, &nd) && nd.Reason == DenySpelling && nd.Addr == got):
				t.Fatalf("hostAddr(%q) = %v, %v, %v; inet_aton reads %v", h, a, isAddr, err, got)
			}
		}
	})
}
