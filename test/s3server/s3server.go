// Package s3server runs versitygw, a real S3 server, on a loopback port with
// a posix directory behind it: the S3 endpoint the blob store tests talk to.
// One server serves a whole test package (see Shared); Stop and Start on the
// same port and directory simulate an endpoint that goes away mid-upload.
package s3server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/cubesandbox/cubetemplatecenter/test/childproc"
)

// BinaryEnv names the environment variable that points at a versitygw binary.
const BinaryEnv = "TC_VERSITYGW"

// InstallHint tells how to get the binary.
const InstallHint = "run `make tools` in the repository root (it installs .tools/bin/versitygw), or set " + BinaryEnv

// toolsPath is where `make tools` installs versitygw, relative to the module root.
const toolsPath = ".tools/bin/versitygw"

// readyTimeout bounds the wait for the server to answer S3 requests.
const readyTimeout = 30 * time.Second

// startAttempts bounds retries when the chosen port was taken in between.
const startAttempts = 3

// Server is a running (or stopped) versitygw.
type Server struct {
	// Endpoint is "127.0.0.1:PORT", fixed for the server's life.
	Endpoint string
	// AccessKey and SecretKey are the root credentials.
	AccessKey, SecretKey string
	// Bucket exists once Start returns.
	Bucket string
	// Dir is the posix directory holding the buckets.
	Dir string

	binary string
	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	out    *childproc.Output
}

// Binary finds versitygw: $TC_VERSITYGW, then .tools/bin/versitygw under the
// module root, then PATH.
func Binary() (string, error) {
	if p := os.Getenv(BinaryEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w; %s", BinaryEnv, p, err, InstallHint)
		}
		return p, nil
	}
	if root, err := moduleRoot(); err == nil {
		p := filepath.Join(root, toolsPath)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("versitygw not found (%s, %s, PATH); %s", BinaryEnv, toolsPath, InstallHint)
}

// moduleRoot walks up from the working directory to the directory holding go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// New starts versitygw over dir (which must exist) with random root
// credentials on a free loopback port and creates a bucket.
func New(ctx context.Context, dir string) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	s := &Server{AccessKey: "tc" + randomHex(8), SecretKey: randomHex(20), Bucket: "tc-artifacts",
		Dir: dir, binary: bin}
	var lastErr error
	for range startAttempts { // the port may be taken between picking and binding
		if s.Endpoint, err = childproc.FreeLoopbackAddr(); err != nil {
			return nil, err
		}
		if lastErr = s.Start(ctx); lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		return nil, lastErr
	}
	if err := s.Client().MakeBucket(ctx, s.Bucket, minio.MakeBucketOptions{}); err != nil {
		s.Stop()
		return nil, fmt.Errorf("create bucket %s: %w", s.Bucket, err)
	}
	return s, nil
}

// Start runs the server on its endpoint and directory and waits until it
// answers; it does nothing when the server runs already.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	s.out = &childproc.Output{}
	cmd := exec.Command(s.binary, "--access", s.AccessKey, "--secret", s.SecretKey,
		"--port", s.Endpoint, "--quiet", "posix", s.Dir)
	// A clean environment: ROOT_* and VGW_* variables would change flags.
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + s.Dir}
	cmd.Stdout, cmd.Stderr = s.out, s.out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run %s: %w", s.binary, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited
	if err := s.waitReady(ctx, exited); err != nil {
		s.stopLocked()
		return fmt.Errorf("start versitygw on %s: %w; output:\n%s", s.Endpoint, err, s.out.String())
	}
	return nil
}

// waitReady polls an authenticated request until the server answers it.
func (s *Server) waitReady(ctx context.Context, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	client := s.Client()
	for {
		reqCtx, reqCancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := client.ListBuckets(reqCtx)
		reqCancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("exited before answering")
		case <-ctx.Done():
			return fmt.Errorf("no answer within %s: %w (last error: %v)", readyTimeout, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop ends the server (SIGTERM, then SIGKILL after 5 s); Start brings it
// back on the same port and directory.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
}

func (s *Server) stopLocked() {
	if s.cmd == nil {
		return
	}
	childproc.Terminate(s.cmd.Process, s.exited, 5*time.Second)
	s.cmd = nil
}

// Output returns what the server printed since its last Start.
func (s *Server) Output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.out == nil {
		return ""
	}
	return s.out.String()
}

// URL is the endpoint as an http URL.
func (s *Server) URL() string { return "http://" + s.Endpoint }

// Client returns a minio client with the root credentials, for checks that
// go around the code under test.
func (s *Server) Client() *minio.Client {
	c, err := minio.New(s.Endpoint, &minio.Options{
		Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""), Region: "us-east-1",
		BucketLookup: minio.BucketLookupPath, MaxRetries: 1,
	})
	if err != nil { // only for a malformed endpoint, which New never makes
		panic(fmt.Sprintf("s3server: minio client for %s: %v", s.Endpoint, err))
	}
	return c
}

// Shared starts one server for a whole test package on first use. Declare it
// as a package variable of the test package and call Close from TestMain.
type Shared struct {
	once sync.Once
	srv  *Server
	dir  string
	err  error
}

// Get returns the package's server, starting it on the first call; it fails
// the test (never skips it) when versitygw is missing or does not start.
func (sh *Shared) Get(tb testing.TB) *Server {
	tb.Helper()
	sh.once.Do(func() {
		sh.dir, sh.err = os.MkdirTemp("", "tc-s3server-")
		if sh.err != nil {
			return
		}
		sh.srv, sh.err = New(context.Background(), sh.dir)
	})
	if sh.err != nil {
		tb.Fatalf("s3 test server: %v", sh.err)
	}
	return sh.srv
}

// Close stops the server, if one was started, and removes its directory.
func (sh *Shared) Close() {
	if sh.srv != nil {
		sh.srv.Stop()
	}
	if sh.dir != "" {
		os.RemoveAll(sh.dir)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
