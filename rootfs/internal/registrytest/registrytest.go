package registrytest

import (
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/test/registry"
)

// Options configure a registry: optional basic-auth credentials.
type Options struct {
	Username string
	Password string
}

// Registry is a running docker-registry.
type Registry = registry.Registry

// Start is registry.StartForTest.
//
// Deprecated: use test/registry's StartForTest; this package stays only
// until rootfs/oci's tests switch.
func Start(t testing.TB, opts Options) *Registry {
	t.Helper()
	return registry.StartForTest(t, registry.Options{Username: opts.Username, Password: opts.Password})
}
