package bench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
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
	// PipelineCold is the agent with an empty layer cache.
	PipelineCold = "tc-cold"
	// PipelineRecode is the agent's background work after the cold build:
	// re-encoding the cached gzip layers as zstd, from the BUILT report
	// until the layer cache is idle. It is not a build (no upstream/TC
	// ratio); its size columns repeat the cold build's image.
	PipelineRecode = "tc-recode"
	// PipelineWarm is the agent with the layers cached and a new envd.
	PipelineWarm = "tc-warm"
	// PipelineReuse is the agent asked for a spec it already published.
	PipelineReuse = "tc-reuse"
)

// pipelines in table order.
var pipelines = [...]string{PipelineUpstream, PipelineCold, PipelineRecode, PipelineWarm, PipelineReuse}

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
	// Size and Allocated are the output file's apparent and allocated
	// bytes.
	Size      int64   `json:"size_bytes"`
	Allocated int64   `json:"allocated_bytes"`
	SHA256    string  `json:"sha256"`
	Load1     float64 `json:"load1"`
	Steps     []Step  `json:"steps,omitempty"`
	// path is the output image, while the iteration keeps it.
	path string
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

// Report is the outcome of Run.
type Report struct {
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
func (r *Report) Rows() []Row {
	var order []string
	groups := map[string][]Measurement{}
	for _, m := range r.Measurements {
		if !slices.Contains(order, m.Image) {
			order = append(order, m.Image)
		}
		k := m.Image + "\x00" + m.Pipeline
		groups[k] = append(groups[k], m)
	}
	var rows []Row
	for _, img := range order {
		upstream := 0.0
		for _, p := range pipelines {
			ms := groups[img+"\x00"+p]
			if len(ms) == 0 {
				continue
			}
			row := summarize(img, p, ms)
			if p == PipelineUpstream {
				upstream = row.WallMedian
			} else if p != PipelineRecode && upstream > 0 && row.WallMedian > 0 {
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

// Target is one of issue 5's goals checked against a run.
type Target struct {
	Name string
	Want string
	Got  string
	Pass bool
}

// Target thresholds.
const (
	targetColdRatio  = 4
	targetWarmRatio  = 8
	targetReuseSecs  = 0.1
	targetRSSMiB     = 256
	targetRSSGrowth  = 1.25 // large image's peak over the Debian image's
	targetWrittenPer = 1.3
)

// Targets checks the rows against the project's performance targets.
// Targets whose images were not measured are left out.
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
	for _, img := range images {
		if img == ImageDebian || img == ImageLarge {
			if r, ok := get(img, PipelineCold); ok && r.Ratio > 0 {
				out = append(out, Target{Name: "cold speed-up " + img, Want: fmt.Sprintf(">= %dx", targetColdRatio),
					Got: fmt.Sprintf("%.2fx", r.Ratio), Pass: r.Ratio >= targetColdRatio})
			}
		}
		if r, ok := get(img, PipelineWarm); ok && r.Ratio > 0 {
			out = append(out, Target{Name: "warm speed-up " + img, Want: fmt.Sprintf(">= %dx", targetWarmRatio),
				Got: fmt.Sprintf("%.2fx", r.Ratio), Pass: r.Ratio >= targetWarmRatio})
		}
		if r, ok := get(img, PipelineReuse); ok {
			out = append(out, Target{Name: "reuse BUILT latency " + img, Want: fmt.Sprintf("< %.0f ms (max of runs)", targetReuseSecs*1000),
				Got: fmt.Sprintf("median %.1f ms, max %.1f ms", r.WallMedian*1000, r.WallMax*1000), Pass: r.WallMax < targetReuseSecs})
		}
		peak := 0.0
		for _, p := range []string{PipelineCold, PipelineRecode, PipelineWarm, PipelineReuse} {
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

// writeSteps prints upstream's steps per image: median wall and CPU
// time, largest RSS and median bytes written of each step.
func (r *Report) writeSteps(w io.Writer) {
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
func (r *Report) Write(w io.Writer) error {
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
	r.writeFirstBuild(bw)
	r.writeSteps(bw)
	fmt.Fprintln(bw)
	for _, v := range r.Verified {
		fmt.Fprintln(bw, v)
	}
	fmt.Fprintln(bw)
	fmt.Fprintln(bw, "targets:")
	for _, t := range Targets(rows) {
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
func (r *Report) writeFirstBuild(w io.Writer) {
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
