package main

import (
	"slices"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/layercodec"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/oci"
)

// TestDenyNetworksDefaultsAgree keeps the defaults that
// registry.lift_default_deny may name and the puller's default deny the
// same list, and checks the agent's default configuration adds, lifts
// and allows nothing.
func TestDenyNetworksDefaultsAgree(t *testing.T) {
	var want []string
	for _, p := range oci.DefaultDenyNetworks() {
		want = append(want, p.String())
	}
	if got := config.DefaultDenyNetworks(); !slices.Equal(got, want) {
		t.Errorf("config.DefaultDenyNetworks %v differs from oci.DefaultDenyNetworks %v", got, want)
	}
	nets, err := config.Default().Registry.Networks()
	if err != nil {
		t.Fatal(err)
	}
	if nets.Deny != nil || nets.Lift != nil || nets.Allow != nil {
		t.Errorf("default registry networks %+v, want nothing added, lifted or allowed", nets)
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
