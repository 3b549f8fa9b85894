package agent

import (
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
)

// TestHTTPRequestsCountedAndRejectionsLogged: requests to a running agent
// show in http_requests_total by pattern (an unknown path under one label
// value), and each rejected request is logged once with its reason, route,
// status and remote address, never the token it carried.
func TestHTTPRequestsCountedAndRejectionsLogged(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	const wrongToken = "wrong-token-never-logged"
	if code, _ := h.postWithToken("/tc/api/v1/build", buildBody("r1", "img"), wrongToken); code != http.StatusUnauthorized {
		t.Fatalf("build with a wrong token: %d, want 401", code)
	}
	if code, _ := h.post("/tc/api/v1/build", []byte(`{"job_id":`)); code != http.StatusBadRequest {
		t.Fatalf("build with a truncated body: %d, want 400", code)
	}
	for _, p := range []string{"/no/such/path", "/another/random/path"} {
		resp, err := http.Get(h.url + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("GET %s: %d, want 404", p, resp.StatusCode)
		}
	}
	h.submit("r2", "img")
	h.terminal("r2")

	m := scrape(t, h)
	for _, want := range []string{
		`cube_templatecenter_http_requests_total{code="401",method="POST",route="POST /tc/api/v1/build"} 1`,
		`cube_templatecenter_http_requests_total{code="400",method="POST",route="POST /tc/api/v1/build"} 1`,
		`cube_templatecenter_http_requests_total{code="200",method="POST",route="POST /tc/api/v1/build"} 1`,
		`cube_templatecenter_http_requests_total{code="404",method="GET",route="unmatched"} 2`,
		`cube_templatecenter_http_request_duration_seconds_count{route="POST /tc/api/v1/build"} 3`,
		fmt.Sprintf(`cube_templatecenter_build_info{goversion=%q,revision="rev-test",version="v-test"} 1`, runtime.Version()),
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(m, "/no/such/path") {
		t.Error("metrics carry a raw request path")
	}

	logs := h.logs.String()
	if strings.Contains(logs, wrongToken) || strings.Contains(logs, testToken) {
		t.Errorf("a token reached the log:\n%s", logs)
	}
	var unauthorized []string
	for l := range strings.Lines(logs) {
		if strings.Contains(l, "request rejected") && strings.Contains(l, "status=401") {
			unauthorized = append(unauthorized, l)
		}
	}
	if len(unauthorized) != 1 {
		t.Fatalf("%d log lines for the 401, want 1:\n%s", len(unauthorized), logs)
	}
	for _, want := range []string{"level=WARN", `route="POST /tc/api/v1/build"`, `reason="invalid or missing shared token"`, "remote=127.0.0.1:"} {
		if !strings.Contains(unauthorized[0], want) {
			t.Errorf("401 line lacks %s: %s", want, unauthorized[0])
		}
	}
	for _, want := range []string{"status=400 reason=", "route=unmatched method=GET path=/no/such/path status=404"} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
}

// TestOversizedBodyClosesConnection: behind the observer a body over the
// limit still makes the server close the connection (413 with Connection:
// close) instead of reading the rest.
func TestOversizedBodyClosesConnection(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Common.MaxBodyBytes = 1 << 10 })
	h.start()
	req, err := http.NewRequest(http.MethodPost, h.url+"/tc/api/v1/build", strings.NewReader(strings.Repeat("x", 64<<10)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(api.TokenHeader, testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !resp.Close {
		t.Errorf("oversized body: %d, connection close %v; want 413 and close", resp.StatusCode, resp.Close)
	}
	if !strings.Contains(h.logs.String(), "status=413 reason=\"request body exceeds 1024 bytes\"") {
		t.Errorf("no rejection line for the 413:\n%s", h.logs.String())
	}
}

// TestAPIErrorsAreJSON: under /tc/api/v1/ every answer is JSON, a path no
// route takes (404) and a method its route does not take (405, with
// Allow) included; both still count as the unmatched route, one label
// whatever the path.
func TestAPIErrorsAreJSON(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	for _, c := range []struct {
		method, path string
		code         int
		allow        string
	}{
		{http.MethodGet, "/tc/api/v1/no/such/route", http.StatusNotFound, ""},
		{http.MethodGet, "/tc/api/v1/build", http.StatusMethodNotAllowed, "POST"},
		{http.MethodDelete, "/tc/api/v1/jobs/j1", http.StatusMethodNotAllowed, "GET, HEAD"},
		{"BREW", "/tc/api/v1/jobs/j1/cancel", http.StatusMethodNotAllowed, "POST"},
	} {
		req, _ := http.NewRequest(c.method, h.url+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body map[string]string
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != c.code || err != nil || body["error"] == "" || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s = %d %q (%v, Content-Type %q), want %d with a JSON error", c.method, c.path, resp.StatusCode, body, err,
				resp.Header.Get("Content-Type"), c.code)
		}
		if got := resp.Header.Get("Allow"); got != c.allow {
			t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, got, c.allow)
		}
	}
	m := scrape(t, h)
	for _, want := range []string{
		`cube_templatecenter_http_requests_total{code="404",method="GET",route="unmatched"} 1`,
		`cube_templatecenter_http_requests_total{code="405",method="DELETE",route="unmatched"} 1`,
		`cube_templatecenter_http_requests_total{code="405",method="other",route="unmatched"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}
