package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultReuseLoadSamples is Config.ReuseLoadSamples's default.
const DefaultReuseLoadSamples = 5

// targetReuseLoad bounds a reuse submitted the moment a cold build's
// BUILT report arrives, from the submit to its BUILT report.
const targetReuseLoad = 100 * time.Millisecond

// ReuseLoadSample is one reuse submitted the moment a cold build's BUILT
// report arrived, on the agent that made both.
type ReuseLoadSample struct {
	Image  string `json:"image"`
	Sample int    `json:"sample"`
	// Cold is the cold build's wall time, Accept the reuse's POST until
	// its answer, Reuse the reuse's POST until its BUILT report.
	Cold   time.Duration `json:"cold_ns"`
	Accept time.Duration `json:"accept_ns"`
	Reuse  time.Duration `json:"reuse_ns"`
	Load1  float64       `json:"load1"`
}

// reuseLoad measures, per image, reuses submitted as a cold build's BUILT
// arrives: the builds' image and layer cache are then still being written
// back to the filesystem the spool shares, and the layer cache's re-encode
// is about to start. One agent directory per image keeps its store and
// spool across the samples (so the earlier spec stays reusable); the
// agent is restarted with an empty layer cache before each sample so that
// each build is cold.
func (h *harness) reuseLoad(ctx context.Context) error {
	n := h.cfg.ReuseLoadSamples
	switch {
	case n < 0:
		return nil
	case n == 0:
		n = DefaultReuseLoadSamples
	}
	for _, name := range h.cfg.Images {
		if err := h.reuseLoadImage(ctx, name, n); err != nil {
			return err
		}
	}
	return nil
}

func (h *harness) reuseLoadImage(ctx context.Context, name string, samples int) error {
	dir := filepath.Join(h.cfg.WorkDir, "builds", "reuse-load-"+name)
	defer os.RemoveAll(dir)
	var a *agentProc
	stop := func() {
		if a != nil {
			a.Stop()
			keepLog(a.log.Name(), filepath.Join(h.cfg.WorkDir, "logs", "agent-reuse-load-"+name+".log"))
			a = nil
		}
	}
	defer stop()
	start := func() error {
		var err error
		a, err = startAgent(ctx, h.setup, dir)
		return err
	}
	if err := start(); err != nil {
		return err
	}
	earlier := envdBlob(name, 0, "reuse-load-earlier")
	first, err := a.build(ctx, h.master, fmt.Sprintf("bench-reuse-load-%s-earlier-%d", name, time.Now().UnixNano()), h.refs[name], earlier)
	if err != nil {
		return fmt.Errorf("bench: reuse under load, earlier build of %s: %w", name, err)
	}
	for i := range samples {
		// A fresh layer cache, so the next build is cold; the store and
		// the spool stay, with the earlier spec's artifact.
		stop()
		if err := os.RemoveAll(filepath.Join(dir, "work")); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		if err := start(); err != nil {
			return err
		}
		unix.Sync()
		s := ReuseLoadSample{Image: name, Sample: i, Load1: loadAvg1()}
		cold, err := a.build(ctx, h.master, fmt.Sprintf("bench-reuse-load-%s-cold-%d-%d", name, i, time.Now().UnixNano()),
			h.refs[name], envdBlob(name, i, "reuse-load-cold"))
		if err != nil {
			return fmt.Errorf("bench: reuse under load, cold build of %s: %w", name, err)
		}
		s.Cold = cold.Wall
		// At once: the reuse goes out as the BUILT report arrives.
		jobID := fmt.Sprintf("bench-reuse-load-%s-reuse-%d-%d", name, i, time.Now().UnixNano())
		began, err := a.submit(ctx, h.master, jobID, h.refs[name], earlier)
		if err != nil {
			return fmt.Errorf("bench: reuse under load of %s: %w", name, err)
		}
		s.Accept = time.Since(began)
		reuse, err := a.wait(ctx, h.master, jobID, began)
		if err != nil {
			return fmt.Errorf("bench: reuse under load of %s: %w", name, err)
		}
		if reuse.SHA256 != first.SHA256 {
			return fmt.Errorf("bench: reuse under load of %s returned %s, the earlier build made %s", name, reuse.SHA256, first.SHA256)
		}
		s.Reuse = reuse.Wall
		h.report.ReuseLoad = append(h.report.ReuseLoad, s)
		h.logf("%-7s reuse under load %d: cold %.3f s, reuse %.1f ms (accepted after %.1f ms)", name, i, s.Cold.Seconds(),
			ms(s.Reuse), ms(s.Accept))
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// reuseLoadStats are the medians and maxima of an image's samples, in
// milliseconds.
type reuseLoadStats struct {
	image                               string
	n                                   int
	reuseMedian, reuseMax, acceptMedian float64
	coldMedian                          float64
}

func (r *Results) reuseLoadStats() []reuseLoadStats {
	var order []string
	by := map[string][]ReuseLoadSample{}
	for _, s := range r.ReuseLoad {
		if _, ok := by[s.Image]; !ok {
			order = append(order, s.Image)
		}
		by[s.Image] = append(by[s.Image], s)
	}
	var out []reuseLoadStats
	for _, img := range order {
		var reuse, accept, cold []float64
		for _, s := range by[img] {
			reuse, accept, cold = append(reuse, ms(s.Reuse)), append(accept, ms(s.Accept)), append(cold, ms(s.Cold))
		}
		out = append(out, reuseLoadStats{image: img, n: len(reuse), reuseMedian: median(reuse), reuseMax: slices.Max(reuse),
			acceptMedian: median(accept), coldMedian: median(cold)})
	}
	return out
}

// writeReuseLoad prints the reuse-under-load row.
func (r *Results) writeReuseLoad(w io.Writer) {
	st := r.reuseLoadStats()
	if len(st) == 0 {
		return
	}
	fmt.Fprintln(w, "reuse under load (a reuse of an earlier spec submitted the moment a cold build's BUILT arrives; submit to BUILT at the CubeMaster stand-in):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| image | samples | reuse median ms | reuse max ms | accept median ms | cold build median s |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
	for _, s := range st {
		fmt.Fprintf(w, "| %s | %d | %.1f | %.1f | %.1f | %.3f |\n", s.image, s.n, s.reuseMedian, s.reuseMax, s.acceptMedian, s.coldMedian/1000)
	}
	fmt.Fprintln(w)
}

// reuseLoadTargets checks every sample against targetReuseLoad.
func (r *Results) reuseLoadTargets() []Target {
	var out []Target
	for _, s := range r.reuseLoadStats() {
		out = append(out, Target{Name: "reuse under load " + s.image, Want: fmt.Sprintf("< %d ms, every sample", targetReuseLoad.Milliseconds()),
			Got:  fmt.Sprintf("median %.1f ms, max %.1f ms over %d", s.reuseMedian, s.reuseMax, s.n),
			Pass: s.reuseMax < ms(targetReuseLoad)})
	}
	return out
}
