package bench

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubesandbox/cubetemplatecenter/test/linkproxy"
)

// PipelineLinkCold is the agent with an empty layer cache pulling through
// the link model: a linkproxy in front of the bench registry. Its runs are
// Report.Links, apart from the loopback pipelines.
const PipelineLinkCold = "tc-cold-link"

// DefaultLinks are the link-model bandwidths `make bench` measures, in
// Mbit/s, as ParseLinks reads them.
const DefaultLinks = "400,1000"

// linkConnDelay is added to each new connection through the link model:
// a round trip of a regional link.
const linkConnDelay = 20 * time.Millisecond

// targetLinkRatio bounds a cold build over a link against its floor.
const targetLinkRatio = 1.15

// linkRatioWithLoopback is the bandwidth from which the link target's
// floor is the larger of the link floor and the loopback cold build: on a
// fast link the build, not the link, may be the bound.
const linkRatioWithLoopback = 1_000_000_000

// DefaultLinkImages returns the images measured through the links.
func DefaultLinkImages() []string { return []string{ImageDebian, ImageLarge} }

// ParseLinks reads comma-separated bandwidths in Mbit/s ("400,1000") as
// bits per second; an empty string is no link.
func ParseLinks(s string) ([]int64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []int64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v <= 0 || v > 1e6 {
			return nil, fmt.Errorf("link bandwidth %q: want Mbit/s, a number above 0", f)
		}
		out = append(out, int64(v*1e6))
	}
	return out, nil
}

// LinkRun is one cold build of the agent through the link model.
type LinkRun struct {
	Measurement
	// BitsPerSecond is the link's bandwidth, shared by all connections.
	BitsPerSecond int64 `json:"link_bits_per_second"`
	// ConnDelay is added to each new connection.
	ConnDelay time.Duration `json:"link_conn_delay_ns"`
	// Compressed is the image's layer blob bytes.
	Compressed int64 `json:"compressed_bytes"`
	// Through is the response body bytes the link carried (blobs,
	// manifest, config, and any bytes fetched twice); Requests,
	// RangeRequests and Connections what the agent sent through it.
	Through       int64 `json:"through_bytes"`
	Requests      int   `json:"requests"`
	RangeRequests int   `json:"range_requests"`
	Connections   int   `json:"connections"`
}

// Floor is the link floor: the compressed bytes at the link's bandwidth.
func (l LinkRun) Floor() time.Duration {
	return linkFloor(l.Compressed, l.BitsPerSecond)
}

func linkFloor(bytes, bps int64) time.Duration {
	if bps <= 0 {
		return 0
	}
	return time.Duration(float64(bytes) * 8 / float64(bps) * float64(time.Second))
}

// linkName prints a bandwidth.
func linkName(bps int64) string {
	return strconv.FormatFloat(float64(bps)/1e6, 'f', -1, 64) + " Mbit/s"
}

// measureLinks measures a cold build of image name through each link,
// when the image is one of the link images; odd runs take the links in
// reverse order.
func (h *harness) measureLinks(ctx context.Context, name string, run int, dir string) error {
	if !slices.Contains(h.cfg.LinkImages, name) {
		return nil
	}
	links := slices.Clone(h.cfg.Links)
	if run%2 == 1 {
		slices.Reverse(links)
	}
	for _, bps := range links {
		if err := h.linkBuild(ctx, name, run, bps, dir); err != nil {
			return err
		}
	}
	return nil
}

// linkBuild starts a link model in front of the registry and a fresh
// agent (empty layer cache) that pulls through it, and measures one cold
// build.
func (h *harness) linkBuild(ctx context.Context, name string, run int, bps int64, dir string) error {
	p, err := linkproxy.New(linkproxy.Options{Target: "http://" + h.reg.Host, BitsPerSecond: bps, ConnDelay: linkConnDelay})
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer p.Close()
	// The agent knows the proxy as it knows the registry: a loopback
	// registry spoken to over plain HTTP.
	setup := h.setup
	setup.RegistryHost = p.Addr()
	label := fmt.Sprintf("link-%d", bps/1_000_000)
	a, err := startAgent(ctx, setup, filepath.Join(dir, label))
	if err != nil {
		return err
	}
	logName := fmt.Sprintf("agent-%s-%d-%s.log", name, run, label)
	defer func() {
		a.Stop()
		keepLog(a.log.Name(), filepath.Join(h.cfg.WorkDir, "logs", logName))
	}()
	ref := p.Addr() + strings.TrimPrefix(h.refs[name], h.reg.Host)
	unix.Sync()
	m, _, err := h.agentBuildRef(ctx, a, name, ref, run, PipelineLinkCold, envdBlob(name, run, label), false)
	if err != nil {
		return fmt.Errorf("%w (agent log: logs/%s)", err, logName)
	}
	st := p.Stats()
	l := LinkRun{Measurement: m, BitsPerSecond: bps, ConnDelay: linkConnDelay, Compressed: h.images[name].compressed(),
		Through: st.BodyBytes, Requests: st.Requests, RangeRequests: st.RangeRequests, Connections: st.Connections}
	// A build that did not pull its layers through the link measured
	// nothing about the link.
	if l.Through < l.Compressed {
		return fmt.Errorf("bench: the cold build of %s over %s carried %d bytes, fewer than the image's %d compressed bytes",
			name, linkName(bps), l.Through, l.Compressed)
	}
	h.report.Links = append(h.report.Links, l)
	h.logf("%-7s run %d %s over %s %7.3f s  link floor %.3f s (%.2fx)  cpu %6.2f s  peak RSS %6.1f MiB  written %7.1f MiB  through %.1f MiB in %d requests, %d connections  load %.2f",
		name, run, PipelineLinkCold, linkName(bps), m.Wall.Seconds(), l.Floor().Seconds(), m.Wall.Seconds()/l.Floor().Seconds(),
		m.CPU.Seconds(), mib(m.PeakRSS), mib(m.Written), mib(l.Through), l.Requests, l.Connections, m.Load1)
	return nil
}

// LinkRow summarizes the link runs of one image and bandwidth: the Row of
// its cold builds (pipeline tc-cold-link), and the link's figures.
type LinkRow struct {
	Row
	BitsPerSecond int64
	// CompressedMiB is the image's layer blobs; Floor the link floor and
	// Loopback the median loopback cold build (0 if not measured), in
	// seconds.
	CompressedMiB float64
	Floor         float64
	Loopback      float64
	// ThroughMiB is the median of the bytes the link carried.
	ThroughMiB float64
}

// Bound is what the target compares the cold build with: the link floor,
// or on links of 1 Gbit/s and more the larger of it and the loopback
// cold build.
func (r LinkRow) Bound() float64 {
	if r.BitsPerSecond >= linkRatioWithLoopback {
		return max(r.Floor, r.Loopback)
	}
	return r.Floor
}

// Pass says whether the median cold build meets the link target.
func (r LinkRow) Pass() bool { return r.WallMedian <= targetLinkRatio*r.Bound() }

// LinkRows summarizes the link runs per image and bandwidth, in the order
// first measured, against the loopback cold builds of rows.
func (r *Report) LinkRows(rows []Row) []LinkRow {
	type key struct {
		img string
		bps int64
	}
	var order []key
	groups := map[key][]LinkRun{}
	for _, l := range r.Links {
		k := key{l.Image, l.BitsPerSecond}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], l)
	}
	var out []LinkRow
	for _, k := range order {
		ls := groups[k]
		ms := make([]Measurement, len(ls))
		var through []float64
		for i, l := range ls {
			ms[i] = l.Measurement
			through = append(through, mib(l.Through))
		}
		lr := LinkRow{Row: summarize(k.img, PipelineLinkCold, ms), BitsPerSecond: k.bps,
			CompressedMiB: mib(ls[0].Compressed), Floor: ls[0].Floor().Seconds(), ThroughMiB: median(through)}
		for _, row := range rows {
			if row.Image == k.img && row.Pipeline == PipelineCold {
				lr.Loopback = row.WallMedian
			}
		}
		out = append(out, lr)
	}
	return out
}

// writeLinks prints the link-model rows.
func (r *Report) writeLinks(w io.Writer, rows []Row) {
	lrs := r.LinkRows(rows)
	if len(lrs) == 0 {
		return
	}
	fmt.Fprintf(w, "link model: the agent's cold builds (fresh agent, empty layer cache) through test/linkproxy in front of the registry, "+
		"a reverse proxy sharing one bandwidth between all connections (a virtual clock, chunks of at most 32 KiB) and adding %v to each new connection; "+
		"link floor = compressed bytes / bandwidth; target: cold <= %.2fx the floor, from %s the larger of the floor and the loopback cold build; medians:\n\n",
		linkConnDelay, targetLinkRatio, linkName(linkRatioWithLoopback))
	fmt.Fprintln(w, "| image | link | runs | compressed MiB | link floor s | loopback cold s | cold s | cold min s | cold max s | cold/floor | cold/max(floor, loopback) | target s | verdict | cpu s | peak RSS MiB | written MiB | written/size | through MiB | load1 |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
	for _, l := range lrs {
		verdict := "PASS"
		if !l.Pass() {
			verdict = "MISS"
		}
		fmt.Fprintf(w, "| %s | %s | %d | %.1f | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f | %.3f | %s | %.2f | %.1f | %.1f | %.2f | %.1f | %.2f |\n",
			l.Image, linkName(l.BitsPerSecond), l.Runs, l.CompressedMiB, l.Floor, l.Loopback, l.WallMedian, l.WallMin, l.WallMax,
			l.WallMedian/l.Floor, l.WallMedian/max(l.Floor, l.Loopback), targetLinkRatio*l.Bound(), verdict, l.CPUMedian, l.PeakRSSMiB,
			l.WrittenMiB, l.WrittenPerSize, l.ThroughMiB, l.Load1)
	}
	fmt.Fprintln(w)
}

// linkTargets checks the link rows: the cold build against its bound per
// image and link, and per image the peak RSS and the bytes written per
// image byte over all its link runs.
func linkTargets(lrs []LinkRow) []Target {
	var out []Target
	var images []string
	for _, l := range lrs {
		if !slices.Contains(images, l.Image) {
			images = append(images, l.Image)
		}
		want := fmt.Sprintf("<= %.2fx link floor", targetLinkRatio)
		if l.BitsPerSecond >= linkRatioWithLoopback {
			want = fmt.Sprintf("<= %.2fx max(floor, loopback)", targetLinkRatio)
		}
		out = append(out, Target{Name: fmt.Sprintf("tc-cold over %s %s", linkName(l.BitsPerSecond), l.Image), Want: want,
			Got:  fmt.Sprintf("%.2fx (%.3f s vs floor %.3f s, loopback %.3f s)", l.WallMedian/l.Bound(), l.WallMedian, l.Floor, l.Loopback),
			Pass: l.Pass()})
	}
	for _, img := range images {
		peak, per := 0.0, 0.0
		for _, l := range lrs {
			if l.Image == img {
				peak, per = max(peak, l.PeakRSSMiB), max(per, l.WrittenPerSize)
			}
		}
		out = append(out,
			Target{Name: "peak RSS " + img + " over the links", Want: fmt.Sprintf("< %d MiB", targetRSSMiB),
				Got: fmt.Sprintf("%.1f MiB", peak), Pass: peak < targetRSSMiB},
			Target{Name: "bytes written / image size " + img + " over the links", Want: fmt.Sprintf("<= %.1f", targetWrittenPer),
				Got: fmt.Sprintf("%.2f", per), Pass: per <= targetWrittenPer})
	}
	return out
}
