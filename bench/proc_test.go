package bench

import (
	"crypto/sha256"
	"os"
	"testing"
	"time"
)

func TestParseStatusKB(t *testing.T) {
	status := "Name:\ttemplatecenter\nVmPeak:\t 1300000 kB\nVmHWM:\t   65432 kB\nVmRSS:\t   60000 kB\n"
	got, err := parseStatusKB(status, "VmHWM")
	if err != nil || got != 65432<<10 {
		t.Errorf("parseStatusKB(VmHWM) = %d, %v; want %d", got, err, 65432<<10)
	}
	if _, err := parseStatusKB(status, "VmSwap"); err == nil {
		t.Error("parseStatusKB(VmSwap) on a status without it: no error")
	}
	if _, err := parseStatusKB("VmHWM:\t12 MB\n", "VmHWM"); err == nil {
		t.Error("parseStatusKB accepted a unit other than kB")
	}
}

func TestParseIOField(t *testing.T) {
	io := "rchar: 100\nwchar: 200\nsyscr: 3\nsyscw: 4\nread_bytes: 4096\nwrite_bytes: 217448448\ncancelled_write_bytes: 0\n"
	got, err := parseIOField(io, "write_bytes")
	if err != nil || got != 217448448 {
		t.Errorf("parseIOField(write_bytes) = %d, %v; want 217448448", got, err)
	}
	if _, err := parseIOField("rchar: x\n", "rchar"); err == nil {
		t.Error("parseIOField accepted a non-number")
	}
}

func TestParseLoadAvg(t *testing.T) {
	got, err := parseLoadAvg("2.23 2.51 3.00 4/146 15478\n")
	if err != nil || got != [3]float64{2.23, 2.51, 3.00} {
		t.Errorf("parseLoadAvg = %v, %v", got, err)
	}
	if _, err := parseLoadAvg("2.23\n"); err == nil {
		t.Error("parseLoadAvg accepted one field")
	}
}

func TestParseTimeUsage(t *testing.T) {
	for _, c := range []struct {
		in   string
		want childUsage
	}{
		{"1392 0 0.00 0.01\n", childUsage{MaxRSS: 1392 << 10, CPU: 10 * time.Millisecond}},
		{"Command exited with non-zero status 1\n27212 64 4.37 7.58\n",
			childUsage{MaxRSS: 27212 << 10, WriteBytes: 64 * 512, CPU: 11950 * time.Millisecond}},
	} {
		got, err := parseTimeUsage(c.in)
		if err != nil || got.MaxRSS != c.want.MaxRSS || got.WriteBytes != c.want.WriteBytes ||
			(got.CPU-c.want.CPU).Abs() > time.Millisecond {
			t.Errorf("parseTimeUsage(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	if _, err := parseTimeUsage("Command terminated by signal 9\n"); err == nil {
		t.Error("parseTimeUsage accepted a line without figures")
	}
}

func TestParseStatCPU(t *testing.T) {
	// The command name may hold spaces and parentheses.
	stat := "4242 (templ (a) b) S 1 4242 4242 0 -1 4194560 2600 0 0 0 250 37 0 0 20 0 9 0 12345 1300000000 16000 18446744073709551615\n"
	got, err := parseStatCPU(stat)
	if err != nil || got != 2870*time.Millisecond {
		t.Errorf("parseStatCPU = %v, %v; want 2.87s (287 ticks)", got, err)
	}
	if _, err := parseStatCPU("4242 (x) S 1 2"); err == nil {
		t.Error("parseStatCPU accepted a short line")
	}
}

// TestSampleProc reads this process's own figures.
func TestSampleProc(t *testing.T) {
	s, err := sampleProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s.PeakRSS <= 0 {
		t.Errorf("sampleProc: peak RSS %d, want > 0", s.PeakRSS)
	}
	before := s.PeakRSS
	big := make([]byte, 64<<20)
	for i := 0; i < len(big); i += 4096 {
		big[i] = 1
	}
	after, err := sampleProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after.PeakRSS < before+32<<20 {
		t.Errorf("peak RSS went from %d to %d after touching 64 MiB", before, after.PeakRSS)
	}
	big[len(big)-1] = 1 // keep it alive until here
	for start := selfCPU(); selfCPU()-start < 100*time.Millisecond; {
		sha256.Sum256(big[:1<<20])
	}
	burnt, err := sampleProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if d := burnt.CPU - after.CPU; d < 50*time.Millisecond {
		t.Errorf("CPU time grew by %v over a 100 ms busy loop", d)
	}
}

// TestUpstreamSize checks upstream's scratch size formula (section 2.8):
// data + 256 MiB + 10 % + 1 KiB per file, at least 1 GiB, rounded up to
// 256 MiB.
func TestUpstreamSize(t *testing.T) {
	for _, c := range []struct {
		data, files, want int64
	}{
		{0, 0, 1 << 30},
		{200 << 20, 7000, 1 << 30},
		// 700 MiB + 256 MiB + 70 MiB + 1000 KiB > 1 GiB: rounded to 1.25 GiB.
		{700 << 20, 1000, 1280 << 20},
		// 1000 + 256 + 100 MiB = 1356 MiB, rounded up to 1536 MiB.
		{1000 << 20, 0, 1536 << 20},
	} {
		if got := upstreamSize(c.data, c.files); got != c.want {
			t.Errorf("upstreamSize(%d, %d) = %d, want %d", c.data, c.files, got, c.want)
		}
	}
}

func TestEnvdBlob(t *testing.T) {
	a, b := envdBlob("debian", 0, "cold"), envdBlob("debian", 0, "warm")
	if string(a[:4]) != "\x7fELF" || string(b[:4]) != "\x7fELF" {
		t.Errorf("envd blobs start %q, %q; want the ELF magic", a[:4], b[:4])
	}
	if string(a) == string(b) {
		t.Error("cold and warm envd blobs are equal: the fingerprint would not change")
	}
	if string(envdBlob("debian", 0, "cold")) != string(a) {
		t.Error("envdBlob is not deterministic")
	}
}

func TestParseMetric(t *testing.T) {
	text := `# HELP cube_templatecenter_layer_cache_transcode_pending Cached layers queued.
# TYPE cube_templatecenter_layer_cache_transcode_pending gauge
cube_templatecenter_layer_cache_transcode_pending_other 7
cube_templatecenter_layer_cache_transcode_pending 2
cube_templatecenter_build_dedup_hits_total{kind="reuse"} 1
`
	if v, err := parseMetric(text, "cube_templatecenter_layer_cache_transcode_pending"); err != nil || v != 2 {
		t.Errorf("parseMetric = %v, %v; want 2", v, err)
	}
	if _, err := parseMetric(text, "cube_templatecenter_missing"); err == nil {
		t.Error("parseMetric of a missing series succeeded")
	}
	if _, err := parseMetric("x_total abc\n", "x_total"); err == nil {
		t.Error("parseMetric of a non-number succeeded")
	}
}
