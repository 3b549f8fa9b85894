package config

import (
	"strings"
	"testing"
	"time"
)

func TestRestartOnly(t *testing.T) {
	a, b := Default(), Default()
	b.Build.MaxConcurrentBuilds, b.Log.Level, b.Build.Timeout = 9, "debug", time.Minute
	if keys := a.RestartOnly(b); len(keys) != 0 {
		t.Errorf("live-reloadable changes flagged: %v", keys)
	}
	b.Common.HTTPPort, b.Store.Dir = 1, "/x"
	if keys := a.RestartOnly(b); strings.Join(keys, ",") != "common,store" {
		t.Errorf("RestartOnly = %v", keys)
	}
	c := Default()
	c.Build.CAPath, c.Build.DirectIO, c.Registry.Insecure = "/other.crt", false, []string{"r:5000"}
	if keys := a.RestartOnly(c); len(keys) != 2 || !strings.HasPrefix(keys[0], "build") || keys[1] != "registry" {
		t.Errorf("RestartOnly for builder settings = %v", keys)
	}
}
