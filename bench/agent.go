package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/childproc"
	"github.com/cubesandbox/cubetemplatecenter/test/cubemaster"

	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// benchToken is the callback token shared by the agent and the stand-in.
const benchToken = "tcbench-shared-token"

// agentHealthy bounds the wait for a starting agent.
const agentHealthy = 60 * time.Second

// agentProc is a running templatecenter agent with its own store, layer
// cache and spool under one directory.
type agentProc struct {
	// Base is the agent's URL ("http://127.0.0.1:PORT").
	Base   string
	Dir    string
	cmd    *exec.Cmd
	exited chan struct{}
	log    *os.File
}

// agentSetup is what every agent of a run shares.
type agentSetup struct {
	Binary       string
	Master       *cubemaster.Server
	RegistryHost string
	CAPath       string
	// ExtraYAML is appended to each agent's configuration (sections the
	// base configuration does not have).
	ExtraYAML string
}

// startAgent runs the agent binary with a configuration of its own under
// dir (store, work_dir with the layer cache, spool) and waits for /health.
// build holds more lines of the configuration's build section
// ("max_entries: 2000000").
func startAgent(ctx context.Context, s agentSetup, dir string, build ...string) (*agentProc, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("start agent: %w", err)
	}
	var lastErr error
	for range 3 { // the port may be taken between picking and binding
		host, err := childproc.FreeLoopbackAddr()
		if err != nil {
			return nil, fmt.Errorf("start agent: %w", err)
		}
		_, port, _ := net.SplitHostPort(host)
		conf := filepath.Join(dir, "conf.yaml")
		yaml := fmt.Sprintf(`common:
  http_bind: 127.0.0.1
  http_port: %s
log:
  level: info
store:
  dir: %s
  work_dir: %s
spool:
  path: %s
build:
  ca_path: %s
%sregistry:
  insecure: [%q]
`, port, filepath.Join(dir, "store"), filepath.Join(dir, "work"), filepath.Join(dir, "state", "spool.db"), s.CAPath,
			buildLines(build), s.RegistryHost) + s.ExtraYAML
		if err := os.WriteFile(conf, []byte(yaml), 0o644); err != nil {
			return nil, fmt.Errorf("start agent: %w", err)
		}
		a, err := runAgent(ctx, s, dir, conf, "http://"+host)
		if err == nil {
			return a, nil
		}
		lastErr = err
	}
	return nil, fmt.Errorf("start agent: %w", lastErr)
}

// buildLines indents extra lines of the build section.
func buildLines(lines []string) string {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

func runAgent(ctx context.Context, s agentSetup, dir, conf, base string) (*agentProc, error) {
	logFile, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(s.Binary)
	// The generated images hold random files and no shell: the start check
	// runs (its cost is part of a build) and only warns.
	cmd.Env = append(os.Environ(), "CUBE_TEMPLATE_CENTER_CONFIG_PATH="+conf, "CUBE_MASTER_ADDR="+s.Master.URL(),
		"CUBE_TEMPLATE_CALLBACK_TOKEN="+benchToken, "CUBE_TEMPLATE_CENTER_START_CHECK=warn")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("run %s: %w", s.Binary, err)
	}
	a := &agentProc{Base: base, Dir: dir, cmd: cmd, exited: make(chan struct{}), log: logFile}
	go func() {
		cmd.Wait()
		close(a.exited)
	}()
	if err := childproc.WaitHTTP(ctx, base+"/health", a.exited, agentHealthy); err != nil {
		a.Stop()
		out, _ := os.ReadFile(logFile.Name())
		return nil, fmt.Errorf("agent: %w; log:\n%s", err, images.Tail(out, 4096))
	}
	return a, nil
}

// Pid is the agent's process id.
func (a *agentProc) Pid() int { return a.cmd.Process.Pid }

// Stop ends the agent gracefully (SIGTERM), killing it after 30 s.
func (a *agentProc) Stop() {
	childproc.Terminate(a.cmd.Process, a.exited, 30*time.Second)
	a.log.Close()
}

// tcBuild is the outcome of one build through the API.
type tcBuild struct {
	// Wall runs from just before the POST to the arrival of the BUILT
	// report at the stand-in CubeMaster.
	Wall time.Duration
	// Done is when the BUILT report arrived.
	Done   time.Time
	Path   string
	SHA256 string
	Size   int64
}

// build submits a build of ref with envd the way CubeMaster does and waits
// for its terminal report.
func (a *agentProc) build(ctx context.Context, master *cubemaster.Server, jobID, ref string, envd []byte) (*tcBuild, error) {
	began, err := a.submit(ctx, master, jobID, ref, envd)
	if err != nil {
		return nil, err
	}
	return a.wait(ctx, master, jobID, began)
}

// submit posts a build of ref with envd the way CubeMaster does and
// returns when the agent accepted it, with the time just before the POST.
func (a *agentProc) submit(ctx context.Context, master *cubemaster.Server, jobID, ref string, envd []byte) (time.Time, error) {
	return a.submitMessage(ctx, buildMessage(master, jobID, ref, envd))
}

// buildMessage is the build request CubeMaster sends for ref with envd.
func buildMessage(master *cubemaster.Server, jobID, ref string, envd []byte) map[string]any {
	msg := cubemaster.BuildRequest(jobID, ref, map[string]any{"requestID": jobID, "template_id": "tpl-bench"})
	msg["download_base_url"], msg["envd_data"] = master.URL(), envd
	return msg
}

// submitMessage posts a build request and returns when the agent accepted
// it, with the time just before the POST.
func (a *agentProc) submitMessage(ctx context.Context, msg map[string]any) (time.Time, error) {
	body, err := json.Marshal(msg)
	if err != nil {
		return time.Time{}, fmt.Errorf("encode build request: %w", err)
	}
	began := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.Base+"/tc/api/v1/build", bytes.NewReader(body))
	if err != nil {
		return time.Time{}, fmt.Errorf("submit build: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Cube-Template-Callback-Token", benchToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return time.Time{}, fmt.Errorf("submit build: %w", err)
	}
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return time.Time{}, fmt.Errorf("submit build: %d %s", resp.StatusCode, answer)
	}
	return began, nil
}

// wait waits for the terminal report of jobID, submitted at began.
func (a *agentProc) wait(ctx context.Context, master *cubemaster.Server, jobID string, began time.Time) (*tcBuild, error) {
	final, err := master.WaitTerminal(ctx, jobID)
	if err != nil {
		return nil, fmt.Errorf("wait for job %s: %w", jobID, err)
	}
	if final.Field("status") != "BUILT" {
		return nil, fmt.Errorf("job %s ended %s: %s", jobID, final.Field("status"), final.Field("error_message"))
	}
	b := &tcBuild{Wall: final.At.Sub(began), Done: final.At, Path: final.Field("ext4_path"), SHA256: final.Field("ext4_sha256"), Size: final.Int("ext4_size_bytes")}
	if b.Path == "" {
		return nil, errors.New("BUILT report without ext4_path")
	}
	return b, nil
}

// cacheIdlePoll is how often waitCacheIdle scrapes the agent's metrics.
const cacheIdlePoll = 10 * time.Millisecond

// waitCacheIdle polls the agent's /metrics until its layer cache has no
// re-encode queued or running.
func (a *agentProc) waitCacheIdle(ctx context.Context) error {
	const series = "cube_templatecenter_layer_cache_transcode_pending"
	for {
		pending, err := a.metric(ctx, series)
		if err != nil {
			return fmt.Errorf("wait for the layer cache: %w", err)
		}
		if pending == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the layer cache: %w", ctx.Err())
		case <-a.exited:
			return errors.New("wait for the layer cache: agent exited")
		case <-time.After(cacheIdlePoll):
		}
	}
}

// metric reads one unlabelled series from the agent's /metrics.
func (a *agentProc) metric(ctx context.Context, series string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.Base+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, err
	}
	return parseMetric(string(body), series)
}

// parseMetric finds "series value" in Prometheus text.
func parseMetric(text, series string) (float64, error) {
	for line := range strings.Lines(text) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), " ")
		if ok && name == series {
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				return 0, fmt.Errorf("metric %s: %w", series, err)
			}
			return v, nil
		}
	}
	return 0, fmt.Errorf("metric %s: %w", series, errNotExported)
}

// errNotExported is a series missing from /metrics (a labelled series the
// agent never touched).
var errNotExported = errors.New("not exported")

// builderTime reads the Builder's own time in job jobID from the agent's
// log: the "took" of its "artifact published" line. It is 0 with no error
// when the job built nothing (a reuse).
func (a *agentProc) builderTime(jobID string) (time.Duration, error) {
	b, err := os.ReadFile(a.log.Name())
	if err != nil {
		return 0, fmt.Errorf("read the agent's log: %w", err)
	}
	return parseBuilderTime(string(b), jobID)
}

// parseBuilderTime finds the "artifact published" line of jobID in an
// agent's log and returns its took=.
func parseBuilderTime(log, jobID string) (time.Duration, error) {
	for line := range strings.Lines(log) {
		if !strings.Contains(line, `msg="artifact published"`) || !strings.Contains(line, " job_id="+jobID+" ") {
			continue
		}
		for _, field := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(field, "took="); ok {
				d, err := time.ParseDuration(v)
				if err != nil {
					return 0, fmt.Errorf("artifact published line of job %s: took %q: %w", jobID, v, err)
				}
				return d, nil
			}
		}
		return 0, fmt.Errorf("artifact published line of job %s has no took=", jobID)
	}
	return 0, nil
}
