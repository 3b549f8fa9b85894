// Package registry runs Debian's docker-registry server (distribution 2.8)
// on a loopback port with filesystem storage and optional htpasswd auth: a
// real registry for end-to-end tests and benchmarks.
package registry

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/cubesandbox/cubetemplatecenter/test/childproc"
)

// Binary is where Debian's docker-registry package installs the server.
const Binary = "/usr/bin/docker-registry"

// InstallHint tells how to get the tools this package runs.
const InstallHint = "apt-get install -y docker-registry apache2-utils"

// startAttempts bounds retries when the chosen port was taken in between.
const startAttempts = 3

// readyTimeout bounds the wait for /v2/ to answer.
const readyTimeout = 30 * time.Second

// Options configure a registry.
type Options struct {
	// Dir holds the config file, the htpasswd file and the storage; it
	// must exist.
	Dir string
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

	opts   Options
	cmd    *exec.Cmd
	exited chan struct{}
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

// Start runs docker-registry until Stop. A missing binary is an error
// naming the packages to install.
func Start(ctx context.Context, opts Options) (*Registry, error) {
	if _, err := os.Stat(Binary); err != nil {
		return nil, fmt.Errorf("%s not found (%w); install it with: %s", Binary, err, InstallHint)
	}
	r := &Registry{Dir: opts.Dir, opts: opts}
	htpasswdFile := ""
	if opts.Username != "" {
		htpasswdFile = filepath.Join(r.Dir, "htpasswd")
		if err := writeHtpasswd(ctx, htpasswdFile, opts.Username, opts.Password); err != nil {
			return nil, err
		}
	}
	storage := filepath.Join(r.Dir, "storage")
	if err := os.MkdirAll(storage, 0o755); err != nil {
		return nil, fmt.Errorf("create registry storage: %w", err)
	}
	var lastErr error
	for range startAttempts { // the port may be taken between picking and binding
		host, err := childproc.FreeLoopbackAddr()
		if err != nil {
			return nil, fmt.Errorf("pick a registry port: %w", err)
		}
		cfg := filepath.Join(r.Dir, "config.yml")
		if err := os.WriteFile(cfg, []byte(config(host, storage, htpasswdFile)), 0o600); err != nil {
			return nil, fmt.Errorf("write registry config: %w", err)
		}
		if lastErr = r.run(ctx, cfg, host); lastErr == nil {
			r.Host = host
			return r, nil
		}
	}
	return nil, fmt.Errorf("start docker-registry: %w", lastErr)
}

// StartForTest runs docker-registry until the test ends, in opts.Dir or,
// when that is empty, a fresh t.TempDir(). A missing binary fails the test
// with the apt-get command to run: it is never skipped silently.
func StartForTest(tb testing.TB, opts Options) *Registry {
	tb.Helper()
	if opts.Dir == "" {
		opts.Dir = tb.TempDir()
	}
	r, err := Start(context.Background(), opts)
	if err != nil {
		tb.Fatalf("registry: %v", err)
	}
	tb.Cleanup(r.Stop)
	return r
}

// run starts the server and waits for /v2/.
func (r *Registry) run(ctx context.Context, cfg, host string) error {
	out := &childproc.Output{}
	cmd := exec.Command(Binary, "serve", cfg)
	// A clean environment: REGISTRY_* variables of the host would override
	// the config file.
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + filepath.Dir(cfg)}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run %s: %w", Binary, err)
	}
	r.cmd, r.exited = cmd, make(chan struct{})
	go func() {
		cmd.Wait()
		close(r.exited)
	}()
	if err := childproc.WaitHTTP(ctx, "http://"+host+"/v2/", r.exited, readyTimeout); err != nil {
		r.Stop()
		return fmt.Errorf("%w; output:\n%s", err, out.String())
	}
	return nil
}

// Stop ends the server (SIGTERM, then SIGKILL after 5 s).
func (r *Registry) Stop() {
	if r.cmd == nil {
		return
	}
	childproc.Terminate(r.cmd.Process, r.exited, 5*time.Second)
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
    realm: registry
    path: %s
`, htpasswdFile)
	}
	return b.String()
}

// writeHtpasswd writes a bcrypt htpasswd line with apache2-utils' htpasswd
// (golang.org/x/crypto is not a dependency of this module).
func writeHtpasswd(ctx context.Context, file, user, pass string) error {
	bin, err := exec.LookPath("htpasswd")
	if err != nil {
		return fmt.Errorf("htpasswd not found (%w); install it with: %s", err, InstallHint)
	}
	cmd := exec.CommandContext(ctx, bin, "-niB", user)
	cmd.Stdin = strings.NewReader(pass + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	line, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("htpasswd: %w: %s", err, stderr.String())
	}
	if err := os.WriteFile(file, line, 0o600); err != nil {
		return fmt.Errorf("write htpasswd: %w", err)
	}
	return nil
}
