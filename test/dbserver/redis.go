package dbserver

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/cubesandbox/cubetemplatecenter/test/childproc"
)

// Redis is a running (or stopped) redis-server, CubeMaster's Redis: password
// required, no persistence, so Stop and Start lose its keys.
type Redis struct {
	// Addr is "127.0.0.1:PORT", fixed for the server's life.
	Addr string
	// Password is required of every client (requirepass; the default user).
	Password string
	// Dir is the server's working directory; Close removes it.
	Dir string

	binary string
	args   []string
	// tls, when set, is the client side of WithTLS: the server listens
	// on a TLS port only.
	tls *tls.Config
	running
}

// NewRedis starts redis-server on a free loopback port with a password, no
// RDB or AOF files and its working directory in a new temporary directory.
// Close stops it and removes the directory.
func NewRedis(ctx context.Context, opts ...Option) (*Redis, error) {
	o := makeOptions(opts)
	bin, err := findBinary([]string{"redis-server"}, []string{"/usr/bin"})
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tc-redis-")
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	r := &Redis{Password: randomHex(12), Dir: dir, binary: bin, running: running{stopSig: syscall.SIGTERM, dir: dir}}
	// The password goes in as an argument: visible in ps, harmless for a
	// throwaway password on a test machine.
	r.args = []string{"--bind", "127.0.0.1", "--requirepass", r.Password, "--save", "",
		"--appendonly", "no", "--dir", dir, "--daemonize", "no", "--logfile", ""}
	if t := o.tls; t != nil {
		if r.tls, err = t.clientConfig(); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		r.args = append(r.args, "--tls-cert-file", t.certFile, "--tls-key-file", t.keyFile,
			"--tls-ca-cert-file", t.caFile, "--tls-auth-clients", "no")
	}
	for _, v := range o.vars {
		r.args = append(r.args, "--"+v[0], v[1])
	}
	for range startAttempts { // the port may be taken between picking and binding
		if r.Addr, err = childproc.FreeLoopbackAddr(); err != nil {
			break
		}
		if err = r.Start(ctx); err == nil {
			return r, nil
		}
	}
	os.RemoveAll(dir)
	return nil, err
}

// StartRedis is NewRedis for one test: it fails the test when the server
// cannot start and closes it at the test's cleanup.
func StartRedis(tb testing.TB, opts ...Option) *Redis {
	tb.Helper()
	return startForTest(tb, "redis", NewRedis, opts)
}

// Client returns a go-redis client with the password (and TLS trusting the
// CA, under WithTLS), for checks that go around the code under test; the
// caller closes it.
func (r *Redis) Client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: r.Addr, Password: r.Password, MaxRetries: -1, TLSConfig: r.tls})
}

// Start runs the server on its address and waits until it answers an
// authenticated PING; it does nothing when the server runs already.
func (r *Redis) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.p != nil {
		return nil
	}
	_, port, err := net.SplitHostPort(r.Addr)
	if err != nil {
		return fmt.Errorf("start redis: %w", err)
	}
	ports := []string{"--port", port}
	if r.tls != nil {
		ports = []string{"--port", "0", "--tls-port", port}
	}
	cmd := exec.Command(r.binary, append(ports, r.args...)...)
	cmd.Dir, cmd.Env = r.Dir, cleanEnv(r.Dir)
	client := r.Client()
	defer client.Close()
	return r.launchLocked(ctx, "redis", r.Addr, cmd, func(ctx context.Context) error { return client.Ping(ctx).Err() })
}
