package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/wait"

	"github.com/cubesandbox/cubetemplatecenter/agent/config"
)

// podGrace is Kubernetes' default terminationGracePeriodSeconds.
const podGrace = 30 * time.Second

// TestDefaultStopFitsPodGrace: the default shutdown.timeout, which bounds
// the whole stop, leaves a pod's default grace period room for the signal
// and the exit, and holds serve's flushes with most of it left to drain.
func TestDefaultStopFitsPodGrace(t *testing.T) {
	if d := config.DefaultShutdownTimeout; d > podGrace-5*time.Second {
		t.Errorf("default shutdown.timeout %s leaves less than 5s of the %s grace period", d, podGrace)
	}
	if flush := liveCloseTimeout + traceFlushTimeout; flush > config.DefaultShutdownTimeout/2 {
		t.Errorf("serve's flushes (%s) take over half the default shutdown.timeout %s", flush, config.DefaultShutdownTimeout)
	}
}

// TestSIGTERMMidBuildInPod runs the binary as a pod would (config file
// from a mount, shutdown.timeout and the token from the environment, JSON
// logs): /livez and /readyz answer 200, then SIGTERM mid-build exits 0
// within shutdown.timeout (set by the variable) with the build back in the queue, no terminal
// report sent, every log line JSON on stderr and nothing on stdout.
func TestSIGTERMMidBuildInPod(t *testing.T) {
	t.Parallel()
	cm := startCubeMaster(t, testToken)
	pulled := make(chan struct{}, 1)
	// A registry that never answers: the build is mid-pull when SIGTERM
	// comes, and only its cancellation ends the request.
	registry := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case pulled <- struct{}{}:
		default:
		}
		<-r.Context().Done()
	}))
	t.Cleanup(registry.Close)
	host := strings.TrimPrefix(registry.URL, "http://")

	h := newHarness(t, cm.URL(), testToken)
	h.set("registry.insecure", []string{host})
	h.set("log.format", "json")
	h.writeConfig()
	const grace = 12 * time.Second
	stdout := newLogBuffer()
	cmd := exec.Command(agentBuild.Path(t))
	cmd.Env = h.environ("CUBE_TEMPLATE_CENTER_SHUTDOWN_TIMEOUT=" + grace.String())
	cmd.Stdout = stdout
	p := startCmd(t, "agent (pod)", cmd)
	waitHealthy(t, p, h.baseURL())
	for _, path := range []string{"/livez", "/readyz"} {
		wait.Until(t, waitLimit, path+" 200", func() (bool, string) {
			resp, err := http.Get(h.baseURL() + path)
			if err != nil {
				return false, err.Error()
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK, string(body)
		})
	}

	const id = "pod-stop"
	submit(t, h.baseURL(), testToken, id, host+"/blackbox/never:latest")
	select {
	case <-pulled:
	case <-time.After(waitLimit):
		t.Fatal("the build never reached the registry")
	}
	p.signal(t, syscall.SIGTERM)
	if code := p.waitExit(t, grace+exitSlack); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}

	if s := h.showJob(id); s.Job.State != "queued" {
		t.Errorf("job after SIGTERM mid-build: state %q, want queued (resumed at next start)\n%s", s.Job.State, s.raw)
	}
	if got := acceptedTerminals(cm, id); len(got) != 0 {
		t.Errorf("a stop sent CubeMaster a terminal report: %v", got[0].Body)
	}
	if out := stdout.String(); out != "" {
		t.Errorf("stdout holds %q, want logs on stderr only", out)
	}
	var msgs []string
	for _, line := range strings.Split(strings.TrimSpace(p.out.String()), "\n") {
		var rec struct {
			Level string   `json:"level"`
			Msg   string   `json:"msg"`
			Drain *float64 `json:"drain"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec.Level == "" || rec.Msg == "" {
			t.Errorf("stderr line is not a JSON log record: %q (%v)", line, err)
			continue
		}
		msgs = append(msgs, rec.Msg)
		// The drain leaves serve's flushes their time within the timeout.
		if want := (grace - liveCloseTimeout - traceFlushTimeout).Seconds(); rec.Msg == "stopping" && (rec.Drain == nil || *rec.Drain != want) {
			t.Errorf("stopping record %s: want drain %v (shutdown.timeout %s less serve's flushes)", line, want, grace)
		}
	}
	joined := strings.Join(msgs, "\n")
	for _, want := range []string{"signal received, stopping", "stopped"} {
		if !strings.Contains(joined, want) {
			t.Errorf("logs lack %q:\n%s", want, joined)
		}
	}
}
