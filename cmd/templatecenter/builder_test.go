package main

import (
	"slices"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/layercodec"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/oci"
)

// TestDenyNetworksDefaultsAgree keeps the agent's registry.deny_networks
// default and the puller's own default (used when a caller sets none) the
// same list.
func TestDenyNetworksDefaultsAgree(t *testing.T) {
	deny, allow, err := config.Default().Registry.Networks()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(deny, oci.DefaultDenyNetworks()) || len(allow) != 0 {
		t.Errorf("config default deny %v (allow %v) differs from oci.DefaultDenyNetworks %v", deny, allow, oci.DefaultDenyNetworks())
	}
}

// TestGzipInflaterFromEnv checks the mapping of CUBE_TEMPLATE_CENTER_INFLATE:
// "go" forces the pure-Go inflater and is the logged reason; any other
// value leaves the choice automatic, with the loader's reason if any.
func TestGzipInflaterFromEnv(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == inflateEnv {
				return v
			}
			return ""
		}
	}
	gz, why := gzipInflater(env("go"))
	if gz.Backend() != layercodec.BackendGo || why != "CUBE_TEMPLATE_CENTER_INFLATE=go" {
		t.Errorf("gzipInflater(go) = %s, %q; want %s, %q", gz.Backend(), why, layercodec.BackendGo, "CUBE_TEMPLATE_CENTER_INFLATE=go")
	}
	for _, v := range []string{"", "auto", "isal", "GO"} {
		gz, why := gzipInflater(env(v))
		if want := layercodec.NewGzipInflater(layercodec.InflaterAuto); gz.Backend() != want.Backend() || why != want.Reason() {
			t.Errorf("gzipInflater(%q) = %s, %q; want %s, %q", v, gz.Backend(), why, want.Backend(), want.Reason())
		}
	}
}
