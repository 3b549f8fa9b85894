package tcimage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/wait"

	"gopkg.in/yaml.v3"

	"github.com/cubesandbox/cubetemplatecenter/test/childproc"
	"github.com/cubesandbox/cubetemplatecenter/test/cubemaster"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

const (
	// token is the callback token the containers and the stand-in share.
	token = "image-test-token"
	// shutdownTimeout is the agent's shutdown.timeout in the containers:
	// the grace period a SIGTERM must end within.
	shutdownTimeout = 5 * time.Second
	// exitSlack is how long, past shutdownTimeout, the container may take
	// to be reaped on a loaded machine.
	exitSlack = 5 * time.Second
	// waitLimit bounds waits for what the agent does promptly.
	waitLimit = 30 * time.Second
	// configPath is where the containers mount their configuration file.
	configPath = "/etc/cube-templatecenter/conf.yaml"
)

// container is the agent running in the image under runc.
type container struct {
	name     string
	runcRoot string
	state    string // host directory mounted at stateDir (spool, work)
	store    string // host directory mounted at stateDir/store
	port     int
	out      *childproc.Output
	cmd      *exec.Cmd
	done     chan struct{}
}

// startContainer runs the image's entrypoint (the agent) with runc: the
// image's user (65532), a read-only root filesystem, a tmpfs on /tmp, host
// directories mounted as the state volume and the store, the
// configuration file cfg mounted read-only, env added to the image's
// environment, and the host's network namespace (so the agent and the
// tests' servers on loopback reach each other).
func startContainer(t *testing.T, b *built, name string, cfg map[string]any, env ...string) *container {
	t.Helper()
	needRoot(t, "runc")
	dir := t.TempDir()
	c := &container{
		name:     fmt.Sprintf("tc-image-test-%s-%d", name, os.Getpid()),
		runcRoot: filepath.Join(dir, "runc"),
		state:    filepath.Join(dir, "state"),
		store:    filepath.Join(dir, "store"),
		port:     childproc.FreePort(t),
		out:      &childproc.Output{},
		done:     make(chan struct{}),
	}
	for _, d := range []string{c.state, c.store} {
		if err := os.Mkdir(d, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, imageUID, imageUID); err != nil {
			t.Fatal(err)
		}
	}
	full := map[string]any{
		"common":   map[string]any{"http_bind": "127.0.0.1", "http_port": c.port},
		"log":      map[string]any{"level": "info", "format": "text"},
		"build":    map[string]any{"max_concurrent_builds": 1, "heartbeat_interval": "1s"},
		"master":   map[string]any{"callback_timeout": "2s", "retry_initial": "100ms", "retry_max": "1s"},
		"shutdown": map[string]any{"timeout": shutdownTimeout.String()},
	}
	for k, v := range cfg {
		full[k] = v
	}
	data, err := yaml.Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "conf.yaml")
	if err := os.WriteFile(cfgFile, data, 0o644); err != nil {
		t.Fatal(err)
	}

	bundle := filepath.Join(dir, "bundle")
	if err := os.Mkdir(bundle, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := runtimeSpec(t, b, c, cfgFile, append([]string{"CUBE_TEMPLATE_CENTER_CONFIG_PATH=" + configPath}, env...))
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), spec, 0o644); err != nil {
		t.Fatal(err)
	}

	c.cmd = exec.Command("runc", "--root", c.runcRoot, "run", "--bundle", bundle, c.name)
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("runc run: %v", err)
	}
	go func() {
		c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		select {
		case <-c.done:
		default:
			exec.Command("runc", "--root", c.runcRoot, "kill", c.name, "KILL").Run()
			select {
			case <-c.done:
			case <-time.After(waitLimit):
				t.Errorf("container %s did not end after SIGKILL", c.name)
			}
		}
		exec.Command("runc", "--root", c.runcRoot, "delete", "--force", c.name).Run()
		if t.Failed() {
			t.Logf("---- output of container %s ----\n%s---- end ----", c.name, c.out)
		}
	})
	return c
}

// runtimeSpec edits the runtime configuration umoci wrote for the image.
func runtimeSpec(t *testing.T, b *built, c *container, cfgFile string, env []string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(filepath.Dir(b.rootfs), "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		OCIVersion string           `json:"ociVersion"`
		Process    map[string]any   `json:"process"`
		Root       map[string]any   `json:"root"`
		Hostname   string           `json:"hostname,omitempty"`
		Mounts     []map[string]any `json:"mounts"`
		Linux      map[string]any   `json:"linux"`
	}
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatalf("umoci's config.json: %v", err)
	}
	// The user is the image's: the test only checks umoci took it over.
	if u, _ := spec.Process["user"].(map[string]any); u["uid"] != float64(imageUID) || u["gid"] != float64(imageUID) {
		t.Fatalf("runtime user from the image = %v, want %d:%d", spec.Process["user"], imageUID, imageUID)
	}
	spec.Process["terminal"] = false
	spec.Process["env"] = append(anyStrings(spec.Process["env"]), toAny(env)...)
	// One shared unpacked image, read-only, for every container.
	spec.Root = map[string]any{"path": b.rootfs, "readonly": true}
	var ns []any
	for _, n := range spec.Linux["namespaces"].([]any) {
		if n.(map[string]any)["type"] != "network" {
			ns = append(ns, n)
		}
	}
	spec.Linux["namespaces"] = ns
	var mounts []map[string]any
	for _, m := range spec.Mounts {
		if m["destination"] != stateDir {
			mounts = append(mounts, m)
		}
	}
	bind := func(src, dst string, opts ...string) map[string]any {
		return map[string]any{"destination": dst, "type": "bind", "source": src, "options": append([]string{"rbind", "nosuid", "nodev"}, opts...)}
	}
	mounts = append(mounts,
		map[string]any{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "nodev", "mode=1777", "size=16m"}},
		bind(c.state, stateDir, "rw"),
		bind(c.store, stateDir+"/store", "rw"),
		bind(cfgFile, configPath, "ro"),
	)
	spec.Mounts = mounts
	out, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func anyStrings(v any) []any {
	l, _ := v.([]any)
	return l
}

func toAny(l []string) []any {
	out := make([]any, len(l))
	for i, s := range l {
		out[i] = s
	}
	return out
}

func (c *container) baseURL() string { return "http://127.0.0.1:" + strconv.Itoa(c.port) }

// kill sends sig to the container's process with runc kill.
func (c *container) kill(t *testing.T, sig string) {
	t.Helper()
	if out, err := exec.Command("runc", "--root", c.runcRoot, "kill", c.name, sig).CombinedOutput(); err != nil {
		t.Fatalf("runc kill %s %s: %v: %s", c.name, sig, err, out)
	}
}

// waitExit waits up to within for the container to end and returns runc's
// exit code (the agent's).
func (c *container) waitExit(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-c.done:
		return c.cmd.ProcessState.ExitCode()
	case <-time.After(within):
		t.Fatalf("container %s did not exit within %s", c.name, within)
		return 0
	}
}

// waitServing polls path until it answers 200; it fails at once if the
// container exits.
func (c *container) waitServing(t *testing.T, path string) {
	t.Helper()
	if err := childproc.WaitHTTP(t.Context(), c.baseURL()+path, c.done, waitLimit); err != nil {
		t.Fatalf("container %s: %v", c.name, err)
	}
}

// get returns the status code of a GET of path.
func (c *container) get(t *testing.T, path string) int {
	t.Helper()
	code, _ := c.fetch(t, path)
	return code
}

// fetch returns the status and body of a GET of path.
func (c *container) fetch(t *testing.T, path string) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: 3 * time.Second}
	req, err := http.NewRequest(http.MethodGet, c.baseURL()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The token shows a probe's reasons.
	req.Header.Set("X-Cube-Template-Callback-Token", token)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, string(body)
}

// submit posts a build of ref as CubeMaster does.
func (c *container) submit(t *testing.T, jobID, ref string) {
	t.Helper()
	body, err := json.Marshal(cubemaster.BuildRequest(jobID, ref, map[string]any{"with_cube_ca": false}))
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, c.baseURL()+"/tc/api/v1/build", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Cube-Template-Callback-Token", token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("submit %s: %v", jobID, err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("submit %s = %d %s, want 200", jobID, resp.StatusCode, answer)
	}
}

// agentConfig is the configuration of a container building from reg.
func agentConfig(reg *images.Registry) map[string]any {
	return map[string]any{"registry": map[string]any{
		// The registry is on loopback, which the agent denies by default.
		"allow_networks": []string{"127.0.0.0/8"},
		"insecure":       []string{reg.Host},
	}}
}

// TestAgentInContainer runs the agent from the image under runc as the
// image's non-root user with a read-only root filesystem: it loads ISA-L,
// answers /livez and /readyz, builds an image from a registry on the host's
// loopback to BUILT with the ext4 on the mounted store, and on SIGTERM
// (runc kill) ends within its grace period with the running build back in
// the queue.
func TestAgentInContainer(t *testing.T) {
	b := image(t)
	needRoot(t, "runc")
	cm, err := cubemaster.Start(token)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cm.Stop)
	img := images.New(t, images.Config{}, images.Layer{Tar: images.TarOf(t, map[string]string{"etc/motd": "built in a container\n"})})
	// Another layer, so the agent's layer cache does not have it.
	held := images.New(t, images.Config{}, images.Layer{Tar: images.TarOf(t, map[string]string{"etc/motd": "never arrives\n"})})
	cfgName, err := held.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	// The layers of image-test/held never come while the test runs: its
	// build stays running until the agent gives it up.
	release := make(chan struct{})
	var releaseOnce sync.Once
	reg := images.StartRegistry(t, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if d, ok := images.BlobDigest(r); ok && r.Method == http.MethodGet &&
				strings.Contains(r.URL.Path, "/image-test/held/") && d != cfgName.String() {
				select {
				case <-r.Context().Done():
				case <-release:
				}
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	okRef := reg.Push(t, "image-test/ok:v1", img)
	heldRef := reg.Push(t, "image-test/held:v1", held)

	c := startContainer(t, b, "agent", agentConfig(reg), "CUBE_MASTER_ADDR="+cm.URL(), "CUBE_TEMPLATE_CALLBACK_TOKEN="+token)
	c.waitServing(t, "/health")
	if line, ok := findLine(c.out.String(), "gzip_inflate="); !ok || !strings.Contains(line, "gzip_inflate=isal") {
		t.Errorf("the agent in the image does not inflate with ISA-L (libisal2): start line %q", line)
	}
	// The readiness checker's first round may still be running.
	c.waitServing(t, "/readyz")
	if code := c.get(t, "/livez"); code != http.StatusOK {
		t.Errorf("GET /livez = %d, want 200", code)
	}

	c.submit(t, "in-container", okRef)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	cb, err := cm.WaitTerminal(ctx, "in-container")
	if err != nil {
		t.Fatal(err)
	}
	if cb.Field("status") != "BUILT" {
		t.Fatalf("build in the container ended %v, want BUILT", cb.Body)
	}
	rel, ok := strings.CutPrefix(cb.Field("ext4_path"), stateDir+"/store/")
	if !ok {
		t.Fatalf("ext4_path %q is not on the mounted store %s/store", cb.Field("ext4_path"), stateDir)
	}
	data, err := os.ReadFile(filepath.Join(c.store, rel))
	if err != nil {
		t.Fatalf("the template image is not on the host's store volume: %v", err)
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != strings.TrimPrefix(cb.Field("ext4_sha256"), "sha256:") {
		t.Errorf("the store's image has sha256 %x, the report says %s", sum, cb.Field("ext4_sha256"))
	}
	// What the agent wrote is the image user's: it did not run as root.
	for _, p := range []string{filepath.Join(c.state, "spool.db"), filepath.Join(c.store, rel)} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Errorf("not on the volume: %v", err)
			continue
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != imageUID {
			t.Errorf("%s is owned by uid %d, want the image's %d", p, st.Uid, imageUID)
		}
	}

	c.submit(t, "held", heldRef)
	wait.For(t, "the held build to write its temporary image", func() bool { return len(images.StoreTemps(t, c.store)) > 0 })
	start := time.Now()
	c.kill(t, "TERM")
	if code := c.waitExit(t, shutdownTimeout+exitSlack); code != 0 {
		t.Errorf("after SIGTERM the agent exited with code %d, want 0", code)
	}
	t.Logf("SIGTERM to exit: %s", time.Since(start).Round(time.Millisecond))
	releaseOnce.Do(func() { close(release) })

	show := exec.Command(b.binary, "jobs", "show", "held", "--json", "--spool", filepath.Join(c.state, "spool.db"))
	show.Env = []string{"PATH=" + os.Getenv("PATH"), "CUBE_TEMPLATE_CENTER_SYSCONF_DIR=" + t.TempDir()}
	out, err := show.Output()
	if err != nil {
		t.Fatalf("templatecenter jobs show held: %v", err)
	}
	var job struct {
		Job struct {
			State string `json:"state"`
		} `json:"job"`
	}
	if err := json.Unmarshal(out, &job); err != nil {
		t.Fatalf("jobs show output: %v\n%s", err, out)
	}
	if job.Job.State != "queued" {
		t.Errorf("the build running at SIGTERM is %q in the spool, want queued (requeued for the next start)\n%s", job.Job.State, out)
	}
	for _, cb := range cm.Callbacks("held") {
		if cb.Terminal() {
			t.Errorf("the interrupted build was reported terminal: %v", cb.Body)
		}
	}
}

// TestDatabaseDownInContainer: with CubeMaster's database configured and
// nothing answering at its address, the agent in the container keeps
// running; /readyz (and /health) fail for the database alone while /livez
// passes, so Kubernetes stops routing to the pod without restarting it.
func TestDatabaseDownInContainer(t *testing.T) {
	b := image(t)
	needRoot(t, "runc")
	cfg := map[string]any{"instance_db_config": map[string]any{
		"driver": "mysql", "addr": "127.0.0.1:" + strconv.Itoa(childproc.FreePort(t)),
		"user": "cube", "db_name": "cube", "conn_timeout": 1,
	}}
	c := startContainer(t, b, "dbdown", cfg, "CUBE_TEMPLATE_CENTER_DB_PASSWORD=not-a-real-password", "CUBE_TEMPLATE_CALLBACK_TOKEN="+token)
	c.waitServing(t, "/livez")
	// Not ready for the database alone: the volumes work. The checker's
	// first round may still be running (also 503, for another reason).
	type checks struct {
		Checks map[string]bool   `json:"checks"`
		Errors map[string]string `json:"errors"`
	}
	onlyDatabase := func(path string) (bool, string) {
		code, body := c.fetch(t, path)
		var v checks
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			return false, fmt.Sprintf("%d %s: %v", code, body, err)
		}
		_, db := v.Errors["database"]
		return code == http.StatusServiceUnavailable && db && len(v.Errors) == 1 && !v.Checks["database"] && v.Checks["store"],
			fmt.Sprintf("%d %s", code, body)
	}
	for _, path := range []string{"/readyz", "/health"} {
		wait.Until(t, waitLimit, "GET "+path+" with the database down to answer 503 with only the database failing",
			func() (bool, string) { return onlyDatabase(path) })
	}
	// Liveness never asks the database: still 200, so Kubernetes keeps
	// the pod and only stops routing builds to it.
	if code, body := c.fetch(t, "/livez"); code != http.StatusOK {
		t.Errorf("GET /livez with the database down = %d %s, want 200", code, body)
	}
	c.kill(t, "TERM")
	if code := c.waitExit(t, shutdownTimeout+exitSlack); code != 0 {
		t.Errorf("after SIGTERM the agent exited with code %d, want 0", code)
	}
}

// findLine returns the first line of text holding sub.
func findLine(text, sub string) (string, bool) {
	for line := range strings.Lines(text) {
		if strings.Contains(line, sub) {
			return strings.TrimRight(line, "\n"), true
		}
	}
	return "", false
}
