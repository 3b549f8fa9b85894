package bench

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"
)

func measurement(img, pipeline string, run int, wall time.Duration, rss, written, size int64) Measurement {
	return Measurement{Image: img, Pipeline: pipeline, Run: run, Wall: wall, CPU: wall / 2, PeakRSS: rss, Written: written,
		Size: size, Allocated: size / 2, Load1: float64(run)}
}

func TestRows(t *testing.T) {
	r := &Results{Measurements: []Measurement{
		measurement("debian", PipelineUpstream, 0, 9*time.Second, 30<<20, 500<<20, 250<<20),
		measurement("debian", PipelineCold, 0, 3*time.Second, 60<<20, 300<<20, 200<<20),
		measurement("debian", PipelineUpstream, 1, 12*time.Second, 20<<20, 520<<20, 250<<20),
		measurement("debian", PipelineCold, 1, 2*time.Second, 70<<20, 280<<20, 200<<20),
		measurement("debian", PipelineUpstream, 2, 8*time.Second, 25<<20, 510<<20, 250<<20),
		measurement("debian", PipelineCold, 2, 4*time.Second, 65<<20, 290<<20, 200<<20),
		measurement("small", PipelineReuse, 0, 20*time.Millisecond, 50<<20, 1<<20, 100<<20),
	}}
	rows := r.Rows()
	if len(rows) != 3 {
		t.Fatalf("Rows: %d rows, want 3: %+v", len(rows), rows)
	}
	up, cold, reuse := rows[0], rows[1], rows[2]
	if up.Pipeline != PipelineUpstream || cold.Pipeline != PipelineCold || reuse.Image != "small" {
		t.Fatalf("Rows order: %+v", rows)
	}
	if up.WallMedian != 9 || up.WallMin != 8 || up.WallMax != 12 || up.Runs != 3 {
		t.Errorf("upstream wall median/min/max/runs = %v/%v/%v/%d, want 9/8/12/3", up.WallMedian, up.WallMin, up.WallMax, up.Runs)
	}
	if cold.Ratio != 3 {
		t.Errorf("cold ratio = %v, want 9/3", cold.Ratio)
	}
	if cold.PeakRSSMiB != 70 || cold.WrittenMiB != 290 || cold.WrittenPerSize != 1.45 || cold.SizeMiB != 200 || cold.AllocatedMiB != 100 {
		t.Errorf("cold row = %+v", cold)
	}
	if up.Ratio != 0 || reuse.Ratio != 0 {
		t.Errorf("ratios without an upstream row to compare: %v, %v; want 0", up.Ratio, reuse.Ratio)
	}
	if cold.CPUMedian != 1.5 {
		t.Errorf("cold cpu median = %v, want 1.5", cold.CPUMedian)
	}
	if cold.Load1 != 1 {
		t.Errorf("cold load1 median = %v, want 1", cold.Load1)
	}
}

func TestTableRoundTrip(t *testing.T) {
	rows := []Row{
		{Image: "debian", Pipeline: PipelineUpstream, Runs: 3, WallMedian: 12.5, WallMin: 11.25, WallMax: 16.125, CPUMedian: 13.25,
			PeakRSSMiB: 26.5, WrittenMiB: 542.5, WrittenPerSize: 2.09, SizeMiB: 260, AllocatedMiB: 239.5, Load1: 2.5},
		{Image: "debian", Pipeline: PipelineReuse, Runs: 3, WallMedian: 0.048, WallMin: 0.031, WallMax: 0.051, CPUMedian: 0.01,
			PeakRSSMiB: 66.3, WrittenMiB: 0.3, WrittenPerSize: 0, SizeMiB: 248, AllocatedMiB: 207, Ratio: 260.42, Load1: 3.53},
	}
	var buf bytes.Buffer
	buf.WriteString("some text before\n\n")
	if err := WriteTable(&buf, rows); err != nil {
		t.Fatal(err)
	}
	buf.WriteString("\ntargets:\n  PASS ...\n")
	got, err := ParseTable(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(rows) {
		t.Fatalf("ParseTable: %d rows, want %d", len(got), len(rows))
	}
	for i := range rows {
		if !rowsClose(got[i], rows[i]) {
			t.Errorf("row %d: got %+v, want %+v", i, got[i], rows[i])
		}
	}
	if _, err := ParseTable(strings.NewReader("no table here\n")); err == nil {
		t.Error("ParseTable without a table: no error")
	}
	bad := "| " + strings.Join(tableColumns[:], " | ") + " |\n|---|\n| debian | upstream | x |\n"
	if _, err := ParseTable(strings.NewReader(bad)); err == nil {
		t.Error("ParseTable accepted a short row")
	}
}

// rowsClose compares rows within the table's printed precision.
func rowsClose(a, b Row) bool {
	near := func(x, y, eps float64) bool { return math.Abs(x-y) <= eps }
	return a.Image == b.Image && a.Pipeline == b.Pipeline && a.Runs == b.Runs &&
		near(a.WallMedian, b.WallMedian, 5e-4) && near(a.WallMin, b.WallMin, 5e-4) && near(a.WallMax, b.WallMax, 5e-4) && near(a.CPUMedian, b.CPUMedian, 0.005) &&
		near(a.PeakRSSMiB, b.PeakRSSMiB, 0.05) && near(a.WrittenMiB, b.WrittenMiB, 0.05) &&
		near(a.WrittenPerSize, b.WrittenPerSize, 0.005) && near(a.SizeMiB, b.SizeMiB, 0.05) &&
		near(a.AllocatedMiB, b.AllocatedMiB, 0.05) && near(a.Ratio, b.Ratio, 0.005) && near(a.Load1, b.Load1, 0.005)
}

func TestTargets(t *testing.T) {
	rows := []Row{
		{Image: ImageDebian, Pipeline: PipelineUpstream, WallMedian: 10, SizeMiB: 260, AllocatedMiB: 240},
		{Image: ImageDebian, Pipeline: PipelineFloor, WallMedian: 0.5},
		{Image: ImageDebian, Pipeline: PipelineCold, WallMedian: 1.0, Ratio: 10, PeakRSSMiB: 60, WrittenPerSize: 1.2, SizeMiB: 248, AllocatedMiB: 207},
		{Image: ImageDebian, Pipeline: PipelineWarmNow, WallMedian: 1.0, Ratio: 10, PeakRSSMiB: 60},
		{Image: ImageDebian, Pipeline: PipelineWarm, WallMedian: 2, Ratio: 5, PeakRSSMiB: 64, WrittenPerSize: 0.8, SizeMiB: 248, AllocatedMiB: 207},
		{Image: ImageDebian, Pipeline: PipelineReuse, WallMedian: 0.03, WallMax: 0.06, Ratio: 200, PeakRSSMiB: 64, SizeMiB: 248},
		{Image: ImageLarge, Pipeline: PipelineUpstream, WallMedian: 20, SizeMiB: 500, AllocatedMiB: 450},
		{Image: ImageLarge, Pipeline: PipelineFloor, WallMedian: 1.5},
		{Image: ImageLarge, Pipeline: PipelineCold, WallMedian: 4, Ratio: 3.9, PeakRSSMiB: 300, WrittenPerSize: 1.4, SizeMiB: 520, AllocatedMiB: 440},
		{Image: ImageSmall, Pipeline: PipelineCold, WallMedian: 0.5, Ratio: 3, PeakRSSMiB: 50},
	}
	got := map[string]bool{}
	for _, tg := range Targets(rows) {
		got[tg.Name] = tg.Pass
	}
	want := map[string]bool{
		"tc-cold speed-up debian":                   true,
		"tc-warm-now speed-up debian":               true,
		"tc-warm speed-up debian":                   false, // 5x < 12x
		"tc-cold / floor debian":                    false, // 2.0
		"reuse BUILT latency debian":                false, // max 60 ms
		"peak RSS debian":                           true,
		"bytes written / image size debian tc-cold": true,
		"bytes written / image size debian tc-warm": true,
		"image size vs upstream debian":             true,
		"tc-cold speed-up large":                    false,
		"tc-cold / floor large":                     false, // 2.67
		"peak RSS large":                            false,
		"bytes written / image size large tc-cold":  false,
		"peak RSS growth large/debian (cold)":       false, // 300/60
	}
	for name, pass := range want {
		if g, ok := got[name]; !ok || g != pass {
			t.Errorf("target %q: pass=%v present=%v, want pass=%v", name, g, ok, pass)
		}
	}
	for _, name := range []string{"image size vs upstream large", "tc-cold speed-up small", "tc-warm-now speed-up large"} {
		if _, ok := got[name]; ok {
			t.Errorf("target %q without the rows it needs (or not required)", name)
		}
	}
}

func TestReportTargets(t *testing.T) {
	r := &Results{Measurements: []Measurement{
		measurement("debian", PipelineCold, 0, 1000*time.Millisecond, 60<<20, 1, 1),
		measurement("debian", PipelineWarmNow, 0, 900*time.Millisecond, 60<<20, 1, 1),
		measurement("debian", PipelineCold, 1, 1000*time.Millisecond, 60<<20, 1, 1),
		measurement("debian", PipelineWarmNow, 1, 1100*time.Millisecond, 60<<20, 1, 1),
		measurement("small", PipelineCold, 0, 500*time.Millisecond, 60<<20, 1, 1),
		measurement("small", PipelineWarmNow, 0, 400*time.Millisecond, 60<<20, 1, 1),
	}}
	scale := func(content int64, cold, now time.Duration, rss int64) {
		for _, m := range []Measurement{measurement("s", PipelineCold, 0, cold, rss, 1, 1), measurement("s", PipelineWarmNow, 0, now, rss, 1, 1)} {
			m.Image, m.Content = scaleImageName(content), content
			r.Scale = append(r.Scale, m)
		}
	}
	scale(1<<30, 2*time.Second, time.Second, 80<<20)
	scale(256<<20, 500*time.Millisecond, 300*time.Millisecond, 70<<20) // warm-now 1.2 s/GiB: +9 % of the mean 1.1
	scale(2<<30, 4400*time.Millisecond, 2*time.Second, 85<<20)         // cold 2.2 s/GiB
	r.Concurrency = []ConcurrencyRun{{Images: []string{"a", "b", "c", "d"}, Solo: []time.Duration{time.Second, time.Second, time.Second, time.Second},
		All: 3 * time.Second}}
	r.ManyFiles = []ManyFilesRun{{Entries: 1_000_000, PeakRSS: 400 << 20, IdleRSS: 20 << 20}}
	got := map[string]Target{}
	for _, tg := range r.Targets() {
		got[tg.Name] = tg
	}
	for name, pass := range map[string]bool{
		"tc-warm-now <= tc-cold debian":          false, // run 1: 1.1 s against 1.0 s
		"tc-warm-now <= tc-cold small":           true,
		"scale: s/GiB tc-cold":                   true, // 2.0, 2.0, 2.2 around 2.067: at most +6 %
		"scale: s/GiB tc-warm-now":               true, // 1.2, 1.0, 1.0 around 1.067: at most +12.5 %
		"scale: peak RSS scale-2048m/scale-256m": true,
		"4 images together / sum of solo":        false, // 0.75
		"RSS per entry, 1000000 entries":         true,  // 398 B
	} {
		if tg, ok := got[name]; !ok || tg.Pass != pass {
			t.Errorf("target %q = %+v (present %v), want pass=%v", name, tg, ok, pass)
		}
	}
	if g := got["tc-warm-now <= tc-cold debian"].Got; !strings.Contains(g, "1 of 2 runs slower") {
		t.Errorf("warm-now target says %q", g)
	}
}

func TestDiffTrees(t *testing.T) {
	a := map[string]treeEntryInfo{".": {Type: 1}, "etc": {Type: 1}, "etc/x": {Type: 2, SHA256: "aa"}, "only-a": {}}
	b := map[string]treeEntryInfo{".": {Type: 1}, "etc": {Type: 1}, "etc/x": {Type: 2, SHA256: "bb"}, "only-b": {}}
	d := diffTrees(a, b, 10)
	if len(d) != 3 || !strings.HasPrefix(d[0], "etc/x:") || d[1] != "only in the first: only-a" || d[2] != "only in the second: only-b" {
		t.Errorf("diffTrees = %q", d)
	}
	if d := diffTrees(a, a, 10); len(d) != 0 {
		t.Errorf("diffTrees of a tree with itself = %q", d)
	}
	if d := diffTrees(a, b, 2); len(d) != 3 || d[2] != "..." {
		t.Errorf("diffTrees limited to 2 = %q", d)
	}
}

func TestFirstBuildSumsColdAndRecode(t *testing.T) {
	cold := measurement("large", PipelineCold, 0, 3*time.Second, 60<<20, 650<<20, 500<<20)
	cold.Cancelled = 0
	recode := measurement("large", PipelineRecode, 0, 7*time.Second, 80<<20, 180<<20, 500<<20)
	recode.Cancelled = 195 << 20
	warm := measurement("large", PipelineWarm, 0, 2*time.Second, 80<<20, 460<<20, 500<<20)
	up := measurement("large", PipelineUpstream, 0, 14*time.Second, 25<<20, 1200<<20, 768<<20)
	r := &Results{Measurements: []Measurement{up, cold, recode, warm}}
	var out bytes.Buffer
	r.writeFirstBuild(&out)
	want := "| large | 830.0 | 195.0 | 635.0 | 1.66 | 1.27 |"
	if !strings.Contains(out.String(), want) {
		t.Errorf("first-build table:\n%s\nwant a row %q", out.String(), want)
	}
	// The re-encode row has no upstream ratio.
	for _, row := range r.Rows() {
		if (row.Pipeline == PipelineRecode) != (row.Ratio == 0) && row.Pipeline != PipelineUpstream {
			t.Errorf("row %s: ratio %v; only the re-encode has none", row.Pipeline, row.Ratio)
		}
	}
}

// TestStartCheckReport prints the start check's row per image and checks
// the Debian image's against its target by the slowest run.
func TestStartCheckReport(t *testing.T) {
	r := &Results{StartChecks: []StartCheckRun{
		{Image: "debian", Run: 0, Time: 3 * time.Millisecond, Result: "warnings", Libraries: 2},
		{Image: "debian", Run: 1, Time: 5 * time.Millisecond, Result: "warnings", Libraries: 2},
		{Image: "debian", Run: 2, Time: 4 * time.Millisecond, Result: "warnings", Libraries: 2},
		{Image: "small", Run: 0, Time: 30 * time.Millisecond, Result: "warnings"},
	}}
	var b strings.Builder
	r.writeStartChecks(&b)
	if !strings.Contains(b.String(), "| debian | 4.00 | 5.00 | warnings | 2 |") || !strings.Contains(b.String(), "| small | 30.00 | 30.00 |") {
		t.Errorf("start check table:\n%s", b.String())
	}
	tg := r.startCheckTargets()
	if len(tg) != 1 || !tg[0].Pass || !strings.Contains(tg[0].Got, "max 5.00 ms") {
		t.Errorf("start check targets = %+v, want the Debian image's, passing", tg)
	}
	r.StartChecks[1].Time = 25 * time.Millisecond
	if tg := r.startCheckTargets(); tg[0].Pass {
		t.Errorf("a 25 ms run passes the %v target: %+v", targetStartCheck, tg)
	}
}
