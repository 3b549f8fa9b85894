package config

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// DefaultDenyNetworks are the networks no registry connection may reach
// whatever registry.deny_networks adds: link-local addresses and the cloud
// metadata services (169.254.169.254 apart from 169.254.0.0/16, so that
// lifting link-local leaves it denied). Only registry.lift_default_deny
// takes one out. Private ranges stay allowed, for local registries and
// mirrors; the host's own addresses are denied apart from this list (see
// Registry.DenyNetworks).
func DefaultDenyNetworks() []string {
	return []string{"169.254.0.0/16", "fe80::/10", "169.254.169.254/32", "fd00:ec2::254/128",
		"fd00:ec2::23/128", "fd20:ce::254/128", "100.100.100.200/32"}
}

// RegistryNetworks are the parsed network settings of the registry
// section.
type RegistryNetworks struct {
	// Deny adds to the default deny; Lift takes defaults out of it.
	Deny, Lift []netip.Prefix
	// Allow, when not empty, is the only networks registries may be
	// reached at.
	Allow []netip.Prefix
}

// Networks parses DenyNetworks, LiftDefaultDeny and AllowNetworks; each
// entry of LiftDefaultDeny must be one of DefaultDenyNetworks.
func (r Registry) Networks() (RegistryNetworks, error) {
	var n RegistryNetworks
	var derr, lerr, aerr error
	n.Deny, derr = parseNetworks("registry.deny_networks", r.DenyNetworks)
	n.Lift, lerr = parseNetworks("registry.lift_default_deny", r.LiftDefaultDeny)
	n.Allow, aerr = parseNetworks("registry.allow_networks", r.AllowNetworks)
	defaults := DefaultDenyNetworks()
	for _, l := range n.Lift {
		if !slices.Contains(defaults, l.Masked().String()) {
			lerr = errors.Join(lerr, fmt.Errorf("registry.lift_default_deny: %s is not one of the default denied networks (%s)",
				l, strings.Join(defaults, ", ")))
		}
	}
	return n, errors.Join(derr, lerr, aerr)
}

func parseNetworks(key string, list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	var errs []error
	for _, s := range list {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %q is not a CIDR (address/bits, e.g. 169.254.0.0/16)", key, s))
			continue
		}
		out = append(out, p)
	}
	return out, errors.Join(errs...)
}

// reachWarnings says which default denied networks the configuration
// lifts, and that an empty registry.deny_networks, which once denied
// nothing, leaves the defaults in place.
func (r Registry) reachWarnings() []string {
	var out []string
	n, err := r.Networks()
	if err != nil {
		return nil // Validate reports it
	}
	for _, l := range n.Lift {
		out = append(out, fmt.Sprintf("registry.lift_default_deny: %s is lifted from the default deny: registry connections, "+
			"realms and redirects may reach it (the unit's IPAddressDeny= still blocks it unless a drop-in lifts it too)", l))
	}
	if r.DenyNetworks != nil && len(r.DenyNetworks) == 0 {
		out = append(out, "registry.deny_networks is empty: it adds to the default deny (link-local, cloud metadata), "+
			"which still applies; registry.lift_default_deny lifts a default")
	}
	return out
}
