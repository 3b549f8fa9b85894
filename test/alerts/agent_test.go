package alerts

import (
	"bufio"
	"bytes"
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
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/cubesandbox/cubetemplatecenter/test/childproc"
	"github.com/cubesandbox/cubetemplatecenter/test/cmdbin"
	"github.com/cubesandbox/cubetemplatecenter/test/cubemaster"
	"github.com/cubesandbox/cubetemplatecenter/test/wait"
)

const (
	// testToken is the shared secret of the agents under test.
	testToken   = "alerts-shared-token"
	tokenHeader = "X-Cube-Template-Callback-Token"
	// unreachableImage lives on a port nothing listens on: its build ends
	// FAILED at once, leaving a final report to deliver.
	unreachableImage = "127.0.0.1:1/alerts/unreachable:latest"
	shutdownTimeout  = 5 * time.Second
)

func TestMain(m *testing.M) {
	code := m.Run()
	cmdbin.Cleanup()
	os.Exit(code)
}

// child is a process run for the test's duration: stopped with SIGTERM
// (killed if it does not exit) when the test ends, its output logged when
// the test failed.
type child struct {
	name string
	done <-chan struct{}
}

func startChild(t testing.TB, name string, env []string, argv ...string) *child {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	out := &childproc.Output{}
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = out, out
	return &child{name: name, done: childproc.Start(t, name, cmd, out, shutdownTimeout+5*time.Second)}
}

// waitHTTP polls url until it answers, failing at once if the child exits.
func (c *child) waitHTTP(t testing.TB, url string) {
	t.Helper()
	if err := childproc.WaitHTTP(t.Context(), url, c.done, wait.Limit); err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
}

// agent is a running templatecenter.
type agent struct {
	*child
	port int
}

func (a *agent) base() string { return "http://127.0.0.1:" + strconv.Itoa(a.port) }

// target is the agent's address as Prometheus' instance label has it.
func (a *agent) target() string { return "127.0.0.1:" + strconv.Itoa(a.port) }

// startAgent runs an agent in its own directory whose reports go to
// masterAddr, with the configuration sections of extra laid over the
// test defaults, and waits until /livez answers (not /health: an agent
// with a backend down is alive but not ready).
func startAgent(t testing.TB, name, masterAddr string, extra map[string]map[string]any) *agent {
	t.Helper()
	dir := t.TempDir()
	port := childproc.FreePort(t)
	cfg := map[string]map[string]any{
		"common":   {"http_bind": "127.0.0.1", "http_port": port},
		"log":      {"level": "info", "format": "text"},
		"store":    {"dir": filepath.Join(dir, "store"), "work_dir": filepath.Join(dir, "work")},
		"spool":    {"path": filepath.Join(dir, "state", "spool.db")},
		"build":    {"max_concurrent_builds": 1, "heartbeat_interval": "1s", "ca_path": filepath.Join(dir, "ca.crt")},
		"master":   {"callback_timeout": "2s", "retry_initial": "100ms", "retry_max": "1s"},
		"shutdown": {"timeout": shutdownTimeout.String()},
		"registry": {"allow_networks": []string{"127.0.0.0/8"}},
	}
	for section, kv := range extra {
		if cfg[section] == nil {
			cfg[section] = map[string]any{}
		}
		for k, v := range kv {
			cfg[section][k] = v
		}
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	confPath := writeFile(t, dir, "conf.yaml", data)
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"CUBE_TEMPLATE_CENTER_CONFIG_PATH=" + confPath,
		// No installed configuration of the host leaks in.
		"CUBE_TEMPLATE_CENTER_SYSCONF_DIR=" + filepath.Join(dir, "no-install"),
		"CUBE_MASTER_ADDR=" + masterAddr,
		"CUBE_TEMPLATE_CALLBACK_TOKEN=" + testToken,
	}
	a := &agent{child: startChild(t, name, env, cmdbin.Build{}.Path(t)), port: port}
	a.waitHTTP(t, a.base()+"/livez")
	return a
}

// submit posts a build of image and fails unless it is accepted.
func (a *agent) submit(t testing.TB, jobID, image string) {
	t.Helper()
	body := mustJSON(t, cubemaster.BuildRequest(jobID, image, map[string]any{"with_cube_ca": false}))
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, a.base()+"/tc/api/v1/build", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(tokenHeader, testToken)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("POST /tc/api/v1/build: %v", err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /tc/api/v1/build %s = %d %s, want 200", jobID, resp.StatusCode, answer)
	}
}

// metricFamilies scrapes /metrics and returns the names of the series it
// holds: every family's name, and for histograms and summaries the
// _bucket, _sum and _count series Prometheus stores.
func (a *agent) metricFamilies(t testing.TB) map[string]string {
	t.Helper()
	resp, err := http.Get(a.base() + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: status %d", resp.StatusCode)
	}
	fams, err := parseTypes(resp.Body)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	return fams
}

// parseTypes reads the "# TYPE name type" lines of a Prometheus text
// exposition into series names and their family's type.
func parseTypes(r io.Reader) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 4 || f[0] != "#" || f[1] != "TYPE" {
			continue
		}
		name, typ := f[2], f[3]
		out[name] = typ
		switch typ {
		case "histogram":
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[name+s] = typ
			}
		case "summary":
			for _, s := range []string{"_sum", "_count"} {
				out[name+s] = typ
			}
		}
	}
	return out, sc.Err()
}

func TestParseTypes(t *testing.T) {
	in := `# HELP a_total A.
# TYPE a_total counter
a_total 1
# TYPE h_seconds histogram
h_seconds_bucket{le="+Inf"} 0
# TYPE s summary
`
	got, err := parseTypes(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for n := range got {
		names = append(names, n)
	}
	slices.Sort(names)
	want := []string{"a_total", "h_seconds", "h_seconds_bucket", "h_seconds_count", "h_seconds_sum", "s", "s_count", "s_sum"}
	if !slices.Equal(names, want) {
		t.Errorf("parseTypes = %q, want %q", names, want)
	}
}

// writeFile writes data to dir/name and returns the path.
func writeFile(t testing.TB, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// mustJSON encodes v or fails.
func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(fmt.Errorf("encode %T: %w", v, err))
	}
	return b
}
