package cmdbin

import (
	"debug/buildinfo"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// settings returns the build settings go build recorded in the binary at
// path.
func settings(t *testing.T, path string) map[string]string {
	t.Helper()
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		t.Fatalf("read build info of %s: %v", path, err)
	}
	out := map[string]string{"path": info.Path}
	for _, s := range info.Settings {
		out[s.Key] = s.Value
	}
	return out
}

// TestBuildOncePerVariant: a variant is built once and keeps the command's
// name, another variant is a binary of its own carrying its settings, and
// Cleanup removes them all. tcimage stands in for templatecenter: it links
// in a moment.
func TestBuildOncePerVariant(t *testing.T) {
	t.Cleanup(Cleanup)
	plain := Build{Command: "tcimage"}
	first := plain.Path(t)
	if filepath.Base(first) != "tcimage" {
		t.Errorf("binary %s, want it named tcimage", first)
	}
	stat, err := os.Stat(first)
	if err != nil || stat.Mode()&0o111 == 0 {
		t.Fatalf("stat %s = %v, %v; want an executable", first, stat, err)
	}
	if again := plain.Path(t); again != first {
		t.Errorf("second Path = %s, want the first build %s", again, first)
	}
	if got := settings(t, first); got["CGO_ENABLED"] != "1" || got["path"] != module+"/cmd/tcimage" || got["-ldflags"] != "" {
		t.Errorf("plain build settings %v, want cgo on, cmd/tcimage, no -ldflags", got)
	}

	stamped := Build{Command: "tcimage", Version: "v9.9.9-test", Revision: "abc123", NoCgo: true}
	other := stamped.Path(t)
	if other == first || filepath.Base(other) != "tcimage" {
		t.Errorf("stamped variant at %s, plain at %s: want two binaries named tcimage", other, first)
	}
	got := settings(t, other)
	if got["CGO_ENABLED"] != "0" || !strings.Contains(got["-ldflags"], "-X main.Version=v9.9.9-test") || !strings.Contains(got["-ldflags"], "-X main.Revision=abc123") {
		t.Errorf("stamped build settings %v, want cgo off and both -X flags", got)
	}

	Cleanup()
	for _, p := range []string{first, other} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("after Cleanup, stat %s = %v; want it gone", p, err)
		}
	}
}

// TestBuildFailureRemembered: a command that does not compile fails with
// go build's words, and the next call answers the same without building.
func TestBuildFailureRemembered(t *testing.T) {
	t.Cleanup(Cleanup)
	missing := Build{Command: "no-such-command"}
	_, err := missing.Binary()
	if err == nil || !strings.Contains(err.Error(), "cmd/no-such-command") {
		t.Fatalf("Binary of a missing command = %v, want go build's error naming it", err)
	}
	if _, again := missing.Binary(); again != err {
		t.Errorf("second Binary = %v, want the first error %v", again, err)
	}
}
