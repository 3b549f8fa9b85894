package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

// buildResult is what `templatecenter build` prints.
type buildResult struct {
	ArtifactID      string             `json:"artifact_id"`
	Ext4Path        string             `json:"ext4_path"`
	Ext4SHA256      string             `json:"ext4_sha256"`
	Ext4SizeBytes   int64              `json:"ext4_size_bytes"`
	Fingerprint     string             `json:"template_spec_fingerprint"`
	SourceDigest    string             `json:"source_image_digest"`
	ImageConfig     rootfs.ImageConfig `json:"image_config"`
	CABaked         bool               `json:"cube_egress_ca_baked"`
	CAFingerprint   string             `json:"cube_egress_ca_fingerprint,omitempty"`
	CATargets       int                `json:"cube_egress_ca_targets_written"`
	DurationSeconds float64            `json:"duration_seconds"`
	// TemplateCheck is the start check's result (absent with
	// --start-check off).
	TemplateCheck *rootfs.StartCheck `json:"template_check,omitempty"`
}

// failedCheck is what build prints when the start check fails it.
type failedCheck struct {
	TemplateCheck rootfs.StartCheck `json:"template_check"`
}

var buildCmd = command{name: "build", synopsis: []string{
	"build --image REF [--envd FILE] [--ca FILE | --no-ca] [--out DIR] [--cache DIR] [--username U --password-stdin] [--insecure] [--start-check fail|warn|off]"},
	about: `
Build a template image without an agent or CubeMaster: pull REF (a registry
reference, oci-layout:DIR[:TAG] or docker-archive:FILE), write
OUT/<artifact_id>/<artifact_id>.ext4 and print the result as JSON. A
progress bar shows on a terminal. Layers are cached in
$XDG_CACHE_HOME/cube-templatecenter/layers (~/.cache/cube-templatecenter/layers
without XDG_CACHE_HOME), or in --cache; remove the directory to reclaim the
space. The result's template_check says whether the image's start command
can run in it; when it certainly cannot, the build fails (exit 1, nothing
written) and prints the check, unless --start-check is warn or off.`}

// build makes a template image without an agent or CubeMaster.
func build(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	f, err := parseBuildFlags(args, stdout)
	if err != nil {
		return err
	}
	in, err := readBuildInput(f, stdin)
	if err != nil {
		return err
	}
	b, err := rootfs.NewBuilder(in.builder)
	if err != nil {
		return err
	}
	defer b.Close()

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	began := time.Now()
	spec, art, err := in.run(ctx, b, newProgressBar(stderr))
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	var failed *rootfs.StartCheckError
	if errors.As(err, &failed) {
		// The whole check, for what the error's first problem leaves out.
		if perr := enc.Encode(failedCheck{failed.Result}); perr != nil {
			return perr
		}
	}
	if err != nil {
		return err
	}
	return enc.Encode(newBuildResult(spec, art, time.Since(began)))
}

// buildFlags are the build command's flags as given.
type buildFlags struct {
	image, envdPath, caPath, out, cache, username, platform, writable string
	noCA, passwordStdin, insecure                                     bool
	startCheck                                                        rootfs.StartCheckMode
}

// parseBuildFlags reads the build command's flags, refusing missing and
// contradictory ones.
func parseBuildFlags(args []string, stdout io.Writer) (buildFlags, error) {
	var f buildFlags
	fs := newFlagSet(buildCmd)
	fs.StringVar(&f.image, "image", "", "image reference (registry ref, oci-layout:DIR[:TAG], docker-archive:FILE)")
	fs.StringVar(&f.envdPath, "envd", "", "envd binary to install at /usr/local/bin/envd")
	fs.StringVar(&f.caPath, "ca", "/etc/cube/ca/cube-root-ca.crt", "egress CA certificate to bake in")
	fs.BoolVar(&f.noCA, "no-ca", false, "do not bake the egress CA")
	fs.StringVar(&f.out, "out", "out", "artifact store directory: the image lands in OUT/<artifact_id>/<artifact_id>.ext4")
	fs.StringVar(&f.cache, "cache", "", "layer cache directory (default: $XDG_CACHE_HOME/cube-templatecenter/layers, else ~/.cache/cube-templatecenter/layers)")
	fs.StringVar(&f.username, "username", "", "registry username")
	fs.BoolVar(&f.passwordStdin, "password-stdin", false, "read the registry password from standard input")
	fs.BoolVar(&f.insecure, "insecure", false, "reach the image's registry over plain HTTP")
	fs.StringVar(&f.platform, "platform", "linux/"+runtime.GOARCH, "platform to pick from a multi-platform image")
	fs.StringVar(&f.writable, "writable-layer-size", "20Gi", "writable_layer_size of the template spec (fingerprint input)")
	startCheck := fs.String("start-check", string(rootfs.StartCheckFail), "start check of the image's command: fail (the build when it cannot run), warn (report only) or off")
	operands, err := parseArgs(fs, buildCmd, args, stdout)
	if err != nil {
		return f, err
	}
	switch {
	case len(operands) != 0:
		return f, usageError(buildCmd, "takes no arguments, got %q", operands)
	case f.image == "":
		return f, usageError(buildCmd, "--image is required")
	case f.noCA && isSet(fs, "ca"):
		return f, usageError(buildCmd, "--ca and --no-ca contradict each other")
	case f.passwordStdin && f.username == "":
		return f, usageError(buildCmd, "--password-stdin needs --username")
	}
	if strings.TrimSpace(f.writable) == "" {
		return f, usageError(buildCmd, "--writable-layer-size must not be empty")
	}
	if f.startCheck, err = rootfs.ParseStartCheckMode(*startCheck); err != nil {
		return f, usageError(buildCmd, "--start-check: %v", err)
	}
	return f, nil
}

// buildInput is a build the command runs: the request as the agent would
// take it (template spec, envd), where its image comes from, and the
// builder that makes it.
type buildInput struct {
	req        api.Build
	source     rootfs.Source
	withCA     bool
	startCheck rootfs.StartCheckMode
	builder    rootfs.Options
}

// readBuildInput reads what the flags name (the password on standard
// input, the envd file) and creates the output directory.
func readBuildInput(f buildFlags, stdin io.Reader) (buildInput, error) {
	var err error
	if f.cache == "" {
		if f.cache, err = defaultCacheDir(os.Getenv); err != nil {
			return buildInput{}, err
		}
	}
	parsed, err := rootfs.ValidateImageRef(f.image)
	if err != nil {
		return buildInput{}, err
	}
	in := buildInput{source: rootfs.Source{Ref: f.image, Username: f.username}, withCA: !f.noCA, startCheck: f.startCheck,
		req: api.Build{Template: api.TemplateRequest{SourceImageRef: f.image, WritableLayerSize: f.writable}}}
	if f.passwordStdin {
		line, err := bufio.NewReader(stdin).ReadString('\n')
		if err != nil && err != io.EOF {
			return buildInput{}, fmt.Errorf("read password: %w", err)
		}
		in.source.Password = strings.TrimRight(line, "\r\n")
	}
	if f.envdPath != "" {
		if in.req.EnvdData, err = os.ReadFile(f.envdPath); err != nil {
			return buildInput{}, fmt.Errorf("read envd: %w", err)
		}
		if err := in.req.ValidateEnvd(); err != nil {
			return buildInput{}, fmt.Errorf("envd %s: %w", f.envdPath, err)
		}
	}
	outDir, err := filepath.Abs(f.out)
	if err != nil {
		return buildInput{}, err
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return buildInput{}, fmt.Errorf("create output directory: %w", err)
	}
	gz, _ := gzipInflater(os.Getenv)
	pull := rootfs.PullOptions{CacheDir: f.cache, Platform: platformOf(f.platform), LocalRoots: []string{"/"}, Gzip: gz}
	if f.insecure && parsed.Registry != "" {
		pull.Insecure = []string{parsed.Registry}
	}
	defaults := config.Default().Build
	in.builder = rootfs.Options{Store: rootfs.Store(outDir), CAPath: f.caPath, Pull: pull,
		HeadroomPercent: defaults.HeadroomPercent, HeadroomInodes: defaults.HeadroomInodes, DirectIO: defaults.DirectIO,
		Pacer: rootfs.NewMemoryPacer()}
	return in, nil
}

// run follows the build recipe with b: resolve the image, plan the build
// (rootfs.Plan), build it.
func (in buildInput) run(ctx context.Context, b *rootfs.Builder, bar *progressBar) (rootfs.Spec, *rootfs.Artifact, error) {
	bar.phase("resolving " + in.source.Ref)
	img, err := b.Resolve(ctx, in.source)
	if err != nil {
		return rootfs.Spec{}, nil, err
	}
	spec, err := rootfs.Plan(ctx, b, img, in.withCA, in.req.Name)
	var caErr *rootfs.CAError
	switch {
	case errors.As(err, &caErr):
		return rootfs.Spec{}, nil, fmt.Errorf("%w (use --no-ca to build without it)", caErr.Err)
	case err != nil:
		return rootfs.Spec{}, nil, err
	}
	spec.Envd, spec.StartCheck = in.req.EnvdData, in.startCheck
	art, err := b.Build(ctx, spec, bar.update)
	bar.done()
	return spec, art, err
}

// newBuildResult is what build prints of art, built from spec in took.
func newBuildResult(spec rootfs.Spec, art *rootfs.Artifact, took time.Duration) buildResult {
	caFingerprint := ""
	if spec.CA != nil {
		caFingerprint = spec.CA.Fingerprint
	}
	return buildResult{ArtifactID: art.ID, Ext4Path: art.Path, Ext4SHA256: art.SHA256, Ext4SizeBytes: art.Size,
		Fingerprint: spec.Fingerprint, SourceDigest: spec.Image.Digest, ImageConfig: spec.Image.Config,
		CABaked: art.CABaked, CAFingerprint: caFingerprint, CATargets: art.CATargets,
		DurationSeconds: took.Seconds(), TemplateCheck: art.StartCheck}
}

// defaultCacheDir is where build keeps its layer cache without --cache:
// the user's cache directory of the XDG base directory specification
// (a relative $XDG_CACHE_HOME is ignored, as the specification says), so
// it survives between builds and never lands in the current directory.
func defaultCacheDir(getenv func(string) string) (string, error) {
	base := getenv("XDG_CACHE_HOME")
	if !filepath.IsAbs(base) {
		home := getenv("HOME")
		if !filepath.IsAbs(home) {
			return "", errors.New("no cache directory for the layers: neither XDG_CACHE_HOME nor HOME is an absolute path; pass --cache DIR")
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "cube-templatecenter", "layers"), nil
}

// isSet reports whether the flag name was given on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// progressBar draws build progress on a terminal and stays silent otherwise.
// Downloads and layer writing report concurrently; the bar never goes back.
type progressBar struct {
	w    io.Writer
	tty  bool
	mu   sync.Mutex
	last string
	max  int
}

func newProgressBar(w io.Writer) *progressBar {
	p := &progressBar{w: w}
	if f, ok := w.(*os.File); ok {
		_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
		p.tty = err == nil
	}
	return p
}

func (p *progressBar) phase(s string) {
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", s)
	}
}

func (p *progressBar) update(pr rootfs.Progress) {
	if !p.tty {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	pr.Percent = max(pr.Percent, p.max)
	p.max = pr.Percent
	const width = 30
	filled := width * pr.Percent / 100
	line := fmt.Sprintf("[%s%s] %3d%%", strings.Repeat("#", filled), strings.Repeat(" ", width-filled), pr.Percent)
	if pr.Pull != nil && !pr.Pull.Done() {
		line += fmt.Sprintf(" pulling %d/%d layers, %.1f/%.1f MB", pr.Pull.CompletedLayers, pr.Pull.TotalLayers,
			float64(pr.Pull.DownloadedBytes)/1e6, float64(pr.Pull.TotalBytes)/1e6)
	} else if pr.Percent >= 60 {
		line += " writing ext4"
	}
	if line != p.last {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		p.last = line
	}
}

func (p *progressBar) done() {
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
