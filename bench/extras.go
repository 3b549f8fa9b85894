package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// concurrencyImages is how many distinct images the concurrency run
// submits together.
const concurrencyImages = 4

// extras measures what only the agent is measured on: the scale curve,
// concurrent builds of distinct images, and the many-files image.
func (h *harness) extras(ctx context.Context) error {
	imgDir := filepath.Join(h.cfg.WorkDir, "images")
	if h.cfg.ScaleLayerBytes > 0 {
		pool, err := scalePool(ctx, imgDir, h.cfg.ScaleLayerBytes, h.cfg.Log)
		if err != nil {
			return err
		}
		var scale []*benchImage
		for _, n := range ScaleSteps {
			img := &benchImage{Name: scaleImageName(int64(n) * h.cfg.ScaleLayerBytes), Layers: pool[:n]}
			if err := h.push(ctx, img); err != nil {
				return err
			}
			scale = append(scale, img)
		}
		var conc []*benchImage
		for k := range concurrencyImages {
			img := &benchImage{Name: fmt.Sprintf("conc-%d", k), Layers: pool[len(pool)-concurrencyImages+k : len(pool)-concurrencyImages+k+1]}
			if err := h.push(ctx, img); err != nil {
				return err
			}
			conc = append(conc, img)
		}
		for run := range h.cfg.Runs {
			order := slices.Clone(scale)
			if run%2 == 1 {
				slices.Reverse(order)
			}
			for _, img := range order {
				if err := h.scaleRun(ctx, img, run); err != nil {
					return err
				}
			}
		}
		for run := range h.cfg.Runs {
			if err := h.concurrencyRun(ctx, conc, run); err != nil {
				return err
			}
		}
	}
	if h.cfg.ManyFiles > 0 {
		img, err := manyFilesImage(ctx, imgDir, h.cfg.ManyFiles, h.cfg.Log)
		if err != nil {
			return err
		}
		if err := h.push(ctx, img); err != nil {
			return err
		}
		if err := h.manyFilesRun(ctx, img); err != nil {
			return err
		}
	}
	return nil
}

// withAgent runs fn with a fresh agent under builds/label, keeping its
// log, and removes its directory afterwards.
func (h *harness) withAgent(ctx context.Context, label string, fn func(a *agentProc) error, build ...string) error {
	dir := filepath.Join(h.cfg.WorkDir, "builds", label)
	defer os.RemoveAll(dir)
	a, err := startAgent(ctx, h.setup, dir, build...)
	if err != nil {
		return err
	}
	err = fn(a)
	a.Stop()
	keepLog(a.log.Name(), filepath.Join(h.cfg.WorkDir, "logs", "agent-"+label+".log"))
	if err != nil {
		return fmt.Errorf("%w (agent log: logs/agent-%s.log)", err, label)
	}
	return nil
}

// scaleRun measures a cold and a warm-now build of a scale image.
func (h *harness) scaleRun(ctx context.Context, img *benchImage, run int) error {
	return h.withAgent(ctx, fmt.Sprintf("%s-%d", img.Name, run), func(a *agentProc) error {
		unix.Sync()
		for i, p := range []string{PipelineCold, PipelineWarmNow} {
			m, _, err := h.agentBuild(ctx, a, img.Name, run, p, envdBlob(img.Name, run, p), i > 0)
			if err != nil {
				return err
			}
			m.Content = img.uncompressed()
			h.report.Scale = append(h.report.Scale, m)
			h.logMeasurement(m)
		}
		return nil
	})
}

// concurrencyRun builds each image alone on a fresh agent, then all of
// them submitted together to one fresh agent, all cold.
func (h *harness) concurrencyRun(ctx context.Context, imgs []*benchImage, run int) error {
	c := ConcurrencyRun{Run: run, Load1: loadAvg1()}
	for _, img := range imgs {
		c.Images = append(c.Images, img.Name)
		err := h.withAgent(ctx, fmt.Sprintf("%s-solo-%d", img.Name, run), func(a *agentProc) error {
			unix.Sync()
			m, _, err := h.agentBuild(ctx, a, img.Name, run, PipelineCold, envdBlob(img.Name, run, "solo"), false)
			c.Solo = append(c.Solo, m.Wall)
			return err
		})
		if err != nil {
			return err
		}
	}
	err := h.withAgent(ctx, fmt.Sprintf("together-%d", run), func(a *agentProc) error {
		unix.Sync()
		ids := make([]string, len(imgs))
		began := make([]time.Time, len(imgs))
		for i, img := range imgs {
			ids[i] = fmt.Sprintf("bench-together-%d-%s-%d", run, img.Name, time.Now().UnixNano())
			var err error
			if began[i], err = a.submit(ctx, h.master, ids[i], h.refs[img.Name], envdBlob(img.Name, run, "together")); err != nil {
				return fmt.Errorf("bench: %w", err)
			}
		}
		var last time.Time
		for i := range imgs {
			res, err := a.wait(ctx, h.master, ids[i], began[i])
			if err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			c.Together = append(c.Together, res.Wall)
			if res.Done.After(last) {
				last = res.Done
			}
		}
		c.All = last.Sub(began[0])
		s, err := sampleProc(a.Pid())
		c.PeakRSS = s.PeakRSS
		return err
	})
	if err != nil {
		return err
	}
	h.report.Concurrency = append(h.report.Concurrency, c)
	h.logf("concurrency run %d: solo sum %.3f s, together %.3f s (%.2f)", run, c.SoloSum().Seconds(), c.All.Seconds(),
		c.All.Seconds()/c.SoloSum().Seconds())
	return nil
}

// manyFilesRun measures a cold build of the many-files image on an agent
// whose entry and tree-memory limits admit it.
func (h *harness) manyFilesRun(ctx context.Context, img *benchImage) error {
	entries := img.entries()
	build := []string{fmt.Sprintf("max_entries: %d", 2*entries+1000), "max_tree_memory: 8GiB"}
	return h.withAgent(ctx, img.Name, func(a *agentProc) error {
		idle, err := sampleProc(a.Pid())
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		unix.Sync()
		load := loadAvg1()
		m, _, err := h.agentBuild(ctx, a, img.Name, 0, PipelineCold, envdBlob(img.Name, 0, "cold"), true)
		if err != nil {
			return err
		}
		mf := ManyFilesRun{Entries: entries, Wall: m.Wall, CPU: m.CPU, PeakRSS: m.PeakRSS, IdleRSS: idle.RSS, Size: m.Size, Load1: load}
		h.report.ManyFiles = append(h.report.ManyFiles, mf)
		h.logf("%s: %d entries, %.3f s, peak RSS %.1f MiB (idle %.1f), %.0f B per entry", img.Name, entries, m.Wall.Seconds(),
			mib(mf.PeakRSS), mib(mf.IdleRSS), mf.BytesPerEntry())
		return nil
	}, build...)
}
