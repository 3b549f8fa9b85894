package main

// Black-box tests of the templatecenter binary: built once (test/cmdbin), and
// every test runs it as a child process with its own configuration, store,
// spool and ports, against the CubeMaster stand-in of test/cubemaster.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/cubesandbox/cubetemplatecenter/test/childproc"
	"github.com/cubesandbox/cubetemplatecenter/test/cmdbin"
	"github.com/cubesandbox/cubetemplatecenter/test/cubemaster"
	"github.com/cubesandbox/cubetemplatecenter/test/dbserver"
	"github.com/cubesandbox/cubetemplatecenter/test/s3server"
	"github.com/cubesandbox/cubetemplatecenter/test/wait"
)

const (
	// testVersion is linked into the binary under test with -X main.Version.
	testVersion = "v0.0.0-blackbox"
	// testToken is the shared secret of tests that configure one.
	testToken = "blackbox-shared-token"
	// tokenHeader is the wire name of the shared-token header.
	tokenHeader = "X-Cube-Template-Callback-Token"
	// registrySecret is a registry password sent in build requests; it
	// must never be shown by the agent or the jobs command.
	registrySecret = "registry-password-must-not-leak"
	// unreachableImage lives on a port nothing listens on, so a build of it
	// ends FAILED at once, whether or not the rootfs builder is wired.
	unreachableImage = "127.0.0.1:1/blackbox/unreachable:latest"
	// waitLimit bounds every wait for something the agent does promptly.
	waitLimit = 20 * time.Second
	// shutdownTimeout is the shutdown.timeout of every test configuration.
	shutdownTimeout = 5 * time.Second
	// exitSlack is how long a process may take, past its own timeout, to
	// be reaped on a loaded machine.
	exitSlack = 3 * time.Second
)

// agentBuild is the binary under test: the version it prints is
// testVersion.
var agentBuild = cmdbin.Build{Version: testVersion}

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

// runTests builds the binary before any test runs, so that no test times
// the build as part of what it measures.
func runTests(m *testing.M) int {
	defer cmdbin.Cleanup()
	if _, err := agentBuild.Binary(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s3srv.Close()
	defer dbservers.Close()
	return m.Run()
}

// s3srv is the package's one S3 server, started on first use.
var s3srv s3server.Shared

// dbservers are the package's MariaDB and PostgreSQL servers, each started
// on first use, for CubeMaster's database.
var dbservers dbserver.Shared

// logBuffer collects a child's output and lets tests wait for a line.
type logBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

func newLogBuffer() *logBuffer { return &logBuffer{changed: make(chan struct{})} }

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	close(b.changed)
	b.changed = make(chan struct{})
	return n, err
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitLine blocks until one line holds every substring, and returns it.
func (b *logBuffer) waitLine(ctx context.Context, subs ...string) (string, error) {
	for {
		b.mu.Lock()
		ch, text := b.changed, b.buf.String()
		b.mu.Unlock()
		if line, ok := findLine(text, subs...); ok {
			return line, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("wait for a log line with %q: %w", subs, ctx.Err())
		case <-ch:
		}
	}
}

// findLine returns the first line of text holding every substring.
func findLine(text string, subs ...string) (string, bool) {
	for line := range strings.Lines(text) {
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			return strings.TrimRight(line, "\n"), true
		}
	}
	return "", false
}

// proc is a child process whose output is kept for failure reports.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *logBuffer
	done <-chan struct{}
}

// startProc runs argv with exactly env; the process is killed (if still
// running) when the test ends, and its output logged if the test failed.
func startProc(t testing.TB, name string, env []string, argv ...string) *proc {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	return startCmd(t, name, cmd)
}

// startCmd is startProc for a command set up by the caller: its stderr,
// and its stdout unless the caller set one, go to the proc's log.
func startCmd(t testing.TB, name string, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{name: name, cmd: cmd, out: newLogBuffer()}
	if cmd.Stdout == nil {
		cmd.Stdout = p.out
	}
	cmd.Stderr = p.out
	p.done = childproc.Start(t, name, cmd, p.out, 0)
	return p
}

func (p *proc) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("send %v to %s: %v", sig, p.name, err)
	}
}

// kill sends SIGKILL and reaps the process.
func (p *proc) kill(t testing.TB) {
	t.Helper()
	p.signal(t, syscall.SIGKILL)
	p.waitExit(t, waitLimit)
}

// waitExit waits up to within for the process to end and returns its exit
// code (-1 when a signal ended it).
func (p *proc) waitExit(t testing.TB, within time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(within):
		t.Fatalf("%s did not exit within %s", p.name, within)
		return 0
	}
}

// stop sends SIGTERM and fails unless the process exits 0 within the
// configured shutdown.timeout.
func (p *proc) stop(t testing.TB) {
	t.Helper()
	p.signal(t, syscall.SIGTERM)
	if code := p.waitExit(t, shutdownTimeout+exitSlack); code != 0 {
		t.Fatalf("%s exited with code %d after SIGTERM, want 0", p.name, code)
	}
}

func (p *proc) waitLine(t testing.TB, subs ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	line, err := p.out.waitLine(ctx, subs...)
	if err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
	return line
}

// harness is one agent installation: configuration, store, spool, port and
// environment, reused across restarts.
type harness struct {
	t          testing.TB
	dir        string
	configPath string
	spoolPath  string
	port       int
	cfg        map[string]map[string]any
	env        map[string]string
}

// newHarness prepares an installation whose reports go to masterURL (the
// built-in default when empty) with the shared token (none when empty).
func newHarness(t testing.TB, masterURL, token string) *harness {
	t.Helper()
	dir := t.TempDir()
	h := &harness{
		t:          t,
		dir:        dir,
		configPath: filepath.Join(dir, "etc", "templatecenter.yaml"),
		spoolPath:  filepath.Join(dir, "state", "spool.db"),
		port:       childproc.FreePort(t),
	}
	// No installed configuration of the host leaks in (templatecenter.env).
	h.env = map[string]string{"CUBE_TEMPLATE_CENTER_CONFIG_PATH": h.configPath, sysconfDirEnv: filepath.Join(dir, "no-install")}
	if masterURL != "" {
		h.env["CUBE_MASTER_ADDR"] = masterURL
	}
	if token != "" {
		h.env["CUBE_TEMPLATE_CALLBACK_TOKEN"] = token
	}
	if err := os.MkdirAll(filepath.Dir(h.configPath), 0o755); err != nil {
		t.Fatal(err)
	}
	h.cfg = map[string]map[string]any{
		"common":   {"http_bind": "127.0.0.1", "http_port": h.port},
		"log":      {"level": "info", "format": "text"},
		"store":    {"dir": filepath.Join(dir, "store"), "work_dir": filepath.Join(dir, "work")},
		"spool":    {"path": h.spoolPath},
		"build":    {"max_concurrent_builds": 2, "heartbeat_interval": "1s", "ca_path": filepath.Join(dir, "ca.crt")},
		"master":   {"callback_timeout": "2s", "retry_initial": "100ms", "retry_max": "1s"},
		"shutdown": {"timeout": shutdownTimeout.String()},
		// The tests' registries (and unreachableImage) are on loopback,
		// which the agent denies by default: the one place they are let in.
		"registry": {"allow_networks": []string{"127.0.0.0/8", "::1/128"}},
	}
	return h
}

// set changes one "section.key" of the configuration (nil removes it); it
// takes effect at the next writeConfig.
func (h *harness) set(key string, v any) {
	section, name, ok := strings.Cut(key, ".")
	if !ok {
		h.t.Fatalf("config key %q has no section", key)
	}
	if h.cfg[section] == nil {
		h.cfg[section] = map[string]any{}
	}
	if v == nil {
		delete(h.cfg[section], name)
		return
	}
	h.cfg[section][name] = v
}

// writeConfig writes the configuration the way editors and config
// management do: to a temporary file, then renamed over the old one.
func (h *harness) writeConfig() {
	h.t.Helper()
	data, err := yaml.Marshal(h.cfg)
	if err != nil {
		h.t.Fatalf("encode config: %v", err)
	}
	h.writeConfigText(string(data))
}

func (h *harness) writeConfigText(text string) {
	h.t.Helper()
	f, err := os.CreateTemp(filepath.Dir(h.configPath), ".templatecenter-*.tmp")
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := f.WriteString(text); err != nil {
		h.t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(f.Name(), h.configPath); err != nil {
		h.t.Fatal(err)
	}
}

// environ is the child's whole environment: nothing of the test process's
// own (a JOURNAL_STREAM or NOTIFY_SOCKET there must not leak in) but PATH
// and HOME, the harness's variables, then extra ("NAME=value").
func (h *harness) environ(extra ...string) []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	keys := make([]string, 0, len(h.env))
	for k := range h.env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		env = append(env, k+"="+h.env[k])
	}
	return append(env, extra...)
}

func (h *harness) baseURL() string { return "http://127.0.0.1:" + strconv.Itoa(h.port) }

// startAgent writes the configuration, runs the agent and waits until its
// /health answers 200.
func (h *harness) startAgent(name string, extraEnv ...string) *proc {
	h.t.Helper()
	h.writeConfig()
	p := startProc(h.t, name, h.environ(extraEnv...), agentBuild.Path(h.t))
	waitHealthy(h.t, p, h.baseURL())
	return p
}

// waitHealthy polls base/health until it answers; it fails at once if the
// process exits.
func waitHealthy(t testing.TB, p *proc, base string) {
	t.Helper()
	if err := childproc.WaitHTTP(t.Context(), base+"/health", p.done, waitLimit); err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
}

// startCubeMaster runs the CubeMaster stand-in for the test's duration.
func startCubeMaster(t testing.TB, token string) *cubemaster.Server {
	t.Helper()
	cm, err := cubemaster.Start(token)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cm.Stop)
	return cm
}

// buildBody is a valid build request for jobID of image, with the
// registry credentials of the black-box registry; the egress CA is not
// asked for, so no CA file is needed.
func buildBody(t testing.TB, jobID, image string) []byte {
	t.Helper()
	body, err := json.Marshal(cubemaster.BuildRequest(jobID, image, map[string]any{
		"registry_username": "blackbox",
		"registry_password": registrySecret,
		"with_cube_ca":      false,
	}))
	if err != nil {
		t.Fatalf("encode build request: %v", err)
	}
	return body
}

// call makes one HTTP request, with the shared-token header when token is
// not empty, and decodes a JSON object answer.
func call(t testing.TB, method, url, token string, body []byte) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set(tokenHeader, token)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read answer: %v", method, url, err)
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: answer %d is not a JSON object: %q", method, url, resp.StatusCode, raw)
	}
	return resp.StatusCode, out
}

// submit posts a build of image and fails unless it is accepted with 200.
func submit(t testing.TB, base, token, jobID, image string) {
	t.Helper()
	status, body := call(t, http.MethodPost, base+"/tc/api/v1/build", token, buildBody(t, jobID, image))
	if status != http.StatusOK || body["status"] != "accepted" || body["job_id"] != jobID {
		t.Fatalf("POST /tc/api/v1/build %s = %d %v, want 200 {status:accepted job_id:%s}", jobID, status, body, jobID)
	}
}

// waitTerminal waits for the stand-in to accept jobID's terminal report.
func waitTerminal(t testing.TB, cm *cubemaster.Server, jobID string) cubemaster.Callback {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	cb, err := cm.WaitTerminal(ctx, jobID)
	if err != nil {
		t.Fatalf("job %s: %v", jobID, err)
	}
	return cb
}

// acceptedTerminals returns jobID's terminal reports the stand-in accepted.
func acceptedTerminals(cm *cubemaster.Server, jobID string) []cubemaster.Callback {
	var out []cubemaster.Callback
	for _, c := range cm.Callbacks(jobID) {
		if c.Terminal() {
			out = append(out, c)
		}
	}
	return out
}

// checkConsistentTerminals fails unless the stand-in accepted at least one
// terminal report for jobID, all of the same status and well-formed, and
// never refused one as a conflicting flip (409). It returns how many it
// accepted (more than one is an at-least-once redelivery).
func checkConsistentTerminals(t testing.TB, cm *cubemaster.Server, jobID string) int {
	t.Helper()
	got := acceptedTerminals(cm, jobID)
	if len(got) == 0 {
		t.Errorf("job %s: the stand-in accepted no terminal report", jobID)
		return 0
	}
	for _, c := range got {
		if c.Field("status") != got[0].Field("status") {
			t.Errorf("job %s: accepted terminal reports disagree: %s then %s", jobID, got[0].Field("status"), c.Field("status"))
		}
		checkTerminal(t, c)
	}
	for _, c := range cm.All() {
		if c.JobID == jobID && c.Status == http.StatusConflict {
			t.Errorf("job %s: the stand-in refused a conflicting terminal flip: %v", jobID, c.Body)
		}
	}
	return len(got)
}

// checkOneTerminal fails unless exactly one well-formed terminal report of
// jobID reached the stand-in.
func checkOneTerminal(t testing.TB, cm *cubemaster.Server, jobID string) {
	t.Helper()
	if n := checkConsistentTerminals(t, cm, jobID); n > 1 {
		t.Errorf("job %s: the stand-in accepted %d terminal reports, want exactly 1", jobID, n)
	}
}

// checkTerminal fails unless c is a well-formed BUILT or FAILED report.
func checkTerminal(t testing.TB, c cubemaster.Callback) {
	t.Helper()
	if got := c.Int("progress"); got != 100 {
		t.Errorf("job %s: terminal report progress = %d, want 100", c.JobID, got)
	}
	switch c.Field("status") {
	case "BUILT":
		for _, key := range []string{"artifact_id", "ext4_path", "ext4_sha256", "template_spec_fingerprint", "source_image_digest"} {
			if c.Field(key) == "" {
				t.Errorf("job %s: BUILT report has no %s: %v", c.JobID, key, c.Body)
			}
		}
	case "FAILED":
		if c.Field("phase") == "" {
			t.Errorf("job %s: FAILED report has no phase: %v", c.JobID, c.Body)
		}
		checkFailureReason(t, c.JobID, c.Field("error_message"))
	default:
		t.Errorf("job %s: terminal report status %q, want BUILT or FAILED: %v", c.JobID, c.Field("status"), c.Body)
	}
}

// checkFailureReason is the one place that knows why the tests' builds
// fail: their images live where no registry serves them, so resolving
// fails while pulling.
func checkFailureReason(t testing.TB, jobID, msg string) {
	t.Helper()
	const want = "resolve image 127.0.0.1:"
	if !strings.Contains(msg, want) {
		t.Errorf("job %s: FAILED error_message = %q, want it to contain %q", jobID, msg, want)
	}
	if strings.Contains(msg, registrySecret) {
		t.Errorf("job %s: FAILED error_message leaks the registry password: %q", jobID, msg)
	}
}

// waitOutboxEmpty waits until the agent's outbox_depth metric reads 0: every
// report was delivered (or given up on).
func waitOutboxEmpty(t testing.TB, base string) {
	t.Helper()
	wait.Until(t, waitLimit, "the outbox empty", func() (bool, string) {
		v, err := scrapeMetric(base, "cube_templatecenter_outbox_depth")
		if err != nil {
			return false, err.Error()
		}
		return v == 0, fmt.Sprintf("outbox_depth %g", v)
	})
}

// scrapeMetric reads one unlabelled series from base/metrics.
func scrapeMetric(base, name string) (float64, error) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(base + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("metric %s not exposed", name)
}

// cliResult is what one run of the binary printed and returned.
type cliResult struct {
	stdout, stderr string
	code           int
}

// runCLI runs the binary with args and exactly env, to completion.
func runCLI(t testing.TB, env []string, args ...string) cliResult {
	t.Helper()
	return runCLIInput(t, env, "", args...)
}

// jobView is the job part of `templatecenter jobs show`.
type jobView struct {
	JobID    string `json:"job_id"`
	State    string `json:"state"`
	Phase    string `json:"phase"`
	Progress int    `json:"progress"`
	Attempts int    `json:"attempts"`
	Error    string `json:"error_message"`
}

// pendingReport is one undelivered report in `templatecenter jobs show`.
type pendingReport struct {
	Kind      string         `json:"kind"`
	Terminal  bool           `json:"terminal"`
	Attempts  int            `json:"attempts"`
	LastError string         `json:"last_error"`
	Body      map[string]any `json:"body"`
}

// jobShow is the output of `templatecenter jobs show`.
type jobShow struct {
	Job     jobView         `json:"job"`
	Pending []pendingReport `json:"pending_reports"`
	raw     string
}

// terminalPending returns the job's undelivered terminal report, if any.
func (s jobShow) terminalPending() (pendingReport, bool) {
	for _, r := range s.Pending {
		if r.Terminal {
			return r, true
		}
	}
	return pendingReport{}, false
}

// showJob runs `templatecenter jobs show JOB_ID -spool PATH` on the harness's
// spool, read-only, and decodes its output.
func (h *harness) showJob(jobID string) jobShow {
	h.t.Helper()
	res := runCLI(h.t, h.environ(), "jobs", "show", jobID, "-json", "-spool", h.spoolPath)
	if res.code != 0 {
		h.t.Fatalf("templatecenter jobs show %s: exit %d, stderr %q", jobID, res.code, res.stderr)
	}
	var s jobShow
	if err := json.Unmarshal([]byte(res.stdout), &s); err != nil {
		h.t.Fatalf("templatecenter jobs show %s: output is not JSON: %v\n%s", jobID, err, res.stdout)
	}
	s.raw = res.stdout
	return s
}

// waitShow polls `jobs show` until cond holds.
func (h *harness) waitShow(jobID string, what string, cond func(jobShow) bool) jobShow {
	h.t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		s := h.showJob(jobID)
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("job %s: %s did not happen within %s; last jobs show:\n%s", jobID, what, waitLimit, s.raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// terminalState reports whether a spool state is final.
func terminalState(s string) bool { return s == "built" || s == "failed" }
