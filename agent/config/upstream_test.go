package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// upstreamConf is upstream's shipped conf.yaml (single-node template, as
// its installer renders it): no database driver, upstream's key names.
const upstreamConf = `common:
  http_bind: 127.0.0.1
  http_port: 8090
  http_readtimeout: 120
  http_writetimeout: 360
  http_idletimeout: 360
  master_addr: http://10.0.0.1:8089
  sync_meta_data_interval: 30
  sync_metric_data_interval: 1
  collect_metric_interval: 1
log:
  module: templatecenter
  path: /data/log/CubeTemplateCenter
  file_size: 100
  file_num: 10
  level: info
instance_db_config:
  addr: 127.0.0.1:3306
  user: cube
  pwd: cube_pass
  db_name: cube_mvp
  conn_timeout: 5
  read_timeout: 5
  write_timeout: 5
  max_idle_conns: 5
  max_open_conns: 20
  max_conn_life_time_seconds: 300
  migration_lock_timeout_seconds: 30
redis:
  nodes: 127.0.0.1:6379
  password: redis_pass
  db_no: 0
  max_idle: 8
  max_active: 32
  idle_timeout: 30
  max_retry: 2
auth:
  enable: false
`

// readFile loads text as the configuration file under env, through Read.
func readFile(t *testing.T, text string, env map[string]string, opts Options) (*Config, *Provenance, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "conf.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	all := map[string]string{PathEnv: path}
	for k, v := range env {
		all[k] = v
	}
	return Read(envOf(all), opts)
}

func warningTexts(rep *Provenance) []string {
	var out []string
	for _, w := range rep.Warnings {
		out = append(out, w.Text)
	}
	return out
}

// TestUpstreamConfYAML: upstream's conf.yaml loads, its database is on
// (MySQL, upstream's default driver), each mapped key is applied under TC's
// name and each key TC has no use for is reported ignored; none is unknown.
func TestUpstreamConfYAML(t *testing.T) {
	c, rep, err := readFile(t, upstreamConf, nil, Options{})
	if err != nil {
		t.Fatalf("upstream's conf.yaml: %v", err)
	}
	if !c.InstanceDB.Enabled() || c.InstanceDB.Driver != DriverMySQL || c.InstanceDB.Addr != "127.0.0.1:3306" ||
		c.InstanceDB.Pwd.Reveal() != "cube_pass" {
		t.Errorf("database %+v: want MySQL on 127.0.0.1:3306", c.InstanceDB)
	}
	if c.Common.ReadTimeout != 120*time.Second || c.Common.WriteTimeout != 360*time.Second || c.Master.Addr != "http://10.0.0.1:8089" {
		t.Errorf("mapped keys not applied: read %s write %s master %s", c.Common.ReadTimeout, c.Common.WriteTimeout, c.Master.Addr)
	}
	if !c.Redis.Enabled() || c.Redis.Password.Reveal() != "redis_pass" {
		t.Errorf("redis %+v", c.Redis)
	}
	got := warningTexts(rep)
	want := []string{
		"common.http_readtimeout (line 4) is deprecated, use common.read_timeout (applied)",
		"common.http_writetimeout (line 5) is deprecated, use common.write_timeout (applied)",
		"common.http_idletimeout (line 6) ignored: TC closes idle keep-alive connections after a fixed 2m",
		"common.master_addr (line 7) is deprecated, use master.addr (applied)",
		"common.sync_meta_data_interval (line 8) ignored: TC keeps no node metadata replica",
		"common.sync_metric_data_interval (line 9) ignored: " + whyInherited,
		"common.collect_metric_interval (line 10) ignored: " + whyInherited,
		"log.module (line 12) ignored: " + whyLogFiles,
		"log.path (line 13) ignored: " + whyLogFiles,
		"log.file_size (line 14) ignored: " + whyLogFiles,
		"log.file_num (line 15) ignored: " + whyLogFiles,
		"instance_db_config.migration_lock_timeout_seconds (line 28) ignored: " + whyNoMigrate,
		"redis.max_idle (line 33) ignored: " + whyRedisPool,
		"redis.max_active (line 34) ignored: " + whyRedisPool,
		"redis.idle_timeout (line 35) ignored: " + whyRedisPool,
		"redis.max_retry (line 36) ignored: " + whyRedisPool,
		"auth.enable (line 38) ignored: TC authenticates every call with the shared token (CUBE_TEMPLATE_CALLBACK_TOKEN); " +
			"only CUBE_TEMPLATE_CALLBACK_INSECURE_NO_TOKEN=true turns that off",
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("no warning %q", w)
		}
	}
	for _, w := range got {
		if strings.Contains(w, "unknown key") {
			t.Errorf("upstream key reported unknown: %s", w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d warnings, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	// Strict mode is about unknown keys: upstream's file passes.
	if _, _, err := readFile(t, upstreamConf, nil, Options{Strict: true}); err != nil {
		t.Errorf("upstream's conf.yaml in strict mode: %v", err)
	}
}

// TestEveryUpstreamKeyIsTold: each key of the table, alone in a file, is
// applied with a warning naming TC's key or reported ignored with its reason.
func TestEveryUpstreamKeyIsTold(t *testing.T) {
	values := map[string]string{"common.master_addr": "http://m:1"}
	for key, u := range upstreamKeys {
		section, leaf := splitKey(key)
		v := values[key]
		if v == "" {
			v = "30"
		}
		text, line := section+":\n  "+leaf+": "+v+"\n", "2"
		if section == "instance_db_config" { // a database section needs a server
			text, line = section+":\n  addr: 127.0.0.1:3306\n  user: u\n  db_name: d\n  "+leaf+": "+v+"\n", "5"
		}
		_, rep, err := readFile(t, text, nil, Options{Strict: true})
		if err != nil {
			t.Errorf("%s: %v", key, err)
			continue
		}
		want := key + " (line " + line + ") ignored: " + u.why
		if u.to != "" {
			want = key + " (line " + line + ") is deprecated, use " + u.to + " (applied)"
			if rep.Source(u.to) != rep.Path+":"+line+" ("+key+")" {
				t.Errorf("%s: source of %s is %q", key, u.to, rep.Source(u.to))
			}
		}
		if got := warningTexts(rep); !slices.Equal(got, []string{want}) {
			t.Errorf("%s: warnings %q, want %q", key, got, want)
		}
	}
}

// TestTCKeyWinsOverUpstreamName: a file with both names keeps TC's and
// says the upstream one is ignored.
func TestTCKeyWinsOverUpstreamName(t *testing.T) {
	c, rep, err := readFile(t, "common:\n  read_timeout: 30s\n  http_readtimeout: 120\n", nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Common.ReadTimeout != 30*time.Second {
		t.Errorf("read_timeout = %s, want TC's 30s", c.Common.ReadTimeout)
	}
	want := "common.http_readtimeout (line 3) is upstream's name for common.read_timeout, which the file also sets: common.http_readtimeout ignored"
	if got := warningTexts(rep); !slices.Equal(got, []string{want}) {
		t.Errorf("warnings %q, want %q", got, want)
	}
	if _, _, err := readFile(t, "common:\n  http_readtimeout: soon\n", nil, Options{}); err == nil ||
		!strings.Contains(err.Error(), "common.http_readtimeout (line 2)") {
		t.Errorf("bad upstream value: %v, want an error naming the key and line", err)
	}
}

// TestDatabaseDriverDefault: a database section without driver is MySQL,
// as upstream; an explicit empty driver, or no section, is no database.
func TestDatabaseDriverDefault(t *testing.T) {
	db := "instance_db_config:\n  addr: db:3306\n  user: cube\n  db_name: cube_mvp\n"
	c, rep, err := readFile(t, db, nil, Options{})
	if err != nil || c.InstanceDB.Driver != DriverMySQL {
		t.Fatalf("no driver: %+v, %v; want mysql", c, err)
	}
	if src := rep.Source("instance_db_config.driver"); !strings.Contains(src, "no driver: mysql, upstream's default") {
		t.Errorf("driver's source %q does not say it is upstream's default", src)
	}
	if c, _, err := readFile(t, db+"  driver: \"\"\n", nil, Options{}); err != nil || c.InstanceDB.Enabled() {
		t.Errorf("driver \"\": %v, enabled %v; want no database", err, c != nil && c.InstanceDB.Enabled())
	}
	if c, _, err := readFile(t, db+"  driver: postgres\n", nil, Options{}); err != nil || c.InstanceDB.Driver != DriverPostgres {
		t.Errorf("driver postgres: %v", err)
	}
	if c, _, err := readFile(t, "log:\n  level: info\n", nil, Options{}); err != nil || c.InstanceDB.Enabled() {
		t.Errorf("no section: %v; want no database", err)
	}
	// A section that names no server is an error, never silently off.
	if _, _, err := readFile(t, "instance_db_config:\n  conn_timeout: 5\n", nil, Options{}); err == nil ||
		!strings.Contains(err.Error(), "instance_db_config.addr") {
		t.Errorf("section without addr: %v, want an error naming instance_db_config.addr", err)
	}
}

// TestUpstreamVariables: each upstream variable is applied with a warning
// naming TC's name, or reported ignored with the reason; never silent.
func TestUpstreamVariables(t *testing.T) {
	mapped := []struct {
		name, value, want string
		check             func(c *Config) bool
	}{
		{LegacyPathEnv, "", "CUBE_MASTER_CONFIG_PATH is deprecated, use CUBE_TEMPLATE_CENTER_CONFIG_PATH",
			func(c *Config) bool { return c.Build.QueueSize == 9 }},
		{"CUBEMASTER_ROOTFS_ARTIFACT_DIR", "/srv/work", "CUBEMASTER_ROOTFS_ARTIFACT_DIR is deprecated, use CUBE_TEMPLATE_CENTER_WORK_DIR",
			func(c *Config) bool { return c.Store.WorkDir == "/srv/work" }},
		{"CUBEMASTER_NATIVE_ROOTFS_EXPORT_JOBS", "12",
			"CUBEMASTER_NATIVE_ROOTFS_EXPORT_JOBS is deprecated: set build.download_jobs in the configuration file (the variable is applied meanwhile, over the file)",
			func(c *Config) bool { return c.Build.DownloadJobs == 12 }},
		{"CUBE_TEMPLATECENTER_LAYER_CACHE_QUOTA_BYTES", "21474836480",
			"CUBE_TEMPLATECENTER_LAYER_CACHE_QUOTA_BYTES is deprecated: set build.layer_cache_quota in the configuration file (the variable is applied meanwhile, over the file)",
			func(c *Config) bool { return c.Build.LayerCacheQuota == 20<<30 }},
		{"CUBE_TC_MAX_CONCURRENT_BUILDS", "3", "CUBE_TC_MAX_CONCURRENT_BUILDS is deprecated, use CUBE_TEMPLATE_CENTER_MAX_CONCURRENT_BUILDS",
			func(c *Config) bool { return c.Build.MaxConcurrentBuilds == 3 }},
		{"CUBE_TC_RECONCILE_INTERVAL", "5m", "CUBE_TC_RECONCILE_INTERVAL is deprecated, use CUBE_TEMPLATE_CENTER_RECONCILE_INTERVAL",
			func(c *Config) bool { return c.Replicas.ReconcileInterval == 5*time.Minute }},
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "conf.yaml")
	os.WriteFile(conf, []byte("build:\n  queue_size: 9\n"), 0o600)
	for _, m := range mapped {
		env := map[string]string{m.name: m.value}
		if m.name == LegacyPathEnv {
			env[m.name] = conf
		}
		c, rep, err := Read(envOf(env), Options{})
		if err != nil {
			t.Errorf("%s: %v", m.name, err)
			continue
		}
		if !m.check(c) {
			t.Errorf("%s=%s not applied", m.name, m.value)
		}
		if got := warningTexts(rep); !slices.Contains(got, m.want) {
			t.Errorf("%s: warnings %q, want %q", m.name, got, m.want)
		}
		for _, w := range rep.Warnings {
			if !w.Env {
				t.Errorf("%s: warning %q not marked as the environment's", m.name, w.Text)
			}
		}
	}
	// The sizes take upstream's spellings too.
	if c, _, err := Read(envOf(map[string]string{"CUBE_TEMPLATECENTER_LAYER_CACHE_QUOTA_BYTES": "8Gi"}), Options{}); err != nil ||
		c.Build.LayerCacheQuota != 8<<30 {
		t.Errorf("quota 8Gi: %v", err)
	}

	var ignored int
	for _, ig := range ignoredEnv {
		for _, name := range ig.names {
			ignored++
			_, rep, err := Read(envOf(map[string]string{name: "1h"}), Options{})
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			want := name + " is set but ignored: " + ig.why
			if got := warningTexts(rep); !slices.Equal(got, []string{want}) {
				t.Errorf("%s: warnings %q, want %q", name, got, want)
			}
		}
	}
	// The section 4 variables TC has no equivalent for, each listed.
	for _, name := range []string{"CUBE_TEMPLATE_CENTER_RECONCILE_STALE_AFTER", "CUBE_TC_RECONCILE_STALE_AFTER",
		"CUBE_TEMPLATE_CENTER_RECONCILE_PENDING_STALE_AFTER", "CUBE_TEMPLATE_CENTER_RECONCILE_PULLING_STALE_AFTER",
		"CUBE_TEMPLATE_CENTER_RECONCILE_RUNNING_STALE_AFTER", "CUBE_TEMPLATE_CENTER_NODE_IP", "CUBE_SANDBOX_NODE_IP",
		"CUBEMASTER_DISK_SPACE_SAFETY_MARGIN", "CUBE_AUTO_MIGRATION", "CUBEMASTER_NATIVE_ROOTFS_EXPORT_ENABLED",
		"CUBE_TEMPLATECENTER_LAYER_CACHE_DIR", "CUBEMASTER_EXT4_FIXED_OVERHEAD_MIB", "CUBEMASTER_EXT4_OVERHEAD_PERCENT",
		"CUBE_TEMPLATE_CENTER_LOOP_MOUNT_EXT4_ENABLED", "CUBEMASTER_LOOP_MOUNT_EXT4_ENABLED",
		"CUBE_TEMPLATE_CENTER_SERVE_TEMPLATE_API", "CUBE_TC_SERVE_TEMPLATE_API"} {
		if !slices.ContainsFunc(ignoredEnv, func(ig ignoredVar) bool { return slices.Contains(ig.names, name) }) {
			t.Errorf("%s is not reported", name)
		}
	}
	if ignored < 17 {
		t.Errorf("only %d ignored variables", ignored)
	}
}

// TestAliasesDisagree: two names of one setting with different values
// earn a warning naming both; the preferred one wins.
func TestAliasesDisagree(t *testing.T) {
	c, rep, err := Read(envOf(map[string]string{"CUBE_TEMPLATE_CENTER_ARTIFACT_STORE_DIR": "/a",
		"CUBEMASTER_ROOTFS_ARTIFACT_STORE_DIR": "/b"}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := `CUBE_TEMPLATE_CENTER_ARTIFACT_STORE_DIR="/a" and CUBEMASTER_ROOTFS_ARTIFACT_STORE_DIR="/b" disagree: CUBE_TEMPLATE_CENTER_ARTIFACT_STORE_DIR wins`
	if c.Store.Dir != "/a" || !slices.Contains(warningTexts(rep), want) {
		t.Errorf("store.dir %s, warnings %q", c.Store.Dir, warningTexts(rep))
	}
}

// TestByteSizeSpellings: TC's, upstream's and Kubernetes' binary
// spellings, and the short ones, all read as powers of 1024.
func TestByteSizeSpellings(t *testing.T) {
	for in, want := range map[string]ByteSize{
		"20Gi": 20 << 30, "512Mi": 512 << 20, "4Ki": 4 << 10, "1Ti": 1 << 40, "2Pi": 2 << 50,
		"20GiB": 20 << 30, "1G": 1 << 30, "1GB": 1 << 30, "512M": 512 << 20, "64k": 64 << 10, "64kB": 64 << 10,
		"100B": 100, " 3 Gi ": 3 << 30, "1PiB": 1 << 50,
	} {
		if got, err := ParseByteSize(in); err != nil || got != want {
			t.Errorf("ParseByteSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"Gi", "1.5Gi", "-1Gi", "+1Gi", "1Xi", "1 G B", "9999999Pi", "1e9"} {
		if _, err := ParseByteSize(bad); err == nil {
			t.Errorf("ParseByteSize(%q) succeeded", bad)
		}
	}
	c, _, err := readFile(t, "build:\n  layer_cache_quota: 20Gi\n  max_tree_memory: 256Mi\n", nil, Options{})
	if err != nil || c.Build.LayerCacheQuota != 20<<30 || c.Build.MaxTreeMemory != 256<<20 {
		t.Errorf("sizes in the file: %v", err)
	}
}

// TestDidYouMean: an unknown key is told with the closest known key, a
// typo or the right name in the wrong section; nothing close, no guess.
func TestDidYouMean(t *testing.T) {
	for key, want := range map[string]string{
		"build.max_concurent_builds":   "build.max_concurrent_builds",
		"build.queue_sise":             "build.queue_size",
		"common.max_concurrent_builds": "build.max_concurrent_builds",
		"instance_db_config.passwd":    "",
		"biuld.timeout":                "build.timeout",
		"common.surprise":              "",
		"common.http_read_timeout":     "common.http_readtimeout",
	} {
		if got := suggest(key); got != want {
			t.Errorf("suggest(%q) = %q, want %q", key, got, want)
		}
	}
	if got := suggest("biuld"); got != "build" {
		t.Errorf("suggest(biuld) = %q, want the section build", got)
	}
	_, rep, err := readFile(t, "build:\n  max_concurent_builds: 4\n", nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := `unknown key "build.max_concurent_builds" (line 2) ignored; did you mean "build.max_concurrent_builds"?`
	if got := warningTexts(rep); !slices.Equal(got, []string{want}) {
		t.Errorf("warnings %q, want %q", got, want)
	}
}

// TestStrictUnknownKeys: config.strict, Options.Strict (the flag) and
// StrictEnv each make unknown keys fatal, naming them.
func TestStrictUnknownKeys(t *testing.T) {
	typo := "build:\n  max_concurent_builds: 4\n"
	want := `unknown key "build.max_concurent_builds" (line 2): unknown keys are errors in strict mode; did you mean "build.max_concurrent_builds"?`
	for name, tc := range map[string]struct {
		text string
		env  map[string]string
		opts Options
	}{
		"file":   {text: "config:\n  strict: true\n" + typo},
		"flag":   {text: typo, opts: Options{Strict: true}},
		"env":    {text: typo, env: map[string]string{StrictEnv: "true"}},
		"upfile": {text: typo + "config:\n  strict: true\n"},
	} {
		_, _, err := readFile(t, tc.text, tc.env, tc.opts)
		if err == nil || !strings.Contains(err.Error(), strings.Replace(want, "(line 2)", "", 1)[:40]) ||
			!strings.Contains(err.Error(), "did you mean \"build.max_concurrent_builds\"") {
			t.Errorf("%s: %v, want %q", name, err, want)
		}
	}
	if _, _, err := readFile(t, typo, map[string]string{StrictEnv: "maybe"}, Options{}); err == nil || !strings.Contains(err.Error(), StrictEnv) {
		t.Errorf("bad %s: %v", StrictEnv, err)
	}
	if _, _, err := readFile(t, typo, map[string]string{StrictEnv: "false"}, Options{}); err != nil {
		t.Errorf("%s=false: %v", StrictEnv, err)
	}
}

// TestSettingsSourcesAndRedaction: every setting has its source (default,
// file line, variable, secret file) and no secret's value is ever shown.
func TestSettingsSourcesAndRedaction(t *testing.T) {
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "pw")
	os.WriteFile(pwFile, []byte("file-secret-pw\n"), 0o600)
	c, rep, err := readFile(t, upstreamConf, map[string]string{
		"CUBE_MASTER_ADDR": "http://cm:8089", "CUBE_TEMPLATE_CALLBACK_TOKEN": "token-secret-value",
		"CUBE_TEMPLATE_CENTER_REDIS_PASSWORD_FILE": pwFile,
	}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	settings := rep.Settings(c)
	byKey := map[string]Setting{}
	for _, s := range settings {
		if _, dup := byKey[s.Key]; dup {
			t.Errorf("%s listed twice", s.Key)
		}
		byKey[s.Key] = s
		for _, secret := range []string{"cube_pass", "token-secret-value", "file-secret-pw", "redis_pass"} {
			if strings.Contains(s.Value, secret) || strings.Contains(s.Source, secret) {
				t.Errorf("%s shows a secret: %+v", s.Key, s)
			}
		}
	}
	for key, want := range map[string][2]string{
		"common.http_port":             {"8090", rep.Path + ":3"},
		"common.read_timeout":          {"2m0s", rep.Path + ":4 (common.http_readtimeout)"},
		"master.addr":                  {`"http://cm:8089"`, "env CUBE_MASTER_ADDR"},
		"CUBE_TEMPLATE_CALLBACK_TOKEN": {"REDACTED", "env CUBE_TEMPLATE_CALLBACK_TOKEN"},
		"instance_db_config.pwd":       {"REDACTED", rep.Path + ":20"},
		"redis.password":               {"REDACTED", "env CUBE_TEMPLATE_CENTER_REDIS_PASSWORD_FILE (" + pwFile + ")"},
		"build.queue_size":             {"64", "default"},
		"build.layer_cache_quota":      {"20GiB", "default"},
		"artifact_store.record_secret": {`""`, "default"},
		"redis.nodes":                  {`["127.0.0.1:6379"]`, rep.Path + ":30"},
	} {
		s, ok := byKey[key]
		if !ok || s.Value != want[0] || s.Source != want[1] {
			t.Errorf("%s = %+v, want value %s from %s", key, s, want[0], want[1])
		}
	}
	// Every key of the file's sections is listed: the walk and the list
	// agree on names.
	for key := range rep.sources {
		if _, ok := byKey[key]; !ok && (!strings.Contains(key, ".") || envOnlyHint(key) != "") {
			continue // a section, or a setting listed under its variable
		} else if !ok && !slices.ContainsFunc(settings, func(s Setting) bool { return strings.HasPrefix(s.Key, key+".") }) {
			t.Errorf("source recorded for %s, which is not listed", key)
		}
	}
}
