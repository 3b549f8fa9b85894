package system

import (
	"strings"
	"testing"
)

// wantConfMode is conf.yaml's mode and owner once installed: it may hold
// passwords, so only root and the service's group read it.
const wantConfMode = "640 root:cube-templatecenter"

// checkConfMode fails the test unless conf.yaml in c has wantConfMode.
func checkConfMode(t *testing.T, c *container, when string) {
	t.Helper()
	if got := strings.TrimSpace(c.must("stat", "-c", "%a %U:%G", confPath)); got != wantConfMode {
		t.Errorf("%s %s: %s, want %s", confPath, when, got, wantConfMode)
	}
}

// loosenConf makes conf.yaml world-readable, as packages before 0640 left
// it, so the upgrade after it must tighten it again.
func loosenConf(c *container) {
	c.must("chmod", "0644", confPath)
	c.must("chgrp", "root", confPath)
}
