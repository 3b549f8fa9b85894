package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// registryReady bounds the wait for docker-registry to answer.
const registryReady = 30 * time.Second

// registry is a running docker-registry (distribution 2.8, Debian's
// package) with filesystem storage, on a loopback port, plain HTTP.
type registry struct {
	// Host is "127.0.0.1:PORT".
	Host string

	dir    string
	cmd    *exec.Cmd
	exited chan struct{}
}

// startRegistry runs docker-registry with its storage under dir.
func startRegistry(ctx context.Context, dir string) (*registry, error) {
	bin, err := lookTool("docker-registry")
	if err != nil {
		return nil, fmt.Errorf("start registry: %w", err)
	}
	storage := filepath.Join(dir, "storage")
	if err := os.MkdirAll(storage, 0o755); err != nil {
		return nil, fmt.Errorf("start registry: %w", err)
	}
	var lastErr error
	for range 3 { // the port may be taken between picking and binding
		host, err := freeLoopbackAddr()
		if err != nil {
			return nil, fmt.Errorf("start registry: %w", err)
		}
		cfg := filepath.Join(dir, "config.yml")
		if err := os.WriteFile(cfg, []byte(registryConfig(host, storage)), 0o600); err != nil {
			return nil, fmt.Errorf("start registry: %w", err)
		}
		r, err := runRegistry(ctx, bin, cfg, host)
		if err == nil {
			r.dir = dir
			return r, nil
		}
		lastErr = err
	}
	return nil, fmt.Errorf("start registry: %w", lastErr)
}

func runRegistry(ctx context.Context, bin, cfg, host string) (*registry, error) {
	out := &lockedBuffer{}
	cmd := exec.Command(bin, "serve", cfg)
	// REGISTRY_* variables of the host would override the config file.
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + filepath.Dir(cfg)}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("run %s: %w", bin, err)
	}
	r := &registry{Host: host, cmd: cmd, exited: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(r.exited)
	}()
	if err := waitHTTP(ctx, "http://"+host+"/v2/", r.exited, registryReady); err != nil {
		r.Stop()
		return nil, fmt.Errorf("docker-registry: %w; output:\n%s", err, out.String())
	}
	return r, nil
}

// Stop ends the registry.
func (r *registry) Stop() {
	r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.exited:
	case <-time.After(5 * time.Second):
		r.cmd.Process.Kill()
		<-r.exited
	}
}

// Remove stops the registry and deletes its storage.
func (r *registry) Remove() error {
	r.Stop()
	if r.dir == "" {
		return nil
	}
	return os.RemoveAll(r.dir)
}

// waitHTTP polls url until it answers 200 (or 401), the process behind it
// exits, or timeout passes.
func waitHTTP(ctx context.Context, url string, exited <-chan struct{}, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized {
				return nil
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("exited before answering %s", url)
		case <-ctx.Done():
			return fmt.Errorf("no answer from %s: %w", url, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("pick a port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func registryConfig(host, storage string) string {
	secret := make([]byte, 16)
	rand.Read(secret)
	return fmt.Sprintf(`version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
  secret: %s
`, storage, host, hex.EncodeToString(secret))
}

// lockedBuffer collects a child's output from exec's copy goroutines,
// keeping at most 64 KiB.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() < 64<<10 {
		l.b.Write(p)
	}
	return len(p), nil
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
