package bench

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Pipelines measured for every image.
const (
	// PipelineUpstream is upstream's dockerless pipeline.
	PipelineUpstream = "upstream"
	// PipelineFloor is what the hardware allows: the fastest single-core
	// inflate of every layer as served plus writing the agent's image's
	// allocated bytes with an fsync on the builds' filesystem. It is not
	// a build; its size columns repeat the cold build's image.
	PipelineFloor = "floor"
	// PipelineCold is the agent with an empty layer cache.
	PipelineCold = "tc-cold"
	// PipelineWarmNow is the agent's second build of the image (a new
	// envd), submitted the moment the cold build's BUILT report arrives,
	// while the agent's background work is still to do.
	PipelineWarmNow = "tc-warm-now"
	// PipelineRecode is the agent's background work after the first
	// builds: re-encoding the cached gzip layers as zstd, from the
	// warm-now build's BUILT report until the layer cache is idle. It is
	// not a build (no upstream/TC ratio); its size columns repeat the
	// cold build's image.
	PipelineRecode = "tc-recode"
	// PipelineWarm is the agent with the layers cached (and re-encoded)
	// and the cache idle, a new envd.
	PipelineWarm = "tc-warm"
	// PipelineReuse is the agent asked for a spec it already published;
	// several samples per run.
	PipelineReuse = "tc-reuse"
)

// pipelines in table order.
var pipelines = [...]string{PipelineUpstream, PipelineFloor, PipelineCold, PipelineWarmNow, PipelineRecode, PipelineWarm, PipelineReuse}

// Measurement is one timed build.
type Measurement struct {
	Image    string `json:"image"`
	Pipeline string `json:"pipeline"`
	Run      int    `json:"run"`
	// Wall is submission to BUILT report for the agent, first to last step
	// for upstream.
	Wall time.Duration `json:"wall_ns"`
	// PeakRSS is the agent's VmHWM during the build, or for upstream the
	// largest ru_maxrss of its steps (they run one after another).
	PeakRSS int64 `json:"peak_rss_bytes"`
	// Written is write_bytes of the agent during the build, or the sum of
	// the steps' ru_oublock × 512 for upstream.
	Written int64 `json:"written_bytes"`
	// Cancelled is the agent's cancelled_write_bytes over the same span:
	// written bytes deleted before writeback (0 for upstream, unmeasured).
	Cancelled int64 `json:"cancelled_write_bytes,omitempty"`
	// CPU is the user plus system time of the agent during the build, or
	// the sum over upstream's steps.
	CPU time.Duration `json:"cpu_ns"`
	// Builder is, for the agent, its Builder's own time in the build (0
	// for a reuse): Wall less it is the time outside the Builder.
	Builder time.Duration `json:"builder_ns,omitempty"`
	// Size and Allocated are the output file's apparent and allocated
	// bytes.
	Size      int64   `json:"size_bytes"`
	Allocated int64   `json:"allocated_bytes"`
	SHA256    string  `json:"sha256"`
	Load1     float64 `json:"load1"`
	Steps     []Step  `json:"steps,omitempty"`
	// Transcoded is, for tc-recode, how many layers the agent's cache
	// had re-encoded once idle (some may finish before the BUILT report
	// arrives, their writes then counted in the build's).
	Transcoded int `json:"transcoded,omitempty"`
	// Inflate and WriteTime are the floor's two parts; Inflaters names
	// the fastest inflater of each layer.
	Inflate   time.Duration `json:"inflate_ns,omitempty"`
	WriteTime time.Duration `json:"write_ns,omitempty"`
	Inflaters []string      `json:"inflaters,omitempty"`
	// Content is the image's uncompressed layer bytes (scale curve).
	Content int64 `json:"content_bytes,omitempty"`
	// path is the output image, while the iteration keeps it.
	path string
}

// Outside is the agent's time in a build outside its Builder: accepting
// the job, resolving the image, the reuse checks, recording the artifact,
// reporting, and every wait between them; 0 when the build did not run
// the Builder.
func (m Measurement) Outside() time.Duration {
	if m.Builder <= 0 {
		return 0
	}
	return m.Wall - m.Builder
}

// ImageInfo describes a generated image.
type ImageInfo struct {
	Name         string `json:"name"`
	Ref          string `json:"ref"`
	Layers       int    `json:"layers"`
	Compressed   int64  `json:"compressed_bytes"`
	Uncompressed int64  `json:"uncompressed_bytes"`
	Entries      int    `json:"entries"`
}

// Results is the outcome of Run.
type Results struct {
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Host     string    `json:"host"`
	// Filesystem describes where the builds ran.
	Filesystem   string        `json:"filesystem"`
	Runs         int           `json:"runs"`
	LoadStart    [3]float64    `json:"load_start"`
	LoadEnd      [3]float64    `json:"load_end"`
	Images       []ImageInfo   `json:"images"`
	Measurements []Measurement `json:"measurements"`
	// Verified holds one line per image comparing upstream's and the
	// agent's image trees.
	Verified []string `json:"verified,omitempty"`
	// Mismatch is set when an image's trees differed.
	Mismatch bool `json:"mismatch,omitempty"`
	// Replicas holds the two-replica rows, when measured.
	Replicas *ReplicaResult `json:"replicas,omitempty"`
	// Scale holds the agent's builds of the scale images (cold and
	// warm-now), Concurrency the runs of four images at once, ManyFiles
	// the builds of the many-files image.
	Scale       []Measurement    `json:"scale,omitempty"`
	Concurrency []ConcurrencyRun `json:"concurrency,omitempty"`
	ManyFiles   []ManyFilesRun   `json:"many_files,omitempty"`
	// Links holds the agent's cold builds through the link model.
	Links []LinkRun `json:"links,omitempty"`
	// ReuseLoad holds the reuses submitted as a cold build's BUILT
	// arrived.
	ReuseLoad []ReuseLoadSample `json:"reuse_load,omitempty"`
	// StartChecks holds the start check of in-process builds of each
	// image.
	StartChecks []StartCheckRun `json:"start_checks,omitempty"`
}

// ConcurrencyRun is one run of distinct images built alone, one after
// the other, then submitted together to one agent.
type ConcurrencyRun struct {
	Run    int      `json:"run"`
	Images []string `json:"images"`
	// Solo are the cold builds alone (each on a fresh agent), Together
	// each build's wall time when all were submitted at once (a fresh
	// agent), All from the first submission to the last BUILT.
	Solo     []time.Duration `json:"solo_ns"`
	Together []time.Duration `json:"together_ns"`
	All      time.Duration   `json:"all_ns"`
	PeakRSS  int64           `json:"peak_rss_bytes"`
	Load1    float64         `json:"load1"`
}

// SoloSum is the sum of the solo builds' wall times.
func (c ConcurrencyRun) SoloSum() time.Duration {
	var d time.Duration
	for _, s := range c.Solo {
		d += s
	}
	return d
}

// ManyFilesRun is a cold build of the many-files image.
type ManyFilesRun struct {
	Entries int           `json:"entries"`
	Wall    time.Duration `json:"wall_ns"`
	CPU     time.Duration `json:"cpu_ns"`
	// PeakRSS is VmHWM over the build, IdleRSS VmRSS of the idle agent
	// just before it.
	PeakRSS int64   `json:"peak_rss_bytes"`
	IdleRSS int64   `json:"idle_rss_bytes"`
	Size    int64   `json:"size_bytes"`
	Load1   float64 `json:"load1"`
}

// BytesPerEntry is the resident memory the build added per tar entry.
func (m ManyFilesRun) BytesPerEntry() float64 {
	if m.Entries == 0 {
		return 0
	}
	return float64(m.PeakRSS-m.IdleRSS) / float64(m.Entries)
}

// Row summarizes the runs of one pipeline on one image.
type Row struct {
	Image    string
	Pipeline string
	Runs     int
	// Wall times in seconds: median, minimum and maximum.
	WallMedian, WallMin, WallMax float64
	// CPUMedian is the median CPU time (user plus system) in seconds.
	CPUMedian float64
	// PeakRSSMiB is the largest peak over the runs.
	PeakRSSMiB float64
	// WrittenMiB is the median of bytes written; WrittenPerSize the median
	// of written / apparent output size.
	WrittenMiB     float64
	WrittenPerSize float64
	// SizeMiB and AllocatedMiB are the output's apparent and allocated
	// size (median).
	SizeMiB      float64
	AllocatedMiB float64
	// Ratio is upstream's median wall time over this row's (0 for
	// upstream itself).
	Ratio float64
	// Load1 is the median one-minute load average at the runs' starts.
	Load1 float64
}

// Rows summarizes the measurements per image and pipeline, images in the
// order they were measured.
func (r *Results) Rows() []Row {
	order, byImage := byImage(r.Measurements)
	var rows []Row
	for _, img := range order {
		groups := map[string][]Measurement{}
		for _, m := range byImage[img] {
			groups[m.Pipeline] = append(groups[m.Pipeline], m)
		}
		upstream := 0.0
		for _, p := range pipelines {
			ms := groups[p]
			if len(ms) == 0 {
				continue
			}
			row := summarize(img, p, ms)
			if p == PipelineUpstream {
				upstream = row.WallMedian
			} else if p != PipelineRecode && p != PipelineFloor && upstream > 0 && row.WallMedian > 0 {
				row.Ratio = upstream / row.WallMedian
			}
			rows = append(rows, row)
		}
	}
	return rows
}

func summarize(img, pipeline string, ms []Measurement) Row {
	row := Row{Image: img, Pipeline: pipeline, Runs: len(ms)}
	var walls, cpu, written, per, size, alloc, load []float64
	for _, m := range ms {
		walls = append(walls, m.Wall.Seconds())
		cpu = append(cpu, m.CPU.Seconds())
		written = append(written, mib(m.Written))
		if m.Size > 0 {
			per = append(per, float64(m.Written)/float64(m.Size))
		}
		size = append(size, mib(m.Size))
		alloc = append(alloc, mib(m.Allocated))
		load = append(load, m.Load1)
		row.PeakRSSMiB = max(row.PeakRSSMiB, mib(m.PeakRSS))
	}
	row.WallMedian = median(walls)
	row.WallMin, row.WallMax = slices.Min(walls), slices.Max(walls)
	row.CPUMedian = median(cpu)
	row.WrittenMiB = median(written)
	row.WrittenPerSize = median(per)
	row.SizeMiB, row.AllocatedMiB = median(size), median(alloc)
	row.Load1 = median(load)
	return row
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// tableColumns is the header of the results table; units are in the
// names so cells are plain numbers.
var tableColumns = [...]string{"image", "pipeline", "runs", "wall median s", "wall min s", "wall max s",
	"cpu s", "peak RSS MiB", "written MiB", "written/size", "size MiB", "allocated MiB", "upstream/TC", "load1"}

// WriteTable writes rows as a Markdown table (ParseTable reads it back).
func WriteTable(w io.Writer, rows []Row) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "| %s |\n", strings.Join(tableColumns[:], " | "))
	seps := make([]string, len(tableColumns))
	for i := range seps {
		seps[i] = "---"
		if i >= 2 {
			seps[i] = "---:"
		}
	}
	fmt.Fprintf(bw, "|%s|\n", strings.Join(seps, "|"))
	for _, r := range rows {
		ratio := "-"
		if r.Ratio > 0 {
			ratio = fmt.Sprintf("%.2f", r.Ratio)
		}
		fmt.Fprintf(bw, "| %s | %s | %d | %.3f | %.3f | %.3f | %.2f | %.1f | %.1f | %.2f | %.1f | %.1f | %s | %.2f |\n",
			r.Image, r.Pipeline, r.Runs, r.WallMedian, r.WallMin, r.WallMax, r.CPUMedian, r.PeakRSSMiB, r.WrittenMiB,
			r.WrittenPerSize, r.SizeMiB, r.AllocatedMiB, ratio, r.Load1)
	}
	return bw.Flush()
}

// ParseTable reads the first results table WriteTable wrote from r,
// skipping any text around it.
func ParseTable(r io.Reader) ([]Row, error) {
	sc := bufio.NewScanner(r)
	header := "| " + strings.Join(tableColumns[:], " | ") + " |"
	inTable := false
	var rows []Row
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !inTable {
			if line == header {
				inTable = true
				if !sc.Scan() || !strings.HasPrefix(sc.Text(), "|---") {
					return nil, errors.New("parse table: no separator line after the header")
				}
			}
			continue
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		row, err := parseRow(line)
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("parse table: %w", err)
	}
	if !inTable {
		return nil, errors.New("parse table: no results table found")
	}
	return rows, nil
}

func parseRow(line string) (Row, error) {
	cells := strings.Split(strings.Trim(line, "|"), "|")
	if len(cells) != len(tableColumns) {
		return Row{}, fmt.Errorf("parse table: %d cells, want %d: %q", len(cells), len(tableColumns), line)
	}
	for i := range cells {
		cells[i] = strings.TrimSpace(cells[i])
	}
	row := Row{Image: cells[0], Pipeline: cells[1]}
	runs, err := strconv.Atoi(cells[2])
	if err != nil {
		return Row{}, fmt.Errorf("parse table: runs %q: %w", cells[2], err)
	}
	row.Runs = runs
	nums := []*float64{&row.WallMedian, &row.WallMin, &row.WallMax, &row.CPUMedian, &row.PeakRSSMiB, &row.WrittenMiB,
		&row.WrittenPerSize, &row.SizeMiB, &row.AllocatedMiB, &row.Ratio, &row.Load1}
	for i, dst := range nums {
		c := cells[3+i]
		if c == "-" {
			continue
		}
		v, err := strconv.ParseFloat(c, 64)
		if err != nil {
			return Row{}, fmt.Errorf("parse table: %s %q: %w", tableColumns[3+i], c, err)
		}
		*dst = v
	}
	return row, nil
}

// Target is one of the project's performance goals checked against a run.
type Target struct {
	Name string
	Want string
	Got  string
	Pass bool
}

// Target thresholds.
const (
	targetColdRatio    = 8
	targetWarmRatio    = 12
	targetWarmNowRatio = 8
	targetFloorRatio   = 1.6
	targetReuseSecs    = 0.05
	targetOutsideMs    = 30 // a cold build's time outside the Builder
	targetRSSMiB       = 256
	targetRSSGrowth    = 1.25 // larger image's peak over the smaller one's
	targetWrittenPer   = 1.3
	targetScaleSpread  = 0.15 // seconds per GiB, each point against the mean
	targetConcurrency  = 0.65 // together over the sum of solo builds
	targetBytesPerFile = 400
)

// Targets checks the rows against the performance targets the rows can
// tell. Targets whose images were not measured are left out.
func Targets(rows []Row) []Target {
	get := func(img, p string) (Row, bool) {
		for _, r := range rows {
			if r.Image == img && r.Pipeline == p {
				return r, true
			}
		}
		return Row{}, false
	}
	var images []string
	for _, r := range rows {
		if !slices.Contains(images, r.Image) {
			images = append(images, r.Image)
		}
	}
	var out []Target
	speedup := func(img, p string, want float64) {
		if r, ok := get(img, p); ok && r.Ratio > 0 {
			out = append(out, Target{Name: p + " speed-up " + img, Want: fmt.Sprintf(">= %gx upstream", want),
				Got: fmt.Sprintf("%.2fx", r.Ratio), Pass: r.Ratio >= want})
		}
	}
	for _, img := range images {
		required := img == ImageDebian || img == ImageLarge
		if required {
			speedup(img, PipelineCold, targetColdRatio)
			speedup(img, PipelineWarm, targetWarmRatio)
			speedup(img, PipelineWarmNow, targetWarmNowRatio)
		}
		fl, okF := get(img, PipelineFloor)
		cold, okC := get(img, PipelineCold)
		if okF && okC && fl.WallMedian > 0 {
			q := cold.WallMedian / fl.WallMedian
			out = append(out, Target{Name: "tc-cold / floor " + img, Want: fmt.Sprintf("<= %.1f", targetFloorRatio),
				Got: fmt.Sprintf("%.2f (%.3f s vs %.3f s)", q, cold.WallMedian, fl.WallMedian), Pass: q <= targetFloorRatio})
		}
		if r, ok := get(img, PipelineReuse); ok {
			out = append(out, Target{Name: "reuse BUILT latency " + img, Want: fmt.Sprintf("< %.0f ms (max of samples)", targetReuseSecs*1000),
				Got: fmt.Sprintf("median %.1f ms, max %.1f ms", r.WallMedian*1000, r.WallMax*1000), Pass: r.WallMax < targetReuseSecs})
		}
		peak := 0.0
		for _, p := range []string{PipelineCold, PipelineWarmNow, PipelineRecode, PipelineWarm, PipelineReuse} {
			if r, ok := get(img, p); ok {
				peak = max(peak, r.PeakRSSMiB)
			}
		}
		if peak > 0 {
			out = append(out, Target{Name: "peak RSS " + img, Want: fmt.Sprintf("< %d MiB", targetRSSMiB),
				Got: fmt.Sprintf("%.1f MiB", peak), Pass: peak < targetRSSMiB})
		}
		for _, p := range []string{PipelineCold, PipelineWarm} {
			if r, ok := get(img, p); ok && r.SizeMiB > 0 {
				out = append(out, Target{Name: "bytes written / image size " + img + " " + p, Want: fmt.Sprintf("<= %.1f", targetWrittenPer),
					Got: fmt.Sprintf("%.2f", r.WrittenPerSize), Pass: r.WrittenPerSize <= targetWrittenPer})
			}
		}
		u, ok1 := get(img, PipelineUpstream)
		w, ok2 := get(img, PipelineWarm)
		if ok1 && ok2 {
			out = append(out, Target{Name: "image size vs upstream " + img, Want: "<= upstream (apparent and allocated)",
				Got:  fmt.Sprintf("%.1f / %.1f MiB vs %.1f / %.1f MiB", w.SizeMiB, w.AllocatedMiB, u.SizeMiB, u.AllocatedMiB),
				Pass: w.SizeMiB <= u.SizeMiB && w.AllocatedMiB <= u.AllocatedMiB})
		}
	}
	deb, ok1 := get(ImageDebian, PipelineCold)
	large, ok2 := get(ImageLarge, PipelineCold)
	if ok1 && ok2 && deb.PeakRSSMiB > 0 {
		g := large.PeakRSSMiB / deb.PeakRSSMiB
		out = append(out, Target{Name: "peak RSS growth large/debian (cold)", Want: fmt.Sprintf("<= %.2f", targetRSSGrowth),
			Got: fmt.Sprintf("%.2f (%.1f vs %.1f MiB)", g, large.PeakRSSMiB, deb.PeakRSSMiB), Pass: g <= targetRSSGrowth})
	}
	return out
}

// Targets checks the whole report: the rows' targets, then those of the
// runs themselves (warm-now against cold per run), the start check, the
// scale curve, the concurrent builds and the many-files image.
func (r *Results) Targets() []Target {
	rows := r.Rows()
	out := Targets(rows)
	out = append(out, linkTargets(r.LinkRows(rows))...)
	out = append(out, r.outsideTargets()...)
	out = append(out, r.startCheckTargets()...)
	// warm-now never slower than the cold build of the same run.
	type key struct {
		img string
		run int
	}
	cold := map[key]time.Duration{}
	var order []string
	for _, m := range r.Measurements {
		if m.Pipeline == PipelineCold {
			cold[key{m.Image, m.Run}] = m.Wall
			if !slices.Contains(order, m.Image) {
				order = append(order, m.Image)
			}
		}
	}
	for _, img := range order {
		runs, slower, worst := 0, 0, 0.0
		for _, m := range r.Measurements {
			c, ok := cold[key{m.Image, m.Run}]
			if m.Image != img || m.Pipeline != PipelineWarmNow || !ok || c <= 0 {
				continue
			}
			runs++
			q := m.Wall.Seconds() / c.Seconds()
			worst = max(worst, q)
			if q > 1 {
				slower++
			}
		}
		if runs > 0 {
			out = append(out, Target{Name: "tc-warm-now <= tc-cold " + img, Want: "in every run",
				Got: fmt.Sprintf("%d of %d runs slower; worst warm-now/cold %.2f", slower, runs, worst), Pass: slower == 0})
		}
	}
	if pts := r.scalePoints(); len(pts) >= 2 {
		for _, p := range []string{PipelineCold, PipelineWarmNow} {
			var per []float64
			for _, pt := range pts {
				if v := pt.perGiB[p]; v > 0 {
					per = append(per, v)
				}
			}
			if len(per) < 2 {
				continue
			}
			mean := 0.0
			for _, v := range per {
				mean += v
			}
			mean /= float64(len(per))
			spread := 0.0
			for _, v := range per {
				spread = max(spread, math.Abs(v/mean-1))
			}
			out = append(out, Target{Name: "scale: s/GiB " + p, Want: fmt.Sprintf("each within ±%.0f %% of the mean", targetScaleSpread*100),
				Got: fmt.Sprintf("%s s/GiB (worst %+.0f %%)", joinFloats(per, "%.2f"), spread*100), Pass: spread <= targetScaleSpread})
		}
		small, big := pts[0], pts[len(pts)-1]
		if small.peakMiB > 0 {
			g := big.peakMiB / small.peakMiB
			out = append(out, Target{Name: "scale: peak RSS " + big.name + "/" + small.name, Want: fmt.Sprintf("<= %.2f and < %d MiB", targetRSSGrowth, targetRSSMiB),
				Got:  fmt.Sprintf("%.2f (%.1f vs %.1f MiB)", g, big.peakMiB, small.peakMiB),
				Pass: g <= targetRSSGrowth && big.peakMiB < targetRSSMiB})
		}
	}
	if len(r.Concurrency) > 0 {
		var q []float64
		for _, c := range r.Concurrency {
			if s := c.SoloSum(); s > 0 {
				q = append(q, c.All.Seconds()/s.Seconds())
			}
		}
		if len(q) > 0 {
			m := median(q)
			out = append(out, Target{Name: fmt.Sprintf("%d images together / sum of solo", len(r.Concurrency[0].Images)),
				Want: fmt.Sprintf("<= %.2f", targetConcurrency), Got: fmt.Sprintf("median %.2f (runs: %s)", m, joinFloats(q, "%.2f")),
				Pass: m <= targetConcurrency})
		}
	}
	for _, mf := range r.ManyFiles {
		b := mf.BytesPerEntry()
		out = append(out, Target{Name: fmt.Sprintf("RSS per entry, %d entries", mf.Entries), Want: fmt.Sprintf("<= %d B", targetBytesPerFile),
			Got:  fmt.Sprintf("%.0f B (peak %.1f MiB, idle %.1f MiB)", b, mib(mf.PeakRSS), mib(mf.IdleRSS)),
			Pass: b <= targetBytesPerFile})
	}
	return append(out, r.reuseLoadTargets()...)
}

func joinFloats(v []float64, format string) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf(format, x)
	}
	return strings.Join(s, ", ")
}

// scalePoint summarizes the scale image of one size.
type scalePoint struct {
	name    string
	content int64
	runs    int
	wall    map[string]float64 // median wall per pipeline
	perGiB  map[string]float64 // median s per GiB of content
	peakMiB float64
}

// byImage groups measurements by image, images in the order first
// measured.
func byImage(ms []Measurement) (order []string, by map[string][]Measurement) {
	by = map[string][]Measurement{}
	for _, m := range ms {
		if _, ok := by[m.Image]; !ok {
			order = append(order, m.Image)
		}
		by[m.Image] = append(by[m.Image], m)
	}
	return order, by
}

// scalePoints summarizes r.Scale per image, smallest first.
func (r *Results) scalePoints() []scalePoint {
	order, by := byImage(r.Scale)
	var pts []scalePoint
	for _, img := range order {
		ms := by[img]
		pt := scalePoint{name: img, content: ms[0].Content, wall: map[string]float64{}, perGiB: map[string]float64{}}
		walls := map[string][]float64{}
		for _, m := range ms {
			walls[m.Pipeline] = append(walls[m.Pipeline], m.Wall.Seconds())
			pt.peakMiB = max(pt.peakMiB, mib(m.PeakRSS))
			if m.Pipeline == PipelineCold {
				pt.runs++
			}
		}
		for p, w := range walls {
			pt.wall[p] = median(w)
			if pt.content > 0 {
				pt.perGiB[p] = pt.wall[p] / (float64(pt.content) / (1 << 30))
			}
		}
		pts = append(pts, pt)
	}
	slices.SortFunc(pts, func(a, b scalePoint) int { return cmp.Compare(a.content, b.content) })
	return pts
}

// writeSteps prints upstream's steps per image: median wall and CPU
// time, largest RSS and median bytes written of each step.
func (r *Results) writeSteps(w io.Writer) {
	type key struct{ img, step string }
	var order []key
	walls, cpu, written := map[key][]float64{}, map[key][]float64{}, map[key][]float64{}
	rss := map[key]float64{}
	for _, m := range r.Measurements {
		if m.Pipeline != PipelineUpstream {
			continue
		}
		for _, s := range m.Steps {
			k := key{m.Image, s.Name}
			if _, ok := walls[k]; !ok {
				order = append(order, k)
			}
			walls[k] = append(walls[k], s.Wall.Seconds())
			cpu[k] = append(cpu[k], s.CPU.Seconds())
			written[k] = append(written[k], mib(s.Written))
			rss[k] = max(rss[k], mib(s.PeakRSS))
		}
	}
	if len(order) == 0 {
		return
	}
	fmt.Fprintln(w, "| image | upstream step | wall median s | cpu s | peak RSS MiB | written MiB |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|")
	for _, k := range order {
		fmt.Fprintf(w, "| %s | %s | %.3f | %.2f | %.1f | %.1f |\n", k.img, k.step, median(walls[k]), median(cpu[k]), rss[k], median(written[k]))
	}
}

// Write prints the whole report: context, the results table, upstream's
// step breakdown, the content check and the targets.
func (r *Results) Write(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "tcbench %s, %d run(s) per pipeline and image, %s\n", r.Started.UTC().Format(time.RFC3339), r.Runs, r.Finished.Sub(r.Started).Round(time.Second))
	fmt.Fprintf(bw, "host: %s\n", r.Host)
	fmt.Fprintf(bw, "builds in: %s\n", r.Filesystem)
	fmt.Fprintf(bw, "load average: start %.2f %.2f %.2f, end %.2f %.2f %.2f\n\n", r.LoadStart[0], r.LoadStart[1], r.LoadStart[2], r.LoadEnd[0], r.LoadEnd[1], r.LoadEnd[2])
	fmt.Fprintln(bw, "| image | layers | compressed MiB | tar MiB | tar entries |")
	fmt.Fprintln(bw, "|---|---:|---:|---:|---:|")
	for _, i := range r.Images {
		fmt.Fprintf(bw, "| %s | %d | %.1f | %.1f | %d |\n", i.Name, i.Layers, mib(i.Compressed), mib(i.Uncompressed), i.Entries)
	}
	fmt.Fprintln(bw)
	rows := r.Rows()
	if err := WriteTable(bw, rows); err != nil {
		return err
	}
	fmt.Fprintln(bw)
	writeRatios(bw, rows)
	r.writeFloor(bw)
	r.writeOutside(bw)
	r.writeLinks(bw, rows)
	r.writeScale(bw)
	r.writeConcurrency(bw)
	r.writeManyFiles(bw)
	r.writeReuseLoad(bw)
	r.writeStartChecks(bw)
	r.writeFirstBuild(bw)
	r.writeSteps(bw)
	fmt.Fprintln(bw)
	for _, v := range r.Verified {
		fmt.Fprintln(bw, v)
	}
	fmt.Fprintln(bw)
	fmt.Fprintln(bw, "targets:")
	for _, t := range r.Targets() {
		verdict := "PASS"
		if !t.Pass {
			verdict = "MISS"
		}
		fmt.Fprintf(bw, "  %s  %-48s want %-36s got %s\n", verdict, t.Name, t.Want, t.Got)
	}
	if r.Replicas != nil {
		fmt.Fprintln(bw)
		r.Replicas.write(bw)
	}
	return bw.Flush()
}

// writeFirstBuild prints, per image, what the first build of an image costs
// in writes including its background work (tc-cold plus tc-recode), and how
// much of it was deleted before writeback (the served gzip blobs, once
// re-encoded), medians over the runs.
func (r *Results) writeFirstBuild(w io.Writer) {
	type sums struct{ written, cancelled, size []float64 }
	var order []string
	per := map[string]*sums{}
	recode := map[string]Measurement{}
	for _, m := range r.Measurements {
		if m.Pipeline == PipelineRecode {
			recode[fmt.Sprintf("%s/%d", m.Image, m.Run)] = m
		}
	}
	for _, m := range r.Measurements {
		rc, ok := recode[fmt.Sprintf("%s/%d", m.Image, m.Run)]
		if m.Pipeline != PipelineCold || !ok || m.Size == 0 {
			continue
		}
		s := per[m.Image]
		if s == nil {
			s = &sums{}
			per[m.Image] = s
			order = append(order, m.Image)
		}
		s.written = append(s.written, float64(m.Written+rc.Written))
		s.cancelled = append(s.cancelled, float64(m.Cancelled+rc.Cancelled))
		s.size = append(s.size, float64(m.Size))
	}
	if len(order) == 0 {
		return
	}
	fmt.Fprintln(w, "first build of an image (tc-cold + tc-recode), medians:")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| image | written MiB | deleted before writeback MiB | reached the disk MiB | written/size | reached/size |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
	for _, img := range order {
		s := per[img]
		wr, c, sz := median(s.written), median(s.cancelled), median(s.size)
		fmt.Fprintf(w, "| %s | %.1f | %.1f | %.1f | %.2f | %.2f |\n", img, wr/(1<<20), c/(1<<20), (wr-c)/(1<<20), wr/sz, (wr-c)/sz)
	}
	fmt.Fprintln(w)
}

// writeRatios prints, per image, the agent's builds against upstream's
// pipeline and against the floor (medians of wall time).
func writeRatios(w io.Writer, rows []Row) {
	type set map[string]float64
	var order []string
	walls := map[string]set{}
	for _, r := range rows {
		if walls[r.Image] == nil {
			walls[r.Image] = set{}
			order = append(order, r.Image)
		}
		walls[r.Image][r.Pipeline] = r.WallMedian
	}
	ratio := func(a, b float64) string {
		if a <= 0 || b <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", a/b)
	}
	fmt.Fprintln(w, "ratios (medians of wall time; upstream/TC is the speed-up):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| image | upstream/cold | upstream/warm-now | upstream/warm | cold/floor | warm-now/floor | warm/floor | warm-now/cold |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, img := range order {
		v := walls[img]
		up, fl, c, wn, wa := v[PipelineUpstream], v[PipelineFloor], v[PipelineCold], v[PipelineWarmNow], v[PipelineWarm]
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", img, ratio(up, c), ratio(up, wn), ratio(up, wa),
			ratio(c, fl), ratio(wn, fl), ratio(wa, fl), ratio(wn, c))
	}
	fmt.Fprintln(w)
}

// outsidePipelines are the agent's builds whose time outside the Builder
// is reported, in table order.
var outsidePipelines = []string{PipelineCold, PipelineWarmNow, PipelineWarm}

// outsideRow is the time outside the Builder of one pipeline on one
// image, in milliseconds.
type outsideRow struct {
	image, pipeline string
	runs            int
	median, max     float64
	builder         float64 // median Builder time, ms
}

// outsideRows summarizes Measurement.Outside per image and pipeline.
func (r *Results) outsideRows() []outsideRow {
	order, by := byImage(r.Measurements)
	var out []outsideRow
	for _, img := range order {
		for _, p := range outsidePipelines {
			var outside, builder []float64
			for _, m := range by[img] {
				if m.Pipeline == p && m.Builder > 0 {
					outside, builder = append(outside, ms(m.Outside())), append(builder, ms(m.Builder))
				}
			}
			if len(outside) > 0 {
				out = append(out, outsideRow{image: img, pipeline: p, runs: len(outside), median: median(outside),
					max: slices.Max(outside), builder: median(builder)})
			}
		}
	}
	return out
}

// writeOutside prints the agent's time outside its Builder.
func (r *Results) writeOutside(w io.Writer) {
	rows := r.outsideRows()
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "time outside the Builder: the build's wall time (its POST to its BUILT report at the CubeMaster stand-in) "+
		"less the Builder's own time (the took= of the agent's \"artifact published\" line): accepting the job, resolving the image, "+
		"the reuse checks, recording the artifact, reporting, and the waits between them:")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| image | pipeline | runs | Builder median ms | outside median ms | outside max ms |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|")
	for _, o := range rows {
		fmt.Fprintf(w, "| %s | %s | %d | %.1f | %.1f | %.1f |\n", o.image, o.pipeline, o.runs, o.builder, o.median, o.max)
	}
	fmt.Fprintln(w)
}

// outsideTargets checks the cold builds' time outside the Builder.
func (r *Results) outsideTargets() []Target {
	var out []Target
	for _, o := range r.outsideRows() {
		if o.pipeline != PipelineCold {
			continue
		}
		out = append(out, Target{Name: "time outside the Builder, tc-cold " + o.image, Want: fmt.Sprintf("<= %d ms (median)", targetOutsideMs),
			Got: fmt.Sprintf("median %.1f ms, max %.1f ms", o.median, o.max), Pass: o.median <= targetOutsideMs})
	}
	return out
}

// writeFloor prints the floor's parts per image (medians).
func (r *Results) writeFloor(w io.Writer) {
	var floors []Measurement
	for _, m := range r.Measurements {
		if m.Pipeline == PipelineFloor {
			floors = append(floors, m)
		}
	}
	order, by := byImage(floors)
	if len(order) == 0 {
		return
	}
	fmt.Fprintln(w, "floor: fastest single-core inflate of every layer as served, plus writing the agent's image (its allocated bytes) with fsync on the builds' filesystem; medians:")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| image | inflate s | fastest inflater per layer | write MiB | write+fsync s | floor s |")
	fmt.Fprintln(w, "|---|---:|---|---:|---:|---:|")
	for _, img := range order {
		var inflate, write, total []float64
		for _, m := range by[img] {
			inflate, write, total = append(inflate, m.Inflate.Seconds()), append(write, m.WriteTime.Seconds()), append(total, m.Wall.Seconds())
		}
		last := by[img][len(by[img])-1]
		fmt.Fprintf(w, "| %s | %.3f | %s | %.1f | %.3f | %.3f |\n", img, median(inflate), strings.Join(last.Inflaters, ", "),
			mib(last.Written), median(write), median(total))
	}
	fmt.Fprintln(w)
}

// writeScale prints the scale curve: cold and warm-now builds of images
// of growing content, in seconds per GiB.
func (r *Results) writeScale(w io.Writer) {
	pts := r.scalePoints()
	if len(pts) == 0 {
		return
	}
	fmt.Fprintln(w, "scale curve (the agent only; layers of equal size and mix; medians):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| image | content MiB | runs | cold s | cold s/GiB | warm-now s | warm-now s/GiB | peak RSS MiB |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, pt := range pts {
		fmt.Fprintf(w, "| %s | %.1f | %d | %.3f | %.3f | %.3f | %.3f | %.1f |\n", pt.name, mib(pt.content), pt.runs,
			pt.wall[PipelineCold], pt.perGiB[PipelineCold], pt.wall[PipelineWarmNow], pt.perGiB[PipelineWarmNow], pt.peakMiB)
	}
	fmt.Fprintln(w)
}

// writeConcurrency prints the runs of several images at once.
func (r *Results) writeConcurrency(w io.Writer) {
	if len(r.Concurrency) == 0 {
		return
	}
	fmt.Fprintf(w, "concurrency: %s built alone (cold, each on a fresh agent), then submitted together to one fresh agent:\n\n",
		strings.Join(r.Concurrency[0].Images, ", "))
	fmt.Fprintln(w, "| run | solo s (each) | sum of solo s | together s (each) | together s (first submit to last BUILT) | together/sum | peak RSS MiB | load1 |")
	fmt.Fprintln(w, "|---:|---|---:|---|---:|---:|---:|---:|")
	secs := func(ds []time.Duration) string {
		v := make([]float64, len(ds))
		for i, d := range ds {
			v[i] = d.Seconds()
		}
		return joinFloats(v, "%.2f")
	}
	for _, c := range r.Concurrency {
		q := 0.0
		if s := c.SoloSum(); s > 0 {
			q = c.All.Seconds() / s.Seconds()
		}
		fmt.Fprintf(w, "| %d | %s | %.3f | %s | %.3f | %.2f | %.1f | %.2f |\n", c.Run, secs(c.Solo), c.SoloSum().Seconds(),
			secs(c.Together), c.All.Seconds(), q, mib(c.PeakRSS), c.Load1)
	}
	fmt.Fprintln(w)
}

// writeManyFiles prints the builds of the many-files image.
func (r *Results) writeManyFiles(w io.Writer) {
	if len(r.ManyFiles) == 0 {
		return
	}
	fmt.Fprintln(w, "many files (cold build; the agent's build.max_entries and build.max_tree_memory raised for it):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| entries | wall s | cpu s | idle RSS MiB | peak RSS MiB | RSS per entry B | size MiB | load1 |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, m := range r.ManyFiles {
		fmt.Fprintf(w, "| %d | %.3f | %.2f | %.1f | %.1f | %.0f | %.1f | %.2f |\n", m.Entries, m.Wall.Seconds(), m.CPU.Seconds(),
			mib(m.IdleRSS), mib(m.PeakRSS), m.BytesPerEntry(), mib(m.Size), m.Load1)
	}
	fmt.Fprintln(w)
}
