package config

import (
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
)

// wantProblems reads each document of cases as the configuration file and
// checks that the decoder or Validate refuses it with an error holding the
// document's value, the key at fault.
func wantProblems(t *testing.T, cases map[string]string) {
	t.Helper()
	for doc, want := range cases {
		c, _, err := Parse(strings.NewReader(doc))
		if err == nil {
			err = c.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config %q: error %v, want it to mention %q", doc, err, want)
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
	wantProblems(t, cases)
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

// TestValidateReportsInOrder: with every check failing, Validate names the
// keys in one fixed order (the environment's errors first, the sections
// with their own validation last), as check-config prints them.
func TestValidateReportsInOrder(t *testing.T) {
	c := Default()
	c.envErrs = []error{errors.New("CUBE_TEMPLATE_CENTER_SHUTDOWN_TIMEOUT: bad")}
	c.Common.HTTPPort, c.Common.MaxBodyBytes, c.Common.MaxUploadBytes = 0, 1, 1
	c.Log.Level, c.Log.Format = "loud", "xml"
	c.Master.Addr = "ftp://x"
	c.Common.ReadHeaderTimeout, c.Common.ReadTimeout, c.Common.WriteTimeout, c.Common.UploadTimeout = 0, 0, 0, 0
	c.Master.CallbackTimeout, c.Master.RetryInitial, c.Master.RetryMax = 0, 5*time.Second, -time.Second
	c.Spool.Retention, c.Shutdown.Timeout = 0, 0
	c.Build.HeartbeatInterval, c.Build.Timeout, c.Build.StallTimeout = 0, 0, 0
	c.Master.ProgressAttempts, c.Common.MaxConcurrentUploads = 0, 0
	c.Build.MaxConcurrentBuilds, c.Build.QueueSize, c.Build.MaxAttempts, c.Build.DownloadJobs = 0, 0, 0, 0
	c.Build.HeadroomPercent, c.Build.HeadroomInodes = -1, -1
	c.Build.MinTransferRate, c.Build.MaxEntries, c.Build.MaxTreeMemory, c.Build.MaxImageSize = 0, 0, 1, 1
	c.Store.Dir, c.Store.WorkDir, c.Spool.Path, c.Build.CAPath = "relative", "r", "r", "r"
	c.Registry.DenyNetworks, c.Registry.LocalRoots = []string{"10.0.0/8"}, []string{"relative"}
	c.Build.StartCheck, c.Build.Platform = "maybe", "linux"
	c.ArtifactStore.Attempts = 0
	c.InstanceDB.Driver, c.InstanceDB.Addr, c.InstanceDB.User, c.InstanceDB.DBName = "oracle", "db:3306", "u", "d"
	c.Replicas.OrphanAge = time.Hour
	c.Redis.Nodes = Nodes{"no-port"}
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate() = nil")
	}
	var got []string
	for _, line := range strings.Split(err.Error(), "\n") {
		key, _, _ := strings.Cut(line, ": ")
		got = append(got, key)
	}
	want := []string{
		"CUBE_TEMPLATE_CENTER_SHUTDOWN_TIMEOUT",
		"common.http_port", "common.max_body_bytes", "common.max_upload_bytes",
		"log.level", "log.format",
		"master.addr",
		"build.heartbeat_interval", "build.stall_timeout", "build.timeout",
		"common.read_header_timeout", "common.read_timeout", "common.upload_timeout", "common.write_timeout",
		"master.callback_timeout", "master.retry_max", "shutdown.timeout", "spool.retention",
		"master.retry_max",
		"master.progress_attempts", "common.max_concurrent_uploads",
		"build.max_concurrent_builds", "build.queue_size", "build.max_attempts", "build.download_jobs",
		"build.headroom_percent", "build.headroom_inodes",
		"build.min_transfer_rate", "build.max_entries", "build.max_tree_memory", "build.max_image_size",
		"store.dir", "store.work_dir", "spool.path", "build.ca_path",
		"registry.deny_networks", "registry.local_roots",
		"build.start_check", "build.platform",
		"artifact_store.attempts", "instance_db_config.driver", "replicas.orphan_age", "redis.nodes",
	}
	if !slices.Equal(got, want) {
		t.Errorf("Validate() named\n%q\nwant\n%q\nerror:\n%v", got, want, err)
	}
}

// TestDownloadConnectionsBounded: the node's and a layer's connections
// are counts from 1 to maxDownloadConnections.
func TestDownloadConnectionsBounded(t *testing.T) {
	for _, tc := range []struct {
		node, layer int
		bad         string
	}{
		{8, 4, ""}, {1, 1, ""}, {64, 64, ""}, {2, 4, ""},
		{0, 4, "build.download_connections"}, {65, 4, "build.download_connections"},
		{8, 0, "build.layer_connections"}, {8, -1, "build.layer_connections"},
	} {
		c := Default()
		c.Build.DownloadConnections, c.Build.LayerConnections = tc.node, tc.layer
		err := c.Validate()
		switch {
		case tc.bad == "" && err != nil:
			t.Errorf("%d/%d: %v", tc.node, tc.layer, err)
		case tc.bad != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.bad+": ")):
			t.Errorf("%d/%d: Validate() = %v; want a problem with %s", tc.node, tc.layer, err, tc.bad)
		}
	}
}
