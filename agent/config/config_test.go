package config

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func envOf(m map[string]string) Env {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestDefaultsAreValid(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if c.ListenAddr() != "0.0.0.0:8090" || c.Store.Dir != "/data/CubeMaster/storage" || c.Master.Addr != "http://127.0.0.1:8089" ||
		c.Build.MaxConcurrentBuilds != 2 || c.Build.QueueSize != 64 || c.Build.Timeout != 2*time.Hour || !strings.HasPrefix(c.Spool.Path, "/var/lib/cube-templatecenter/") ||
		!c.Build.DirectIO {
		t.Errorf("unexpected defaults: %+v", c)
	}
}

func TestLoadFileEnvAndWarnings(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "conf.yaml")
	os.WriteFile(path, []byte(`
common:
  http_bind: 127.0.0.1
  http_port: 9000
  max_body_bytes: 32MiB
  surprise: 1
build:
  queue_size: 10
  heartbeat_interval: 15s
  timeout: 45m
  layer_cache_quota: 5GiB
  direct_io: false
registry:
  mirrors:
    docker.io: [mirror.local:5000]
typo_section:
  x: 1
`), 0o644)
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	c, err := Load(envOf(map[string]string{
		PathEnv: path, "CUBE_MASTER_ADDR": "http://master:8089/", "CUBE_TC_CALLBACK_TOKEN": " tok ",
		"CUBE_TEMPLATE_CENTER_ARTIFACT_STORE_DIR": "/srv/store", "CUBE_TEMPLATE_CENTER_MAX_CONCURRENT_BUILDS": "4",
		"CUBE_TEMPLATE_CENTER_SPOOL_PATH": "/srv/spool.db", "CUBE_TEMPLATE_CENTER_WORK_DIR": "/srv/work",
		"CUBE_TEMPLATE_CALLBACK_INSECURE_NO_TOKEN": "false",
	}), logger)
	if err != nil {
		t.Fatal(err)
	}
	if c.ListenAddr() != "127.0.0.1:9000" || c.Common.MaxBodyBytes != 32<<20 || c.Build.QueueSize != 10 ||
		c.Build.HeartbeatInterval != 15*time.Second || c.Build.Timeout != 45*time.Minute || c.Build.LayerCacheQuota != 5<<30 ||
		c.Build.DirectIO {
		t.Errorf("file values not applied: %+v %+v", c.Common, c.Build)
	}
	if c.Master.Addr != "http://master:8089/" || c.Master.Token != "tok" || c.Store.Dir != "/srv/store" ||
		c.Build.MaxConcurrentBuilds != 4 || c.Spool.Path != "/srv/spool.db" || c.Store.WorkDir != "/srv/work" {
		t.Errorf("env overrides not applied: %+v %+v", c.Master, c.Store)
	}
	if got := c.Registry.Mirrors["docker.io"]; len(got) != 1 || got[0] != "mirror.local:5000" {
		t.Errorf("mirrors = %v", c.Registry.Mirrors)
	}
	out := logs.String()
	for _, want := range []string{`common.surprise`, `typo_section`, "CUBE_TC_CALLBACK_TOKEN is deprecated"} {
		if !strings.Contains(out, want) {
			t.Errorf("warnings lack %q:\n%s", want, out)
		}
	}
}

func TestInvalidValuesNameTheirKey(t *testing.T) {
	cases := map[string]string{
		"common:\n  http_port: 70000\n":                    "common.http_port",
		"build:\n  max_concurrent_builds: 0\n":             "build.max_concurrent_builds",
		"build:\n  queue_size: -1\n":                       "build.queue_size",
		"master:\n  addr: ftp://x\n":                       "master.addr",
		"log:\n  level: loud\n":                            "log.level",
		"store:\n  dir: relative/path\n":                   "store.dir",
		"build:\n  heartbeat_interval: 0s\n":               "build.heartbeat_interval",
		"build:\n  timeout: 0s\n":                          "build.timeout",
		"build:\n  timeout: -1m\n":                         "build.timeout",
		"build:\n  layer_cache_quota: lots\n":              `build.layer_cache_quota (line 2): "lots"`,
		"common:\n  http_port: [1]\n":                      "common.http_port (line 2)",
		"master:\n  retry_initial: 10s\n  retry_max: 1s\n": "master.retry_max",
		"just a string":                                    "parse YAML",
		"build:\n  stall_timeout: 0s\n":                    "build.stall_timeout",
		"build:\n  min_transfer_rate: 0\n":                 "build.min_transfer_rate",
		"registry:\n  deny_networks: [10.0.0/8]\n":         `registry.deny_networks: "10.0.0/8" is not a CIDR`,
		"registry:\n  allow_networks: [127.0.0.1]\n":       `registry.allow_networks: "127.0.0.1" is not a CIDR`,
		"common:\n  max_concurrent_uploads: 0\n":           "common.max_concurrent_uploads",
		"spool:\n  min_free: 120%\n":                       `spool.min_free (line 2): "120%"`,
	}
	for doc, want := range cases {
		c, _, err := Parse(strings.NewReader(doc))
		if err == nil {
			err = c.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config %q: error %v, want it to mention %q", doc, err, want)
		}
	}
	// TC's own variables are checked as its keys are (upstream's are read
	// by upstream's rules: TestUpstreamVariableParsing).
	_, err := Load(envOf(map[string]string{"CUBE_TEMPLATE_CENTER_SHUTDOWN_TIMEOUT": "soon"}), slog.Default())
	if err == nil || !strings.Contains(err.Error(), "CUBE_TEMPLATE_CENTER_SHUTDOWN_TIMEOUT") {
		t.Errorf("bad env value: %v", err)
	}
	_, err = Load(envOf(map[string]string{PathEnv: "/nonexistent/conf.yaml"}), slog.Default())
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/conf.yaml") {
		t.Errorf("missing file: %v", err)
	}
	if c, _, err := Parse(strings.NewReader("")); err != nil || c.Validate() != nil {
		t.Errorf("empty file should mean defaults: %v", err)
	}
}

func TestRestartOnly(t *testing.T) {
	a, b := Default(), Default()
	b.Build.MaxConcurrentBuilds, b.Log.Level, b.Build.Timeout = 9, "debug", time.Minute
	if keys := a.RestartOnly(b); len(keys) != 0 {
		t.Errorf("live-reloadable changes flagged: %v", keys)
	}
	b.Common.HTTPPort, b.Store.Dir = 1, "/x"
	if keys := a.RestartOnly(b); strings.Join(keys, ",") != "common,store" {
		t.Errorf("RestartOnly = %v", keys)
	}
	c := Default()
	c.Build.CAPath, c.Build.DirectIO, c.Registry.Insecure = "/other.crt", false, []string{"r:5000"}
	if keys := a.RestartOnly(c); len(keys) != 2 || !strings.HasPrefix(keys[0], "build") || keys[1] != "registry" {
		t.Errorf("RestartOnly for builder settings = %v", keys)
	}
}

func TestRegistryNetworks(t *testing.T) {
	c := Default()
	if c.Build.StallTimeout != 5*time.Minute {
		t.Errorf("build.stall_timeout default = %s, want 5m", c.Build.StallTimeout)
	}
	if c.Build.MinTransferRate != 1<<10 {
		t.Errorf("build.min_transfer_rate default = %s, want 1KiB", c.Build.MinTransferRate)
	}
	n, err := c.Registry.Networks()
	if err != nil {
		t.Fatal(err)
	}
	// Nothing added, lifted or allowed: the defaults alone apply.
	if n.Deny != nil || n.Lift != nil || n.Allow != nil {
		t.Errorf("default networks: %+v, want none set", n)
	}
	c, _, err = Parse(strings.NewReader("registry:\n  deny_networks: [10.0.0.0/8]\n  lift_default_deny: [169.254.0.0/16]\n  allow_networks: [10.0.0.0/8, \"fd00::/8\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if n, err = c.Registry.Networks(); err != nil || len(n.Deny) != 1 || len(n.Lift) != 1 || len(n.Allow) != 2 {
		t.Errorf("Networks() = %+v, %v; want one added, one lifted, two allowed", n, err)
	}
}

func TestByteSize(t *testing.T) {
	for in, want := range map[string]ByteSize{"0": 0, "1024": 1024, "4KiB": 4096, "512MiB": 512 << 20, "20GiB": 20 << 30, "1TiB": 1 << 40, "3G": 3 << 30} {
		if got, err := ParseByteSize(in); err != nil || got != want {
			t.Errorf("ParseByteSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "1.5GiB", "GiB", "99999999999TiB"} {
		if _, err := ParseByteSize(bad); err == nil {
			t.Errorf("ParseByteSize(%q) succeeded", bad)
		}
	}
	if s := ByteSize(20 << 30).String(); s != "20GiB" {
		t.Errorf("String = %s", s)
	}
}

// TestSpoolReserveAndUploadBound: spool.min_free and
// common.max_concurrent_uploads have working defaults and parse.
func TestSpoolReserveAndUploadBound(t *testing.T) {
	c := Default()
	if c.Spool.MinFree != (Reserve{Bytes: 64 << 20}) || c.Common.MaxConcurrentUploads != 2 {
		t.Errorf("defaults: spool.min_free %s, common.max_concurrent_uploads %d; want 64MiB and 2", c.Spool.MinFree, c.Common.MaxConcurrentUploads)
	}
	c, _, err := Parse(strings.NewReader("spool:\n  min_free: 3%\ncommon:\n  max_concurrent_uploads: 5\n"))
	if err != nil || c.Validate() != nil {
		t.Fatalf("Parse: %v", err)
	}
	if c.Spool.MinFree != (Reserve{Percent: 3}) || c.Common.MaxConcurrentUploads != 5 {
		t.Errorf("parsed spool.min_free %s, common.max_concurrent_uploads %d; want 3%% and 5", c.Spool.MinFree, c.Common.MaxConcurrentUploads)
	}
}
