package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestLiftDefaultDeny: only a default denied network can be lifted, as
// written in DefaultDenyNetworks, and each lifted one is a warning, as is
// an empty deny_networks (which denied nothing before the defaults always
// applied).
func TestLiftDefaultDeny(t *testing.T) {
	for _, bad := range []string{"10.0.0.0/8", "169.254.169.0/24", "::ffff:169.254.0.0/112"} {
		r := Registry{LiftDefaultDeny: []string{bad}}
		if _, err := r.Networks(); err == nil || !strings.Contains(err.Error(), "registry.lift_default_deny: ") ||
			!strings.Contains(err.Error(), "is not one of the default denied networks (169.254.0.0/16, fe80::/10, 169.254.169.254/32") {
			t.Errorf("lift %s: error %v, want a refusal listing the defaults", bad, err)
		}
	}
	path := filepath.Join(t.TempDir(), "conf.yaml")
	if err := os.WriteFile(path, []byte("registry:\n  deny_networks: []\n  lift_default_deny: [169.254.0.0/16, \"fd20:ce::254/128\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, rep, err := Read(envOf(map[string]string{PathEnv: path}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range rep.Warnings {
		got = append(got, w.Text)
	}
	for _, want := range []string{
		"registry.lift_default_deny: 169.254.0.0/16 is lifted from the default deny",
		"registry.lift_default_deny: fd20:ce::254/128 is lifted from the default deny",
		"registry.deny_networks is empty: it adds to the default deny",
	} {
		if !slices.ContainsFunc(got, func(w string) bool { return strings.HasPrefix(w, want) }) {
			t.Errorf("warnings %q lack %q", got, want)
		}
	}
	_, rep, err = Read(envOf(map[string]string{}), Options{})
	if err != nil || len(rep.Warnings) != 0 {
		t.Errorf("defaults: warnings %v, %v; want none", rep.Warnings, err)
	}
}

func TestRegistryNetworks(t *testing.T) {
	c := Default()
	if c.Build.StallTimeout != 5*time.Minute {
		t.Errorf("build.stall_timeout default = %s, want 5m", c.Build.StallTimeout)
	}
	if c.Build.MinTransferRate != 1<<10 {
		t.Errorf("build.min_transfer_rate default = %s, want 1KiB", c.Build.MinTransferRate)
	}
	n, err := c.Registry.Networks()
	if err != nil {
		t.Fatal(err)
	}
	// Nothing added, lifted or allowed: the defaults alone apply.
	if n.Deny != nil || n.Lift != nil || n.Allow != nil {
		t.Errorf("default networks: %+v, want none set", n)
	}
	c, _, err = Parse(strings.NewReader("registry:\n  deny_networks: [10.0.0.0/8]\n  lift_default_deny: [169.254.0.0/16]\n  allow_networks: [10.0.0.0/8, \"fd00::/8\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if n, err = c.Registry.Networks(); err != nil || len(n.Deny) != 1 || len(n.Lift) != 1 || len(n.Allow) != 2 {
		t.Errorf("Networks() = %+v, %v; want one added, one lifted, two allowed", n, err)
	}
}
