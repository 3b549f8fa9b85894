package config

import (
	"slices"
	"testing"
)

// TestEnvNames: a setting's variables come from every group of overrides,
// the preferred name first; a setting only the file holds has none.
func TestEnvNames(t *testing.T) {
	for key, want := range map[string][]string{
		"master.addr":                 {"CUBE_MASTER_ADDR", "CUBE_TEMPLATE_CENTER_MASTER_ENDPOINT", "CUBE_MASTER_ENDPOINT"},
		"artifact_store.s3.bucket":    {"CUBE_S3_BUCKET"},
		"replicas.reconcile_interval": {"CUBE_TEMPLATE_CENTER_RECONCILE_INTERVAL", "CUBE_TC_RECONCILE_INTERVAL"},
		"build.download_jobs":         {"CUBEMASTER_NATIVE_ROOTFS_EXPORT_JOBS"},
		"build.queue_size":            nil,
	} {
		if got := EnvNames(key); !slices.Equal(got, want) {
			t.Errorf("EnvNames(%q) = %q, want %q", key, got, want)
		}
	}
}
