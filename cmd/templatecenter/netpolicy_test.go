package main

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// TestLoopbackRegistryDenied runs the agent with the default registry
// network policy: a build of an image on a loopback registry nobody listed
// fails, the message names the settings that allow it, and the registry
// sees no request.
func TestLoopbackRegistryDenied(t *testing.T) {
	t.Parallel()
	var requests atomic.Int64
	reg := images.StartRegistry(t, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			requests.Add(1)
			next.ServeHTTP(w, r)
		})
	})
	ref := reg.Push(t, "team/app:v1", images.New(t, images.Config{}))
	pushed := requests.Load()

	cm := startCubeMaster(t, testToken)
	h := newHarness(t, cm.URL(), testToken)
	h.set("registry.allow_networks", nil) // the default: nothing listed
	p := h.startAgent("agent")
	defer p.stop(t)
	submit(t, h.baseURL(), testToken, "loopback-1", ref)
	cb := waitTerminal(t, cm, "loopback-1")
	msg := cb.Field("error_message")
	want := "registry address 127.0.0.1 (of " + reg.Host + ") is loopback, denied by default; list the registry in registry.insecure or registry.mirrors, or add 127.0.0.0/8 to registry.allow_networks"
	if cb.Field("status") != "FAILED" || !strings.Contains(msg, want) {
		t.Errorf("job loopback-1: %s %q, want FAILED with %q", cb.Field("status"), msg, want)
	}
	if n := requests.Load() - pushed; n != 0 {
		t.Errorf("the loopback registry saw %d requests from the agent", n)
	}
}
