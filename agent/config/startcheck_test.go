package config

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStartCheckSetting: build.start_check is fail by default, read from
// the file, CUBE_TEMPLATE_CENTER_START_CHECK wins over it, and anything but
// fail, warn or off is an error naming the key.
func TestStartCheckSetting(t *testing.T) {
	if d := Default().Build.StartCheck; d != StartCheckFail {
		t.Errorf("default build.start_check = %q, want fail", d)
	}
	path := filepath.Join(t.TempDir(), "conf.yaml")
	if err := os.WriteFile(path, []byte("build:\n  start_check: warn\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(envOf(map[string]string{PathEnv: path}), slog.Default())
	if err != nil || c.Build.StartCheck != StartCheckWarn {
		t.Fatalf("file: build.start_check = %q, err %v; want warn", c.Build.StartCheck, err)
	}
	c, err = Load(envOf(map[string]string{PathEnv: path, "CUBE_TEMPLATE_CENTER_START_CHECK": " off "}), slog.Default())
	if err != nil || c.Build.StartCheck != StartCheckOff {
		t.Errorf("with the variable: build.start_check = %q, err %v; want off", c.Build.StartCheck, err)
	}
	for _, v := range []string{"FAIL", "yes", "warning"} {
		_, err := Load(envOf(map[string]string{"CUBE_TEMPLATE_CENTER_START_CHECK": v}), slog.Default())
		if err == nil || !strings.Contains(err.Error(), "build.start_check") {
			t.Errorf("CUBE_TEMPLATE_CENTER_START_CHECK=%q: error %v, want it to name build.start_check", v, err)
		}
	}
}
