package system

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// packagedFiles are the payload files both packages carry (deb paths; the
// rpm has its units under /usr/lib) with their modes.
var packagedFiles = map[string]string{
	"/usr/bin/templatecenter":                                "-rwxr-xr-x",
	"/usr/share/man/man8/templatecenter.8.gz":                "-rw-r--r--",
	"/lib/systemd/system/" + serviceUnit:                     "-rw-r--r--",
	"/lib/systemd/system/" + socketUnit:                      "-rw-r--r--",
	"/usr/lib/sysusers.d/cube-templatecenter.conf":           "-rw-r--r--",
	"/usr/lib/tmpfiles.d/cube-templatecenter.conf":           "-rw-r--r--",
	"/etc/cube-templatecenter/conf.yaml":                     "-rw-r-----",
	"/etc/cube-templatecenter/templatecenter.env":            "-rw-------",
	"/usr/share/doc/cube-templatecenter/copyright":           "-rw-r--r--",
	"/usr/share/doc/cube-templatecenter/changelog.Debian.gz": "-rw-r--r--",
	// Examples: docs/observability.md ("Alerts", "Dashboard").
	"/usr/share/cube-templatecenter/prometheus/cube-templatecenter-rules.yml": "-rw-r--r--",
	"/usr/share/cube-templatecenter/grafana/cube-templatecenter.json":         "-rw-r--r--",
}

var conffiles = []string{"/etc/cube-templatecenter/conf.yaml", "/etc/cube-templatecenter/templatecenter.env"}

// glibcNeeded is the newest GLIBC_x.y symbol version the binary links.
func glibcNeeded(t *testing.T, bin string) string {
	t.Helper()
	out := run(t, "objdump", "-T", bin)
	best := ""
	for _, m := range regexp.MustCompile(`GLIBC_(\d+\.\d+(?:\.\d+)?)`).FindAllStringSubmatch(out, -1) {
		if best == "" || versionLess(best, m[1]) {
			best = m[1]
		}
	}
	if best == "" {
		t.Fatalf("%s links no GLIBC symbol: was it built without cgo?", bin)
	}
	return best
}

func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) || i < len(bs); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}

func TestDebPackage(t *testing.T) {
	needTools(t, "dpkg-deb")
	old, _ := packages(t)

	field := func(name string) string { return strings.TrimSpace(run(t, "dpkg-deb", "-f", old.Deb, name)) }
	if got := field("Package"); got != pkgName {
		t.Errorf("Package: %q", got)
	}
	if got := field("Version"); got != old.Version+"-1" {
		t.Errorf("Version: %q, want %s-1", got, old.Version)
	}
	glibc := glibcNeeded(t, old.Binary)
	depends := field("Depends")
	m := regexp.MustCompile(`(?:^|, )libc6 \(>= ([0-9.]+)\)`).FindStringSubmatch(depends)
	if m == nil {
		t.Errorf("Depends %q lacks a versioned libc6 (the cgo SQLite driver needs GLIBC_%s)", depends, glibc)
	} else if versionLess(m[1], glibc) {
		t.Errorf("Depends libc6 (>= %s), but the binary needs GLIBC_%s", m[1], glibc)
	}
	if !strings.Contains(depends, "procps") {
		t.Errorf("Depends %q lacks procps (/bin/kill for ExecReload=)", depends)
	}
	if !strings.Contains(depends, "init-system-helpers") {
		t.Errorf("Depends %q lacks init-system-helpers (deb-systemd-helper in the maintainer scripts)", depends)
	}
	// ISA-L is optional: the binary dlopens it and falls back to Go.
	for _, line := range strings.Split(run(t, "objdump", "-p", old.Binary), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "NEEDED" && strings.HasPrefix(f[1], "libisal") {
			t.Errorf("%s links %s: it must dlopen ISA-L, to run where it is missing", old.Binary, f[1])
		}
	}
	if strings.Contains(depends, "libisal") {
		t.Errorf("Depends %q names libisal, which the binary runs without", depends)
	}
	if recommends := field("Recommends"); !regexp.MustCompile(`(?:^|, )libisal2(?:,|$)`).MatchString(recommends) {
		t.Errorf("Recommends %q lacks libisal2 (ISA-L inflate for gzip layers)", recommends)
	}

	listing := run(t, "dpkg-deb", "-c", old.Deb)
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(listing), "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && !strings.HasSuffix(f[5], "/") {
			got[strings.TrimPrefix(f[5], ".")] = f[0]
			if f[1] != "root/root" {
				t.Errorf("%s owned by %s", f[5], f[1])
			}
		}
	}
	for path, mode := range packagedFiles {
		if got[path] != mode {
			t.Errorf("%s: mode %q, want %q", path, got[path], mode)
		}
	}
	for path := range got {
		if _, ok := packagedFiles[path]; !ok {
			t.Errorf("unexpected file %s", path)
		}
	}

	if got := strings.Fields(run(t, "dpkg-deb", "-I", old.Deb, "conffiles")); !slices.Equal(got, conffiles) {
		t.Errorf("conffiles %q, want %q", got, conffiles)
	}
	for script, src := range map[string]string{"preinst": "upstream-check.sh",
		"postinst": "deb/postinst", "prerm": "deb/prerm", "postrm": "deb/postrm"} {
		body := run(t, "dpkg-deb", "-I", old.Deb, script)
		want, err := os.ReadFile(filepath.Join(repoRoot, "packaging", src))
		if err != nil {
			t.Fatal(err)
		}
		if body != string(want) {
			t.Errorf("%s differs from packaging/%s", script, src)
		}
	}

	// The payload: units as in systemd/, a binary that runs and knows its
	// version.
	root := t.TempDir()
	run(t, "dpkg-deb", "-x", old.Deb, root)
	for _, unit := range []string{serviceUnit, socketUnit} {
		a, _ := os.ReadFile(filepath.Join(root, "lib/systemd/system", unit))
		b, _ := os.ReadFile(filepath.Join(repoRoot, "systemd", unit))
		if !bytes.Equal(a, b) || len(a) == 0 {
			t.Errorf("packaged %s differs from systemd/%s", unit, unit)
		}
	}
	for dst, src := range map[string]string{
		"usr/share/cube-templatecenter/prometheus/cube-templatecenter-rules.yml": "packaging/prometheus/cube-templatecenter-rules.yml",
		"usr/share/cube-templatecenter/grafana/cube-templatecenter.json":         "packaging/grafana/cube-templatecenter.json",
	} {
		a, _ := os.ReadFile(filepath.Join(root, dst))
		b, _ := os.ReadFile(filepath.Join(repoRoot, src))
		if !bytes.Equal(a, b) || len(a) == 0 {
			t.Errorf("packaged /%s differs from %s", dst, src)
		}
	}
	// The first line of version is the version; revision and Go follow.
	if out := run(t, filepath.Join(root, "usr/bin/templatecenter"), "version"); strings.Split(out, "\n")[0] != "templatecenter "+old.Version {
		t.Errorf("templatecenter version: %q", out)
	}
	if out := run(t, filepath.Join(root, "usr/bin/templatecenter"), "--help"); !strings.Contains(out, "Usage: templatecenter") {
		t.Errorf("templatecenter --help: %q", out)
	}
	copyright, _ := os.ReadFile(filepath.Join(root, "usr/share/doc/cube-templatecenter/copyright"))
	if !strings.Contains(string(copyright), "\nLicense: Apache-2.0\n") {
		t.Errorf("copyright file names no Apache-2.0 license:\n%s", copyright)
	}
}

// TestDebLintian fails on any lintian error; warnings are logged.
func TestDebLintian(t *testing.T) {
	needTools(t, "lintian")
	old, _ := packages(t)
	cmd := exec.Command("lintian", "--no-cfg", "--display-info", old.Deb)
	out, err := cmd.CombinedOutput()
	var errs []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "E: ") {
			errs = append(errs, line)
		}
	}
	t.Logf("lintian:\n%s", out)
	// Warnings that matter: maintainer scripts go through
	// deb-systemd-helper and deb-systemd-invoke (policy-rc.d), not
	// systemctl.
	for _, tag := range []string{"maintainer-script-calls-systemctl"} {
		if strings.Contains(string(out), " "+tag+" ") {
			errs = append(errs, tag)
		}
	}
	if len(errs) > 0 {
		t.Errorf("lintian errors:\n%s", strings.Join(errs, "\n"))
	}
	if err != nil && len(errs) == 0 {
		// lintian exits 1 on errors only (its default --fail-on=error).
		t.Errorf("lintian: %v", err)
	}
}

func TestRPMPackage(t *testing.T) {
	needTools(t, "rpm")
	old, _ := packages(t)
	db := t.TempDir()
	rpmq := func(args ...string) string {
		return run(t, "rpm", append([]string{"--dbpath", db}, args...)...)
	}
	if got := rpmq("-qp", "--qf", "%{NAME} %{VERSION}-%{RELEASE}", old.RPM); got != pkgName+" "+old.Version+"-1" {
		t.Errorf("name and version: %q", got)
	}
	if got := rpmq("-qp", "--qf", "%{LICENSE}", old.RPM); got != "Apache-2.0" {
		t.Errorf("rpm License: %q, want Apache-2.0", got)
	}
	if got := rpmq("-qpL", old.RPM); !strings.Contains(got, "/usr/share/licenses/"+pkgName+"/LICENSE") {
		t.Errorf("rpm -qpL: %q, want the LICENSE file", got)
	}
	if out := rpmq("-K", "--nosignature", old.RPM); !strings.Contains(out, "digests OK") {
		t.Errorf("rpm -K: %q", out)
	}

	files := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(rpmq("-qplv", old.RPM)), "\n") {
		f := strings.Fields(line)
		if len(f) >= 9 && !strings.HasPrefix(f[0], "d") {
			files[f[len(f)-1]] = f[0]
			if f[2] != "root" || f[3] != "root" {
				t.Errorf("%s owned by %s:%s", f[len(f)-1], f[2], f[3])
			}
		}
	}
	for path, mode := range packagedFiles {
		if strings.HasPrefix(path, "/usr/share/doc/") {
			continue // Debian's copyright and changelog
		}
		if strings.HasPrefix(path, "/lib/systemd/") {
			path = "/usr" + path
		}
		if files[path] != mode {
			t.Errorf("%s: mode %q, want %q", path, files[path], mode)
		}
	}
	if got := strings.Fields(rpmq("-qpc", old.RPM)); !slices.Equal(got, conffiles) {
		t.Errorf("config files %q, want %q", got, conffiles)
	}
	// Configuration is %config(noreplace): FILEFLAGS has RPMFILE_CONFIG
	// (1) and RPMFILE_NOREPLACE (16).
	for _, line := range strings.Split(rpmq("-qp", "--qf", `[%{FILEFLAGS} %{FILENAMES}\n]`, old.RPM), "\n") {
		flags, name, ok := strings.Cut(line, " ")
		if ok && slices.Contains(conffiles, name) {
			if n, _ := strconv.Atoi(flags); n&1 == 0 || n&16 == 0 {
				t.Errorf("%s: file flags %s, want config and noreplace", name, flags)
			}
		}
	}

	requires := rpmq("-qpR", old.RPM)
	glibc := glibcNeeded(t, old.Binary)
	m := regexp.MustCompile(`(?m)^glibc >= ([0-9.]+)$`).FindStringSubmatch(requires)
	if m == nil || versionLess(m[1], glibc) {
		t.Errorf("Requires %q: want glibc >= %s (the cgo SQLite driver)", requires, glibc)
	}
	if !strings.Contains(requires, "/usr/bin/kill") {
		t.Errorf("Requires %q lacks /usr/bin/kill (ExecReload=)", requires)
	}
	if strings.Contains(requires, "libisal") {
		t.Errorf("Requires %q names libisal, which the binary runs without", requires)
	}
	if recommends := rpmq("-qp", "--recommends", old.RPM); !regexp.MustCompile(`(?m)^libisal\.so\.2\(\)\(64bit\)$`).MatchString(recommends) {
		t.Errorf("Recommends %q lacks libisal.so.2()(64bit) (ISA-L inflate for gzip layers)", recommends)
	}

	// Units are enabled by presets, as %systemd_post does.
	preset := "/usr/lib/systemd/system-preset/80-cube-templatecenter.preset"
	if files[preset] != "-rw-r--r--" {
		t.Errorf("%s: mode %q, want the preset file", preset, files[preset])
	}
	scripts := rpmq("-qp", "--scripts", old.RPM)
	for _, s := range []struct{ header, file string }{
		{"preinstall scriptlet", "upstream-check.sh"}, {"postinstall scriptlet", "rpm/post.sh"},
		{"preuninstall scriptlet", "rpm/preun.sh"}, {"postuninstall scriptlet", "rpm/postun.sh"},
	} {
		body, err := os.ReadFile(filepath.Join(repoRoot, "packaging", s.file))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(scripts, s.header) || !strings.Contains(scripts, strings.TrimSpace(string(body))) {
			t.Errorf("rpm --scripts lacks the %s from packaging/%s:\n%s", s.header, s.file, scripts)
		}
	}
}
