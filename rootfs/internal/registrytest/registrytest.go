package registrytest

import (
	"context"
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

// Start runs docker-registry until the test ends. A missing binary fails the
// test with the apt-get command to run: it is never skipped silently.
func Start(t testing.TB, opts Options) *Registry {
	t.Helper()
	r, err := registry.Start(context.Background(), registry.Options{Dir: t.TempDir(), Username: opts.Username, Password: opts.Password})
	if err != nil {
		t.Fatalf("registrytest: %v", err)
	}
	t.Cleanup(r.Stop)
	return r
}
