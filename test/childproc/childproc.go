// Package childproc holds what tests and benchmarks need to run a server as
// a child process: a free loopback address to give it, a buffer for its
// output, a wait until it answers HTTP, a graceful stop, and a start that
// stops it when the test ends.
package childproc

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// FreeLoopbackAddr returns "127.0.0.1:PORT" for a port free right now.
func FreeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("pick a port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// FreePort returns a loopback TCP port nothing listens on right now, for a
// test.
func FreePort(tb testing.TB) int {
	tb.Helper()
	addr, err := FreeLoopbackAddr()
	if err != nil {
		tb.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(addr)
	n, err := strconv.Atoi(port)
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// WaitHTTP polls url until it answers 200 (or 401), exited closes (the
// process behind it ended), or timeout passes; the error says what url
// last answered.
func WaitHTTP(ctx context.Context, url string, exited <-chan struct{}, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	last := "no answer"
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		switch {
		case err == nil:
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(body))
		case ctx.Err() == nil:
			last = err.Error()
		}
		select {
		case <-exited:
			return fmt.Errorf("exited before answering %s (last: %s)", url, last)
		case <-ctx.Done():
			return fmt.Errorf("no answer from %s within %s (last: %s): %w", url, timeout, last, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Output collects a child's output from exec's copy goroutines, keeping at
// most 64 KiB.
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write keeps p while there is room and always reports it written.
func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.b.Len() < 64<<10 {
		o.b.Write(p)
	}
	return len(p), nil
}

// String returns what was kept.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// Terminate asks p to stop with SIGTERM and waits until exited closes (the
// caller's cmd.Wait returned), killing p once grace has passed.
func Terminate(p *os.Process, exited <-chan struct{}, grace time.Duration) {
	p.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		p.Kill()
		<-exited
	}
}

// Start starts cmd, its environment and output already set, and stops it
// when tb's test ends as Terminate does (grace 0 kills it at once), then
// logs output, what it wrote, if the test failed. The channel closes once
// the process has exited and cmd.ProcessState is set.
func Start(tb testing.TB, name string, cmd *exec.Cmd, output fmt.Stringer, grace time.Duration) <-chan struct{} {
	tb.Helper()
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	tb.Cleanup(func() {
		if grace > 0 {
			Terminate(cmd.Process, exited, grace)
		} else {
			cmd.Process.Kill()
			<-exited
		}
		if tb.Failed() {
			tb.Logf("---- output of %s (pid %d) ----\n%s---- end of %s ----", name, cmd.Process.Pid, output, name)
		}
	})
	return exited
}
