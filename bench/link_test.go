package bench

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseLinks(t *testing.T) {
	cases := []struct {
		in   string
		want []int64
		bad  bool
	}{
		{in: "", want: nil},
		{in: " ", want: nil},
		{in: "400,1000", want: []int64{400_000_000, 1_000_000_000}},
		{in: " 2.5 ", want: []int64{2_500_000}},
		{in: "0", bad: true},
		{in: "-400", bad: true},
		{in: "fast", bad: true},
		{in: "400,", bad: true},
	}
	for _, c := range cases {
		got, err := ParseLinks(c.in)
		if (err != nil) != c.bad || !slices.Equal(got, c.want) {
			t.Errorf("ParseLinks(%q) = %v, %v; want %v (error: %v)", c.in, got, err, c.want, c.bad)
		}
	}
}

func linkRun(img string, bps, compressed int64, run int, wall time.Duration, rss, written, size int64) LinkRun {
	return LinkRun{Measurement: measurement(img, PipelineLinkCold, run, wall, rss, written, size), BitsPerSecond: bps,
		ConnDelay: linkConnDelay, Compressed: compressed, Through: compressed + 4096, Requests: 6, Connections: 2}
}

func TestLinkRowsAndTargets(t *testing.T) {
	const compressed = 100_000_000 // 2 s at 400 Mbit/s, 0.8 s at 1 Gbit/s
	r := &Report{
		Measurements: []Measurement{
			measurement("debian", PipelineCold, 0, 1100*time.Millisecond, 80<<20, 300<<20, 200<<20),
			measurement("debian", PipelineCold, 1, 1000*time.Millisecond, 80<<20, 300<<20, 200<<20),
			measurement("debian", PipelineCold, 2, 900*time.Millisecond, 80<<20, 300<<20, 200<<20),
		},
		Links: []LinkRun{
			linkRun("debian", 400_000_000, compressed, 0, 2200*time.Millisecond, 90<<20, 250<<20, 200<<20),
			linkRun("debian", 1_000_000_000, compressed, 0, 1200*time.Millisecond, 300<<20, 250<<20, 200<<20),
			linkRun("debian", 400_000_000, compressed, 1, 2400*time.Millisecond, 95<<20, 260<<20, 200<<20),
			linkRun("debian", 400_000_000, compressed, 2, 2100*time.Millisecond, 85<<20, 240<<20, 200<<20),
		},
	}
	rows := r.Rows()
	lrs := r.LinkRows(rows)
	if len(lrs) != 2 {
		t.Fatalf("LinkRows: %d rows, want 2: %+v", len(lrs), lrs)
	}
	slow, fast := lrs[0], lrs[1]
	if slow.BitsPerSecond != 400_000_000 || slow.Runs != 3 || slow.WallMedian != 2.2 || slow.WallMin != 2.1 || slow.WallMax != 2.4 {
		t.Errorf("400 Mbit/s row = %+v, want 3 runs, median/min/max 2.2/2.1/2.4", slow)
	}
	if slow.Floor != 2 || slow.Loopback != 1 || slow.Bound() != 2 || !slow.Pass() {
		t.Errorf("400 Mbit/s row: floor %v, loopback %v, bound %v, pass %v; want 2, 1, 2 (the link floor), true",
			slow.Floor, slow.Loopback, slow.Bound(), slow.Pass())
	}
	if slow.PeakRSSMiB != 95 || slow.WrittenMiB != 250 || slow.WrittenPerSize != 1.25 {
		t.Errorf("400 Mbit/s row: peak %v MiB, written %v MiB, written/size %v; want 95, 250, 1.25", slow.PeakRSSMiB, slow.WrittenMiB, slow.WrittenPerSize)
	}
	// At 1 Gbit/s the loopback cold build (1 s) is above the link floor
	// (0.8 s): 1.2 s is 1.2x that bound, a miss.
	if fast.Floor != 0.8 || fast.Bound() != 1 || fast.Pass() {
		t.Errorf("1 Gbit/s row: floor %v, bound %v, pass %v; want 0.8, 1 (loopback), false", fast.Floor, fast.Bound(), fast.Pass())
	}

	got := map[string]bool{}
	for _, tg := range linkTargets(lrs) {
		got[tg.Name] = tg.Pass
	}
	want := map[string]bool{
		"tc-cold over 400 Mbit/s debian":                   true,
		"tc-cold over 1000 Mbit/s debian":                  false,
		"peak RSS debian over the links":                   false, // 300 MiB at 1 Gbit/s
		"bytes written / image size debian over the links": true,
	}
	for name, pass := range want {
		if p, ok := got[name]; !ok || p != pass {
			t.Errorf("link target %q: present %v, pass %v; want pass %v (targets: %v)", name, ok, p, pass, got)
		}
	}

	var out bytes.Buffer
	if err := r.Write(&out); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"| debian | 400 Mbit/s | 3 | 95.4 | 2.000 | 1.000 | 2.200 | 2.100 | 2.400 | 1.10 | 1.10 | 2.300 | PASS |",
		"| debian | 1000 Mbit/s | 1 | 95.4 | 0.800 | 1.000 | 1.200 | 1.200 | 1.200 | 1.50 | 1.20 | 1.150 | MISS |",
		"MISS  tc-cold over 1000 Mbit/s debian",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("report lacks %q:\n%s", line, out.String())
		}
	}
}
