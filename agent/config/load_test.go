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
