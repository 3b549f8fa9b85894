package system

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// installSh runs install.sh on the host with extra environment and returns
// its combined output and exit code.
func installSh(t *testing.T, prefix []string, env []string, args ...string) (string, int) {
	t.Helper()
	return installShInput(t, "", prefix, env, args...)
}

// installShInput is installSh with stdin as the script's standard input.
func installShInput(t *testing.T, stdin string, prefix []string, env []string, args ...string) (string, int) {
	t.Helper()
	argv := append(append(prefix, "bash", filepath.Join(repoRoot, "install.sh")), args...)
	cmd := exec.CommandContext(t.Context(), argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		exit, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("%v: %v", argv, err)
		}
		code = exit.ExitCode()
	}
	return string(out), code
}

// fakeBinary is an executable that answers `version` like templatecenter,
// so installer tests need no build.
func fakeBinary(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "templatecenter")
	if err := os.WriteFile(path, []byte("#!/bin/sh\necho templatecenter 9.9.9\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestInstallScriptStaging installs into DESTDIR: the files land with the
// right modes and the units run the staged binary path; a second run keeps
// an edited configuration and updates only the keys it is given.
func TestInstallScriptStaging(t *testing.T) {
	dest := t.TempDir()
	bin := fakeBinary(t)
	oneClick := filepath.Join(t.TempDir(), "one-click.env")
	if err := os.WriteFile(oneClick, []byte("export CUBE_MASTER_ADDR=\"http://10.1.2.3:8089\"\nOTHER_SECRET=x\n"+
		"CUBE_TEMPLATE_CALLBACK_TOKEN='a\"b\\c$d'\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code := installSh(t, nil, []string{"DESTDIR=" + dest}, "--binary", bin, "--one-click-env", oneClick)
	if code != 0 {
		t.Fatalf("install.sh exited %d:\n%s", code, out)
	}
	want := map[string]os.FileMode{
		"usr/local/bin/templatecenter": 0o755, "etc/systemd/system/" + serviceUnit: 0o644,
		"etc/systemd/system/" + socketUnit: 0o644, "etc/sysusers.d/cube-templatecenter.conf": 0o644,
		"etc/tmpfiles.d/cube-templatecenter.conf": 0o644, "usr/local/share/man/man8/templatecenter.8": 0o644,
		"etc/cube-templatecenter/conf.yaml": 0o640, "etc/cube-templatecenter/templatecenter.env": 0o600,
		"usr/local/share/cube-templatecenter/prometheus/cube-templatecenter-rules.yml": 0o644,
		"usr/local/share/cube-templatecenter/grafana/cube-templatecenter.json":         0o644,
	}
	var found []string
	filepath.Walk(dest, func(path string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			rel, _ := filepath.Rel(dest, path)
			found = append(found, rel)
			if mode, ok := want[rel]; !ok {
				t.Errorf("unexpected file %s", rel)
			} else if fi.Mode().Perm() != mode {
				t.Errorf("%s: mode %v, want %v", rel, fi.Mode().Perm(), mode)
			}
		}
		return nil
	})
	if len(found) != len(want) {
		t.Errorf("staged %q, want %d files", found, len(want))
	}
	unit, _ := os.ReadFile(filepath.Join(dest, "etc/systemd/system", serviceUnit))
	for _, line := range []string{"ExecStart=/usr/local/bin/templatecenter serve", "ExecStartPre=/usr/local/bin/templatecenter check-config -q",
		"ExecReload=/usr/local/bin/templatecenter check-config -q"} {
		if !strings.Contains(string(unit), "\n"+line+"\n") {
			t.Errorf("staged unit lacks %s:\n%s", line, unit)
		}
	}
	for _, line := range strings.Split(string(unit), "\n") {
		if strings.HasPrefix(line, "Exec") && strings.Contains(line, "/usr/bin/templatecenter") {
			t.Errorf("staged unit still runs /usr/bin/templatecenter: %s", line)
		}
	}
	envPath := filepath.Join(dest, "etc/cube-templatecenter/templatecenter.env")
	env, _ := os.ReadFile(envPath)
	if !strings.Contains(string(env), "\nCUBE_MASTER_ADDR=\"http://10.1.2.3:8089\"\n") ||
		!strings.Contains(string(env), "\nCUBE_TEMPLATE_CALLBACK_TOKEN=\"a\\\"b\\\\c\\$d\"\n") || strings.Contains(string(env), "OTHER_SECRET") {
		t.Errorf("environment file:\n%s", env)
	}
	if !strings.Contains(out, "staged under "+dest) {
		t.Errorf("output:\n%s", out)
	}

	// A token on the command line is refused before anything changes.
	before, _ := os.ReadFile(envPath)
	if out, code := installSh(t, nil, []string{"DESTDIR=" + dest}, "--binary", bin, "--token", "on-argv"); code == 0 || !strings.Contains(out, "--token-file") {
		t.Errorf("--token exited %d, want a refusal naming --token-file:\n%s", code, out)
	}
	if after, _ := os.ReadFile(envPath); !bytes.Equal(before, after) {
		t.Errorf("a refused --token changed the environment file:\n%s", after)
	}

	// Rerun: the edited configuration stays; --token-file replaces only
	// the token; the one-click file is not read again.
	conf := filepath.Join(dest, "etc/cube-templatecenter/conf.yaml")
	if err := os.WriteFile(conf, []byte("log:\n  level: debug\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("rotated\r\nsecond line ignored\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, code := installSh(t, nil, []string{"DESTDIR=" + dest}, "--binary", bin, "--token-file", tokenFile); code != 0 {
		t.Fatalf("rerun exited %d:\n%s", code, out)
	}
	if data, _ := os.ReadFile(conf); string(data) != "log:\n  level: debug\n" {
		t.Errorf("rerun replaced the configuration:\n%s", data)
	}
	env, _ = os.ReadFile(envPath)
	if strings.Count(string(env), "CUBE_TEMPLATE_CALLBACK_TOKEN=") != 1 || !strings.Contains(string(env), "\nCUBE_TEMPLATE_CALLBACK_TOKEN=\"rotated\"\n") ||
		!strings.Contains(string(env), "\nCUBE_MASTER_ADDR=\"http://10.1.2.3:8089\"\n") {
		t.Errorf("environment file after rerun:\n%s", env)
	}

	// The token from standard input.
	if out, code := installShInput(t, "from-stdin\n", nil, []string{"DESTDIR=" + dest}, "--binary", bin, "--token-file", "-"); code != 0 {
		t.Fatalf("--token-file - exited %d:\n%s", code, out)
	}
	env, _ = os.ReadFile(envPath)
	if !strings.Contains(string(env), "\nCUBE_TEMPLATE_CALLBACK_TOKEN=\"from-stdin\"\n") {
		t.Errorf("environment file after --token-file -:\n%s", env)
	}
	if out, code := installShInput(t, "", nil, []string{"DESTDIR=" + dest}, "--binary", bin, "--token-file", "-"); code == 0 || !strings.Contains(out, "no token") {
		t.Errorf("--token-file - with empty stdin exited %d, want a refusal:\n%s", code, out)
	}

	// Uninstall from the staging tree keeps configuration unless --purge.
	if out, code := installSh(t, nil, []string{"DESTDIR=" + dest}, "--uninstall"); code != 0 {
		t.Fatalf("uninstall exited %d:\n%s", code, out)
	}
	if _, err := os.Stat(filepath.Join(dest, "usr/local/bin/templatecenter")); err == nil {
		t.Error("uninstall left the binary")
	}
	if _, err := os.Stat(filepath.Join(dest, "usr/local/share/cube-templatecenter")); err == nil {
		t.Error("uninstall left the example rules and dashboard")
	}
	if _, err := os.Stat(conf); err != nil {
		t.Errorf("uninstall removed the configuration: %v", err)
	}
	if out, code := installSh(t, nil, []string{"DESTDIR=" + dest}, "--uninstall", "--purge"); code != 0 {
		t.Fatalf("purge exited %d:\n%s", code, out)
	}
	if _, err := os.Stat(filepath.Dir(conf)); err == nil {
		t.Error("purge left the configuration directory")
	}
}

// TestInstallScriptRefuses checks the clear errors: not root, systemd not
// PID 1, a missing binary, bad options.
func TestInstallScriptRefuses(t *testing.T) {
	needTools(t, "setpriv", "unshare")
	bin := fakeBinary(t)
	cases := []struct {
		name   string
		prefix []string
		env    []string
		args   []string
		want   string
	}{
		{"not root", []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"}, nil,
			[]string{"--binary", bin}, "must be run as root"},
		// In a new PID namespace the script itself is PID 1.
		{"no systemd", []string{"unshare", "--pid", "--fork", "--mount-proc"}, nil,
			[]string{"--binary", bin}, "systemd is not running as PID 1"},
		{"missing binary", nil, []string{"DESTDIR=" + t.TempDir()}, []string{"--binary", "/nonexistent/templatecenter"},
			"binary not found: /nonexistent/templatecenter"},
		{"binary that does not run", nil, []string{"DESTDIR=" + t.TempDir()}, []string{"--binary", "/bin/false"},
			"does not run on this machine"},
		{"unknown option", nil, nil, []string{"--frobnicate"}, "unknown option: --frobnicate"},
		{"purge without uninstall", nil, nil, []string{"--purge"}, "--purge only goes with --uninstall"},
		{"bad master address", nil, nil, []string{"--master-addr", "10.0.0.1:8089"}, "must be an http:// or https:// URL"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "not root" && os.Getuid() != 0 {
				t.Skip("setpriv needs root to drop to nobody")
			}
			out, code := installSh(t, tc.prefix, tc.env, tc.args...)
			if code == 0 || !strings.Contains(out, tc.want) {
				t.Errorf("exit %d, output:\n%s\nwant a failure saying %q", code, out, tc.want)
			}
		})
	}
}

// TestInstallScriptStagingInstallsNoPackages stages into DESTDIR where
// ISA-L is missing and apt-get and dnf are at hand: staging changes
// nothing on the host, so neither package manager runs.
func TestInstallScriptStagingInstallsNoPackages(t *testing.T) {
	fake := t.TempDir()
	calls := filepath.Join(t.TempDir(), "calls")
	for _, tool := range []string{"apt-get", "dnf", "ldconfig"} {
		script := "#!/bin/sh\necho " + tool + " \"$@\" >>" + calls + "\n"
		if err := os.WriteFile(filepath.Join(fake, tool), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dest := t.TempDir()
	out, code := installSh(t, nil, []string{"DESTDIR=" + dest, "PATH=" + fake + ":" + os.Getenv("PATH")}, "--binary", fakeBinary(t))
	if code != 0 {
		t.Fatalf("install.sh exited %d:\n%s", code, out)
	}
	if b, err := os.ReadFile(calls); err == nil {
		t.Errorf("staging ran package tools:\n%s", b)
	}
	if strings.Contains(out, "ISA-L") {
		t.Errorf("staging output mentions ISA-L:\n%s", out)
	}
}
