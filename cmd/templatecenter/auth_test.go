package main

import (
	"net/http"
	"strings"
	"testing"
)

// TestSharedToken checks the shared-token rule end to end, in both
// directions: requests to the agent and callbacks to CubeMaster.
func TestSharedToken(t *testing.T) {
	t.Parallel()

	t.Run("Required", func(t *testing.T) {
		t.Parallel()
		cm := startCubeMaster(t, testToken)
		h := newHarness(t, cm.URL(), testToken)
		p := h.startAgent("agent")
		build := h.baseURL() + "/tc/api/v1/build"

		// The token rule itself (answers, open endpoints) is agent's
		// TestTokenRules; here, that the variable sets it.
		for _, token := range []string{"", "wrong-token"} {
			if status, body := call(t, http.MethodPost, build, token, buildBody(t, "unauthorized-1", unreachableImage)); status != http.StatusUnauthorized {
				t.Errorf("POST build with token %q = %d %v, want 401", token, status, body)
			}
		}
		if status, body := call(t, http.MethodGet, h.baseURL()+"/tc/api/v1/jobs", "", nil); status != http.StatusUnauthorized {
			t.Errorf("GET /tc/api/v1/jobs without the token = %d %v, want 401", status, body)
		}
		res := runCLI(t, h.environ(), "jobs", "show", "unauthorized-1", "-spool", h.spoolPath)
		if res.code != 1 || !strings.Contains(res.stderr, "not found") {
			t.Errorf("a refused request reached the spool: jobs show = exit %d, %s%s", res.code, res.stdout, res.stderr)
		}

		submit(t, h.baseURL(), testToken, "authorized-1", unreachableImage)
		waitTerminal(t, cm, "authorized-1")
		waitOutboxEmpty(t, h.baseURL())
		p.stop(t)
		checkOneTerminal(t, cm, "authorized-1")
		for _, c := range cm.All() {
			if c.Token != testToken || c.Status == http.StatusUnauthorized {
				t.Errorf("callback %v for %s carried token %q (answered %d), want %q", c.Body, c.JobID, c.Token, c.Status, testToken)
			}
		}
	})

	t.Run("LegacyVariable", func(t *testing.T) {
		t.Parallel()
		cm := startCubeMaster(t, testToken)
		h := newHarness(t, cm.URL(), "")
		p := h.startAgent("agent", "CUBE_TC_CALLBACK_TOKEN="+testToken)
		p.waitLine(t, "level=WARN", "CUBE_TC_CALLBACK_TOKEN is deprecated")
		if status, _ := call(t, http.MethodPost, h.baseURL()+"/tc/api/v1/build", "", buildBody(t, "legacy-0", unreachableImage)); status != http.StatusUnauthorized {
			t.Errorf("POST build without the token = %d, want 401", status)
		}
		submit(t, h.baseURL(), testToken, "legacy-1", unreachableImage)
		if cb := waitTerminal(t, cm, "legacy-1"); cb.Token != testToken {
			t.Errorf("callback token %q, want %q", cb.Token, testToken)
		}
		p.stop(t)
	})

	t.Run("NotConfigured", func(t *testing.T) {
		t.Parallel()
		cm := startCubeMaster(t, "")
		h := newHarness(t, cm.URL(), "")
		p := h.startAgent("agent")
		p.waitLine(t, "level=WARN", "CUBE_TEMPLATE_CALLBACK_TOKEN is not set")
		for _, token := range []string{"", "some-token"} {
			status, body := call(t, http.MethodPost, h.baseURL()+"/tc/api/v1/build", token, buildBody(t, "untrusted-1", unreachableImage))
			const want = "CUBE_TEMPLATE_CALLBACK_TOKEN is not configured on template center"
			if status != http.StatusServiceUnavailable || body["error"] != want {
				t.Errorf("POST build with token %q and none configured = %d %v, want 503 %q", token, status, body, want)
			}
		}
		p.stop(t)
		if n := len(cm.All()); n != 0 {
			t.Errorf("CubeMaster received %d callbacks for refused requests", n)
		}
	})

	t.Run("InsecureNoToken", func(t *testing.T) {
		t.Parallel()
		cm := startCubeMaster(t, "")
		h := newHarness(t, cm.URL(), "")
		p := h.startAgent("agent", "CUBE_TEMPLATE_CALLBACK_INSECURE_NO_TOKEN=true")
		p.waitLine(t, "level=WARN", "WITHOUT the shared token")
		submit(t, h.baseURL(), "", "insecure-1", unreachableImage)
		waitTerminal(t, cm, "insecure-1")
		waitOutboxEmpty(t, h.baseURL())
		p.stop(t)
		checkOneTerminal(t, cm, "insecure-1")
		for _, c := range cm.All() {
			if c.Token != "" {
				t.Errorf("callback carried token %q with none configured", c.Token)
			}
		}
	})
}
