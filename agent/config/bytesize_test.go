package config

import (
	"testing"
)

func TestByteSize(t *testing.T) {
	for in, want := range map[string]ByteSize{"0": 0, "1024": 1024, "4KiB": 4096, "512MiB": 512 << 20, "20GiB": 20 << 30, "1TiB": 1 << 40, "3G": 3 << 30} {
		if got, err := ParseByteSize(in); err != nil || got != want {
			t.Errorf("ParseByteSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "1.5GiB", "GiB", "99999999999TiB"} {
		if _, err := ParseByteSize(bad); err == nil {
			t.Errorf("ParseByteSize(%q) succeeded", bad)
		}
	}
	if s := ByteSize(20 << 30).String(); s != "20GiB" {
		t.Errorf("String = %s", s)
	}
}
