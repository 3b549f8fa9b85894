package config

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// upstreamVars are the variables upstream reads that TC maps to a setting
// (section 4 of the upstream reference); each must be read by upstream's
// rules and never stop TC when upstream would run with its value.
var upstreamVars = []string{
	"CUBE_MASTER_ADDR", "CUBE_TEMPLATE_CENTER_MASTER_ENDPOINT", "CUBE_MASTER_ENDPOINT",
	"CUBE_TEMPLATE_CALLBACK_TOKEN", "CUBE_TC_CALLBACK_TOKEN", "CUBE_TEMPLATE_CALLBACK_INSECURE_NO_TOKEN",
	"CUBE_TEMPLATE_CENTER_ARTIFACT_STORE_DIR", "CUBEMASTER_ROOTFS_ARTIFACT_STORE_DIR",
	"CUBE_TEMPLATE_CENTER_ARTIFACT_WORK_DIR", "CUBEMASTER_ROOTFS_ARTIFACT_DIR",
	"CUBE_TEMPLATE_CENTER_MAX_CONCURRENT_BUILDS", "CUBE_TC_MAX_CONCURRENT_BUILDS",
	"CUBE_TEMPLATE_CENTER_RECONCILE_DISABLED", "CUBE_TC_RECONCILE_DISABLED",
	"CUBE_TEMPLATE_CENTER_RECONCILE_INTERVAL", "CUBE_TC_RECONCILE_INTERVAL",
	"CUBE_S3_ENDPOINT", "CUBE_S3_BUCKET", "CUBE_S3_ACCESS_KEY_ID", "CUBE_S3_ACCESS_KEY",
	"CUBE_S3_SECRET_ACCESS_KEY", "CUBE_S3_SECRET_KEY", "CUBE_S3_REGION", "CUBE_S3_USE_PATH_STYLE",
	"CUBE_S3_USE_SSL", "CUBE_S3_ARTIFACT_PREFIX", "CUBE_ARTIFACT_STORE_BACKEND", "CUBE_ARTIFACT_STORE_FS_ROOT",
	"CUBEMASTER_NATIVE_ROOTFS_EXPORT_JOBS", "CUBE_TEMPLATECENTER_LAYER_CACHE_QUOTA_BYTES",
}

// tcOnlyVars are TC's own variables: upstream has none of them, and a bad
// value may stop TC as a bad key does.
var tcOnlyVars = []string{
	"CUBE_TEMPLATE_CENTER_WORK_DIR", "CUBE_TEMPLATE_CENTER_SPOOL_PATH", "CUBE_TEMPLATE_CENTER_START_CHECK",
	"CUBE_TEMPLATE_CENTER_SHUTDOWN_TIMEOUT", "CUBE_S3_SESSION_TOKEN", "CUBE_TEMPLATE_CENTER_DB_PASSWORD",
	"CUBE_TEMPLATE_CENTER_REDIS_PASSWORD", "CUBE_TEMPLATE_CENTER_RECORD_SECRET",
}

// upstreamValue is one value of an upstream variable: what TC makes of it
// and whether it says so.
type upstreamValue struct {
	in   string
	want any
	// warn is a fragment of the warning naming the variable that the value
	// earns; "" for none.
	warn string
}

// TestUpstreamVariableParsing: every upstream variable TC maps is read as
// upstream reads it (its default for what it ignores, its cap, its idea of
// blank and of a boolean), with a warning naming the variable whenever the
// value is not taken as written, and never stops TC.
func TestUpstreamVariableParsing(t *testing.T) {
	const (
		fellBackNote = "is ignored: not a whole number of at least 1, which upstream also ignores"
		notAFlag     = "is not one of 1, true, yes, on, 0, false, no, off"
	)
	count := func(def int, fellBack, capNote string, limit int) []upstreamValue {
		return []upstreamValue{
			{"", def, ""}, {"   ", def, ""}, {"0", def, fellBack}, {"-3", def, fellBack}, {"many", def, fellBack},
			{"2.5", def, fellBack}, {"5", 5, ""}, {fmt.Sprint(limit), limit, ""}, {fmt.Sprint(limit * 4), limit, capNote},
		}
	}
	flag := func() []upstreamValue {
		return []upstreamValue{
			{"", false, ""}, {"1", true, ""}, {"true", true, ""}, {"YES", true, ""}, {"On", true, ""}, {" true ", true, ""},
			{"0", false, ""}, {"false", false, ""}, {"no", false, ""}, {"OFF", false, ""},
			{"maybe", false, notAFlag}, {"2", false, notAFlag}, {"-1", false, notAFlag},
		}
	}
	durationsIgnored := "is ignored: not a positive duration (such as 10m), which upstream also ignores"
	interval := []upstreamValue{
		{"", 10 * time.Minute, ""}, {"5m", 5 * time.Minute, ""}, {" 90s ", 90 * time.Second, ""},
		{"0", 10 * time.Minute, durationsIgnored}, {"0s", 10 * time.Minute, durationsIgnored},
		{"-5m", 10 * time.Minute, durationsIgnored}, {"300", 10 * time.Minute, durationsIgnored},
		{"ten", 10 * time.Minute, durationsIgnored}, {"1ms", 100 * time.Millisecond, "is below TC's floor 100ms"},
	}
	quotaIgnored := "is ignored: not a positive number of bytes"
	quota := []upstreamValue{
		{"", ByteSize(20 << 30), ""}, {"1073741824", ByteSize(1 << 30), ""}, {" 1073741824 ", ByteSize(1 << 30), ""},
		{"8Gi", ByteSize(8 << 30), ""}, {"0", ByteSize(20 << 30), quotaIgnored}, {"-1", ByteSize(20 << 30), quotaIgnored},
		{"lots", ByteSize(20 << 30), quotaIgnored},
	}
	str := func(def string, set ...string) []upstreamValue {
		out := []upstreamValue{{"", def, ""}, {"   ", def, ""}}
		for _, v := range set {
			out = append(out, upstreamValue{v, strings.TrimSpace(v), ""})
		}
		return out
	}

	cases := map[string]struct {
		get    func(c *Config) any
		values []upstreamValue
	}{
		// Upstream: strconv.Atoi of the value as written; below 1 or
		// unparsable is its default 6; above 32 is 32.
		"CUBEMASTER_NATIVE_ROOTFS_EXPORT_JOBS": {func(c *Config) any { return c.Build.DownloadJobs },
			append(count(6, fellBackNote, "is above upstream's cap 32: 32 applies", 32), upstreamValue{" 8", 6, fellBackNote})},
		// Upstream: Atoi of the trimmed value; below 1 or unparsable is
		// its default 2; no cap, TC's limit is 64.
		"CUBE_TEMPLATE_CENTER_MAX_CONCURRENT_BUILDS": {func(c *Config) any { return c.Build.MaxConcurrentBuilds },
			append(count(2, fellBackNote, "is above TC's limit 64: 64 applies", 64), upstreamValue{" 8 ", 8, ""})},
		"CUBE_TC_MAX_CONCURRENT_BUILDS": {func(c *Config) any { return c.Build.MaxConcurrentBuilds },
			append(count(2, fellBackNote, "is above TC's limit 64: 64 applies", 64), upstreamValue{" 8 ", 8, ""})},
		// Upstream: ParseInt of the trimmed value, bytes; not positive or
		// unparsable is its default 20 GiB.
		"CUBE_TEMPLATECENTER_LAYER_CACHE_QUOTA_BYTES": {func(c *Config) any { return c.Build.LayerCacheQuota }, quota},
		// Upstream: time.ParseDuration of the trimmed value; not positive
		// or unparsable is its default 10m.
		"CUBE_TEMPLATE_CENTER_RECONCILE_INTERVAL": {func(c *Config) any { return c.Replicas.ReconcileInterval }, interval},
		"CUBE_TC_RECONCILE_INTERVAL":              {func(c *Config) any { return c.Replicas.ReconcileInterval }, interval},
		// Upstream: 1, true, yes, on (any case, trimmed) are true, all
		// else false.
		"CUBE_TEMPLATE_CENTER_RECONCILE_DISABLED": {func(c *Config) any { return c.Replicas.ReconcileDisabled }, flag()},
		"CUBE_TC_RECONCILE_DISABLED":              {func(c *Config) any { return c.Replicas.ReconcileDisabled }, flag()},
		"CUBE_S3_USE_SSL":                         {func(c *Config) any { return c.ArtifactStore.S3.UseSSL }, flag()},
		"CUBE_S3_USE_PATH_STYLE":                  {func(c *Config) any { return c.ArtifactStore.S3.UsePathStyle }, flag()},
		// Upstream: true only for "true", in any case, trimmed.
		"CUBE_TEMPLATE_CALLBACK_INSECURE_NO_TOKEN": {func(c *Config) any { return c.Master.InsecureNoToken }, []upstreamValue{
			{"", false, ""}, {"true", true, ""}, {"TRUE", true, ""}, {" True ", true, ""}, {"false", false, ""},
			{"1", false, "is not true, which upstream reads as false"}, {"yes", false, "is not true"}, {"on", false, "is not true"},
		}},
		// Upstream hands the endpoint to its S3 client, whose failure
		// leaves artifacts local.
		"CUBE_S3_ENDPOINT": {func(c *Config) any { return c.ArtifactStore.S3.Endpoint }, append(str("", "minio:9000", " https://s3.example "),
			upstreamValue{"http://minio:9000/bucket", "", "is ignored: not host:port or an http(s) URL without path"},
			upstreamValue{"user@minio:9000", "", "is ignored"})},
		// Strings upstream takes as they are, trimmed; blank is unset.
		"CUBE_MASTER_ADDR":                     {func(c *Config) any { return c.Master.Addr }, str("http://127.0.0.1:8089", " http://m:8089/ ")},
		"CUBE_TEMPLATE_CENTER_MASTER_ENDPOINT": {func(c *Config) any { return c.Master.Addr }, str("http://127.0.0.1:8089", "http://m:8089")},
		"CUBE_MASTER_ENDPOINT":                 {func(c *Config) any { return c.Master.Addr }, str("http://127.0.0.1:8089", "https://m")},
		"CUBE_TEMPLATE_CALLBACK_TOKEN":         {func(c *Config) any { return c.Master.Token }, str("", " tok ")},
		"CUBE_TC_CALLBACK_TOKEN":               {func(c *Config) any { return c.Master.Token }, str("", "tok")},
		"CUBE_TEMPLATE_CENTER_ARTIFACT_STORE_DIR": {func(c *Config) any { return c.Store.Dir },
			str("/data/CubeMaster/storage", " /srv/store ")},
		"CUBEMASTER_ROOTFS_ARTIFACT_STORE_DIR":   {func(c *Config) any { return c.Store.Dir }, str("/data/CubeMaster/storage", "/srv/store")},
		"CUBE_TEMPLATE_CENTER_ARTIFACT_WORK_DIR": {func(c *Config) any { return c.Store.WorkDir }, str("/var/cache/cube-templatecenter", "/srv/w")},
		"CUBEMASTER_ROOTFS_ARTIFACT_DIR":         {func(c *Config) any { return c.Store.WorkDir }, str("/var/cache/cube-templatecenter", "/srv/w")},
		"CUBE_S3_BUCKET":                         {func(c *Config) any { return c.ArtifactStore.S3.Bucket }, str("", "b", " b ")},
		"CUBE_S3_REGION":                         {func(c *Config) any { return c.ArtifactStore.S3.Region }, str("", "us-east-1")},
		"CUBE_S3_ARTIFACT_PREFIX":                {func(c *Config) any { return c.ArtifactStore.S3.Prefix }, str("", "tc/x")},
		"CUBE_S3_ACCESS_KEY_ID":                  {func(c *Config) any { return c.ArtifactStore.S3.AccessKeyID }, str("", "AKIA")},
		"CUBE_S3_ACCESS_KEY":                     {func(c *Config) any { return c.ArtifactStore.S3.AccessKeyID }, str("", "AKIA")},
		"CUBE_S3_SECRET_ACCESS_KEY": {func(c *Config) any { return c.ArtifactStore.S3.SecretAccessKey.Reveal() },
			str("", "s3cret")},
		"CUBE_S3_SECRET_KEY": {func(c *Config) any { return c.ArtifactStore.S3.SecretAccessKey.Reveal() }, str("", "s3cret")},
		// Upstream takes an unknown backend as s3; so does TC (warning in
		// resolve).
		"CUBE_ARTIFACT_STORE_BACKEND": {func(c *Config) any { return c.ArtifactStore.Backend }, []upstreamValue{
			{"", "s3", ""}, {"fs", "fs", ""}, {" FS ", "fs", ""}, {"s3", "s3", ""}, {"gcs", "s3", "is neither s3 nor fs; using s3"},
		}},
		"CUBE_ARTIFACT_STORE_FS_ROOT": {func(c *Config) any { return c.ArtifactStore.FSRoot }, str("/data/CubeMaster/storage", "/srv/blobs")},
	}

	for _, name := range upstreamVars {
		if _, ok := cases[name]; !ok {
			t.Errorf("%s: no case of upstream's parsing", name)
		}
	}
	// A new variable must say whose it is.
	for _, o := range allEnvOverrides() {
		for _, name := range o.names {
			if !slices.Contains(upstreamVars, name) && !slices.Contains(tcOnlyVars, name) {
				t.Errorf("%s (%s) is neither in upstreamVars nor in tcOnlyVars", name, o.key)
			}
		}
	}
	for _, s := range secrets {
		for _, name := range append([]string{s.Env}, s.Aliases...) {
			if !slices.Contains(upstreamVars, name) && !slices.Contains(tcOnlyVars, name) {
				t.Errorf("secret %s is neither in upstreamVars nor in tcOnlyVars", name)
			}
		}
	}

	for name, tc := range cases {
		for _, v := range tc.values {
			t.Run(name+"="+v.in, func(t *testing.T) {
				c, rep, err := Read(envOf(map[string]string{name: v.in}), Options{})
				if err != nil {
					t.Fatalf("Read with %s=%q: %v; upstream runs with it", name, v.in, err)
				}
				if got := tc.get(c); got != v.want {
					t.Errorf("%s=%q gave %v, want %v", name, v.in, got, v.want)
				}
				var told []string
				for _, w := range warningTexts(rep) {
					if strings.Contains(w, name+"=") || strings.Contains(w, "neither s3 nor fs") {
						told = append(told, w)
					}
				}
				switch {
				case v.warn == "" && len(told) > 0:
					t.Errorf("%s=%q: warnings %q, want none about the value", name, v.in, told)
				case v.warn != "" && !slices.ContainsFunc(told, func(w string) bool { return strings.Contains(w, v.warn) }):
					t.Errorf("%s=%q: warnings %q, want one saying %q", name, v.in, warningTexts(rep), v.warn)
				}
			})
		}
	}
}

// TestUpstreamValueWarningsRedacted: a value named in a warning loses its
// URL credentials, as every message of TC does.
func TestUpstreamValueWarningsRedacted(t *testing.T) {
	_, rep, err := Read(envOf(map[string]string{"CUBE_S3_ENDPOINT": "http://key:s3cr3t@minio:9000/bucket?sig=x"}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := warningTexts(rep)
	if !slices.ContainsFunc(got, func(w string) bool { return strings.Contains(w, "CUBE_S3_ENDPOINT=") }) {
		t.Errorf("warnings %q, want one naming CUBE_S3_ENDPOINT", got)
	}
	for _, w := range got {
		if strings.Contains(w, "s3cr3t") || strings.Contains(w, "sig=x") {
			t.Errorf("warning %q shows the endpoint's credentials", w)
		}
	}
}

// TestUpstreamVariablesDeliberatelyFatal: the values upstream takes that
// TC refuses, each a row of docs/upstream.md's table of differences: the
// error names the variable's setting and the value.
func TestUpstreamVariablesDeliberatelyFatal(t *testing.T) {
	for name, want := range map[string]string{
		"CUBE_MASTER_ADDR":                        `master.addr: "cubemaster:8089" is not an http(s) URL`,
		"CUBE_TEMPLATE_CENTER_ARTIFACT_STORE_DIR": `store.dir: "cubemaster:8089" is not an absolute path`,
		"CUBEMASTER_ROOTFS_ARTIFACT_DIR":          `store.work_dir: "cubemaster:8089" is not an absolute path`,
		"CUBE_ARTIFACT_STORE_FS_ROOT":             `artifact_store.fs_root: "cubemaster:8089" is not an absolute path`,
	} {
		if _, _, err := Read(envOf(map[string]string{name: "cubemaster:8089"}), Options{}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s=cubemaster:8089: error %v, want %q", name, err, want)
		}
	}
}

// TestUpstreamKeyParsing: upstream's keys TC maps are read as upstream's
// loader reads them: its "unset" (0, blank) leaves TC's value, with a
// warning naming the key; what its loader refuses, TC refuses.
func TestUpstreamKeyParsing(t *testing.T) {
	def := Default()
	cases := []struct {
		key, value string
		get        func(c *Config) any
		want       any
		warn       string // "" for the deprecation warning of an applied key
		fatal      bool
	}{
		{"common.http_readtimeout", "120", func(c *Config) any { return c.Common.ReadTimeout }, 120 * time.Second, "", false},
		{"common.http_readtimeout", "2m", func(c *Config) any { return c.Common.ReadTimeout }, 2 * time.Minute, "", false},
		{"common.http_readtimeout", "0", func(c *Config) any { return c.Common.ReadTimeout }, def.Common.ReadTimeout,
			"is ignored: 0, which upstream's loader takes as unset (common.read_timeout stays 2m0s)", false},
		{"common.http_readtimeout", "-1", func(c *Config) any { return c.Common.ReadTimeout }, def.Common.ReadTimeout,
			"is ignored: -1, which upstream runs as no timeout at all", false},
		{"common.http_readtimeout", "99999999999999999", func(c *Config) any { return c.Common.ReadTimeout },
			time.Duration(math.MaxInt64/int64(time.Second)) * time.Second, "", false},
		{"common.http_readtimeout", "soon", nil, nil, "", true},
		{"common.http_readtimeout", "1.5", nil, nil, "", true},
		{"common.http_writetimeout", "360", func(c *Config) any { return c.Common.WriteTimeout }, 360 * time.Second, "", false},
		{"common.http_writetimeout", "0", func(c *Config) any { return c.Common.WriteTimeout }, def.Common.WriteTimeout,
			"is ignored: 0, which upstream's loader takes as unset (common.write_timeout stays 1m0s)", false},
		{"common.http_writetimeout", "-30", func(c *Config) any { return c.Common.WriteTimeout }, def.Common.WriteTimeout,
			"no timeout at all", false},
		{"common.master_addr", "http://m:8089/", func(c *Config) any { return c.Master.Addr }, "http://m:8089/", "", false},
		{"common.master_addr", `"  "`, func(c *Config) any { return c.Master.Addr }, def.Master.Addr,
			"is ignored: blank, which upstream also takes as unset", false},
		{"common.master_addr", `""`, func(c *Config) any { return c.Master.Addr }, def.Master.Addr, "is ignored: blank", false},
		{"common.http_port", "0", func(c *Config) any { return c.Common.HTTPPort }, 8090,
			"common.http_port (line 2) is 0, which upstream's loader takes as unset: TC's default 8090 applies", false},
	}
	for _, tc := range cases {
		t.Run(tc.key+"="+tc.value, func(t *testing.T) {
			section, leaf := splitKey(tc.key)
			c, rep, err := readFile(t, section+":\n  "+leaf+": "+tc.value+"\n", nil, Options{})
			if tc.fatal {
				if err == nil || !strings.Contains(err.Error(), tc.key+" (line 2)") {
					t.Errorf("error %v, want one naming %s and its line: upstream's loader refuses it too", err, tc.key)
				}
				return
			}
			if err != nil {
				t.Fatalf("%s: %s: %v; upstream runs with it", tc.key, tc.value, err)
			}
			if got := tc.get(c); got != tc.want {
				t.Errorf("gave %v, want %v", got, tc.want)
			}
			got := warningTexts(rep)
			if tc.warn == "" {
				if u := upstreamKeys[tc.key]; u.to != "" && !slices.Contains(got, tc.key+" (line 2) is deprecated, use "+u.to+" (applied)") {
					t.Errorf("warnings %q, want the deprecation of %s", got, tc.key)
				}
				return
			}
			if !slices.ContainsFunc(got, func(w string) bool { return strings.Contains(w, tc.key) && strings.Contains(w, tc.warn) }) {
				t.Errorf("warnings %q, want one naming %s and saying %q", got, tc.key, tc.warn)
			}
		})
	}
}
