package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/test/wait"

	"github.com/cubesandbox/cubetemplatecenter/agent/config"
)

// TestPlainHTTPTokenWarning: the reporter warns once when a reload moves
// CubeMaster to a plain-http address off loopback while a token is set,
// naming the host and never the token; a loopback address is quiet.
func TestPlainHTTPTokenWarning(t *testing.T) {
	const warning = "shared token goes to CubeMaster over plain http"
	h := newHarness(t, nil)
	path := filepath.Join(h.dir, "conf.yaml")
	h.env[config.PathEnv] = path
	h.env["CUBE_TEMPLATE_CALLBACK_TOKEN"] = testToken
	conf := func(addr string) {
		doc := "store:\n  dir: " + h.cfg.Store.Dir + "\n  work_dir: " + h.cfg.Store.WorkDir +
			"\nspool:\n  path: " + h.cfg.Spool.Path + "\nmaster:\n  addr: " + addr + "\n"
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	conf(h.master.URL())
	h.start()
	if strings.Contains(h.logs.String(), warning) {
		t.Fatalf("warning for the loopback address %s:\n%s", h.master.URL(), h.logs)
	}
	conf("http://cubemaster.example:8089")
	for range 2 {
		if err := h.agent.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	logs := h.logs.String()
	if n := strings.Count(logs, warning); n != 1 {
		t.Fatalf("%d warnings after two reloads to a plain-http remote address, want 1:\n%s", n, logs)
	}
	if line, _ := findLogLine(logs, warning); !strings.Contains(line, "host=cubemaster.example") {
		t.Errorf("warning does not name the host: %s", line)
	}
	if strings.Contains(logs, testToken) {
		t.Errorf("the log holds the token:\n%s", logs)
	}
	conf("https://cubemaster.example:8089")
	if err := h.agent.Reload(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(h.logs.String(), warning); n != 1 {
		t.Errorf("%d warnings after moving to https, want still 1", n)
	}
}

// TestPlainHTTPTokenWarningAtStart: an agent started with a plain-http
// CubeMaster off loopback and a token warns as it starts.
func TestPlainHTTPTokenWarningAtStart(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Master.Addr, c.Master.Token = "http://192.0.2.7:8089", testToken
	})
	h.start()
	wait.For(t, "the plain-http warning", func() bool {
		line, ok := findLogLine(h.logs.String(), "shared token goes to CubeMaster over plain http")
		return ok && strings.Contains(line, "host=192.0.2.7")
	})
}
