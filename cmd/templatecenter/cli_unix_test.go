package main

// The command line as a Unix tool: help on every command, usage errors with
// exit 2, version and --json, the installed configuration found from a
// shell, the layer cache under XDG_CACHE_HOME, and a cgo-less build that
// refuses to open the spool without touching it.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/spool"
	"github.com/cubesandbox/cubetemplatecenter/test/cmdbin"
)

// TestCLIHelp: -h and --help on every command print its usage and flags to
// stdout and exit 0.
func TestCLIHelp(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args  []string
		flags []string
	}{
		{[]string{"serve"}, []string{"-strict-config"}},
		{[]string{"check-config"}, []string{"-json", "-q", "-strict-config"}},
		{[]string{"jobs"}, []string{"-state", "-limit", "-json", "-spool", "-config"}},
		{[]string{"jobs", "list"}, []string{"-state", "-limit", "-json", "-spool", "-config"}},
		{[]string{"jobs", "show"}, []string{"-json", "-spool", "-config"}},
		{[]string{"jobs", "cancel"}, []string{"-addr", "-timeout", "-config", "-env-file"}},
		{[]string{"build"}, []string{"-image", "-envd", "-ca", "-no-ca", "-out", "-cache", "-username", "-password-stdin", "-insecure", "-platform", "-writable-layer-size"}},
		{[]string{"inspect"}, []string{"-json"}},
		{[]string{"version"}, []string{"-json"}},
	} {
		for _, h := range []string{"-h", "--help", "-help"} {
			args := append(append([]string{}, c.args...), h)
			name := strings.Join(args, " ")
			res := runCLI(t, minimalEnv(), args...)
			if res.code != 0 || res.stderr != "" {
				t.Errorf("templatecenter %s = exit %d, stderr %q; want exit 0 and nothing on stderr", name, res.code, res.stderr)
				continue
			}
			want := "Usage: templatecenter " + strings.Join(c.args[:1], " ")
			if c.args[0] == "serve" {
				want = "Usage: templatecenter [serve]"
			}
			if !strings.HasPrefix(res.stdout, want) {
				t.Errorf("templatecenter %s: stdout does not start with %q:\n%s", name, want, res.stdout)
			}
			for _, f := range append(c.flags, "--help") {
				if !strings.Contains(res.stdout, "  "+f) && !strings.Contains(res.stdout, ", "+f) {
					t.Errorf("templatecenter %s: flag %s not listed:\n%s", name, f, res.stdout)
				}
			}
		}
	}
	// A flag after the operands is still a flag: inspect -h is help, not
	// an image named "-h".
	if res := runCLI(t, minimalEnv(), "inspect", "image.ext4", "-h"); res.code != 0 || !strings.HasPrefix(res.stdout, "Usage: templatecenter inspect") {
		t.Errorf("templatecenter inspect image.ext4 -h = exit %d, stdout %q, stderr %q; want the help", res.code, res.stdout, res.stderr)
	}
}

// TestCLIBadFlags: unknown flags, bad values and wrong operands are usage
// errors: exit 2, a message naming the mistake, nothing on stdout.
func TestCLIBadFlags(t *testing.T) {
	t.Parallel()
	spoolPath := filepath.Join(t.TempDir(), "spool.db") // never opened
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
		{[]string{"jobs", "-state", "bogus", "-spool", spoolPath}, `--state "bogus": want one of queued, running, built, failed`},
		{[]string{"jobs", "--limit", "-1", "-spool", spoolPath}, "--limit -1"},
		{[]string{"jobs", "--limit", "many", "-spool", spoolPath}, `invalid value "many" for flag -limit`},
		{[]string{"jobs", "list", "extra", "-spool", spoolPath}, "takes no arguments"},
		{[]string{"jobs", "show", "-spool", spoolPath}, "want one JOB_ID"},
		{[]string{"jobs", "show", "a", "b", "-spool", spoolPath}, "want one JOB_ID"},
		{[]string{"jobs", "show", "a", "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"jobs", "cancel"}, "want one JOB_ID"},
		{[]string{"jobs", "cancel", "a", "--timeout", "0s"}, "--timeout 0s"},
		{[]string{"jobs", "cancel", "a", "--timeout", "soon"}, `invalid value "soon" for flag -timeout`},
		{[]string{"jobs", "cancel", "a", "--addr", "ftp://example.com"}, `--addr "ftp://example.com"`},
		{[]string{"build", "--image", "example.com/a:b", "--no-ca", "--ca", "x.crt"}, "--ca and --no-ca"},
		{[]string{"build", "--image", "example.com/a:b", "--password-stdin"}, "--password-stdin needs --username"},
		{[]string{"build", "--no-ca"}, "--image is required"},
		{[]string{"inspect", "--bogus", "a.ext4"}, "flag provided but not defined: -bogus"},
		{[]string{"inspect"}, "want IMAGE.ext4"},
		{[]string{"version", "extra"}, "takes no arguments"},
		{[]string{"version", "--json=maybe"}, `invalid boolean value "maybe"`},
	} {
		res := runCLI(t, minimalEnv(), c.args...)
		name := strings.Join(c.args, " ")
		if res.code != 2 || !strings.Contains(res.stderr, c.want) || !strings.Contains(res.stderr, "usage") || res.stdout != "" {
			t.Errorf("templatecenter %s = exit %d, stdout %q, stderr %q; want exit 2, a usage error with %q", name, res.code, res.stdout, res.stderr, c.want)
		}
	}
	if _, err := os.Stat(spoolPath); err == nil {
		t.Errorf("a usage error created %s", spoolPath)
	}
}

// TestCLIVersion: version prints version, revision and Go version, and
// --json the same as an object.
func TestCLIVersion(t *testing.T) {
	t.Parallel()
	res := runCLI(t, minimalEnv(), "version", "--json")
	var v struct {
		Version, Revision, GoVersion, Platform string
		Cgo                                    bool
	}
	dec := json.NewDecoder(strings.NewReader(res.stdout))
	if err := dec.Decode(&struct {
		Version   *string `json:"version"`
		Revision  *string `json:"revision"`
		GoVersion *string `json:"go_version"`
		Platform  *string `json:"platform"`
		Cgo       *bool   `json:"cgo"`
	}{&v.Version, &v.Revision, &v.GoVersion, &v.Platform, &v.Cgo}); res.code != 0 || err != nil {
		t.Fatalf("templatecenter version --json = exit %d, %v; stdout %q", res.code, err, res.stdout)
	}
	if v.Version != testVersion || v.GoVersion != runtime.Version() || v.Platform != runtime.GOOS+"/"+runtime.GOARCH || !v.Cgo {
		t.Errorf("templatecenter version --json = %+v; want version %s, %s, %s/%s, cgo", v, testVersion, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	}
	res = runCLI(t, minimalEnv(), "version")
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	if res.code != 0 || len(lines) != 3 || lines[0] != "templatecenter "+testVersion ||
		!strings.HasPrefix(lines[1], "revision: ") || lines[2] != "go: "+runtime.Version()+" "+v.Platform {
		t.Errorf("templatecenter version = exit %d:\n%s\nwant version, revision and Go version lines", res.code, res.stdout)
	}
}

// fakeInstall is an installed configuration under a temporary
// /etc/cube-templatecenter: conf.yaml naming a spool with one queued job
// and the agent's port, and templatecenter.env with the token.
type fakeInstall struct {
	dir, conf, envFile, spoolPath string
	port                          int
}

func newFakeInstall(t *testing.T, port int, envText string) fakeInstall {
	t.Helper()
	root := t.TempDir()
	fi := fakeInstall{dir: filepath.Join(root, "etc", "cube-templatecenter"), spoolPath: filepath.Join(root, "var", "spool.db"), port: port}
	fi.conf = filepath.Join(fi.dir, "conf.yaml")
	fi.envFile = filepath.Join(fi.dir, "templatecenter.env")
	for _, d := range []string{fi.dir, filepath.Dir(fi.spoolPath)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	conf := "common:\n  http_bind: 127.0.0.1\n  http_port: " + strconv.Itoa(port) + "\nspool:\n  path: " + fi.spoolPath + "\n"
	if err := os.WriteFile(fi.conf, []byte(conf), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fi.envFile, []byte(envText), 0o600); err != nil {
		t.Fatal(err)
	}
	sp, err := spool.Open(context.Background(), fi.spoolPath)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	if _, err := sp.Enqueue(context.Background(), spool.NewJob{ID: "installed-1", Request: []byte(`{}`)}, 10); err != nil {
		t.Fatal(err)
	}
	return fi
}

// env is a shell environment with nothing exported but the install's
// directory (the last of duplicate variables wins).
func (fi fakeInstall) env() []string { return append(minimalEnv(), sysconfDirEnv+"="+fi.dir) }

// fakeAgent answers cancel requests as the agent does: 200 with the right
// token, 401 otherwise. The function returns the token of the next request
// ("(no request)" when none comes).
func fakeAgent(t *testing.T, token string) (*httptest.Server, func() string) {
	got := make(chan string, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get(tokenHeader)
		if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/cancel") {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get(tokenHeader) != token {
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error":"invalid or missing shared token"}`))
			return
		}
		w.Write([]byte(`{"state":"failed"}`))
	}))
	t.Cleanup(srv.Close)
	return srv, func() string {
		select {
		case tok := <-got:
			return tok
		case <-time.After(waitLimit):
			return "(no request)"
		}
	}
}

func serverPort(t *testing.T, srv *httptest.Server) int {
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(u.Port())
	return p
}

// TestJobsInstalledConfig: run from a shell with nothing exported, jobs and
// jobs cancel read the installed conf.yaml and templatecenter.env.
func TestJobsInstalledConfig(t *testing.T) {
	t.Parallel()
	const token = "installed-token"
	srv, got := fakeAgent(t, token)
	fi := newFakeInstall(t, serverPort(t, srv), "# the service's environment\nCUBE_TEMPLATE_CALLBACK_TOKEN=\""+token+"\"\n")

	res := runCLI(t, fi.env(), "jobs", "--json")
	var views []jobView
	if err := json.Unmarshal([]byte(res.stdout), &views); res.code != 0 || err != nil || len(views) != 1 || views[0].JobID != "installed-1" {
		t.Fatalf("templatecenter jobs --json with an installed config = exit %d (%v), stdout %q, stderr %q; want job installed-1", res.code, err, res.stdout, res.stderr)
	}
	res = runCLI(t, fi.env(), "jobs", "show", "installed-1")
	if res.code != 0 || !strings.Contains(res.stdout, "state:") || !strings.Contains(res.stdout, "queued") {
		t.Errorf("templatecenter jobs show installed-1 = exit %d, stdout %q, stderr %q; want its state", res.code, res.stdout, res.stderr)
	}
	res = runCLI(t, fi.env(), "jobs", "cancel", "installed-1")
	if tok := got(); res.code != 0 || !strings.Contains(res.stdout, "cancelled") || tok != token {
		t.Errorf("templatecenter jobs cancel with the installed env file = exit %d, stderr %q, token %q; want the token sent and the job cancelled", res.code, res.stderr, tok)
	}

	// The token in a file named by the env file's _FILE variable.
	tokenFile := filepath.Join(fi.dir, "callback-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fi.envFile, []byte("CUBE_TEMPLATE_CALLBACK_TOKEN_FILE="+tokenFile+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	res = runCLI(t, fi.env(), "jobs", "cancel", "installed-1")
	if tok := got(); res.code != 0 || tok != token {
		t.Errorf("templatecenter jobs cancel with the token in a _FILE = exit %d, stderr %q, token %q; want the token sent", res.code, res.stderr, tok)
	}

	// --config and --env-file name the files; the environment wins over
	// the env file.
	other := filepath.Join(t.TempDir(), "other.env")
	if err := os.WriteFile(other, []byte("CUBE_TEMPLATE_CALLBACK_TOKEN=from-flag\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(minimalEnv(), sysconfDirEnv+"="+filepath.Join(t.TempDir(), "absent"))
	res = runCLI(t, env, "jobs", "cancel", "installed-1", "--config", fi.conf, "--env-file", other)
	if tok := got(); res.code != 1 || tok != "from-flag" || !strings.Contains(res.stderr, "not the agent's") {
		t.Errorf("templatecenter jobs cancel --config --env-file = exit %d, stderr %q, token %q; want the env file's token sent and refused", res.code, res.stderr, tok)
	}
	res = runCLI(t, append(env, "CUBE_TEMPLATE_CALLBACK_TOKEN="+token), "jobs", "cancel", "installed-1", "--config", fi.conf, "--env-file", other)
	if tok := got(); res.code != 0 || tok != token {
		t.Errorf("templatecenter jobs cancel with the token exported = exit %d, stderr %q, token %q; want the exported token to win", res.code, res.stderr, tok)
	}
	res = runCLI(t, env, "jobs", "cancel", "installed-1", "--env-file", filepath.Join(t.TempDir(), "missing.env"))
	if res.code != 1 || !strings.Contains(res.stderr, "missing.env") {
		t.Errorf("templatecenter jobs cancel --env-file MISSING = exit %d, stderr %q; want exit 1 naming the file", res.code, res.stderr)
	}
}

// TestJobsInstalledConfigUnreadable: an installed configuration the user
// may not read (not root) is named, with what to do, not silently skipped.
func TestJobsInstalledConfigUnreadable(t *testing.T) {
	t.Parallel()
	srv, got := fakeAgent(t, "unreadable-token")
	fi := newFakeInstall(t, serverPort(t, srv), "CUBE_TEMPLATE_CALLBACK_TOKEN=unreadable-token\n")
	run := func(args ...string) cliResult { return runCLI(t, fi.env(), args...) }
	if os.Geteuid() == 0 {
		// Root reads everything: run the binary as nobody, from a copy
		// nobody may execute, with the install's files kept root's.
		bin := nobodyBinary(t)
		run = func(args ...string) cliResult { return runAs(t, bin, 65534, fi.env(), args...) }
	}
	for _, f := range []string{fi.conf, fi.envFile} {
		if err := os.Chmod(f, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if os.Geteuid() != 0 {
		for _, f := range []string{fi.conf, fi.envFile} {
			if err := os.Chmod(f, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The port of conf.yaml is unknown without it: ask the fake agent
	// directly, which refuses the missing token.
	res := run("jobs", "cancel", "installed-1", "--addr", srv.URL)
	for _, want := range []string{fi.envFile + " (permission denied", fi.conf + " (permission denied", "no token was sent", "CUBE_TEMPLATE_CALLBACK_TOKEN"} {
		if res.code != 1 || !strings.Contains(res.stderr, want) {
			t.Errorf("templatecenter jobs cancel with unreadable installed files = exit %d, stderr %q; want exit 1 and %q", res.code, res.stderr, want)
		}
	}
	if tok := got(); tok != "" {
		t.Errorf("a token was sent: %q", tok)
	}
	res = run("jobs")
	if res.code != 1 || !strings.Contains(res.stderr, fi.conf+" (permission denied") {
		t.Errorf("templatecenter jobs with an unreadable conf.yaml = exit %d, stderr %q; want exit 1 naming it", res.code, res.stderr)
	}
}

// nobodyBinary copies the binary under test where any user may run it.
func nobodyBinary(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "templatecenter-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	data, err := os.ReadFile(agentBuild.Path(t))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "templatecenter")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// runAs runs bin as the user uid (the test runs as root) to completion.
func runAs(t *testing.T, bin string, uid uint32, env []string, args ...string) cliResult {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); cmd.ProcessState == nil {
		t.Fatalf("run %s as uid %d: %v", bin, uid, err)
	}
	return cliResult{stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}
}

// TestBuildCLICacheXDG: without --cache, build keeps its layers under
// $XDG_CACHE_HOME/cube-templatecenter, else ~/.cache/cube-templatecenter;
// inspect --json reads the result.
func TestBuildCLICacheXDG(t *testing.T) {
	t.Parallel()
	dir := writeLayout(t, cliImage(t), "v1")
	home, xdg := t.TempDir(), t.TempDir()
	for _, c := range []struct {
		env  []string
		want string
	}{
		{[]string{"HOME=" + home, "XDG_CACHE_HOME=" + xdg}, filepath.Join(xdg, "cube-templatecenter", "layers")},
		{[]string{"HOME=" + home}, filepath.Join(home, ".cache", "cube-templatecenter", "layers")},
		// A relative XDG_CACHE_HOME is ignored, as the specification says.
		{[]string{"HOME=" + home, "XDG_CACHE_HOME=relative"}, filepath.Join(home, ".cache", "cube-templatecenter", "layers")},
	} {
		os.RemoveAll(c.want)
		out := filepath.Join(t.TempDir(), "out")
		env := append([]string{"PATH=" + os.Getenv("PATH")}, c.env...)
		got := decodeBuild(t, runCLI(t, env, "build", "--image", "oci-layout:"+dir+":v1", "--no-ca", "--out", out), out)
		if entries, err := os.ReadDir(c.want); err != nil || len(entries) == 0 {
			t.Errorf("build with %v: layer cache %s = %v entries (%v); want the layers there", c.env, c.want, len(entries), err)
		}
		if _, err := os.Stat("relative"); err == nil {
			t.Error("build created a cache under the relative XDG_CACHE_HOME")
		}
		res := runCLI(t, env, "inspect", "--json", got.Ext4Path, "/")
		var list []struct {
			Name string `json:"name"`
			Type string `json:"type"`
			Perm string `json:"perm"`
		}
		if err := json.Unmarshal([]byte(res.stdout), &list); res.code != 0 || err != nil || len(list) == 0 {
			t.Errorf("inspect --json / = exit %d (%v), stdout %q", res.code, err, res.stdout)
		}
		for _, e := range list {
			if e.Name == "" || e.Type == "" || len(e.Perm) != 4 {
				t.Errorf("inspect --json entry %+v: want a name, a type and a 4-digit perm", e)
			}
		}
	}
	res := runCLI(t, []string{"PATH=" + os.Getenv("PATH")}, "build", "--image", "oci-layout:"+dir+":v1", "--no-ca", "--out", t.TempDir())
	if res.code != 1 || !strings.Contains(res.stderr, "--cache") {
		t.Errorf("build without HOME or XDG_CACHE_HOME = exit %d, stderr %q; want exit 1 asking for --cache", res.code, res.stderr)
	}
}

// TestStaticBuildRefusesSpool: a CGO_ENABLED=0 build compiles, says so in
// version, and its agent and jobs stop at the spool with the reason (the
// build), leaving the spool and its queued job untouched; it never advises
// moving the spool.
func TestStaticBuildRefusesSpool(t *testing.T) {
	t.Parallel()
	bin := cmdbin.Build{NoCgo: true}.Path(t)
	// make build refuses it up front.
	mk := exec.Command("make", "-s", "-C", filepath.Join("..", ".."), "cgo-check")
	mk.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := mk.CombinedOutput(); err == nil || !strings.Contains(string(out), "CGO_ENABLED=1") {
		t.Errorf("CGO_ENABLED=0 make cgo-check = %v, %s; want a refusal saying to build with CGO_ENABLED=1", err, out)
	}

	out, err := exec.Command(bin, "version", "--json").Output()
	if err != nil || !strings.Contains(string(out), `"cgo": false`) {
		t.Errorf("static templatecenter version --json = %v, %s; want cgo false", err, out)
	}

	h := newHarness(t, "", testToken)
	sp, err := spool.Open(context.Background(), h.spoolPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sp.Enqueue(context.Background(), spool.NewJob{ID: "kept-1", Request: []byte(`{}`)}, 10); err != nil {
		t.Fatal(err)
	}
	sp.Close()
	h.writeConfig()
	before := fileSum(t, h.spoolPath)
	for _, args := range [][]string{{"serve"}, {"jobs"}, {"jobs", "show", "kept-1"}} {
		cmd := exec.Command(bin, args...)
		cmd.Env = h.environ()
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		msg := stderr.String()
		if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 1 {
			t.Errorf("static templatecenter %s: %v, want exit 1; stderr:\n%s", strings.Join(args, " "), err, msg)
		}
		for _, want := range []string{h.spoolPath, "CGO_ENABLED=0", "rebuild it with cgo", "not touched"} {
			if !strings.Contains(msg, want) {
				t.Errorf("static templatecenter %s: stderr does not say %q:\n%s", strings.Join(args, " "), want, msg)
			}
		}
		if strings.Contains(msg, "aside") || strings.Contains(msg, "empty spool") {
			t.Errorf("static templatecenter %s advises moving the spool:\n%s", strings.Join(args, " "), msg)
		}
	}
	if after := fileSum(t, h.spoolPath); after != before {
		t.Error("the static build changed the spool file")
	}
	sp, err = spool.OpenReadOnly(context.Background(), h.spoolPath)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	if j, err := sp.Job(context.Background(), "kept-1"); err != nil || j.State != spool.StateQueued {
		t.Errorf("after the static build: job kept-1 = %+v, %v; want it still queued", j, err)
	}
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(data)
}

// TestReadEnvFile: the systemd EnvironmentFile= syntax the service's file
// uses; a malformed line is an error that does not show the line.
func TestReadEnvFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "templatecenter.env")
	text := "# comment\n; comment\n\nA=plain\n  B = spaced  \nC=\"double \\\"quoted\\\"\"\nD='single'\nE=\nF=a=b\n"
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readEnvFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"A": "plain", "B": "spaced", "C": `double "quoted"`, "D": "single", "E": "", "F": "a=b"}
	if len(got) != len(want) {
		t.Errorf("readEnvFile = %q, want %q", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("readEnvFile: %s = %q, want %q", k, got[k], v)
		}
	}
	if err := os.WriteFile(path, []byte("A=1\nsecret-without-equals\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readEnvFile(path); err == nil || !strings.Contains(err.Error(), "line 2") || strings.Contains(err.Error(), "secret") {
		t.Errorf("readEnvFile with a malformed line: %v; want an error naming line 2, not its content", err)
	}
}
