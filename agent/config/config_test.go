package config

import (
	"strings"
	"testing"
	"time"
)

func envOf(m map[string]string) Env {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestDefaultsAreValid(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if c.ListenAddr() != "0.0.0.0:8090" || c.Store.Dir != "/data/CubeMaster/storage" || c.Master.Addr != "http://127.0.0.1:8089" ||
		c.Build.MaxConcurrentBuilds != 2 || c.Build.QueueSize != 64 || c.Build.Timeout != 2*time.Hour || !strings.HasPrefix(c.Spool.Path, "/var/lib/cube-templatecenter/") ||
		!c.Build.DirectIO {
		t.Errorf("unexpected defaults: %+v", c)
	}
}

// TestSpoolReserveAndUploadBound: spool.min_free and
// common.max_concurrent_uploads have working defaults and parse.
func TestSpoolReserveAndUploadBound(t *testing.T) {
	c := Default()
	if c.Spool.MinFree != (Reserve{Bytes: 64 << 20}) || c.Common.MaxConcurrentUploads != 2 {
		t.Errorf("defaults: spool.min_free %s, common.max_concurrent_uploads %d; want 64MiB and 2", c.Spool.MinFree, c.Common.MaxConcurrentUploads)
	}
	c, _, err := Parse(strings.NewReader("spool:\n  min_free: 3%\ncommon:\n  max_concurrent_uploads: 5\n"))
	if err != nil || c.Validate() != nil {
		t.Fatalf("Parse: %v", err)
	}
	if c.Spool.MinFree != (Reserve{Percent: 3}) || c.Common.MaxConcurrentUploads != 5 {
		t.Errorf("parsed spool.min_free %s, common.max_concurrent_uploads %d; want 3%% and 5", c.Spool.MinFree, c.Common.MaxConcurrentUploads)
	}
}
