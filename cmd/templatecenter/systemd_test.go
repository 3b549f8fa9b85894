package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// notifySocket collects the sd_notify(3) datagrams a child sends.
type notifySocket struct {
	path    string
	mu      sync.Mutex
	msgs    []string
	changed chan struct{}
}

// listenNotify opens a unixgram socket to pass as NOTIFY_SOCKET.
func listenNotify(t testing.TB) *notifySocket {
	t.Helper()
	dir := t.TempDir()
	if len(dir) > 80 { // sun_path holds 108 bytes
		var err error
		if dir, err = os.MkdirTemp("", "sdn"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	n := &notifySocket{path: filepath.Join(dir, "notify.sock"), changed: make(chan struct{})}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: n.path, Net: "unixgram"})
	if err != nil {
		t.Fatalf("listen on %s: %v", n.path, err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 64<<10)
		for {
			k, _, err := conn.ReadFromUnix(buf)
			if err != nil {
				return
			}
			n.mu.Lock()
			n.msgs = append(n.msgs, string(buf[:k]))
			close(n.changed)
			n.changed = make(chan struct{})
			n.mu.Unlock()
		}
	}()
	return n
}

// wait calls done with the datagrams so far each time one arrives, until
// it returns true; failed describes them when waitLimit passes first.
func (n *notifySocket) wait(t testing.TB, done func(msgs []string) bool, failed func(msgs []string) string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	for {
		n.mu.Lock()
		msgs, ch := n.msgs, n.changed
		n.mu.Unlock()
		if done(msgs) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal(failed(msgs))
		case <-ch:
		}
	}
}

// waitFrom waits for the first datagram at index from or later that
// satisfies match, and returns its index and text.
func (n *notifySocket) waitFrom(t testing.TB, from int, what string, match func(string) bool) (int, string) {
	t.Helper()
	found := -1
	var msg string
	n.wait(t, func(msgs []string) bool {
		for i := from; i < len(msgs); i++ {
			if match(msgs[i]) {
				found, msg = i, msgs[i]
				return true
			}
		}
		return false
	}, func(msgs []string) string {
		return fmt.Sprintf("no %s notification within %s; got %q", what, waitLimit, msgs)
	})
	return found, msg
}

// count waits until at least k datagrams satisfy match.
func (n *notifySocket) count(t testing.TB, k int, what string, match func(string) bool) {
	t.Helper()
	matching := func(msgs []string) int {
		got := 0
		for _, m := range msgs {
			if match(m) {
				got++
			}
		}
		return got
	}
	n.wait(t, func(msgs []string) bool { return matching(msgs) >= k }, func(msgs []string) string {
		return fmt.Sprintf("%d %s notifications within %s, want %d; got %q", matching(msgs), what, waitLimit, k, msgs)
	})
}

// hasLine matches a datagram holding the line want.
func hasLine(want string) func(string) bool {
	return func(msg string) bool {
		for _, l := range strings.Split(msg, "\n") {
			if l == want {
				return true
			}
		}
		return false
	}
}

// field returns the value of NAME= in a datagram.
func field(msg, name string) (string, bool) {
	for _, l := range strings.Split(msg, "\n") {
		if v, ok := strings.CutPrefix(l, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// monotonicUsec reads CLOCK_MONOTONIC in microseconds, as systemd does.
func monotonicUsec(t testing.TB) uint64 {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Nano() / 1000)
}

var statusLine = regexp.MustCompile(`^STATUS=\d+ queued, \d+ running\b`)

// TestSystemdNotify checks the sd_notify protocol of a Type=notify-reload
// service with a watchdog: readiness, pings, status, reload by SIGHUP and by
// a config file change, and stop.
func TestSystemdNotify(t *testing.T) {
	t.Parallel()
	cm := startCubeMaster(t, testToken)
	n := listenNotify(t)
	h := newHarness(t, cm.URL(), testToken)
	// No WATCHDOG_PID: the watchdog is meant for this process.
	p := h.startAgent("agent", "NOTIFY_SOCKET="+n.path, "WATCHDOG_USEC=400000")

	ready, _ := n.waitFrom(t, 0, "READY=1", hasLine("READY=1"))
	n.count(t, 2, "WATCHDOG=1", hasLine("WATCHDOG=1"))
	_, status := n.waitFrom(t, 0, "STATUS=", func(m string) bool { return strings.HasPrefix(m, "STATUS=") })
	if !statusLine.MatchString(status) {
		t.Errorf("status notification %q does not give queued and running counts", status)
	}

	before := monotonicUsec(t)
	p.signal(t, syscall.SIGHUP)
	reload, msg := n.waitFrom(t, ready+1, "RELOADING=1 after SIGHUP", hasLine("RELOADING=1"))
	after := monotonicUsec(t)
	v, ok := field(msg, "MONOTONIC_USEC")
	if !ok {
		t.Errorf("RELOADING=1 notification %q carries no MONOTONIC_USEC", msg)
	} else if usec, err := strconv.ParseUint(v, 10, 64); err != nil || usec < before || usec > after {
		t.Errorf("MONOTONIC_USEC=%s is not CLOCK_MONOTONIC between %d and %d (the SIGHUP and its notification)", v, before, after)
	}
	reloaded, _ := n.waitFrom(t, reload+1, "READY=1 after the SIGHUP reload", hasLine("READY=1"))

	// An editor's write-temp-and-rename of the file reloads too, and the
	// new value is applied.
	h.set("log.level", "debug")
	h.writeConfig()
	reload, _ = n.waitFrom(t, reloaded+1, "RELOADING=1 after the config file changed", hasLine("RELOADING=1"))
	n.waitFrom(t, reload+1, "READY=1 after the file reload", hasLine("READY=1"))
	p.waitLine(t, "configuration file changed, reloading")
	p.waitLine(t, "configuration reloaded", "log_level=debug")

	p.signal(t, syscall.SIGTERM)
	n.waitFrom(t, reload+1, "STOPPING=1", hasLine("STOPPING=1"))
	if code := p.waitExit(t, shutdownTimeout+exitSlack); code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0", code)
	}
}

// TestWatchdogPIDElsewhere: WATCHDOG_PID naming another process means the
// watchdog is not this process's, so it must not ping.
func TestWatchdogPIDElsewhere(t *testing.T) {
	t.Parallel()
	cm := startCubeMaster(t, testToken)
	n := listenNotify(t)
	h := newHarness(t, cm.URL(), testToken)
	p := h.startAgent("agent", "NOTIFY_SOCKET="+n.path, "WATCHDOG_USEC=200000", fmt.Sprintf("WATCHDOG_PID=%d", os.Getpid()))
	ready, _ := n.waitFrom(t, 0, "READY=1", hasLine("READY=1"))
	// Make the agent do observable work spanning several would-be ping
	// periods (100ms each): a job submitted and a reload.
	submit(t, h.baseURL(), testToken, "wdpid-1", unreachableImage)
	waitTerminal(t, cm, "wdpid-1")
	p.signal(t, syscall.SIGHUP)
	reload, _ := n.waitFrom(t, ready+1, "RELOADING=1", hasLine("RELOADING=1"))
	n.waitFrom(t, reload+1, "READY=1", hasLine("READY=1"))
	p.stop(t)
	n.mu.Lock()
	msgs := n.msgs
	n.mu.Unlock()
	for _, m := range msgs {
		if hasLine("WATCHDOG=1")(m) {
			t.Fatalf("agent pinged a watchdog that WATCHDOG_PID gives to another process: %q", msgs)
		}
	}
	if !slices.ContainsFunc(msgs, hasLine("STOPPING=1")) {
		t.Errorf("no STOPPING=1 among %q", msgs)
	}
}
