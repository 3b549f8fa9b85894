package main

import (
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/test/childproc"
)

// TestSocketActivation runs the agent the way a systemd .socket unit does:
// systemd-socket-activate holds the port and execs the agent on the first
// connection with LISTEN_FDS=1 and LISTEN_FDNAMES=http.
func TestSocketActivation(t *testing.T) {
	t.Parallel()
	tool, err := exec.LookPath("systemd-socket-activate")
	if err != nil {
		t.Fatalf("systemd-socket-activate is missing (Debian: apt-get install -y systemd): %v", err)
	}
	cm := startCubeMaster(t, testToken)
	h := newHarness(t, cm.URL(), testToken)
	h.writeConfig()
	activated := childproc.FreePort(t)
	if activated == h.port {
		t.Fatalf("socket port and common.http_port are both %d", activated)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", activated)

	// systemd-socket-activate passes the program only the variables named
	// with -E (and PATH, HOME, TERM).
	argv := []string{tool, "-l", addr, "--fdname=http"}
	for _, kv := range h.environ() {
		argv = append(argv, "-E", kv)
	}
	argv = append(argv, agentBuild.Path(t))
	p := startProc(t, "systemd-socket-activate", h.environ(), argv...)
	p.waitLine(t, "Listening on", addr)
	if line, ok := findLine(p.out.String(), "msg=templatecenter"); ok {
		t.Fatalf("agent started before any connection: %s", line)
	}

	// The first connection starts the agent, which answers it.
	status, body := call(t, http.MethodGet, "http://"+addr+"/health", "", nil)
	if status != http.StatusOK || body["status"] != "ok" {
		t.Fatalf("first GET /health on the activated socket = %d %v, want 200 {status:ok}", status, body)
	}
	p.waitLine(t, "using socket passed by systemd", "name=http", "addr="+addr)
	// The log reaches the test through a pipe, possibly after the answer:
	// wait for the startup line rather than look for it once.
	p.waitLine(t, "msg=starting", "listen="+addr)

	// common.http_port is not listened on: the port is still free.
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", h.port))
	if err != nil {
		t.Errorf("common.http_port %d is in use although systemd passed a socket: %v", h.port, err)
	} else {
		ln.Close()
	}

	// The inherited socket serves the whole API.
	submit(t, "http://"+addr, testToken, "activated-1", unreachableImage)
	waitTerminal(t, cm, "activated-1")
	checkConsistentTerminals(t, cm, "activated-1")
	p.stop(t)
}
