package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// targetStartCheck bounds the start check inside a build of the Debian
// image: its shell, the shell's libraries and loader, the envd.
const targetStartCheck = 20 * time.Millisecond

// StartCheckRun is the start check of one in-process build of an image:
// the time of its span (rootfs.SpanStartCheck), its result and how many
// shared libraries it resolved.
type StartCheckRun struct {
	Image     string        `json:"image"`
	Run       int           `json:"run"`
	Time      time.Duration `json:"time_ns"`
	Result    string        `json:"result"`
	Libraries int           `json:"libraries"`
}

// startChecks builds every image Runs times with rootfs.Builder in this
// process, its layers cached after the first, and records the start
// check's span: the check runs on the build's own tree (content read back
// from the image being written), as in the agent.
func (h *harness) startChecks(ctx context.Context) error {
	dir := filepath.Join(h.cfg.WorkDir, "builds", "start-check")
	defer os.RemoveAll(dir)
	store, cache := filepath.Join(dir, "store"), filepath.Join(dir, "layers")
	for _, d := range []string{store, cache} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
	}
	b, err := rootfs.NewBuilder(rootfs.Options{Store: rootfs.Store(store), HeadroomPercent: 10, HeadroomInodes: 4096,
		Pull: rootfs.PullOptions{CacheDir: cache, Insecure: []string{h.reg.Host}}})
	if err != nil {
		return fmt.Errorf("bench: start check builder: %w", err)
	}
	defer b.Close()
	for _, name := range h.cfg.Images {
		for run := range h.cfg.Runs {
			r, err := startCheckBuild(ctx, b, h.refs[name], fmt.Sprintf("rfs-startcheck-%s-%d", name, run))
			if err != nil {
				return fmt.Errorf("bench: start check of %s: %w", name, err)
			}
			r.Image, r.Run = name, run
			h.report.StartChecks = append(h.report.StartChecks, r)
			h.logf("start check %s run %d: %v, %s, %d libraries", name, run, r.Time, r.Result, r.Libraries)
		}
	}
	return nil
}

// startCheckBuild builds ref as artifact id (then removes it) and returns
// its start check span.
func startCheckBuild(ctx context.Context, b *rootfs.Builder, ref, id string) (StartCheckRun, error) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.WithoutCancel(ctx))
	ctx, root := tp.Tracer("bench").Start(ctx, "bench.start_check")
	defer root.End()
	img, err := b.Resolve(ctx, rootfs.Source{Ref: ref})
	if err != nil {
		return StartCheckRun{}, err
	}
	fp := fmt.Sprintf("%064x", len(id)) + id
	// An envd the check takes for a static binary of the platform
	// (amd64 when the config names none), so that the image's own
	// command decides the result.
	arch := img.Arch
	if arch == "" {
		arch = "amd64"
	}
	envd := images.StaticELF(arch, 64<<10)
	art, err := b.Build(ctx, rootfs.Spec{Image: img, ArtifactID: id, Fingerprint: fp, Envd: envd,
		StartCheck: rootfs.StartCheckWarn}, func(rootfs.Progress) {})
	if err != nil {
		return StartCheckRun{}, err
	}
	os.Remove(art.Path)
	for _, s := range rec.Ended() {
		if s.Name() != rootfs.SpanStartCheck {
			continue
		}
		r := StartCheckRun{Time: s.EndTime().Sub(s.StartTime())}
		for _, a := range s.Attributes() {
			switch a.Key {
			case "start_check.result":
				r.Result = a.Value.AsString()
			case "start_check.libraries":
				r.Libraries = int(a.Value.AsInt64())
			}
		}
		return r, nil
	}
	return StartCheckRun{}, fmt.Errorf("no %s span", rootfs.SpanStartCheck)
}

// writeStartChecks prints the start check's time per image: median and
// maximum over the runs.
func (r *Results) writeStartChecks(w io.Writer) {
	if len(r.StartChecks) == 0 {
		return
	}
	fmt.Fprintln(w, "| image | start check in a build: median ms | max ms | result | libraries |")
	fmt.Fprintln(w, "|---|---:|---:|---|---:|")
	for _, img := range r.startCheckImages() {
		med, mx, last := r.startCheckTimes(img)
		fmt.Fprintf(w, "| %s | %.2f | %.2f | %s | %d |\n", img, ms(med), ms(mx), last.Result, last.Libraries)
	}
	fmt.Fprintln(w)
}

// startCheckImages are the images with start check runs, in order.
func (r *Results) startCheckImages() []string {
	var out []string
	for _, s := range r.StartChecks {
		if !slices.Contains(out, s.Image) {
			out = append(out, s.Image)
		}
	}
	return out
}

// startCheckTimes returns the median and the largest start check time of
// img's runs, and its last run.
func (r *Results) startCheckTimes(img string) (med, mx time.Duration, last StartCheckRun) {
	var v []float64
	for _, s := range r.StartChecks {
		if s.Image == img {
			v = append(v, float64(s.Time))
			mx = max(mx, s.Time)
			last = s
		}
	}
	return time.Duration(median(v)), mx, last
}

// startCheckTargets checks the Debian image's start check against
// targetStartCheck.
func (r *Results) startCheckTargets() []Target {
	if !slices.Contains(r.startCheckImages(), ImageDebian) {
		return nil
	}
	med, mx, _ := r.startCheckTimes(ImageDebian)
	return []Target{{Name: "start check in a build of " + ImageDebian, Want: fmt.Sprintf("<= %v (max of runs)", targetStartCheck),
		Got: fmt.Sprintf("median %.2f ms, max %.2f ms", ms(med), ms(mx)), Pass: mx <= targetStartCheck}}
}
