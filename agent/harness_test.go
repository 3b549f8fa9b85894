package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/trace"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/agent/space"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/spool"
	"github.com/cubesandbox/cubetemplatecenter/test/cubemaster"
)

const testToken = "s3cret-token"

// testRecordSecret signs artifact records; every replica of a test shares it.
const testRecordSecret = "record-secret-of-the-test-replicas"

// testBuilder is a fast, controllable builder for the agent's own logic
// (queue, dedup, reports, recovery); the real rootfs.Builder is exercised
// through the binary in cmd/templatecenter, test/system and bench. It
// resolves refs to stable digests and publishes a small real file through
// rootfs.Store, so reuse, deletion and recovery act on real files. Hooks
// inject failures and delays.
type testBuilder struct {
	store rootfs.Store

	mu         sync.Mutex
	builds     int
	resolveErr error
	// resolveHook, when set, runs at the start of Resolve.
	resolveHook func()
	caErr       error
	// beforePublish runs inside Build; an error fails the build.
	beforePublish func(ctx context.Context, spec rootfs.Spec) error
	// whileWriting runs inside Build once the temporary image is written,
	// with its path; an error discards it and fails the build, as
	// rootfs.Builder does.
	whileWriting func(ctx context.Context, spec rootfs.Spec, temp string) error
	// startCheck is the start check result the artifacts carry, when set.
	startCheck *rootfs.StartCheck
	// config is the image configuration Resolve gives, when set.
	config *rootfs.ImageConfig
}

func (b *testBuilder) Resolve(ctx context.Context, src rootfs.Source) (*rootfs.Image, error) {
	b.mu.Lock()
	err, hook := b.resolveErr, b.resolveHook
	b.mu.Unlock()
	if hook != nil {
		hook()
	}
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(src.Ref))
	cfg := rootfs.ImageConfig{Cmd: []string{"/bin/sh"}, Env: []string{"PATH=/bin"}}
	if b.config != nil {
		cfg = *b.config
	}
	return &rootfs.Image{Digest: "registry.test/" + src.Ref + "@sha256:" + hex.EncodeToString(sum[:]),
		Config: cfg, CompressedSize: 1000}, nil
}

// CacheStats makes the agent export the layer cache series.
func (b *testBuilder) CacheStats() rootfs.CacheStats {
	return rootfs.CacheStats{Bytes: 4096, Blobs: 2, ZstdBlobs: 1, TranscodePending: 1, Transcoded: 3, TranscodeFailures: 1,
		Hits: 5, Misses: 2}
}

func (b *testBuilder) LoadCA(ctx context.Context) (*rootfs.CA, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.caErr != nil {
		return nil, b.caErr
	}
	return &rootfs.CA{Fingerprint: "0123456789abcdef"}, nil
}

func (b *testBuilder) Build(ctx context.Context, spec rootfs.Spec, progress rootfs.ProgressFunc) (*rootfs.Artifact, error) {
	b.mu.Lock()
	b.builds++
	hook, writing, check := b.beforePublish, b.whileWriting, b.startCheck
	b.mu.Unlock()
	progress(rootfs.Progress{Percent: 50, Pull: &rootfs.PullProgress{TotalBytes: 1000, DownloadedBytes: 1000, TotalLayers: 1, CompletedLayers: 1}})
	if hook != nil {
		if err := hook(ctx, spec); err != nil {
			return nil, err
		}
	}
	f, err := b.store.CreateTemp(spec.ArtifactID)
	if err != nil {
		return nil, err
	}
	content := []byte("ext4 image of " + spec.Fingerprint)
	if _, err := f.Write(content); err != nil {
		b.store.Discard(f, spec.ArtifactID)
		return nil, err
	}
	if writing != nil {
		if err := writing(ctx, spec, f.Name()); err != nil {
			b.store.Discard(f, spec.ArtifactID)
			return nil, err
		}
	}
	if err := b.store.Commit(f, spec.ArtifactID); err != nil {
		return nil, err
	}
	path := b.store.ArtifactPath(spec.ArtifactID)
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(content)
	return &rootfs.Artifact{ID: spec.ArtifactID, Path: path, SHA256: hex.EncodeToString(sum[:]), Size: fi.Size(),
		ModTime: fi.ModTime(), CABaked: spec.CA != nil, CATargets: 1, StartCheck: check}, nil
}

func (b *testBuilder) buildCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.builds
}

// harness runs an in-process agent against a CubeMaster stand-in.
type harness struct {
	t       *testing.T
	dir     string
	cfg     *config.Config
	env     map[string]string
	sp      *spool.Spool
	builder *testBuilder
	master  *cubemaster.Server
	agent   *Agent
	url     string
	cancel  context.CancelFunc
	done    chan error
	logs    *syncBuffer
	// watchdog is passed as systemd's watchdog interval when set.
	watchdog time.Duration
	// purgeEvery replaces the agent's purge interval when set.
	purgeEvery time.Duration
	// loopBounds replace loops' liveness bounds, by loop, when set.
	loopBounds map[string]time.Duration
	// waitPath is what start polls until it answers 200 (default /health).
	waitPath string
	// objects is the blob store the agent keeps artifacts in, when set.
	objects blobstore.Store
	// database is CubeMaster's database submits are checked against, when
	// set.
	database Database
	// live receives pull progress, when set.
	live LiveProgress
	// tracer makes the agent's spans, when set.
	tracer trace.TracerProvider

	notesMu sync.Mutex
	notes   []string
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newHarness(t *testing.T, mutate func(*config.Config)) *harness {
	t.Helper()
	dir := t.TempDir()
	master, err := cubemaster.Start(testToken)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(master.Stop)
	cfg := config.Default()
	cfg.Common.HTTPBind, cfg.Common.HTTPPort = "127.0.0.1", 0
	cfg.Store.Dir = filepath.Join(dir, "store")
	cfg.Store.WorkDir = filepath.Join(dir, "work")
	cfg.Spool.Path = filepath.Join(dir, "state", "spool.db")
	cfg.Master.Addr = master.URL()
	cfg.Master.Token = testToken
	cfg.Master.RetryInitial = 20 * time.Millisecond
	cfg.Master.RetryMax = 200 * time.Millisecond
	cfg.Build.HeartbeatInterval = time.Hour
	cfg.Shutdown.Timeout = 5 * time.Second
	cfg.ArtifactStore.RecordSecret = testRecordSecret
	if mutate != nil {
		mutate(cfg)
	}
	if err := os.MkdirAll(cfg.Store.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, dir: dir, cfg: cfg, master: master, builder: &testBuilder{store: rootfs.Store(cfg.Store.Dir)},
		env: map[string]string{}, logs: &syncBuffer{}}
	t.Cleanup(func() {
		h.stop()
		if t.Failed() {
			t.Logf("agent log:\n%s", h.logs.String())
		}
	})
	return h
}

// pauseAtPublish stops every build before it publishes: the build sends
// its artifact id on entered and waits until release is closed.
func (h *harness) pauseAtPublish() (entered <-chan string, release chan struct{}) {
	ids, release := make(chan string, 1), make(chan struct{})
	h.builder.beforePublish = func(ctx context.Context, spec rootfs.Spec) error {
		ids <- spec.ArtifactID
		<-release
		return nil
	}
	return ids, release
}

// start opens the spool and runs a fresh Agent on it.
func (h *harness) start() {
	h.t.Helper()
	sp, err := spool.Open(context.Background(), h.cfg.Spool.Path)
	if err != nil {
		h.t.Fatal(err)
	}
	h.sp = sp
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		h.t.Fatal(err)
	}
	h.url = "http://" + ln.Addr().String()
	logger := slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := *h.cfg
	h.agent = New(Options{Config: &cfg, Spool: sp, Builder: h.builder, Logger: logger, BlobStore: h.objects,
		Database: h.database, LiveProgress: h.live, BuildInfo: BuildInfo{Version: "v-test", Revision: "rev-test"},
		TracerProvider: h.tracer,
		Load: func() (*config.Config, error) {
			return config.Load(func(k string) (string, bool) { v, ok := h.env[k]; return v, ok }, logger)
		},
		Watchdog: h.watchdog,
		Notify: func(s string) {
			h.notesMu.Lock()
			h.notes = append(h.notes, s)
			h.notesMu.Unlock()
		}})
	if h.purgeEvery > 0 {
		h.agent.purgeEvery = h.purgeEvery
	}
	h.agent.boundOverride = h.loopBounds
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- h.agent.Run(ctx, ln) }()
	h.waitHealthy()
}

func (h *harness) waitHealthy() {
	h.t.Helper()
	path := h.waitPath
	if path == "" {
		path = "/health"
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(h.url + path)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.t.Fatalf("agent at %s never answered 200 on %s", h.url, path)
}

// healthBody is what /health answers; the errors, warnings, space and
// credentials source only to a caller with the token.
type healthBody struct {
	Status      string                `json:"status"`
	Checks      map[string]bool       `json:"checks"`
	Errors      map[string]string     `json:"errors"`
	Warnings    map[string]string     `json:"warnings"`
	Space       map[string]space.View `json:"space"`
	Credentials string                `json:"blobstore_credentials"`
}

// health fetches /health, with the token when verbose.
func (h *harness) health(verbose bool) (int, healthBody) {
	h.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, h.url+"/health", nil)
	if verbose {
		req.Header.Set(api.TokenHeader, testToken)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	var body healthBody
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		h.t.Fatalf("decode /health: %v", err)
	}
	return resp.StatusCode, body
}

// waitHealth polls /health with the token until cond holds on its answer:
// /health serves the checker's last round, which follows a change within
// a round or two.
func (h *harness) waitHealth(what string, cond func(int, healthBody) bool) (int, healthBody) {
	h.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := h.health(true)
		if cond(code, body) {
			return code, body
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("/health: %s never showed; last answer %d %+v", what, code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop stops the agent gracefully and closes its spool.
func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("Run returned %v", err)
		}
	case <-time.After(15 * time.Second):
		h.t.Error("agent did not stop within 15s")
	}
	h.cancel = nil
	h.sp.Close()
}

func (h *harness) notifications() []string {
	h.notesMu.Lock()
	defer h.notesMu.Unlock()
	return append([]string(nil), h.notes...)
}

// buildBody is a valid build request for job id and image ref, with a
// template field the agent does not know (it must keep it) and a download
// base the reports give back as master_node_ip.
func buildBody(id, ref string) map[string]any {
	body := cubemaster.BuildRequest(id, ref, map[string]any{"unknown_future_field": map[string]any{"kept": true}})
	body["download_base_url"] = "10.0.0.1:8089"
	return body
}

// post sends a JSON (or raw []byte) body with the test token.
func (h *harness) post(path string, body any) (int, map[string]any) {
	h.t.Helper()
	return h.postWithToken(path, body, testToken)
}

func (h *harness) postWithToken(path string, body any, token string) (int, map[string]any) {
	h.t.Helper()
	data, ok := body.([]byte)
	if !ok {
		var err error
		if data, err = json.Marshal(body); err != nil {
			h.t.Fatal(err)
		}
	}
	req, err := http.NewRequest(http.MethodPost, h.url+path, bytes.NewReader(data))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set(api.TokenHeader, token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	json.Unmarshal(raw, &out)
	return resp.StatusCode, out
}

func (h *harness) submit(id, ref string) {
	h.t.Helper()
	if code, body := h.post("/tc/api/v1/build", buildBody(id, ref)); code != http.StatusOK || body["status"] != "accepted" || body["job_id"] != id {
		h.t.Fatalf("submit %s: %d %v, want 200 accepted", id, code, body)
	}
}

// terminal waits for the job's terminal report to reach CubeMaster and
// leave the outbox.
func (h *harness) terminal(id string) cubemaster.Callback {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cb, err := h.master.WaitTerminal(ctx, id)
	if err != nil {
		h.t.Fatalf("terminal report of %s: %v", id, err)
	}
	// The outbox lets the report go just after CubeMaster's answer;
	// until then a delete of its artifact is refused, as it must be.
	for {
		reps, err := h.sp.Reports(ctx, id)
		if err == nil && len(reps) == 0 {
			return cb
		}
		if ctx.Err() != nil {
			h.t.Fatalf("reports of %s still in the outbox after its terminal report arrived: %v %v", id, reps, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitJob waits until the spool shows the job in state.
func (h *harness) waitJob(id string, state spool.State) spool.Job {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		j, err := h.sp.Job(context.Background(), id)
		if err == nil && j.State == state {
			return j
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("job %s: state %s (err %v), want %s", id, j.State, err, state)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func statusPhases(cbs []cubemaster.Callback) []string {
	var out []string
	for _, c := range cbs {
		switch {
		case c.Field("status") != "":
			out = append(out, fmt.Sprintf("%s/%s/%d", c.Field("status"), c.Field("phase"), c.Int("progress")))
		case c.Field("template_spec_fingerprint") != "":
			out = append(out, "fingerprint")
		case c.Body["pull_total_bytes"] != nil:
			out = append(out, "pull")
		}
	}
	return out
}

// tempSpool opens a spool of its own for a test that needs no harness; it
// is closed when the test ends.
func tempSpool(t *testing.T) *spool.Spool {
	t.Helper()
	sp, err := spool.Open(context.Background(), filepath.Join(t.TempDir(), "spool.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close() })
	return sp
}

// metric reads series name (without the namespace) with the given label
// pairs from the registry /metrics serves: a counter's or gauge's value, a
// histogram's sample count. A series the registry does not have is 0.
func (h *harness) metric(name string, labelPairs ...string) float64 {
	h.t.Helper()
	mfs, err := h.agent.metrics.registry.Gather()
	if err != nil {
		h.t.Fatalf("gather metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != namespace+"_"+name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labelPairs); i += 2 {
				if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
					return l.GetName() == labelPairs[i] && l.GetValue() == labelPairs[i+1]
				}) {
					continue series
				}
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}
