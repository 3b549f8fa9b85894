package config

import (
	"math"
	"testing"
)

// byteSizeSeeds are sizes as operators write them, and near misses.
var byteSizeSeeds = []string{
	"0", "1024", "4KiB", "512MiB", "20GiB", "1TiB", "3G", " 7 K ", "12B",
	"-1", "+5", "-0", "1.5GiB", "GiB", "99999999999TiB", "8388607TiB", "9223372036854775807",
	"9223372036854775808", "0x10", "1_000", "",
}

// FuzzParseByteSize checks that ParseByteSize never panics, never returns
// a negative size, and that String renders a size ParseByteSize reads back
// as the same value.
func FuzzParseByteSize(f *testing.F) {
	for _, s := range byteSizeSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := ParseByteSize(s)
		if err != nil {
			return
		}
		if b < 0 {
			t.Fatalf("ParseByteSize(%q) = %d, a negative size", s, b)
		}
		again, err := ParseByteSize(b.String())
		if err != nil || again != b {
			t.Fatalf("ParseByteSize(%q) = %d; its String %q parses as %d, %v", s, b, b.String(), again, err)
		}
	})
}

// FuzzParseReserve checks that ParseReserve never panics, keeps percentages
// within 0 to 100, and that String renders a reserve ParseReserve reads
// back as the same value.
func FuzzParseReserve(f *testing.F) {
	for _, s := range append(byteSizeSeeds, "5%", "0%", "100%", "100.5%", "-1%", " 2.5 %", "NaN%", "Inf%", "0x1p-2%", "1e2%", "%") {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseReserve(s)
		if err != nil {
			return
		}
		if math.IsNaN(r.Percent) || r.Percent < 0 || r.Percent > 100 || r.Bytes < 0 {
			t.Fatalf("ParseReserve(%q) = %+v, out of range", s, r)
		}
		again, err := ParseReserve(r.String())
		if err != nil || again != r {
			t.Fatalf("ParseReserve(%q) = %+v; its String %q parses as %+v, %v", s, r, r.String(), again, err)
		}
	})
}
