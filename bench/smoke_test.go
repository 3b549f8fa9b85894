package bench

import (
	"bytes"
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/cmdbin"
)

// testLog sends the harness's progress lines to t.Log.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestMain(m *testing.M) {
	code := m.Run()
	cmdbin.Cleanup()
	os.Exit(code)
}

// TestSmoke runs the whole harness once on the tiny image: upstream's
// pipeline with the real tools, the agent binary cold, warm and reusing,
// cold through the link model, the tree comparison of both images, and the
// report, which it parses back.
// It needs root (umoci, mkfs.ext4 -d and loop mounts keep ownership) and
// installs missing Debian packages with apt-get.
func TestSmoke(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the harness needs root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	agent := cmdbin.Build{}.Path(t)
	report, err := Run(ctx, Config{WorkDir: t.TempDir(), Agent: agent, Runs: 1, Images: []string{ImageTiny},
		Verify: true, ScratchSize: 1 << 30, Log: testLog{t}, ReuseSamples: 2, ReuseLoadSamples: 2, ScaleLayerBytes: 1 << 20, ManyFiles: 3000,
		Links: []Link{{BitsPerSecond: 1_000_000_000, ConnBitsPerSecond: 200_000_000}}, LinkImages: []string{ImageTiny}})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := report.Write(&out); err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", out.String())

	rows, err := ParseTable(bytes.NewReader(out.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rows {
		got = append(got, r.Image+"/"+r.Pipeline)
		runs := 1
		if r.Pipeline == PipelineReuse {
			runs = 2
		}
		if r.Runs != runs || r.WallMedian <= 0 || (r.PeakRSSMiB <= 0) != (r.Pipeline == PipelineFloor) || r.SizeMiB <= 0 || r.AllocatedMiB <= 0 {
			t.Errorf("row %s/%s has empty figures: %+v", r.Image, r.Pipeline, r)
		}
		noRatio := r.Pipeline == PipelineUpstream || r.Pipeline == PipelineRecode || r.Pipeline == PipelineFloor
		if noRatio != (r.Ratio == 0) {
			t.Errorf("row %s/%s: ratio %v (only upstream, the floor and the re-encode have none)", r.Image, r.Pipeline, r.Ratio)
		}
		if r.SizeMiB*(1<<20) != float64(int64(r.SizeMiB*(1<<20))/(2<<20)*(2<<20)) {
			t.Errorf("row %s/%s: size %.1f MiB is not a multiple of 2 MiB", r.Image, r.Pipeline, r.SizeMiB)
		}
	}
	want := []string{"tiny/" + PipelineUpstream, "tiny/" + PipelineFloor, "tiny/" + PipelineCold, "tiny/" + PipelineWarmNow,
		"tiny/" + PipelineRecode, "tiny/" + PipelineWarm, "tiny/" + PipelineReuse}
	if !slices.Equal(got, want) {
		t.Errorf("table rows %v, want %v", got, want)
	}
	if report.Mismatch || len(report.Verified) != 1 || !strings.HasPrefix(report.Verified[0], "verified tiny:") {
		t.Errorf("tree comparison: mismatch=%v %q", report.Mismatch, report.Verified)
	}

	if n := len(report.ReuseLoad); n != 2 {
		t.Errorf("%d reuse-under-load samples, want 2", n)
	}
	for _, s := range report.ReuseLoad {
		if s.Image != ImageTiny || s.Cold <= 0 || s.Accept <= 0 || s.Reuse < s.Accept {
			t.Errorf("reuse-under-load sample with empty figures: %+v", s)
		}
	}

	// Reuse returns the warm build's artifact; a cold and a warm build of
	// different envd payloads are different images.
	byPipeline := map[string]Measurement{}
	for _, m := range report.Measurements {
		byPipeline[m.Pipeline] = m
	}
	if w, r := byPipeline[PipelineWarm], byPipeline[PipelineReuse]; w.SHA256 == "" || w.SHA256 != r.SHA256 {
		t.Errorf("reuse sha256 %q, warm %q: want the same artifact", r.SHA256, w.SHA256)
	}
	if c, w := byPipeline[PipelineCold], byPipeline[PipelineWarm]; c.SHA256 == w.SHA256 {
		t.Error("cold and warm builds produced the same image despite different envd payloads")
	}
	var steps []string
	for _, s := range byPipeline[PipelineUpstream].Steps {
		steps = append(steps, s.Name)
	}
	for _, s := range []string{"skopeo copy", "umoci unpack", "mkfs.ext4 -d", "e2fsck -fy", "resize2fs -M", "e2fsck -fn", "sha256"} {
		if !slices.Contains(steps, s) {
			t.Errorf("upstream steps %q lack %q", steps, s)
		}
	}
	// The tiny image's gzip layers were re-encoded between the cold and the
	// warm build (the writes may fall before the BUILT report, in the
	// build's measurement, now that the re-encode waits only while builds
	// use the cache).
	if r := byPipeline[PipelineRecode]; r.Transcoded < 1 {
		t.Errorf("re-encode after the cold build: %+v, want layers re-encoded", r)
	}
	if up := byPipeline[PipelineUpstream]; up.Written <= 0 {
		t.Errorf("upstream wrote %d bytes, want the sum of its steps' writes", up.Written)
	}
	if !strings.Contains(out.String(), "targets:") {
		t.Error("report has no targets section")
	}
	// The agent-only parts: the scale curve (cold and warm-now of each
	// size), the concurrent builds, the many-files image.
	if pts := report.scalePoints(); len(pts) != len(ScaleSteps) || pts[0].perGiB[PipelineCold] <= 0 || pts[len(pts)-1].perGiB[PipelineWarmNow] <= 0 {
		t.Errorf("scale points: %+v", pts)
	}
	if c := report.Concurrency; len(c) != 1 || len(c[0].Solo) != concurrencyImages || len(c[0].Together) != concurrencyImages || c[0].All <= 0 {
		t.Errorf("concurrency: %+v", c)
	}
	if m := report.ManyFiles; len(m) != 1 || m[0].Entries < 3000 || m[0].PeakRSS <= m[0].IdleRSS || m[0].IdleRSS <= 0 {
		t.Errorf("many files: %+v", m)
	}
	// The start check of an in-process build of the image, timed by its
	// span (the tiny image has no shell: the check warns).
	if c := report.StartChecks; len(c) != 1 || c[0].Image != ImageTiny || c[0].Time <= 0 || c[0].Result == "" {
		t.Errorf("start checks: %+v, want one timed check of the tiny image", c)
	}
	// The link-model build pulled the image's layers through the proxy.
	if l := report.Links; len(l) != 1 || l[0].BitsPerSecond != 1_000_000_000 || l[0].ConnBitsPerSecond != 200_000_000 ||
		l[0].Through < l[0].Compressed || l[0].Compressed <= 0 || l[0].Connections < 1 || l[0].Wall <= 0 || l[0].PeakRSS <= 0 ||
		l[0].SHA256 == "" || l[0].Builder <= 0 || l[0].Builder >= l[0].Wall || l[0].Reuse <= 0 {
		t.Errorf("link runs: %+v, want one cold build through the link of at least the image's compressed bytes, "+
			"its Builder's time within it, and a reuse", l)
	}
	// The agent's builds know their Builder's time; a reuse has none.
	for _, m := range report.Measurements {
		switch built := m.Pipeline == PipelineCold || m.Pipeline == PipelineWarmNow || m.Pipeline == PipelineWarm; {
		case built && (m.Builder <= 0 || m.Builder >= m.Wall):
			t.Errorf("%s build: Builder %v of %v in all", m.Pipeline, m.Builder, m.Wall)
		case m.Pipeline == PipelineReuse && m.Builder != 0:
			t.Errorf("reuse: Builder %v, want none", m.Builder)
		}
	}
	for _, section := range []string{"ratios", "floor:", "link model:", "tc-cold over 1000 Mbit/s, 200 Mbit/s per connection tiny", "outside the Builder", "scale curve", "concurrency:", "many files", "RSS per entry", "tc-warm-now <= tc-cold tiny", "start check in a build"} {
		if !strings.Contains(out.String(), section) {
			t.Errorf("report lacks %q", section)
		}
	}
}
