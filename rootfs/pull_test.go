package rootfs_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/oci"
)

func TestValidateImageRef(t *testing.T) {
	tests := []struct {
		ref      string
		registry string
	}{
		{"debian:12", "index.docker.io"},
		{"docker.io/library/debian:12", "index.docker.io"},
		{"http://127.0.0.1:5000/app:v1", "127.0.0.1:5000"},
		{"quay.io/team/app@sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "quay.io"},
		{"oci-layout:/srv/images/app:v1", ""},
		{"docker-archive:/srv/images/app.tar", ""},
	}
	for _, tc := range tests {
		got, err := rootfs.ValidateImageRef(tc.ref)
		if err != nil {
			t.Errorf("ValidateImageRef(%q): %v", tc.ref, err)
			continue
		}
		if got.Registry != tc.registry {
			t.Errorf("ValidateImageRef(%q).Registry = %q, want %q", tc.ref, got.Registry, tc.registry)
		}
	}
	for _, ref := range []string{"", "-bad", "UPPER/case:tag", "oci-layout:relative/dir"} {
		if _, err := rootfs.ValidateImageRef(ref); !errors.Is(err, oci.ErrInvalidRef) {
			t.Errorf("ValidateImageRef(%q) error = %v, want ErrInvalidRef", ref, err)
		}
	}
}

// TestPullNetworkPolicy runs the registry network policy and the error
// formatting through the facade: PullOptions.DenyNetworks refuses a
// registry before connecting, and a registry's HTML answer never shows in
// the error.
func TestPullNetworkPolicy(t *testing.T) {
	const marker = "INTERNAL-ADMIN-SECRET"
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/" {
			return
		}
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, "<html>"+strings.Repeat(marker+" ", 10000)+"</html>")
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	ref := "http://" + strings.TrimPrefix(srv.URL, "http://") + "/internal/admin:latest"

	opts := builderOptions(t)
	opts.Pull.DenyNetworks = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	_, err := newBuilder(t, opts).Resolve(context.Background(), rootfs.Source{Ref: ref})
	if !errors.Is(err, oci.ErrNetworkDenied) || !strings.Contains(err.Error(), "registry.deny_networks 127.0.0.1/32") {
		t.Fatalf("Resolve error = %v, want the deny rule", err)
	}
	if n := conns.Load(); n != 0 {
		t.Errorf("the denied registry saw %d connections", n)
	}
	// Loopback is denied by default, naming the settings that allow it.
	opts = builderOptions(t)
	opts.Pull.AllowNetworks = nil
	_, err = newBuilder(t, opts).Resolve(context.Background(), rootfs.Source{Ref: ref})
	if !errors.Is(err, oci.ErrNetworkDenied) || !strings.Contains(err.Error(), "is loopback, denied by default; list the registry in registry.insecure or registry.mirrors, or add 127.0.0.0/8 to registry.allow_networks") {
		t.Fatalf("Resolve error = %v, want the loopback refusal", err)
	}
	if n := conns.Load(); n != 0 {
		t.Errorf("the denied registry saw %d connections", n)
	}

	_, err = newBuilder(t, builderOptions(t)).Resolve(context.Background(), rootfs.Source{Ref: ref})
	if !errors.Is(err, oci.ErrNotFound) || strings.Contains(err.Error(), marker) {
		t.Fatalf("Resolve error = %.300v, want ErrNotFound without the body", err)
	}
}
