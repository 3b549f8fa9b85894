package docscheck

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/childproc"
	"github.com/cubesandbox/cubetemplatecenter/test/cmdbin"
	"github.com/cubesandbox/cubetemplatecenter/test/wait"
)

// workDir holds what the tests share (probe values, configuration files),
// removed at the end.
var workDir string

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "docscheck-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "create work directory:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	workDir = dir
	defer cmdbin.Cleanup()
	defer func() {
		if shared.f != nil {
			shared.f.agent.stop()
		}
	}()
	return m.Run()
}

// setting is one line of check-config --json's settings.
type setting struct {
	Key, Value, Source string
}

// checkResult is check-config --json's output.
type checkResult struct {
	Path     string    `json:"path"`
	Valid    bool      `json:"valid"`
	Errors   []string  `json:"errors"`
	Warnings []string  `json:"warnings"`
	Settings []setting `json:"settings"`
	raw      string
}

// binary runs the binary's commands, each with only the environment it is
// given, and remembers check-config's answers: the comparison asks the
// same questions again for each doctored copy of the documentation.
type binary struct {
	path, dir string
	// probeFile holds a value any setting taking a path, a string or a
	// secret accepts.
	probeFile string

	mu    sync.Mutex
	cache map[string]checkResult
}

func newBinary(t testing.TB) *binary {
	t.Helper()
	dir := filepath.Join(workDir, "probes")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	b := &binary{path: cmdbin.Build{}.Path(t), dir: dir, probeFile: filepath.Join(dir, "probe-value"), cache: map[string]checkResult{}}
	if err := os.WriteFile(b.probeFile, []byte("docscheck-probe-value-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return b
}

// environ is a child's whole environment: PATH, a HOME of its own (no
// ~/.aws), then env.
func (b *binary) environ(env ...string) []string {
	return append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + b.dir}, env...)
}

// run runs the binary with args to completion and returns its stdout.
func (b *binary) run(t testing.TB, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(b.path, args...)
	cmd.Env = b.environ(env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if _, exit := err.(*exec.ExitError); !exit {
			t.Fatalf("templatecenter %q: %v", args, err)
		}
	}
	return stdout.String()
}

// checkConfig runs check-config --json with conf as the configuration file
// ("" for none) and env.
func (b *binary) checkConfig(t testing.TB, conf string, env ...string) checkResult {
	t.Helper()
	id := conf + "\x00" + strings.Join(env, "\x00")
	b.mu.Lock()
	res, ok := b.cache[id]
	b.mu.Unlock()
	if ok {
		return res
	}
	if conf != "" {
		f, err := os.CreateTemp(b.dir, "conf-*.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(conf); err != nil {
			t.Fatal(err)
		}
		f.Close()
		env = append([]string{"CUBE_TEMPLATE_CENTER_CONFIG_PATH=" + f.Name()}, env...)
	}
	out := b.run(t, env, "check-config", "--json")
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("check-config --json: %v\n%s", err, out)
	}
	res.raw = out
	b.mu.Lock()
	b.cache[id] = res
	b.mu.Unlock()
	return res
}

// facts is what the binary serves, prints and lists.
type facts struct {
	// metrics are the families /metrics serves with every optional part on.
	metrics map[string]served
	// defaults are check-config's settings without a file or variables.
	defaults []setting
	// commands maps each command path -h lists to the flags its own -h
	// lists.
	commands map[string][]string
	// image is the binary itself, where the variables read outside the
	// configuration are looked for.
	image []byte
	// agent is the binary serving, for the routes.
	agent *agent
}

// setting returns the default of key, and whether check-config lists it.
func (f *facts) setting(key string) (setting, bool) {
	i := slices.IndexFunc(f.defaults, func(s setting) bool { return s.Key == key })
	if i < 0 {
		return setting{}, false
	}
	return f.defaults[i], true
}

// sections returns the configuration's top-level sections.
func (f *facts) sections() map[string]bool {
	out := map[string]bool{}
	for _, s := range f.defaults {
		if section, _, ok := strings.Cut(s.Key, "."); ok {
			out[section] = true
		}
	}
	return out
}

// gatherFacts asks the binary.
func gatherFacts(t testing.TB, b *binary) *facts {
	t.Helper()
	f := &facts{commands: map[string][]string{}}
	def := b.checkConfig(t, "")
	if !def.Valid || len(def.Settings) < 50 {
		t.Fatalf("check-config with the defaults: %s", def.raw)
	}
	f.defaults = def.Settings
	for _, p := range helpCommands(b.run(t, nil, "-h")) {
		f.commands[p] = helpFlags(b.run(t, nil, append(strings.Fields(p), "-h")...))
	}
	if len(f.commands) < 5 {
		t.Fatalf("templatecenter -h lists only %v", slices.Sorted(maps.Keys(f.commands)))
	}
	a, err := startAgent(b, filepath.Join(workDir, "agent"))
	if err != nil {
		t.Fatal(err)
	}
	f.agent = a
	// Once a request has been answered, every series is there.
	text, err := a.metrics()
	if err != nil {
		t.Fatal(err)
	}
	f.metrics = parseMetrics(text)
	image, err := os.ReadFile(b.path)
	if err != nil {
		t.Fatal(err)
	}
	f.image = image
	return f
}

// agent is the binary serving, with every part that adds series (a blob
// store, CubeMaster's database and Redis, none of which need to answer).
// It runs until the tests end: routes are asked about as documents name
// them.
type agent struct {
	cmd    *exec.Cmd
	done   chan struct{}
	logs   *childproc.Output
	base   string
	client *http.Client

	mu     sync.Mutex
	routes map[string]bool
}

// agentToken is the shared token the agent runs with.
const agentToken = "docscheck-token"

// startAgent starts the agent in dir and waits until /livez answers 200.
func startAgent(b *binary, dir string) (*agent, error) {
	addr, err := childproc.FreeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	host, port, _ := net.SplitHostPort(addr)
	conf := fmt.Sprintf(`common: {http_bind: %s, http_port: %s}
store: {dir: %[3]s/store, work_dir: %[3]s/work}
spool: {path: %[3]s/spool.db}
build: {ca_path: %[3]s/ca.crt}
shutdown: {timeout: 5s}
artifact_store: {backend: fs, fs_root: %[3]s/blobs}
instance_db_config: {driver: mysql, addr: "127.0.0.1:1", user: docscheck, db_name: docscheck, conn_timeout: 1}
redis: {nodes: ["127.0.0.1:1"]}
`, host, port, dir)
	path := filepath.Join(dir, "conf.yaml")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	a := &agent{cmd: exec.Command(b.path, "serve"), done: make(chan struct{}), logs: &childproc.Output{},
		base: "http://" + addr, client: &http.Client{Timeout: 5 * time.Second}, routes: map[string]bool{}}
	a.cmd.Env = b.environ("CUBE_TEMPLATE_CENTER_CONFIG_PATH="+path, "CUBE_TEMPLATE_CALLBACK_TOKEN="+agentToken,
		"CUBE_TEMPLATE_CENTER_SYSCONF_DIR="+filepath.Join(dir, "none"))
	a.cmd.Stdout, a.cmd.Stderr = a.logs, a.logs
	if err := a.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { a.cmd.Wait(); close(a.done) }()
	if err := childproc.WaitHTTP(context.Background(), a.base+"/livez", a.done, wait.Limit); err != nil {
		a.stop()
		return nil, fmt.Errorf("the agent: %w\n%s", err, a.logs)
	}
	return a, nil
}

// stop stops the agent and waits for it.
func (a *agent) stop() { childproc.Terminate(a.cmd.Process, a.done, 10*time.Second) }

// request sends method path with the shared token (and an empty JSON
// object as a POST's body) and returns the status and body.
func (a *agent) request(method, path string) (int, string, error) {
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader("{}")
	}
	req, err := http.NewRequest(method, a.base+path, body)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("X-Cube-Template-Callback-Token", agentToken)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out), err
}

// metrics returns /metrics' text.
func (a *agent) metrics() (string, error) {
	code, text, err := a.request(http.MethodGet, "/metrics")
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("GET /metrics: %d", code)
	}
	return text, err
}

// matches reports whether a request of route ("GET /tc/api/v1/jobs/{id}",
// a wildcard filled in) is counted under that route: the agent's pattern
// is the one documented.
func (a *agent) matches(route string) (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ok, seen := a.routes[route]; seen {
		return ok, nil
	}
	method, path, _ := strings.Cut(route, " ")
	if _, _, err := a.request(method, wildcardRe.ReplaceAllString(path, "docscheck-none")); err != nil {
		return false, err
	}
	text, err := a.metrics()
	if err != nil {
		return false, err
	}
	ok := strings.Contains(text, `route="`+route+`"`)
	a.routes[route] = ok
	return ok, nil
}

// wildcardRe is a path wildcard of a route pattern.
var wildcardRe = regexp.MustCompile(`\{[^}]*\}`)
