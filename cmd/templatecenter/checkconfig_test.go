package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// upstreamStyleConf is an upstream conf.yaml trimmed to what the tests
// need: upstream key names, a database without driver, a typo.
const upstreamStyleConf = `common:
  http_port: 8090
  http_readtimeout: 120
  master_addr: http://10.0.0.1:8089
log:
  path: /data/log/CubeTemplateCenter
  level: info
build:
  max_concurent_builds: 3
  layer_cache_quota: 20Gi
instance_db_config:
  addr: 127.0.0.1:3306
  user: cube
  pwd: db-secret-in-file
  db_name: cube_mvp
`

func writeConf(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "conf.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCheckConfigPrintsSourcesRedacted: check-config prints each setting
// with where it came from, never a secret, and the warnings; exit 0.
func TestCheckConfigPrintsSourcesRedacted(t *testing.T) {
	t.Parallel()
	path := writeConf(t, upstreamStyleConf)
	res := runCLI(t, []string{"CUBE_TEMPLATE_CENTER_CONFIG_PATH=" + path, "CUBE_TEMPLATE_CALLBACK_TOKEN=token-secret-value",
		"CUBE_SANDBOX_NODE_IP=10.0.0.5"}, "check-config")
	if res.code != 0 {
		t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", res.code, res.stdout, res.stderr)
	}
	for _, want := range []string{
		"# configuration file: " + path,
		"common.http_port = 8090  # " + path + ":2\n",
		"common.read_timeout = 2m0s  # " + path + ":3 (common.http_readtimeout)\n",
		`master.addr = "http://10.0.0.1:8089"  # ` + path + ":4 (common.master_addr)\n",
		"CUBE_TEMPLATE_CALLBACK_TOKEN = REDACTED  # env CUBE_TEMPLATE_CALLBACK_TOKEN\n",
		"instance_db_config.driver = \"mysql\"  # " + path + ":11 (no driver: mysql, upstream's default)\n",
		"instance_db_config.pwd = REDACTED  # " + path + ":14\n",
		"build.layer_cache_quota = 20GiB  # " + path + ":10\n",
		"build.max_concurrent_builds = 2  # default\n",
		"configuration OK (5 warning(s))",
	} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, res.stdout)
		}
	}
	for _, want := range []string{
		"warning: common.http_readtimeout (line 3) is deprecated, use common.read_timeout (applied)",
		"warning: log.path (line 6) ignored: TC logs to stderr",
		`warning: unknown key "build.max_concurent_builds" (line 9) ignored; did you mean "build.max_concurrent_builds"?`,
		"warning: CUBE_SANDBOX_NODE_IP is set but ignored:",
	} {
		if !strings.Contains(res.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, res.stderr)
		}
	}
	for _, secret := range []string{"token-secret-value", "db-secret-in-file"} {
		if strings.Contains(res.stdout+res.stderr, secret) {
			t.Errorf("check-config printed a secret %q", secret)
		}
	}

	// -q: only errors, and this file has none; the agent logs the warnings.
	quiet := runCLI(t, []string{"CUBE_TEMPLATE_CENTER_CONFIG_PATH=" + path}, "check-config", "-q")
	if quiet.code != 0 || quiet.stdout != "" || quiet.stderr != "" {
		t.Errorf("check-config -q: exit %d\nstdout:\n%s\nstderr:\n%s", quiet.code, quiet.stdout, quiet.stderr)
	}
}

// TestCheckConfigUpstreamValues: values upstream runs with pass the
// unit's ExecStartPre= check, read by upstream's rules and each named in a
// warning: an upstream variable never stops the agent.
func TestCheckConfigUpstreamValues(t *testing.T) {
	t.Parallel()
	path := writeConf(t, "common:\n  http_readtimeout: 0\n  master_addr: \"\"\n")
	for _, tc := range []struct{ env, want string }{
		{"CUBEMASTER_NATIVE_ROOTFS_EXPORT_JOBS=0", "build.download_jobs = 6  # default\n"},
		{"CUBEMASTER_NATIVE_ROOTFS_EXPORT_JOBS=128", "build.download_jobs = 32  # env CUBEMASTER_NATIVE_ROOTFS_EXPORT_JOBS\n"},
		{"CUBE_TEMPLATE_CENTER_MAX_CONCURRENT_BUILDS=abc", "build.max_concurrent_builds = 2  # default\n"},
		{"CUBE_TC_RECONCILE_DISABLED=yes", "replicas.reconcile_disabled = true  # env CUBE_TC_RECONCILE_DISABLED\n"},
	} {
		res := runCLI(t, []string{"CUBE_TEMPLATE_CENTER_CONFIG_PATH=" + path, tc.env}, "check-config")
		if res.code != 0 {
			t.Errorf("%s: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", tc.env, res.code, res.stdout, res.stderr)
			continue
		}
		name, _, _ := strings.Cut(tc.env, "=")
		for _, want := range []string{tc.want, "warning: " + name, "warning: common.http_readtimeout (line 2) is ignored",
			"warning: common.master_addr (line 3) is ignored"} {
			if !strings.Contains(res.stdout+res.stderr, want) {
				t.Errorf("%s: output lacks %q:\nstdout:\n%s\nstderr:\n%s", tc.env, want, res.stdout, res.stderr)
			}
		}
	}
}

// TestCheckConfigInvalid: an invalid configuration is exit 1 with every
// error on stderr, as text and as JSON; strict mode fails on the typo.
func TestCheckConfigInvalid(t *testing.T) {
	t.Parallel()
	bad := writeConf(t, "build:\n  max_concurrent_builds: 0\ncommon:\n  http_port: 70000\n")
	res := runCLI(t, []string{"CUBE_TEMPLATE_CENTER_CONFIG_PATH=" + bad}, "check-config")
	if res.code != 1 || res.stdout != "" {
		t.Errorf("invalid: exit %d, stdout %q; want 1 and nothing", res.code, res.stdout)
	}
	if quiet := runCLI(t, []string{"CUBE_TEMPLATE_CENTER_CONFIG_PATH=" + bad}, "check-config", "-q"); quiet.code != 1 ||
		quiet.stderr != res.stderr {
		t.Errorf("invalid, -q: exit %d, stderr %q; want 1 and the same errors", quiet.code, quiet.stderr)
	}
	for _, want := range []string{"error: build.max_concurrent_builds: 0 is outside 1..64", "error: common.http_port: 70000 is not a TCP port",
		"configuration " + bad + " is invalid: 2 error(s)"} {
		if !strings.Contains(res.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, res.stderr)
		}
	}

	js := runCLI(t, []string{"CUBE_TEMPLATE_CENTER_CONFIG_PATH=" + bad}, "check-config", "--json")
	var out checkConfigResult
	if err := json.Unmarshal([]byte(js.stdout), &out); err != nil {
		t.Fatalf("--json: %v\n%s", err, js.stdout)
	}
	if js.code != 1 || out.Valid || len(out.Errors) != 2 || out.Path != bad || len(out.Settings) != 0 {
		t.Errorf("--json invalid: exit %d, %+v", js.code, out)
	}

	path := writeConf(t, upstreamStyleConf)
	js = runCLI(t, []string{"CUBE_TEMPLATE_CENTER_CONFIG_PATH=" + path, "CUBE_TEMPLATE_CENTER_DB_PASSWORD=db-secret-env"}, "check-config", "--json")
	out = checkConfigResult{}
	if err := json.Unmarshal([]byte(js.stdout), &out); err != nil || js.code != 0 || !out.Valid || len(out.Warnings) != 4 {
		t.Errorf("--json valid: exit %d, %v, %+v", js.code, err, out)
	}
	for _, s := range out.Settings {
		if s.Key == "instance_db_config.pwd" && (s.Value != "REDACTED" || s.Source != "env CUBE_TEMPLATE_CENTER_DB_PASSWORD") {
			t.Errorf("--json pwd: %+v", s)
		}
	}
	if strings.Contains(js.stdout, "db-secret") {
		t.Error("--json printed a secret")
	}

	for name, env := range map[string][]string{
		"flag": nil, "env": {"CUBE_TEMPLATE_CENTER_STRICT_CONFIG=true"},
	} {
		args := []string{"check-config"}
		if env == nil {
			args = append(args, "--strict-config")
		}
		res := runCLI(t, append(env, "CUBE_TEMPLATE_CENTER_CONFIG_PATH="+path), args...)
		if res.code != 1 || !strings.Contains(res.stderr, `unknown key "build.max_concurent_builds" (line 9): unknown keys are errors in strict mode`) {
			t.Errorf("strict by %s: exit %d\n%s", name, res.code, res.stderr)
		}
	}
}

// TestCheckConfigShowsWhatIsInForce: the strictness the environment asks
// for shows with its source; the settings only the environment holds show
// under their variables, and the file naming them is told so, never
// "did you mean" the same key; a value that is not a size names its key.
func TestCheckConfigShowsWhatIsInForce(t *testing.T) {
	t.Parallel()
	path := writeConf(t, "master:\n  token: in-file\n")
	res := runCLI(t, []string{"CUBE_TEMPLATE_CENTER_CONFIG_PATH=" + path, "CUBE_TEMPLATE_CENTER_STRICT_CONFIG=true",
		"CUBE_TEMPLATE_CALLBACK_INSECURE_NO_TOKEN=true"}, "check-config")
	if res.code != 1 || !strings.Contains(res.stderr, `unknown key "master.token" (line 2): unknown keys are errors in strict mode; `+
		"the environment alone sets it: CUBE_TEMPLATE_CALLBACK_TOKEN") || strings.Contains(res.stderr, "did you mean") {
		t.Errorf("master.token in the file, strict: exit %d\n%s", res.code, res.stderr)
	}
	res = runCLI(t, []string{"CUBE_TEMPLATE_CENTER_STRICT_CONFIG=true", "CUBE_TEMPLATE_CALLBACK_INSECURE_NO_TOKEN=true"}, "check-config")
	for _, want := range []string{
		"config.strict = true  # env CUBE_TEMPLATE_CENTER_STRICT_CONFIG\n",
		"CUBE_TEMPLATE_CALLBACK_INSECURE_NO_TOKEN = true  # env CUBE_TEMPLATE_CALLBACK_INSECURE_NO_TOKEN\n",
		"CUBE_TEMPLATE_CALLBACK_TOKEN = \"\"  # default\n",
	} {
		if res.code != 0 || !strings.Contains(res.stdout, want) {
			t.Errorf("exit %d, stdout lacks %q:\n%s%s", res.code, want, res.stdout, res.stderr)
		}
	}
	if strings.Contains(res.stdout, "master.token") || strings.Contains(res.stdout, "master.insecure_no_token") {
		t.Errorf("environment-only settings shown as keys:\n%s", res.stdout)
	}
	if res := runCLI(t, nil, "check-config", "--strict-config"); !strings.Contains(res.stdout, "config.strict = true  # flag --strict-config\n") {
		t.Errorf("--strict-config: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}

	bad := writeConf(t, "common:\n  http_port: 8090\nbuild:\n  queue_size: 4\n  layer_cache_quota: 20 bananas\n")
	res = runCLI(t, []string{"CUBE_TEMPLATE_CENTER_CONFIG_PATH=" + bad}, "check-config")
	if want := `build.layer_cache_quota (line 5): "20 bananas" is not a size`; res.code != 1 || !strings.Contains(res.stderr, want) {
		t.Errorf("a bad size: exit %d, stderr lacks %q:\n%s", res.code, want, res.stderr)
	}
}

// TestCheckConfigUsage: flags it does not know and arguments are usage
// errors (exit 2); -h is help (exit 0); no file means defaults.
func TestCheckConfigUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"check-config", "--bogus"}, {"check-config", "conf.yaml"}} {
		if res := runCLI(t, nil, args...); res.code != 2 {
			t.Errorf("%q: exit %d, want 2\n%s", args, res.code, res.stderr)
		}
	}
	if res := runCLI(t, nil, "check-config", "-h"); res.code != 0 || !strings.Contains(res.stdout, "strict-config") {
		t.Errorf("-h: exit %d\n%s", res.code, res.stderr)
	}
	res := runCLI(t, nil, "check-config")
	if res.code != 0 || !strings.Contains(res.stdout, "# configuration file: none") || !strings.Contains(res.stdout, "common.http_port = 8090  # default") {
		t.Errorf("no file: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
}

// TestServeStrictConfig: serve reads through the same path: with
// --strict-config an unknown key stops it at once.
func TestServeStrictConfig(t *testing.T) {
	t.Parallel()
	path := writeConf(t, "build:\n  max_concurent_builds: 3\n")
	res := runCLI(t, []string{"CUBE_TEMPLATE_CENTER_CONFIG_PATH=" + path, "CUBE_TEMPLATE_CALLBACK_TOKEN=x"}, "serve", "--strict-config")
	if res.code != 1 || !strings.Contains(res.stderr, `did you mean "build.max_concurrent_builds"`) {
		t.Errorf("serve --strict-config: exit %d\n%s", res.code, res.stderr)
	}
}

// TestUpstreamWarningsAtStartAndReload: the agent logs an upstream
// variable it ignores once, at start; a reload (SIGHUP) logs the file's
// warnings again, which the file may have changed, but not the
// environment's, which it cannot.
func TestUpstreamWarningsAtStartAndReload(t *testing.T) {
	t.Parallel()
	cm := startCubeMaster(t, testToken)
	h := newHarness(t, cm.URL(), testToken)
	h.set("log.path", "/data/log/CubeTemplateCenter")
	p := h.startAgent("agent", "CUBE_AUTO_MIGRATION=false")
	p.waitLine(t, "level=WARN", "CUBE_AUTO_MIGRATION is set but ignored: TC runs no schema migrations")
	p.waitLine(t, "level=WARN", "log.path (line", "ignored: TC logs to stderr")
	p.signal(t, syscall.SIGHUP)
	p.waitLine(t, `msg="configuration reloaded"`, "outcome=applied")
	p.stop(t)
	logs := p.out.String()
	if n := strings.Count(logs, "CUBE_AUTO_MIGRATION is set but ignored"); n != 1 {
		t.Errorf("the ignored variable was logged %d times, want once (at start):\n%s", n, logs)
	}
	if n := strings.Count(logs, "log.path (line"); n != 2 {
		t.Errorf("the ignored key was logged %d times, want at start and at the reload:\n%s", n, logs)
	}
}

// TestURLCredentialsRedacted: a password in CUBE_MASTER_ADDR or in an S3
// endpoint shows neither in check-config, in its errors, nor in the
// agent's log.
func TestURLCredentialsRedacted(t *testing.T) {
	t.Parallel()
	const secret = "url-pass-never-shown"
	res := runCLI(t, []string{"CUBE_MASTER_ADDR=http://cm:" + secret + "@127.0.0.1:8089/?sig=" + secret}, "check-config")
	if res.code != 0 || !strings.Contains(res.stdout, `master.addr = "http://REDACTED@127.0.0.1:8089/?REDACTED"  # env CUBE_MASTER_ADDR`) {
		t.Errorf("check-config: exit %d\n%s%s", res.code, res.stdout, res.stderr)
	}
	js := runCLI(t, []string{"CUBE_MASTER_ADDR=http://cm:" + secret + "@127.0.0.1:8089"}, "check-config", "--json")
	// An invalid master address stops the agent; an invalid endpoint from
	// upstream's variable is ignored with a warning, as upstream's failing
	// uploads leave artifacts local: both name the address without its
	// credentials.
	for name, tc := range map[string]struct {
		env  string
		code int
	}{
		"master":      {"CUBE_MASTER_ADDR=ftp://cm:" + secret + "@127.0.0.1:8089", 1},
		"s3 endpoint": {"CUBE_S3_ENDPOINT=http://key:" + secret + "@127.0.0.1:9000/bucket", 0},
	} {
		bad := runCLI(t, []string{tc.env, "CUBE_S3_BUCKET=b"}, "check-config")
		if bad.code != tc.code || !strings.Contains(bad.stderr, "REDACTED@127.0.0.1") {
			t.Errorf("%s invalid: exit %d, stderr %q; want %d naming the address without its credentials", name, bad.code, bad.stderr, tc.code)
		}
		res.stderr += bad.stdout + bad.stderr
	}

	h := newHarness(t, "", testToken)
	h.env["CUBE_MASTER_ADDR"] = "http://cm:" + secret + "@127.0.0.1:1"
	agent := h.startAgent("agent (master with a password)")
	agent.waitLine(t, "msg=starting", "master=http://REDACTED@127.0.0.1:1")
	agent.stop(t)
	if out := res.stdout + res.stderr + js.stdout + js.stderr + agent.out.String(); strings.Contains(out, secret) {
		t.Errorf("a URL's password shows:\n%s", out)
	}
}
