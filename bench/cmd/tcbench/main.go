// Command tcbench measures CubeTemplateCenter against upstream's dockerless
// pipeline (`make bench`): it generates its images, serves them from a
// loopback docker-registry, builds each with upstream's tools and with the
// templatecenter agent (cold, warm right after, warm with the cache idle,
// reuse, and cold through a link model at a few bandwidths), measures the
// floor the hardware allows, then the agent alone on a scale curve, four
// images at once and an image of a million files, and prints the tables
// and the targets. Run it as root on an otherwise idle machine if you can;
// the load average is recorded with every run.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/cubesandbox/cubetemplatecenter/bench"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "tcbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tcbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	agent := fs.String("templatecenter", "bin/templatecenter", "agent binary to measure")
	work := fs.String("work", "/var/tmp/cube-templatecenter-bench", "work directory: generated images (kept), registry storage, builds")
	runs := fs.Int("n", 3, "runs per pipeline and image")
	images := fs.String("images", strings.Join(bench.DefaultImages(), ","), "images to measure: "+strings.Join(append(bench.DefaultImages(), bench.ImageTiny), ", "))
	verify := fs.Bool("verify", true, "compare upstream's and the agent's image trees once per image (loop mounts)")
	replicas := fs.Bool("replicas", true, "add the two-replica rows (two agents on one MariaDB database and fs blob store)")
	hostFS := fs.Bool("hostfs", false, "build in the work directory's filesystem instead of a fresh journaled ext4 loop-mounted at WORK/builds")
	reuse := fs.Int("reuse-samples", bench.DefaultReuseSamples, "reuse submissions measured per run and image")
	reuseLoad := fs.Int("reuse-load-samples", bench.DefaultReuseLoadSamples, "reuses submitted as a cold build's BUILT arrives, per image; negative skips them")
	scaleMiB := fs.Int64("scale-layer-mib", bench.DefaultScaleLayerBytes>>20, "MiB of content per layer of the scale curve (1, 2, 4 and 8 layers) and of the 4 concurrency images; 0 skips both")
	many := fs.Int("many-files", bench.DefaultManyFiles, "files of the image built once for the memory per entry; 0 skips it")
	linkList := fs.String("links", bench.DefaultLinks, "link models of the link rows (cold builds of the "+
		strings.Join(bench.DefaultLinkImages(), " and ")+" images through a throttling proxy), comma-separated: a bandwidth in Mbit/s "+
		"shared by all connections, optionally /Mbit/s per connection (1000/200); empty skips them")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	links, err := bench.ParseLinks(*linkList)
	if err != nil {
		return fmt.Errorf("-links: %w", err)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	report, err := bench.Run(ctx, bench.Config{WorkDir: *work, Agent: *agent, Runs: *runs,
		Images: strings.Split(*images, ","), Verify: *verify, HostFS: *hostFS, Log: stderr,
		ReuseSamples: *reuse, ReuseLoadSamples: *reuseLoad, ScaleLayerBytes: *scaleMiB << 20, ManyFiles: *many, Replicas: *replicas,
		Links: links})
	if err != nil {
		return err
	}
	if err := report.Write(stdout); err != nil {
		return err
	}
	if err := saveReport(report, *work); err != nil {
		return err
	}
	if report.Mismatch {
		return errors.New("upstream's and the agent's images differ (see above): the comparison is not like for like")
	}
	return nil
}

// saveReport keeps the report as results.md and the raw measurements as
// results.json in the work directory.
func saveReport(r *bench.Results, work string) error {
	f, err := os.Create(filepath.Join(work, "results.md"))
	if err != nil {
		return fmt.Errorf("save report: %w", err)
	}
	defer f.Close()
	if err := r.Write(f); err != nil {
		return fmt.Errorf("save report: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("save report: %w", err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("save report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(work, "results.json"), b, 0o644); err != nil {
		return fmt.Errorf("save report: %w", err)
	}
	return nil
}
