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

// TestReloadKeepsRestartOnlySettings: a reload applies the live settings
// of the new file and keeps the running values of those that need a
// restart.
func TestReloadKeepsRestartOnlySettings(t *testing.T) {
	cur, next := Default(), Default()
	next.Log.Level, next.Build.MaxConcurrentBuilds, next.Build.Timeout = "debug", 9, time.Minute
	if applied, keys := cur.Reload(next); applied != next || keys != nil {
		t.Errorf("live-only change: Reload = %p, %v; want next itself, no keys", applied, keys)
	}
	next.Store.Dir, next.Build.CAPath, next.Registry.Insecure = "/elsewhere", "/other.crt", []string{"r:5000"}
	applied, keys := cur.Reload(next)
	if len(keys) != 3 {
		t.Errorf("keys = %v; want store, build, registry", keys)
	}
	if applied.Store.Dir != cur.Store.Dir || applied.Build.CAPath != cur.Build.CAPath || len(applied.Registry.Insecure) != 0 {
		t.Errorf("restart-only settings applied: store %q, ca %q, insecure %v", applied.Store.Dir, applied.Build.CAPath, applied.Registry.Insecure)
	}
	if applied.Log.Level != "debug" || applied.Build.MaxConcurrentBuilds != 9 || applied.Build.Timeout != time.Minute {
		t.Errorf("live settings not applied: %q %d %s", applied.Log.Level, applied.Build.MaxConcurrentBuilds, applied.Build.Timeout)
	}
	if next.Store.Dir != "/elsewhere" {
		t.Error("Reload changed the configuration it was given")
	}
}
