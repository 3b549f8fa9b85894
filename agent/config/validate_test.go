package config

import (
	"log/slog"
	"strings"
	"testing"
)

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
