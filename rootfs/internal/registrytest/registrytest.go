package registrytest

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
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
)

// Binary is where Debian's docker-registry package installs the server.
const Binary = "/usr/bin/docker-registry"

// installHint tells CI how to get the tools this package runs.
const installHint = "apt-get install -y docker-registry apache2-utils"

// startAttempts bounds retries when the chosen port was taken in between.
const startAttempts = 3

// readyTimeout bounds the wait for /v2/ to answer.
const readyTimeout = 30 * time.Second

// Options configure a registry.
type Options struct {
	// Username and Password, when Username is set, make the registry
	// require HTTP basic auth (an htpasswd file with a bcrypt hash, made by
	// the htpasswd tool of apache2-utils).
	Username string
	Password string
}

// Registry is a running docker-registry.
type Registry struct {
	// Host is "127.0.0.1:<port>", the registry part of references pushed
	// with remote.Write (loopback registries are spoken to over plain HTTP).
	Host string
	// Dir holds the config file, the htpasswd file and the storage.
	Dir string

	opts Options
}

// Ref returns Host + "/" + repoAndTag.
func (r *Registry) Ref(repoAndTag string) string { return r.Host + "/" + repoAndTag }

// Auth returns the authenticator pushes and pulls need (anonymous when the
// registry has no auth).
func (r *Registry) Auth() authn.Authenticator {
	if r.opts.Username == "" {
		return authn.Anonymous
	}
	return &authn.Basic{Username: r.opts.Username, Password: r.opts.Password}
}

// Start runs docker-registry until the test ends. A missing binary fails the
// test with the apt-get command to run: it is never skipped silently.
func Start(t testing.TB, opts Options) *Registry {
	t.Helper()
	if _, err := os.Stat(Binary); err != nil {
		t.Fatalf("registrytest: %s not found (%v); install it with: %s", Binary, err, installHint)
	}
	r := &Registry{Dir: t.TempDir(), opts: opts}
	htpasswdFile := ""
	if opts.Username != "" {
		htpasswdFile = filepath.Join(r.Dir, "htpasswd")
		writeHtpasswd(t, htpasswdFile, opts.Username, opts.Password)
	}
	storage := filepath.Join(r.Dir, "storage")
	if err := os.MkdirAll(storage, 0o755); err != nil {
		t.Fatalf("registrytest: create storage: %v", err)
	}

	var lastErr error
	for range startAttempts {
		host, err := freeLoopbackAddr()
		if err != nil {
			t.Fatalf("registrytest: pick a port: %v", err)
		}
		cfg := filepath.Join(r.Dir, "config.yml")
		if err := os.WriteFile(cfg, []byte(config(host, storage, htpasswdFile)), 0o600); err != nil {
			t.Fatalf("registrytest: write config: %v", err)
		}
		if lastErr = run(t, cfg, host); lastErr == nil {
			r.Host = host
			return r
		}
	}
	t.Fatalf("registrytest: start docker-registry: %v", lastErr)
	return nil
}

// run starts the server and waits for /v2/; on success the server is
// stopped at cleanup.
func run(t testing.TB, cfg, host string) error {
	t.Helper()
	out := &lockedBuffer{}
	cmd := exec.Command(Binary, "serve", cfg)
	// A clean environment: REGISTRY_* variables of the host would override
	// the config file.
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + filepath.Dir(cfg)}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run %s: %w", Binary, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	}
	if err := waitReady(host, exited); err != nil {
		stop()
		return fmt.Errorf("%w; output:\n%s", err, out.String())
	}
	t.Cleanup(stop)
	return nil
}

// waitReady polls GET /v2/ until the server answers 200 or 401.
func waitReady(host string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+host+"/v2/", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized {
				return nil
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("docker-registry exited before serving %s", host)
		case <-ctx.Done():
			return fmt.Errorf("docker-registry did not answer on %s within %s", host, readyTimeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func config(host, storage, htpasswdFile string) string {
	secret := make([]byte, 16)
	rand.Read(secret)
	var b strings.Builder
	fmt.Fprintf(&b, `version: 0.1
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
	if htpasswdFile != "" {
		fmt.Fprintf(&b, `auth:
  htpasswd:
    realm: registrytest
    path: %s
`, htpasswdFile)
	}
	return b.String()
}

// writeHtpasswd writes a bcrypt htpasswd line with apache2-utils' htpasswd
// (golang.org/x/crypto is not a dependency of this module).
func writeHtpasswd(t testing.TB, file, user, pass string) {
	t.Helper()
	bin, err := exec.LookPath("htpasswd")
	if err != nil {
		t.Fatalf("registrytest: htpasswd not found (%v); install it with: %s", err, installHint)
	}
	cmd := exec.Command(bin, "-niB", user)
	cmd.Stdin = strings.NewReader(pass + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	line, err := cmd.Output()
	if err != nil {
		t.Fatalf("registrytest: htpasswd: %v: %s", err, stderr.String())
	}
	if err := os.WriteFile(file, line, 0o600); err != nil {
		t.Fatalf("registrytest: write htpasswd: %v", err)
	}
}

// lockedBuffer collects the server's output from exec's copy goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 64<<10 {
		return len(p), nil
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
