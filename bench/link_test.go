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
		want []Link
		bad  bool
	}{
		{in: "", want: nil},
		{in: " ", want: nil},
		{in: "400,1000", want: []Link{{BitsPerSecond: 400_000_000}, {BitsPerSecond: 1_000_000_000}}},
		{in: " 2.5 ", want: []Link{{BitsPerSecond: 2_500_000}}},
		{in: "400, 1000/200", want: []Link{{BitsPerSecond: 400_000_000}, {BitsPerSecond: 1_000_000_000, ConnBitsPerSecond: 200_000_000}}},
		{in: "0", bad: true},
		{in: "-400", bad: true},
		{in: "fast", bad: true},
		{in: "400,", bad: true},
		{in: "1000/", bad: true},
		{in: "1000/0", bad: true},
		{in: "1000/200/100", bad: true},
	}
	for _, c := range cases {
		got, err := ParseLinks(c.in)
		if (err != nil) != c.bad || !slices.Equal(got, c.want) {
			t.Errorf("ParseLinks(%q) = %v, %v; want %v (error: %v)", c.in, got, err, c.want, c.bad)
		}
	}
	if got, err := ParseLinks(DefaultLinks); err != nil || len(got) != 2 || got[0].capped() || !got[1].capped() {
		t.Errorf("ParseLinks(DefaultLinks) = %v, %v; want an uncapped and a capped link", got, err)
	}
}

func TestLinkNames(t *testing.T) {
	for _, c := range []struct {
		link         Link
		name, label  string
		capped       bool
		targetFactor float64
	}{
		{Link{BitsPerSecond: 400_000_000}, "400 Mbit/s", "link-400", false, targetLinkRatio},
		{Link{BitsPerSecond: 1_000_000_000, ConnBitsPerSecond: 200_000_000}, "1000 Mbit/s, 200 Mbit/s per connection", "link-1000-200", true, targetLinkCappedRatio},
		// A cap at or above the shared bandwidth caps nothing.
		{Link{BitsPerSecond: 100_000_000, ConnBitsPerSecond: 200_000_000}, "100 Mbit/s, 200 Mbit/s per connection", "link-100-200", false, targetLinkRatio},
	} {
		if got := c.link.String(); got != c.name {
			t.Errorf("%+v: String() = %q, want %q", c.link, got, c.name)
		}
		if got := c.link.label(); got != c.label {
			t.Errorf("%+v: label() = %q, want %q", c.link, got, c.label)
		}
		if c.link.capped() != c.capped || c.link.targetRatio() != c.targetFactor {
			t.Errorf("%+v: capped %v, target %v; want %v, %v", c.link, c.link.capped(), c.link.targetRatio(), c.capped, c.targetFactor)
		}
	}
}

func linkRun(img string, link Link, compressed int64, run int, wall time.Duration, rss, written, size int64) LinkRun {
	m := measurement(img, PipelineLinkCold, run, wall, rss, written, size)
	m.Builder = wall - 40*time.Millisecond
	return LinkRun{Measurement: m, Link: link, ConnDelay: linkConnDelay, Compressed: compressed, Through: compressed + 4096,
		Requests: 6, Connections: 2, Reuse: 15 * time.Millisecond}
}

func TestLinkRowsAndTargets(t *testing.T) {
	const compressed = 100_000_000 // 2 s at 400 Mbit/s, 0.8 s at 1 Gbit/s
	slowLink := Link{BitsPerSecond: 400_000_000}
	fastLink := Link{BitsPerSecond: 1_000_000_000}
	cappedLink := Link{BitsPerSecond: 1_000_000_000, ConnBitsPerSecond: 200_000_000}
	r := &Results{
		Measurements: []Measurement{
			measurement("debian", PipelineCold, 0, 1100*time.Millisecond, 80<<20, 300<<20, 200<<20),
			measurement("debian", PipelineCold, 1, 1000*time.Millisecond, 80<<20, 300<<20, 200<<20),
			measurement("debian", PipelineCold, 2, 900*time.Millisecond, 80<<20, 300<<20, 200<<20),
		},
		Links: []LinkRun{
			linkRun("debian", slowLink, compressed, 0, 2200*time.Millisecond, 90<<20, 250<<20, 200<<20),
			linkRun("debian", fastLink, compressed, 0, 1200*time.Millisecond, 300<<20, 250<<20, 200<<20),
			linkRun("debian", cappedLink, compressed, 0, 1000*time.Millisecond, 90<<20, 250<<20, 200<<20),
			linkRun("debian", slowLink, compressed, 1, 2400*time.Millisecond, 95<<20, 260<<20, 200<<20),
			linkRun("debian", slowLink, compressed, 2, 2100*time.Millisecond, 85<<20, 240<<20, 200<<20),
		},
	}
	rows := r.Rows()
	lrs := r.LinkRows(rows)
	if len(lrs) != 3 {
		t.Fatalf("LinkRows: %d rows, want 3: %+v", len(lrs), lrs)
	}
	slow, fast, capped := lrs[0], lrs[1], lrs[2]
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
	// With a cap per connection the bound is the link floor of the shared
	// bandwidth, whatever the loopback build: 1.0 s is 1.25x 0.8 s, within
	// the 1.3x of a capped link.
	if capped.Floor != 0.8 || capped.Bound() != 0.8 || !capped.Pass() || capped.OutsideMs != 40 || capped.ReuseMs != 15 {
		t.Errorf("capped row: floor %v, bound %v, pass %v, outside %v ms, reuse %v ms; want 0.8, 0.8, true, 40, 15",
			capped.Floor, capped.Bound(), capped.Pass(), capped.OutsideMs, capped.ReuseMs)
	}

	got := map[string]bool{}
	for _, tg := range linkTargets(lrs) {
		got[tg.Name] = tg.Pass
	}
	want := map[string]bool{
		"tc-cold over 400 Mbit/s debian":                             true,
		"tc-cold over 1000 Mbit/s debian":                            false,
		"tc-cold over 1000 Mbit/s, 200 Mbit/s per connection debian": true,
		"peak RSS debian over the links":                             false, // 300 MiB at 1 Gbit/s
		"bytes written / image size debian over the links":           true,
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
		"| debian | 400 Mbit/s | 3 | 95.4 | 2.000 | 1.000 | 2.200 | 2.100 | 2.400 | 1.10 | 1.10 | 2.300 | PASS | 40.0 | 15.0 |",
		"| debian | 1000 Mbit/s | 1 | 95.4 | 0.800 | 1.000 | 1.200 | 1.200 | 1.200 | 1.50 | 1.20 | 1.150 | MISS |",
		"| debian | 1000 Mbit/s, 200 Mbit/s per connection | 1 | 95.4 | 0.800 | 1.000 | 1.000 | 1.000 | 1.000 | 1.25 | 1.25 | 1.040 | PASS |",
		"PASS  tc-cold over 1000 Mbit/s, 200 Mbit/s per connection debian",
		"MISS  tc-cold over 1000 Mbit/s debian",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("report lacks %q:\n%s", line, out.String())
		}
	}
}

func TestParseBuilderTime(t *testing.T) {
	log := `time=2026-12-04T23:03:48.443Z level=INFO msg="build started" job_id=j1 attempt=1 image=r/x:1
time=2026-12-04T23:03:49.390Z level=INFO msg="artifact published" job_id=j10 attempt=1 image=r/x:1 artifact_id=rfs-b path=/s/b.ext4 size=1 sha256=bb took=2.5s
time=2026-12-04T23:03:49.391Z level=INFO msg="artifact published" job_id=j1 attempt=1 image=r/x:1 artifact_id=rfs-a path=/s/a.ext4 size=1 sha256=aa took=903ms
time=2026-12-04T23:03:49.392Z level=INFO msg="build finished" job_id=j1 attempt=1 took=950ms
`
	for _, c := range []struct {
		job  string
		want time.Duration
		bad  bool
	}{
		{job: "j1", want: 903 * time.Millisecond},
		{job: "j10", want: 2500 * time.Millisecond},
		{job: "j2"}, // a reuse: no such line
	} {
		got, err := parseBuilderTime(log, c.job)
		if got != c.want || (err != nil) != c.bad {
			t.Errorf("parseBuilderTime(%s) = %v, %v; want %v", c.job, got, err, c.want)
		}
	}
	if _, err := parseBuilderTime(`time=x level=INFO msg="artifact published" job_id=j1 took=soon`+"\n", "j1"); err == nil {
		t.Error("a took= that is no duration: no error")
	}
}

func TestOutsideTheBuilder(t *testing.T) {
	built := func(p string, run int, wall, builder time.Duration) Measurement {
		m := measurement("debian", p, run, wall, 80<<20, 300<<20, 200<<20)
		m.Builder = builder
		return m
	}
	r := &Results{Measurements: []Measurement{
		built(PipelineCold, 0, 1000*time.Millisecond, 980*time.Millisecond),
		built(PipelineCold, 1, 1100*time.Millisecond, 1060*time.Millisecond),
		built(PipelineCold, 2, 900*time.Millisecond, 875*time.Millisecond),
		built(PipelineWarm, 0, 500*time.Millisecond, 490*time.Millisecond),
		built(PipelineReuse, 0, 15*time.Millisecond, 0),
	}}
	rows := r.outsideRows()
	if len(rows) != 2 || rows[0].pipeline != PipelineCold || rows[0].runs != 3 || rows[0].median != 25 || rows[0].max != 40 ||
		rows[1].pipeline != PipelineWarm || rows[1].median != 10 {
		t.Fatalf("outside rows = %+v; want cold (3 runs, median 25 ms, max 40 ms) and warm (10 ms), no reuse", rows)
	}
	tg := r.outsideTargets()
	if len(tg) != 1 || !tg[0].Pass || !strings.Contains(tg[0].Name, "tc-cold debian") {
		t.Errorf("targets = %+v; want the cold builds' 25 ms to pass", tg)
	}
	r.Measurements[2].Builder = 800 * time.Millisecond // 100 ms outside: median 40 ms
	if tg := r.outsideTargets(); tg[0].Pass {
		t.Errorf("a median of 40 ms outside the Builder passes: %+v", tg)
	}
	var out bytes.Buffer
	r.writeOutside(&out)
	if !strings.Contains(out.String(), "| debian | tc-cold | 3 | 980.0 | 40.0 | 100.0 |") {
		t.Errorf("outside table:\n%s", out.String())
	}
}
