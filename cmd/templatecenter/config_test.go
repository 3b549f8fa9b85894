package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestConfigErrors: a configuration the agent cannot run with stops it at
// once with exit code 1 and a message naming what is wrong.
func TestConfigErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		setup func(h *harness)
		// raw replaces the generated configuration file.
		raw  string
		env  []string
		want []string
		// wantPath: the message must name the config file.
		wantPath bool
	}{
		{name: "MaxConcurrentBuildsZero", setup: func(h *harness) { h.set("build.max_concurrent_builds", 0) },
			want: []string{"build.max_concurrent_builds"}},
		{name: "HTTPPortTooLarge", setup: func(h *harness) { h.set("common.http_port", 70000) },
			want: []string{"common.http_port", "70000"}},
		{name: "MasterAddrNotHTTP", setup: func(h *harness) { h.set("master.addr", "ftp://x") },
			want: []string{"master.addr", "ftp://x"}},
		{name: "EveryErrorAtOnce", setup: func(h *harness) {
			h.set("build.max_concurrent_builds", 0)
			h.set("common.http_port", 70000)
			h.set("master.addr", "ftp://x")
		}, want: []string{"build.max_concurrent_builds", "common.http_port", "master.addr"}},
		{name: "MalformedYAML", raw: "common: [http_port\n", want: []string{"YAML"}, wantPath: true},
		// TC's own variable; upstream's are read by upstream's rules
		// (TestCheckConfigUpstreamValues).
		{name: "EnvNotADuration", env: []string{"CUBE_TEMPLATE_CENTER_SHUTDOWN_TIMEOUT=abc"},
			want: []string{"CUBE_TEMPLATE_CENTER_SHUTDOWN_TIMEOUT", "abc"}},
		{name: "MissingFile", setup: func(h *harness) {
			h.env["CUBE_TEMPLATE_CENTER_CONFIG_PATH"] = filepath.Join(h.dir, "absent", "conf.yaml")
		}, want: []string{"no such file"}, wantPath: true},
		{name: "UnreadableFile", setup: func(h *harness) {
			// Root reads any mode; a directory is unreadable as a file.
			h.env["CUBE_TEMPLATE_CENTER_CONFIG_PATH"] = h.dir
		}, want: []string{"is a directory"}, wantPath: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, "", testToken)
			if tc.setup != nil {
				tc.setup(h)
			}
			if tc.raw != "" {
				h.writeConfigText(tc.raw)
			} else {
				h.writeConfig()
			}
			res := runCLI(t, h.environ(tc.env...))
			if res.code != 1 {
				t.Fatalf("exit code %d, want 1; stderr:\n%s", res.code, res.stderr)
			}
			want := tc.want
			if tc.wantPath {
				want = append(want, h.env["CUBE_TEMPLATE_CENTER_CONFIG_PATH"])
			}
			for _, w := range want {
				if !strings.Contains(res.stderr, w) {
					t.Errorf("stderr does not mention %q:\n%s", w, res.stderr)
				}
			}
			if strings.Contains(res.stderr, "msg=ready") {
				t.Errorf("agent became ready with a bad configuration:\n%s", res.stderr)
			}
		})
	}
}

// TestFSRootNotCreatable: an fs blob store root below a regular file stops
// the agent with a message naming the configured root and where it is set,
// not only the ancestor mkdir tripped on.
func TestFSRootNotCreatable(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "", testToken)
	file := filepath.Join(h.dir, "plain-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(file, "blobs", "root")
	h.env["CUBE_ARTIFACT_STORE_BACKEND"] = "fs"
	h.env["CUBE_ARTIFACT_STORE_FS_ROOT"] = root
	h.writeConfig()
	res := runCLI(t, h.environ())
	if res.code != 1 {
		t.Fatalf("exit code %d, want 1; stderr:\n%s", res.code, res.stderr)
	}
	for _, w := range []string{root, "artifact_store.fs_root", "CUBE_ARTIFACT_STORE_FS_ROOT", "not a directory"} {
		if !strings.Contains(res.stderr, w) {
			t.Errorf("stderr does not mention %q:\n%s", w, res.stderr)
		}
	}
}

// TestStoreDirNotCreatable: a store that cannot be created stops the
// agent, where upstream would fall back to a directory under $TMPDIR that
// CubeMaster never reads: the message names the directory, its key, its
// variables, where the value came from, and that there is no fallback.
func TestStoreDirNotCreatable(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "", testToken)
	file := filepath.Join(h.dir, "plain-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(file, "CubeMaster", "storage")
	h.set("store.dir", store)
	h.writeConfig()
	res := runCLI(t, h.environ())
	if res.code != 1 {
		t.Fatalf("exit code %d, want 1; stderr:\n%s", res.code, res.stderr)
	}
	for _, w := range []string{"create the artifact store " + store, "store.dir", "CUBE_TEMPLATE_CENTER_ARTIFACT_STORE_DIR",
		"CUBEMASTER_ROOTFS_ARTIFACT_STORE_DIR", "set by " + h.configPath + ":", "not a directory",
		"does not fall back to $TMPDIR/cubemaster-rootfs-artifacts-store"} {
		if !strings.Contains(res.stderr, w) {
			t.Errorf("stderr does not mention %q:\n%s", w, res.stderr)
		}
	}
	if strings.Contains(res.stderr, "msg=ready") {
		t.Errorf("agent became ready without its store:\n%s", res.stderr)
	}
}

// TestConfigUnknownKeyWarns: unknown keys (typos, keys of a newer version)
// are reported but do not stop the agent.
func TestConfigUnknownKeyWarns(t *testing.T) {
	t.Parallel()
	cm := startCubeMaster(t, testToken)
	h := newHarness(t, cm.URL(), testToken)
	h.set("build.turbo_mode", true)
	h.set("telemetry.endpoint", "http://example.invalid")
	p := h.startAgent("agent")
	for _, key := range []string{"build.turbo_mode", "telemetry"} {
		p.waitLine(t, "level=WARN", "unknown key", key)
	}
	p.stop(t)
}

// TestLogTimestamps: under journald (JOURNAL_STREAM set) log lines carry no
// time attribute, since the journal stamps them, and start with their
// sd-daemon priority (<4> for a warning); elsewhere every line has a time
// and no prefix. The configuration's own warnings, logged before the
// logger exists, come out in the configured format like every other line.
func TestLogTimestamps(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		journal bool
		format  string
	}{
		{"TextUnderJournal", true, "text"},
		{"TextOnTerminal", false, "text"},
		{"JSONUnderJournal", true, "json"},
		{"JSONOnTerminal", false, "json"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, "", testToken)
			h.set("log.format", tc.format)
			// An unknown key is reported while the configuration is read,
			// before the configured logger exists: its line must follow
			// the rules too.
			h.set("log.colour", "always")
			var env []string
			if tc.journal {
				env = append(env, "JOURNAL_STREAM=8:424242")
			}
			p := h.startAgent("agent", env...)
			p.stop(t)
			out := p.out.String()
			warning, ok := findLine(out, "unknown key", "log.colour")
			if !ok {
				t.Errorf("no boot-time warning about log.colour in:\n%s", out)
			}
			if tc.journal && !strings.HasPrefix(warning, "<4>") {
				t.Errorf("boot-time warning does not carry the warning priority <4>: %s", warning)
			}
			lines := 0
			for line := range strings.Lines(out) {
				line = strings.TrimRight(line, "\n")
				if line == "" {
					continue
				}
				lines++
				prefix := journalPriority.FindString(line)
				switch {
				case tc.journal && prefix == "":
					t.Errorf("line has no sd-daemon priority under journald: %s", line)
				case !tc.journal && prefix != "":
					t.Errorf("line has a priority prefix outside journald: %s", line)
				}
				line = strings.TrimPrefix(line, prefix)
				stamp, hasTime := lineTime(t, tc.format, line)
				switch {
				case tc.journal && hasTime:
					t.Errorf("line has a time attribute under journald: %s", line)
				case !tc.journal && !hasTime:
					t.Errorf("line has no time attribute outside journald: %s", line)
				case hasTime:
					if _, err := time.Parse(time.RFC3339Nano, stamp); err != nil {
						t.Errorf("time attribute %q is not RFC 3339: %s", stamp, line)
					}
				}
			}
			if lines < 3 {
				t.Errorf("only %d log lines from a start and stop:\n%s", lines, out)
			}
		})
	}
}

// journalPriority matches the sd-daemon(3) priority prefix of a line.
var journalPriority = regexp.MustCompile(`^<[0-7]>`)

// lineTime returns a log line's time attribute and whether it has one.
func lineTime(t testing.TB, format, line string) (string, bool) {
	t.Helper()
	if format == "json" {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("log line is not JSON: %s", line)
			return "", false
		}
		if _, ok := rec["level"]; !ok {
			t.Errorf("JSON log line has no level: %s", line)
		}
		v, ok := rec["time"]
		s, _ := v.(string)
		return s, ok
	}
	if !strings.HasPrefix(line, "time=") && !strings.HasPrefix(line, "level=") {
		t.Errorf("log line is not a key=value record starting with time= or level=: %s", line)
	}
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, "time="); ok {
			return v, true
		}
	}
	return "", false
}
