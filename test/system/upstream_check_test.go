package system

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// checkFuncs returns the definitions of the named functions of
// packaging/upstream-check.sh, to run them on strings without running the
// check itself.
func checkFuncs(t *testing.T, names ...string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "packaging/upstream-check.sh"))
	if err != nil {
		t.Fatal(err)
	}
	script := string(data)
	var defs strings.Builder
	for _, name := range names {
		_, body, ok := strings.Cut(script, "\n"+name+"() {\n")
		if !ok {
			t.Fatalf("packaging/upstream-check.sh defines no function %s", name)
		}
		body, _, ok = strings.Cut(body, "\n}\n")
		if !ok {
			t.Fatalf("function %s of packaging/upstream-check.sh has no end", name)
		}
		defs.WriteString(name + "() {\n" + body + "\n}\n")
	}
	return defs.String()
}

// shRun runs script with sh (the shell the packages' scriptlets run under)
// in dir with args as its positional parameters and returns its output.
func shRun(t *testing.T, dir, script string, args ...string) string {
	t.Helper()
	cmd := exec.Command("sh", append([]string{"-c", script, "sh"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sh -c %q: %v\n%s", script, err, out)
	}
	return string(out)
}

// TestUpstreamCheckWords checks the command lines the check prints for a
// person to paste: plain words stay as they are, and any other word reads
// back as itself in a shell, with nothing expanded or run.
func TestUpstreamCheckWords(t *testing.T) {
	words := checkFuncs(t, "plain_word", "quote", "words") + `words "$@"`
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"Disable", []string{"systemctl", "disable", "--now", serviceUnit},
			"systemctl disable --now " + serviceUnit},
		{"Move", []string{"mv", "/etc/systemd/system/" + serviceUnit, "/var/backups/cube-templatecenter-upstream/"},
			"mv /etc/systemd/system/" + serviceUnit + " /var/backups/cube-templatecenter-upstream/"},
		{"Setfacl", []string{"find", "/data/CubeMaster/storage", "-type", "d", "-exec", "setfacl", "-m", "u:cube-templatecenter:rwx", "{}", "+"},
			"find /data/CubeMaster/storage -type d -exec setfacl -m u:cube-templatecenter:rwx {} +"},
		{"Kill", []string{"kill", "4242"}, "kill 4242"},
		{"CommandInName", []string{"systemctl", "disable", "--now", "x;touch PWNED;#.service"},
			`systemctl disable --now 'x;touch PWNED;#.service'`},
		{"SingleQuotes", []string{"echo", `it's`, `'`}, `echo 'it'\''s' ''\'''`},
		{"Expansions", []string{"echo", "$(touch PWNED)", "`touch PWNED`", "${HOME}", "~", "*", "a{b,c}", "{}x"},
			"echo '$(touch PWNED)' '`touch PWNED`' '${HOME}' '~' '*' 'a{b,c}' '{}x'"},
		{"Blanks", []string{"echo", "a b", "a\tb", "a\nb", ""}, "echo 'a b' 'a\tb' 'a\nb' ''"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A file for a glob to find, and the directory a command in
			// a word would create PWNED in.
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "glob-bait"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			line := shRun(t, dir, words, tc.args...)
			if line != tc.want {
				t.Errorf("words %q = %q, want %q", tc.args, line, tc.want)
			}
			// The operator's shell reads the line back: the same words,
			// one per \037-terminated field.
			got := shRun(t, dir, `set -- `+line+`; printf '%s\037' "$@"`)
			if want := strings.Join(tc.args, "\037") + "\037"; got != want {
				t.Errorf("sh reads %q back as %q, want %q", line, strings.Split(got, "\037"), tc.args)
			}
			if _, err := os.Stat(filepath.Join(dir, "PWNED")); err == nil {
				t.Errorf("reading %q back ran a command", line)
			}
		})
	}
}

// TestUpstreamCheckValidUnit checks which cgroup names can be taken for a
// service's name at all (systemd must then confirm it).
func TestUpstreamCheckValidUnit(t *testing.T) {
	validUnit := checkFuncs(t, "valid_unit") + `if valid_unit "$1"; then echo yes; else echo no; fi`
	for unit, want := range map[string]bool{
		serviceUnit: true,
		"cube-sandbox-cubetemplatecenter.service": true,
		"ssh.service":                         true,
		"user@1000.service":                   true,
		"getty@tty1.service":                  true,
		"a:b_c.service":                       true,
		"x;touch PWNED;#.service":             false,
		"x touch.service":                     false,
		`x\x2d.service`:                       false,
		"$(id).service":                       false,
		"-now.service":                        false,
		".service":                            false,
		"ssh.socket":                          false,
		"session-2.scope":                     false,
		"ssh.service\n":                       false,
		"":                                    false,
		strings.Repeat("a", 248) + ".service": true,
		strings.Repeat("a", 249) + ".service": false,
	} {
		if got := shRun(t, t.TempDir(), validUnit, unit) == "yes\n"; got != want {
			t.Errorf("valid_unit %q = %v, want %v", unit, got, want)
		}
	}
}

// TestUpstreamCheckPrintable checks what the check prints of a string read
// from /proc: printable ASCII only, cut short.
func TestUpstreamCheckPrintable(t *testing.T) {
	printable := checkFuncs(t, "printable") + `printable "$1" "$2"`
	for _, tc := range []struct{ max, in, want string }{
		{"32", "perl", "perl"},
		{"10", "ab\x1b[31mcd\nef", "ab?[31mcd?..."},
		{"10", "0123456789", "0123456789"},
		{"10", "0123456789a", "0123456789..."},
		{"32", "caf\u00e9\r", "caf???"},
		{"32", "", ""},
	} {
		if got := shRun(t, t.TempDir(), printable, tc.max, tc.in); got != tc.want {
			t.Errorf("printable %s %q = %q, want %q", tc.max, tc.in, got, tc.want)
		}
	}
}
