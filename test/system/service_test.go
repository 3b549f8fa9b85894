package system

// Helpers over the installed service, shared by the end-to-end tests.

import (
	"net"
	"strconv"
	"time"
)

const (
	confPath  = "/etc/cube-templatecenter/conf.yaml"
	envPath   = "/etc/cube-templatecenter/templatecenter.env"
	stateDir  = "/var/lib/cube-templatecenter"
	cacheDir  = "/var/cache/cube-templatecenter"
	storeDir  = "/data/CubeMaster/storage"
	storeKeep = storeDir + "/rfs-system-test/rfs-system-test.ext4"
	// restartLimit bounds how long systemd takes to bring the agent back
	// (RestartSec=2s, a watchdog timeout of a few seconds, the start).
	restartLimit = 60 * time.Second
)

// agentState is what the service's restarts are judged by.
type agentState struct {
	pid      string
	restarts int
	active   string
	subState string
	result   string
}

func (c *container) agent() agentState {
	c.t.Helper()
	p := c.show(serviceUnit, "MainPID", "NRestarts", "ActiveState", "SubState", "Result")
	n, _ := strconv.Atoi(p["NRestarts"])
	return agentState{pid: p["MainPID"], restarts: n, active: p["ActiveState"], subState: p["SubState"], result: p["Result"]}
}

// waitRestarted waits until systemd restarted the agent on its own: a new
// main process, one more restart counted, and the service running again.
func (c *container) waitRestarted(before agentState) agentState {
	c.t.Helper()
	var now agentState
	c.waitUntil("systemd restarts the agent", restartLimit, func() (bool, string) {
		now = c.agent()
		return now.restarts == before.restarts+1 && now.pid != before.pid && now.pid != "0" &&
			now.active == "active" && now.subState == "running", now.String()
	})
	return now
}

func (s agentState) String() string {
	return "MainPID=" + s.pid + " NRestarts=" + strconv.Itoa(s.restarts) + " " + s.active + "/" + s.subState + " Result=" + s.result
}

// waitHealthy waits until /health answers 200 (connecting starts the agent
// when only the socket is active).
func (c *container) waitHealthy() string {
	c.t.Helper()
	var body string
	c.waitUntil("/health answers 200", restartLimit, func() (bool, string) {
		code, b, err := health()
		body = b
		if err != nil {
			return false, err.Error()
		}
		return code == 200, strconv.Itoa(code) + " " + b
	})
	return body
}

// portClosed reports whether nothing listens on the agent's port.
func portClosed() bool {
	conn, err := net.DialTimeout("tcp", "127.0.0.1:8090", time.Second)
	if err != nil {
		return true
	}
	conn.Close()
	return false
}
