package config

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestShutdownTimeoutFromEnv: CUBE_TEMPLATE_CENTER_SHUTDOWN_TIMEOUT sets
// shutdown.timeout over the file (a pod's grace period lives in its spec),
// and a bad value names the variable or the key.
func TestShutdownTimeoutFromEnv(t *testing.T) {
	path := filepath.Join(t.TempDir(), "conf.yaml")
	if err := os.WriteFile(path, []byte("shutdown:\n  timeout: 10s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(envOf(map[string]string{PathEnv: path}), slog.Default())
	if err != nil || c.Shutdown.Timeout != 10*time.Second {
		t.Fatalf("file alone: shutdown.timeout = %v, err %v; want 10s", c.Shutdown.Timeout, err)
	}
	c, err = Load(envOf(map[string]string{PathEnv: path, "CUBE_TEMPLATE_CENTER_SHUTDOWN_TIMEOUT": " 50s "}), slog.Default())
	if err != nil || c.Shutdown.Timeout != 50*time.Second {
		t.Errorf("with the variable: shutdown.timeout = %v, err %v; want 50s", c.Shutdown.Timeout, err)
	}
	for v, want := range map[string]string{"soon": "CUBE_TEMPLATE_CENTER_SHUTDOWN_TIMEOUT", "50": "CUBE_TEMPLATE_CENTER_SHUTDOWN_TIMEOUT", "-5s": "shutdown.timeout"} {
		_, err := Load(envOf(map[string]string{"CUBE_TEMPLATE_CENTER_SHUTDOWN_TIMEOUT": v}), slog.Default())
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CUBE_TEMPLATE_CENTER_SHUTDOWN_TIMEOUT=%q: error %v, want it to name %s", v, err, want)
		}
	}
	if d := Default().Shutdown.Timeout; d != DefaultShutdownTimeout {
		t.Errorf("default shutdown.timeout = %v, want %v", d, DefaultShutdownTimeout)
	}
}
