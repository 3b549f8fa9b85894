package bench

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubesandbox/cubetemplatecenter/test/cubemaster"
	"github.com/cubesandbox/cubetemplatecenter/test/registry"
)

// Config configures Run.
type Config struct {
	// WorkDir holds the generated images, the registry's storage and
	// every build's files. Generated images are kept between runs.
	WorkDir string
	// Agent is the templatecenter binary.
	Agent string
	// Runs is how often each pipeline runs on each image.
	Runs int
	// Images are the images to measure (DefaultImages when empty).
	Images []string
	// Verify compares upstream's and the agent's image trees (loop
	// mounts, needs root) once per image.
	Verify bool
	// HostFS runs the builds in WorkDir's own filesystem instead of a
	// fresh journaled ext4 filesystem loop-mounted at WorkDir/builds.
	HostFS bool
	// ScratchSize is the size of that filesystem (DefaultScratchSize when
	// 0).
	ScratchSize int64
	// Replicas adds the two-replica rows (a MariaDB server started for
	// them), after the main run.
	Replicas bool
	// ReuseSamples is how many reuse submissions each run measures
	// (DefaultReuseSamples when 0).
	ReuseSamples int
	// ReuseLoadSamples is how many reuses under load each image measures
	// (DefaultReuseLoadSamples when 0, none when negative).
	ReuseLoadSamples int
	// ScaleLayerBytes is the content of one layer of the scale curve's
	// images (ScaleSteps layers each) and of the concurrency images; 0
	// measures neither.
	ScaleLayerBytes int64
	// ManyFiles is the file count of the many-files image built once for
	// its memory per entry; 0 skips it.
	ManyFiles int
	// Links are the link models of the link rows: cold builds through a
	// linkproxy in front of the registry; none skips them.
	Links []Link
	// LinkImages are the images measured through the links
	// (DefaultLinkImages when nil).
	LinkImages []string
	// Log receives progress lines (discarded when nil).
	Log io.Writer
}

// Run measures upstream's pipeline and the agent on every image, Runs
// times each, alternating which goes first. Any failed build ends it with
// an error.
func Run(ctx context.Context, cfg Config) (*Results, error) {
	if cfg.Runs < 1 {
		return nil, errors.New("bench: runs must be at least 1")
	}
	if cfg.Agent == "" || cfg.WorkDir == "" {
		return nil, errors.New("bench: agent binary and work directory are required")
	}
	if len(cfg.Images) == 0 {
		cfg.Images = DefaultImages()
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if cfg.ScratchSize == 0 {
		cfg.ScratchSize = DefaultScratchSize
	}
	if cfg.ReuseSamples == 0 {
		cfg.ReuseSamples = DefaultReuseSamples
	}
	if cfg.LinkImages == nil {
		cfg.LinkImages = DefaultLinkImages()
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("bench: run as root (umoci unpack and mkfs.ext4 -d keep ownership, debootstrap and loop mounts need it)")
	}
	var err error
	if cfg.WorkDir, err = filepath.Abs(cfg.WorkDir); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if cfg.Agent, err = filepath.Abs(cfg.Agent); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if err := EnsureTools(ctx, cfg.Images, cfg.Log); err != nil {
		return nil, err
	}
	h := &harness{cfg: cfg}
	defer h.close()
	return h.run(ctx)
}

// harness holds what one Run sets up.
type harness struct {
	cfg    Config
	master *cubemaster.Server
	reg    *registry.Registry
	fs     *scratchFS
	setup  agentSetup
	caPEM  []byte
	refs   map[string]string
	images map[string]*benchImage
	report *Results
}

// DefaultReuseSamples is Config.ReuseSamples's default.
const DefaultReuseSamples = 10

// close stops what run started and removes the registry's storage and
// the scratch filesystem; the generated images stay for the next run.
func (h *harness) close() {
	if h.reg != nil {
		h.reg.Stop()
		if err := os.RemoveAll(h.reg.Dir); err != nil {
			h.logf("remove registry storage: %v", err)
		}
	}
	if h.master != nil {
		h.master.Stop()
	}
	if h.fs != nil {
		if err := h.fs.Close(); err != nil {
			h.logf("%v", err)
		}
	}
}

func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(h.cfg.Log, format+"\n", args...)
}

func (h *harness) run(ctx context.Context) (*Results, error) {
	w := h.cfg.WorkDir
	scratchImage, buildsDir := scratchPaths(w)
	releaseScratch(scratchImage, buildsDir)
	for _, d := range []string{"registry", "builds", "logs"} {
		if err := os.RemoveAll(filepath.Join(w, d)); err != nil {
			return nil, fmt.Errorf("bench: clean %s: %w", d, err)
		}
	}
	for _, d := range []string{"builds", "logs"} {
		if err := os.MkdirAll(filepath.Join(w, d), 0o755); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
	}
	load, _ := readLoad()
	h.report = &Results{Started: time.Now(), Host: hostInfo(), Runs: h.cfg.Runs, LoadStart: load,
		Filesystem: "host filesystem of " + buildsDir}
	if !h.cfg.HostFS {
		var err error
		if h.fs, err = mountScratch(ctx, scratchImage, buildsDir, h.cfg.ScratchSize); err != nil {
			return nil, err
		}
		h.report.Filesystem = fmt.Sprintf("journaled ext4 (mkfs.ext4 defaults), %d GiB, on a direct-I/O loop device backed by %s", h.cfg.ScratchSize>>30, scratchImage)
	}

	caPath := filepath.Join(w, "cube-root-ca.crt")
	pemBytes, err := writeCA(caPath)
	if err != nil {
		return nil, err
	}
	h.caPEM = pemBytes
	if h.master, err = cubemaster.Start(benchToken); err != nil {
		return nil, fmt.Errorf("bench: start CubeMaster stand-in: %w", err)
	}
	regDir := filepath.Join(w, "registry")
	if err := os.MkdirAll(regDir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if h.reg, err = registry.Start(ctx, registry.Options{Dir: regDir}); err != nil {
		return nil, err
	}
	h.setup = agentSetup{Binary: h.cfg.Agent, Master: h.master, RegistryHost: h.reg.Host, CAPath: caPath}
	h.refs, h.images = map[string]string{}, map[string]*benchImage{}
	for _, name := range h.cfg.Images {
		img, err := prepareImage(ctx, name, filepath.Join(w, "images"), h.cfg.Log)
		if err != nil {
			return nil, err
		}
		if err := h.push(ctx, img); err != nil {
			return nil, err
		}
	}

	for run := range h.cfg.Runs {
		for _, name := range h.cfg.Images {
			if err := h.iteration(ctx, name, run); err != nil {
				return nil, err
			}
		}
	}
	if err := h.reuseLoad(ctx); err != nil {
		return nil, err
	}
	if err := h.startChecks(ctx); err != nil {
		return nil, err
	}
	if err := h.extras(ctx); err != nil {
		return nil, err
	}
	if h.cfg.Replicas {
		if err := h.measureReplicas(ctx); err != nil {
			return nil, err
		}
	}
	h.report.Finished = time.Now()
	h.report.LoadEnd, _ = readLoad()
	return h.report, nil
}

// push writes img to the registry and records it.
func (h *harness) push(ctx context.Context, img *benchImage) error {
	ref, err := img.push(ctx, h.reg.Host)
	if err != nil {
		return err
	}
	h.refs[img.Name], h.images[img.Name] = ref, img
	h.report.Images = append(h.report.Images, ImageInfo{Name: img.Name, Ref: ref, Layers: len(img.Layers),
		Compressed: img.compressed(), Uncompressed: img.uncompressed(), Entries: img.entries()})
	h.logf("pushed %s", ref)
	return nil
}

// iteration measures one run of every pipeline on one image: upstream,
// the agent on loopback, the agent through the links; odd runs go in the
// reverse order.
func (h *harness) iteration(ctx context.Context, name string, run int) error {
	dir := filepath.Join(h.cfg.WorkDir, "builds", fmt.Sprintf("%s-%d", name, run))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer os.RemoveAll(dir)
	warmEnvd := envdBlob(name, run, "warm")
	var agent *agentProc
	agentLog := filepath.Join(h.cfg.WorkDir, "logs", fmt.Sprintf("agent-%s-%d.log", name, run))
	defer func() {
		if agent != nil {
			agent.Stop()
			keepLog(agent.log.Name(), agentLog)
		}
	}()
	doUpstream := func() error {
		return h.measureUpstream(ctx, name, run, filepath.Join(dir, "upstream"), warmEnvd)
	}
	doAgent := func() error {
		var err error
		if agent, err = h.measureAgent(ctx, name, run, filepath.Join(dir, "tc"), warmEnvd); err != nil && agent != nil {
			return fmt.Errorf("%w (agent log: %s)", err, agentLog)
		}
		return err
	}
	// The link-model builds of the image run in the same iteration as the
	// loopback cold build they are compared with.
	doLinks := func() error { return h.measureLinks(ctx, name, run, dir) }
	steps := []func() error{doUpstream, doAgent, doLinks}
	if run%2 == 1 {
		slices.Reverse(steps)
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	if cold := h.find(name, run, PipelineCold); cold != nil {
		fl, err := measureFloor(ctx, h.images[name], cold.Allocated, dir)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		fl.Run, fl.Size, fl.Allocated = run, cold.Size, cold.Allocated
		h.report.Measurements = append(h.report.Measurements, fl)
		h.logMeasurement(fl)
	}
	if h.cfg.Verify && run == 0 {
		// Upstream's run injected the warm build's envd: same content.
		return h.verify(ctx, name, h.find(name, run, PipelineUpstream), h.find(name, run, PipelineWarm), dir)
	}
	return nil
}

// find returns the measurement of pipeline p in run of image name.
func (h *harness) find(name string, run int, p string) *Measurement {
	for i := range h.report.Measurements {
		m := &h.report.Measurements[i]
		if m.Image == name && m.Run == run && m.Pipeline == p {
			return m
		}
	}
	return nil
}

// verify compares the trees of upstream's and the agent's images.
func (h *harness) verify(ctx context.Context, name string, up, warm *Measurement, dir string) error {
	if up == nil || warm == nil {
		return errors.New("bench: verify: measurements missing")
	}
	sum, diffs, err := compareImages(ctx, up.path, warm.path, dir)
	if err != nil {
		return fmt.Errorf("bench: verify %s: %w", name, err)
	}
	if len(diffs) == 0 {
		h.report.Verified = append(h.report.Verified, fmt.Sprintf("verified %s: upstream's and the agent's images hold the same tree (%d entries, %.1f MiB of file content; timestamps and directory sizes not compared)",
			name, sum.Entries, mib(sum.Bytes)))
	} else {
		h.report.Mismatch = true
		h.report.Verified = append(h.report.Verified, fmt.Sprintf("MISMATCH %s: the images differ (first: upstream, second: agent):\n  %s", name, strings.Join(diffs, "\n  ")))
	}
	h.logf("%s", h.report.Verified[len(h.report.Verified)-1])
	return nil
}

func upstreamID(name string, run int) string { return fmt.Sprintf("rfs-upstream-%s-%d", name, run) }

// measureUpstream runs upstream's pipeline once.
func (h *harness) measureUpstream(ctx context.Context, name string, run int, dir string, envd []byte) error {
	unix.Sync()
	m := Measurement{Image: name, Pipeline: PipelineUpstream, Run: run, Load1: loadAvg1()}
	res, err := runUpstream(ctx, upstreamJob{Ref: h.refs[name], Dir: dir, ID: upstreamID(name, run), Envd: envd, CAPEM: h.caPEM})
	if err != nil {
		return fmt.Errorf("bench: upstream pipeline on %s: %w", name, err)
	}
	m.Wall, m.Steps, m.SHA256 = res.Wall, res.Steps, res.SHA256
	for _, s := range res.Steps {
		m.PeakRSS = max(m.PeakRSS, s.PeakRSS)
		m.Written += s.Written
		m.CPU += s.CPU
	}
	if m.Size, m.Allocated, err = fileSize(res.Image); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	m.path = res.Image
	h.report.Measurements = append(h.report.Measurements, m)
	h.logMeasurement(m)
	return nil
}

func (h *harness) logMeasurement(m Measurement) {
	h.logf("%-7s run %d %-9s %7.3f s  cpu %6.2f s  peak RSS %6.1f MiB  written %7.1f MiB  size %7.1f MiB  load %.2f", m.Image, m.Run, m.Pipeline,
		m.Wall.Seconds(), m.CPU.Seconds(), mib(m.PeakRSS), mib(m.Written), mib(m.Size), m.Load1)
}

// measureAgent starts an agent with an empty layer cache and measures a
// cold build, a warm build submitted the moment the cold one's BUILT
// report arrives (warm-now), the background work left after them, a warm
// build with the cache idle, and reuses of the warm build's spec. Each
// build has its own envd (warmEnvd for the warm build, which upstream's
// run also injects). It returns the agent, still running (also with an
// error, once started), so that its image stays in place until the
// iteration ends and its log can be kept.
func (h *harness) measureAgent(ctx context.Context, name string, run int, dir string, warmEnvd []byte) (*agentProc, error) {
	a, err := startAgent(ctx, h.setup, dir)
	if err != nil {
		return nil, err
	}
	// The cold build's peak is the process's since start.
	unix.Sync()
	cold, _, err := h.agentBuild(ctx, a, name, run, PipelineCold, envdBlob(name, run, "cold"), false)
	if err != nil {
		return a, err
	}
	h.record(cold)
	// At once: no sync, no waiting for the layer cache.
	now, nowAfter, err := h.agentBuild(ctx, a, name, run, PipelineWarmNow, envdBlob(name, run, "warm-now"), true)
	if err != nil {
		return a, err
	}
	h.record(now)
	if err := h.measureRecode(ctx, a, cold, nowAfter, nowAfter.at); err != nil {
		return a, err
	}
	unix.Sync()
	warm, _, err := h.agentBuild(ctx, a, name, run, PipelineWarm, warmEnvd, true)
	if err != nil {
		return a, err
	}
	h.record(warm)
	for range h.cfg.ReuseSamples {
		reuse, _, err := h.agentBuild(ctx, a, name, run, PipelineReuse, warmEnvd, true)
		if err != nil {
			return a, err
		}
		if reuse.SHA256 != warm.SHA256 {
			return a, fmt.Errorf("bench: reuse of %s returned %s, the warm build made %s", name, reuse.SHA256, warm.SHA256)
		}
		h.record(reuse)
	}
	return a, nil
}

// sampledBuild is the process sample after a build and when its BUILT
// report arrived.
type sampledBuild struct {
	procSample
	at time.Time
}

// agentBuild submits one build to a and measures it; resetPeak has the
// peak RSS count from the build's start rather than the process's.
func (h *harness) agentBuild(ctx context.Context, a *agentProc, name string, run int, pipeline string, envd []byte, reset bool) (Measurement, sampledBuild, error) {
	return h.agentBuildRef(ctx, a, name, h.refs[name], run, pipeline, envd, reset)
}

// agentBuildRef is agentBuild of the image name pulled as ref.
func (h *harness) agentBuildRef(ctx context.Context, a *agentProc, name, ref string, run int, pipeline string, envd []byte, reset bool) (Measurement, sampledBuild, error) {
	if reset {
		if err := resetPeak(a.Pid()); err != nil {
			return Measurement{}, sampledBuild{}, fmt.Errorf("bench: %w", err)
		}
	}
	before, err := sampleProc(a.Pid())
	if err != nil {
		return Measurement{}, sampledBuild{}, fmt.Errorf("bench: %w", err)
	}
	m := Measurement{Image: name, Pipeline: pipeline, Run: run, Load1: loadAvg1()}
	jobID := fmt.Sprintf("bench-%s-%d-%s-%d", name, run, pipeline, time.Now().UnixNano())
	res, err := a.build(ctx, h.master, jobID, ref, envd)
	if err != nil {
		return m, sampledBuild{}, fmt.Errorf("bench: %s build of %s: %w", pipeline, name, err)
	}
	after, err := sampleProc(a.Pid())
	if err != nil {
		return m, sampledBuild{}, fmt.Errorf("bench: %w", err)
	}
	m.Wall, m.SHA256, m.PeakRSS = res.Wall, res.SHA256, after.PeakRSS
	if m.Builder, err = a.builderTime(jobID); err != nil {
		return m, sampledBuild{}, fmt.Errorf("bench: %w", err)
	}
	m.Written, m.CPU = after.WriteBytes-before.WriteBytes, after.CPU-before.CPU
	m.Cancelled = after.CancelledBytes - before.CancelledBytes
	if m.Size, m.Allocated, err = fileSize(res.Path); err != nil {
		return m, sampledBuild{}, fmt.Errorf("bench: %w", err)
	}
	m.path = res.Path
	return m, sampledBuild{after, res.Done}, nil
}

// record adds m to the report and logs it.
func (h *harness) record(m Measurement) {
	h.report.Measurements = append(h.report.Measurements, m)
	h.logMeasurement(m)
}

// measureRecode measures the agent's background work after the first
// builds (the layer cache re-encoding the new gzip layers as zstd), from
// the BUILT report of the last of them, whose process sample is at, until
// the cache is idle, so that the warm build neither competes with it nor
// misses its result. Its sizes are those of the cold build's image.
func (h *harness) measureRecode(ctx context.Context, a *agentProc, cold Measurement, at sampledBuild, built time.Time) error {
	if err := resetPeak(a.Pid()); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := a.waitCacheIdle(ctx); err != nil {
		return fmt.Errorf("bench: %s: %w", cold.Image, err)
	}
	idle := time.Now()
	after, err := sampleProc(a.Pid())
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	transcoded, err := a.metric(ctx, "cube_templatecenter_layer_cache_transcoded_total")
	if err != nil {
		return fmt.Errorf("bench: %s: %w", cold.Image, err)
	}
	m := Measurement{Image: cold.Image, Pipeline: PipelineRecode, Run: cold.Run, Load1: cold.Load1,
		Wall: idle.Sub(built), CPU: after.CPU - at.CPU, Written: after.WriteBytes - at.WriteBytes,
		Cancelled: after.CancelledBytes - at.CancelledBytes, PeakRSS: after.PeakRSS,
		Size: cold.Size, Allocated: cold.Allocated, Transcoded: int(transcoded)}
	h.record(m)
	return nil
}

// envdBlob is a stand-in envd: 8 KiB starting with an ELF header's magic,
// different for every image, run and label, so each changes the
// fingerprint.
func envdBlob(image string, run int, label string) []byte {
	f := fnv.New64a()
	fmt.Fprintf(f, "%s/%d/%s", image, run, label)
	_, c := newRand(f.Sum64())
	b := make([]byte, 8<<10)
	c.Read(b)
	copy(b, []byte{0x7f, 'E', 'L', 'F', 2, 1, 1, 0})
	return b
}

// writeCA writes a throwaway self-signed root CA standing in for the
// CubeEgress CA and returns its PEM.
func writeCA(path string) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("bench: CA key: %w", err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tcbench egress root CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("bench: CA certificate: %w", err)
	}
	p := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(path, p, 0o644); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	return p, nil
}

func readLoad() ([3]float64, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return [3]float64{}, err
	}
	return parseLoadAvg(string(b))
}

// hostInfo describes the machine: kernel, CPU, cores, memory, tool
// versions.
func hostInfo() string {
	var u unix.Utsname
	unix.Uname(&u)
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	var si unix.Sysinfo_t
	unix.Sysinfo(&si)
	versions := []string{runtime.Version()}
	for _, v := range [][]string{{"skopeo", "--version"}, {"umoci", "--version"}, {"mkfs.ext4", "-V"}} {
		p, err := lookTool(v[0])
		if err != nil {
			continue
		}
		out, _ := exec.Command(p, v[1:]...).CombinedOutput()
		line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		versions = append(versions, line)
	}
	return fmt.Sprintf("Linux %s, %s, %d CPUs, %.1f GiB RAM; %s", unix.ByteSliceToString(u.Release[:]), cpu,
		runtime.NumCPU(), float64(si.Totalram)*float64(si.Unit)/(1<<30), strings.Join(versions, ", "))
}

// keepLog copies an agent's log out of the build directory before it is
// removed (best effort: the log only helps to explain a number).
func keepLog(from, to string) {
	if b, err := os.ReadFile(from); err == nil {
		os.WriteFile(to, b, 0o644)
	}
}
