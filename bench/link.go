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
// Results.Links, apart from the loopback pipelines.
const PipelineLinkCold = "tc-cold-link"

// DefaultLinks are the link models `make bench` measures, as ParseLinks
// reads them: 400 Mbit/s shared and no cap per connection; 1 Gbit/s
// shared and 200 Mbit/s per connection.
const DefaultLinks = "400,1000/200"

// linkConnDelay is added to each new connection through the link model:
// a round trip of a regional link.
const linkConnDelay = 20 * time.Millisecond

// targetLinkRatio bounds a cold build over a link without a cap per
// connection against its floor; targetLinkCappedRatio one over a link
// whose connections are capped.
const (
	targetLinkRatio       = 1.15
	targetLinkCappedRatio = 1.3
)

// linkRatioWithLoopback is the bandwidth from which the floor of an
// uncapped link's target is the larger of the link floor and the loopback
// cold build: on a fast link the build, not the link, may be the bound.
const linkRatioWithLoopback = 1_000_000_000

// DefaultLinkImages returns the images measured through the links.
func DefaultLinkImages() []string { return []string{ImageDebian, ImageLarge} }

// Link is one link model: a bandwidth shared by all connections and, when
// set, a cap on each connection's own rate, both in bits per second.
type Link struct {
	BitsPerSecond     int64 `json:"link_bits_per_second"`
	ConnBitsPerSecond int64 `json:"link_conn_bits_per_second,omitempty"`
}

// String names the link: "400 Mbit/s", or "1000 Mbit/s, 200 Mbit/s per
// connection".
func (l Link) String() string {
	if l.ConnBitsPerSecond <= 0 {
		return mbits(l.BitsPerSecond)
	}
	return mbits(l.BitsPerSecond) + ", " + mbits(l.ConnBitsPerSecond) + " per connection"
}

// label names the link in file names: link-400, link-1000-200.
func (l Link) label() string {
	s := fmt.Sprintf("link-%d", l.BitsPerSecond/1_000_000)
	if l.ConnBitsPerSecond > 0 {
		s += fmt.Sprintf("-%d", l.ConnBitsPerSecond/1_000_000)
	}
	return s
}

// capped says the link caps each connection below the shared bandwidth.
func (l Link) capped() bool {
	return l.ConnBitsPerSecond > 0 && l.ConnBitsPerSecond < l.BitsPerSecond
}

// targetRatio is the link's target against its bound (Bound).
func (l Link) targetRatio() float64 {
	if l.capped() {
		return targetLinkCappedRatio
	}
	return targetLinkRatio
}

// ParseLinks reads comma-separated links in Mbit/s: "400" is 400 Mbit/s
// shared by all connections, "1000/200" 1000 Mbit/s shared with each
// connection capped at 200 Mbit/s. An empty string is no link.
func ParseLinks(s string) ([]Link, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []Link
	for _, f := range strings.Split(s, ",") {
		shared, perConn, capped := strings.Cut(strings.TrimSpace(f), "/")
		var l Link
		var err error
		if l.BitsPerSecond, err = parseMbits(shared); err != nil {
			return nil, fmt.Errorf("link %q: %w", f, err)
		}
		if capped {
			if l.ConnBitsPerSecond, err = parseMbits(perConn); err != nil {
				return nil, fmt.Errorf("link %q: per connection: %w", f, err)
			}
		}
		out = append(out, l)
	}
	return out, nil
}

// parseMbits reads a bandwidth in Mbit/s as bits per second.
func parseMbits(s string) (int64, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || v <= 0 || v > 1e6 {
		return 0, fmt.Errorf("bandwidth %q: want Mbit/s, a number above 0", s)
	}
	return int64(v * 1e6), nil
}

// LinkRun is one cold build of the agent through the link model, timed
// end to end: from the POST of the build to its BUILT report at the
// CubeMaster stand-in.
type LinkRun struct {
	Measurement
	Link
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
	// Reuse is the same spec submitted again right after the BUILT
	// report, through the same link, POST to BUILT.
	Reuse time.Duration `json:"reuse_ns"`
}

// Floor is the link floor: the compressed bytes at the link's shared
// bandwidth.
func (l LinkRun) Floor() time.Duration {
	return linkFloor(l.Compressed, l.BitsPerSecond)
}

func linkFloor(bytes, bps int64) time.Duration {
	if bps <= 0 {
		return 0
	}
	return time.Duration(float64(bytes) * 8 / float64(bps) * float64(time.Second))
}

// mbits prints a bandwidth.
func mbits(bps int64) string {
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
	for _, l := range links {
		if err := h.linkBuild(ctx, name, run, l, dir); err != nil {
			return err
		}
	}
	return nil
}

// linkBuild starts a link model in front of the registry and a fresh
// agent (empty layer cache) that pulls through it, and measures one cold
// build and one reuse of its spec.
func (h *harness) linkBuild(ctx context.Context, name string, run int, link Link, dir string) error {
	p, err := linkproxy.New(linkproxy.Options{Target: "http://" + h.reg.Host, BitsPerSecond: link.BitsPerSecond,
		ConnBitsPerSecond: link.ConnBitsPerSecond, ConnDelay: linkConnDelay})
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer p.Close()
	// The agent knows the proxy as it knows the registry: a loopback
	// registry spoken to over plain HTTP.
	setup := h.setup
	setup.RegistryHost = p.Addr()
	label := link.label()
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
	envd := envdBlob(name, run, label)
	m, _, err := h.agentBuildRef(ctx, a, name, ref, run, PipelineLinkCold, envd, false)
	if err != nil {
		return fmt.Errorf("%w (agent log: logs/%s)", err, logName)
	}
	st := p.Stats()
	l := LinkRun{Measurement: m, Link: link, ConnDelay: linkConnDelay, Compressed: h.images[name].compressed(),
		Through: st.BodyBytes, Requests: st.Requests, RangeRequests: st.RangeRequests, Connections: st.Connections}
	// A build that did not pull its layers through the link measured
	// nothing about the link.
	if l.Through < l.Compressed {
		return fmt.Errorf("bench: the cold build of %s over %s carried %d bytes, fewer than the image's %d compressed bytes",
			name, link, l.Through, l.Compressed)
	}
	reuse, err := a.build(ctx, h.master, fmt.Sprintf("bench-%s-%d-%s-reuse-%d", name, run, label, time.Now().UnixNano()), ref, envd)
	if err != nil {
		return fmt.Errorf("bench: reuse of %s over %s: %w (agent log: logs/%s)", name, link, err, logName)
	}
	if reuse.SHA256 != m.SHA256 {
		return fmt.Errorf("bench: reuse of %s over %s returned %s, the cold build made %s", name, link, reuse.SHA256, m.SHA256)
	}
	l.Reuse = reuse.Wall
	h.report.Links = append(h.report.Links, l)
	h.logf("%-7s run %d %s over %s %7.3f s  link floor %.3f s (%.2fx)  outside the Builder %.1f ms  reuse %.1f ms  cpu %6.2f s  peak RSS %6.1f MiB  written %7.1f MiB  through %.1f MiB in %d requests, %d connections  load %.2f",
		name, run, PipelineLinkCold, link, m.Wall.Seconds(), l.Floor().Seconds(), m.Wall.Seconds()/l.Floor().Seconds(), ms(m.Outside()), ms(l.Reuse),
		m.CPU.Seconds(), mib(m.PeakRSS), mib(m.Written), mib(l.Through), l.Requests, l.Connections, m.Load1)
	return nil
}

// LinkRow summarizes the link runs of one image and link: the Row of its
// cold builds (pipeline tc-cold-link), and the link's figures.
type LinkRow struct {
	Row
	Link
	// CompressedMiB is the image's layer blobs; Floor the link floor and
	// Loopback the median loopback cold build (0 if not measured), in
	// seconds.
	CompressedMiB float64
	Floor         float64
	Loopback      float64
	// ThroughMiB is the median of the bytes the link carried.
	ThroughMiB float64
	// OutsideMs is the median time of the cold builds outside the
	// Builder, ReuseMs the median reuse, in milliseconds.
	OutsideMs float64
	ReuseMs   float64
}

// Bound is what the target compares the cold build with: the link floor,
// or on uncapped links of 1 Gbit/s and more the larger of it and the
// loopback cold build.
func (r LinkRow) Bound() float64 {
	if r.BitsPerSecond >= linkRatioWithLoopback && !r.capped() {
		return max(r.Floor, r.Loopback)
	}
	return r.Floor
}

// Pass says whether the median cold build meets the link target.
func (r LinkRow) Pass() bool { return r.WallMedian <= r.targetRatio()*r.Bound() }

// LinkRows summarizes the link runs per image and link, in the order
// first measured, against the loopback cold builds of rows.
func (r *Results) LinkRows(rows []Row) []LinkRow {
	type key struct {
		img  string
		link Link
	}
	var order []key
	groups := map[key][]LinkRun{}
	for _, l := range r.Links {
		k := key{l.Image, l.Link}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], l)
	}
	var out []LinkRow
	for _, k := range order {
		ls := groups[k]
		runs := make([]Measurement, len(ls))
		var through, outside, reuse []float64
		for i, l := range ls {
			runs[i] = l.Measurement
			through = append(through, mib(l.Through))
			outside = append(outside, ms(l.Outside()))
			reuse = append(reuse, ms(l.Reuse))
		}
		lr := LinkRow{Row: summarize(k.img, PipelineLinkCold, runs), Link: k.link,
			CompressedMiB: mib(ls[0].Compressed), Floor: ls[0].Floor().Seconds(), ThroughMiB: median(through),
			OutsideMs: median(outside), ReuseMs: median(reuse)}
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
func (r *Results) writeLinks(w io.Writer, rows []Row) {
	lrs := r.LinkRows(rows)
	if len(lrs) == 0 {
		return
	}
	fmt.Fprintf(w, "link model: the agent's cold builds (fresh agent, empty layer cache) through test/linkproxy in front of the registry, "+
		"timed end to end (the build's POST to its BUILT report at the CubeMaster stand-in), then the same spec submitted again (reuse); "+
		"the proxy shares one bandwidth between all connections and, where the link names one, caps each connection's rate "+
		"(two virtual clocks, chunks of at most 32 KiB), and adds %v to each new connection; "+
		"link floor = compressed bytes / shared bandwidth; outside = the cold build less the Builder's own time; "+
		"target: cold <= %.2fx the floor (%.2fx with a cap per connection), on uncapped links from %s the larger of the floor and the loopback cold build; medians:\n\n",
		linkConnDelay, targetLinkRatio, targetLinkCappedRatio, mbits(linkRatioWithLoopback))
	fmt.Fprintln(w, "| image | link | runs | compressed MiB | link floor s | loopback cold s | cold s | cold min s | cold max s | cold/floor | cold/bound | target s | verdict | outside ms | reuse ms | cpu s | peak RSS MiB | written MiB | written/size | through MiB | load1 |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, l := range lrs {
		verdict := "PASS"
		if !l.Pass() {
			verdict = "MISS"
		}
		fmt.Fprintf(w, "| %s | %s | %d | %.1f | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f | %.3f | %s | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f | %.1f | %.2f |\n",
			l.Image, l.Link, l.Runs, l.CompressedMiB, l.Floor, l.Loopback, l.WallMedian, l.WallMin, l.WallMax,
			l.WallMedian/l.Floor, l.WallMedian/l.Bound(), l.targetRatio()*l.Bound(), verdict, l.OutsideMs, l.ReuseMs, l.CPUMedian, l.PeakRSSMiB,
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
		want := fmt.Sprintf("<= %.2fx link floor", l.targetRatio())
		if l.BitsPerSecond >= linkRatioWithLoopback && !l.capped() {
			want = fmt.Sprintf("<= %.2fx max(floor, loopback)", l.targetRatio())
		}
		out = append(out, Target{Name: fmt.Sprintf("tc-cold over %s %s", l.Link, l.Image), Want: want,
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
