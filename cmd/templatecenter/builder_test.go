package main

import (
	"slices"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/agent/config"
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
