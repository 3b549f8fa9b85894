package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/minio/minio-go/v7"

	"github.com/cubesandbox/cubetemplatecenter/test/cubemaster"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
	"github.com/cubesandbox/cubetemplatecenter/test/s3server"
)

// s3Env is the environment that points the agent at srv through endpoint
// (srv's own, or a proxy in front of it), with upstream's variable names.
func s3Env(srv *s3server.Server, endpoint, prefix string) map[string]string {
	return map[string]string{
		"CUBE_S3_ENDPOINT": "http://" + endpoint, "CUBE_S3_BUCKET": srv.Bucket,
		"CUBE_S3_ACCESS_KEY_ID": srv.AccessKey, "CUBE_S3_SECRET_ACCESS_KEY": srv.SecretKey,
		"CUBE_S3_REGION": "us-east-1", "CUBE_S3_USE_PATH_STYLE": "true", "CUBE_S3_ARTIFACT_PREFIX": prefix,
	}
}

// incompleteUploads lists key's unfinished multipart uploads.
func incompleteUploads(t *testing.T, srv *s3server.Server, key string) int {
	t.Helper()
	res, err := (&minio.Core{Client: srv.Client()}).ListMultipartUploads(context.Background(), srv.Bucket, key, "", "", "", 1000)
	if err != nil {
		t.Fatalf("list multipart uploads: %v", err)
	}
	n := 0
	for _, u := range res.Uploads {
		if u.Key == key {
			n++
		}
	}
	return n
}

// submitPlain submits a build of image without the egress CA.
func submitPlain(t *testing.T, base, jobID, image string) {
	t.Helper()
	body, err := json.Marshal(cubemaster.BuildRequest(jobID, image, map[string]any{"with_cube_ca": false}))
	if err != nil {
		t.Fatal(err)
	}
	if code, resp := call(t, "POST", base+"/tc/api/v1/build", testToken, body); code != 200 {
		t.Fatalf("submit %s = %d %v", jobID, code, resp)
	}
}

// randomImage is an image with one file of n random bytes, so its ext4
// image is about n bytes that no compression shrinks.
func randomImage(t *testing.T, n int) []byte {
	t.Helper()
	data := make([]byte, n)
	rand.Read(data)
	return images.TarOf(t, map[string]string{"data/blob": string(data)})
}

// stalledUpload is an agent installation S3-backed through a stalling
// proxy, with an image whose upload takes several parts.
type stalledUpload struct {
	srv   *s3server.Server
	cm    *cubemaster.Server
	reg   *images.Registry
	h     *harness
	proxy *stallingProxy
	ref   string
}

// newStalledUpload prepares the installation: artifacts go to srv under
// prefix through a proxy that stalls once 12 MiB went up, 5 MiB parts, and
// a 24 MiB incompressible image to build.
func newStalledUpload(t *testing.T, prefix string) stalledUpload {
	t.Helper()
	u := stalledUpload{srv: s3srv.Get(t), cm: startCubeMaster(t, testToken), reg: images.StartRegistry(t, nil)}
	u.ref = u.reg.Push(t, "s3/"+prefix+":v1", images.New(t, images.Config{}, images.Layer{Tar: randomImage(t, 24<<20)}))
	u.proxy = startStallingProxy(t, u.srv.Endpoint, 12<<20)
	u.h = newHarness(t, u.cm.URL(), testToken)
	u.h.set("registry.insecure", []string{u.reg.Host})
	u.h.set("artifact_store.part_size", "5MiB")
	for k, v := range s3Env(u.srv, u.proxy.addr, prefix) {
		u.h.env[k] = v
	}
	return u
}

// TestS3BackedBuildSurvivesKillMidUpload builds an image with the agent
// S3-backed through a proxy that stalls the upload halfway, kills the agent
// with SIGKILL there, and restarts it on the real endpoint: the job resumes
// with the upload only, ends with exactly one BUILT whose object matches
// the local image and downloads through artifact_url, and the bucket keeps
// no incomplete upload. Delete then removes object and directory.
func TestS3BackedBuildSurvivesKillMidUpload(t *testing.T) {
	t.Parallel()
	u := newStalledUpload(t, "blackbox")
	srv, cm, h, proxy, ref := u.srv, u.cm, u.h, u.proxy, u.ref
	first := h.startAgent("agent (killed mid-upload)")
	submitPlain(t, h.baseURL(), "s3-kill", ref)
	line := first.waitLine(t, "uploading artifact")
	proxy.waitStalled(t)
	first.kill(t)
	// The dead agent's connections drop, as they would to a real S3: no
	// byte it had written reaches the server after the restart.
	proxy.kill()
	_, rest, _ := strings.Cut(line, "object_key=")
	stalledKey, _, _ := strings.Cut(rest, " ")
	if n := incompleteUploads(t, srv, stalledKey); n == 0 {
		t.Fatalf("no multipart upload of %q was under way when the agent was killed", stalledKey)
	}
	if n := len(acceptedTerminals(cm, "s3-kill")); n != 0 {
		t.Fatalf("a terminal report was sent before the upload finished (%d)", n)
	}

	h.env["CUBE_S3_ENDPOINT"] = "http://" + srv.Endpoint
	second := h.startAgent("agent (restarted)")
	cb := waitTerminal(t, cm, "s3-kill")
	waitOutboxEmpty(t, h.baseURL())
	checkOneTerminal(t, cm, "s3-kill")
	key := cb.Field("object_key")
	if key != stalledKey {
		t.Errorf("BUILT names object %q, the killed upload was of %q", key, stalledKey)
	}
	if cb.Field("status") != "BUILT" || cb.Field("storage_backend") != "s3" || !strings.HasPrefix(key, "blackbox/rfs-") {
		t.Fatalf("terminal report = %v, want BUILT in S3", cb.Body)
	}
	if !strings.Contains(second.out.String(), "reusing published artifact") {
		t.Errorf("the restarted agent did not resume on the published artifact:\n%s", second.out.String())
	}
	if n := incompleteUploads(t, srv, key); n != 0 {
		t.Errorf("%d incomplete multipart uploads of %s are left in the bucket", n, key)
	}
	local, err := os.ReadFile(cb.Field("ext4_path"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(cb.Field("artifact_url"))
	if err != nil {
		t.Fatal(err)
	}
	remote, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(local, remote) {
		t.Errorf("artifact_url = %d, %d bytes; want 200 and the %d bytes of the local image", resp.StatusCode, len(remote), len(local))
	}

	id := cb.Field("artifact_id")
	if code, body := call(t, "POST", h.baseURL()+"/tc/api/v1/artifact/delete", testToken, []byte(`{"artifact_id":"`+id+`"}`)); code != 200 {
		t.Fatalf("delete = %d %v", code, body)
	}
	if _, err := srv.Client().StatObject(context.Background(), srv.Bucket, key, minio.StatObjectOptions{}); err == nil {
		t.Error("the object survived artifact/delete")
	}
	second.stop(t)
}

// TestFSBackedBuild builds with the fs backend: the object lands under the
// root, BUILT names it without a URL.
func TestFSBackedBuild(t *testing.T) {
	t.Parallel()
	cm := startCubeMaster(t, testToken)
	reg := images.StartRegistry(t, nil)
	ref := reg.Push(t, "fs/small:v1", images.New(t, images.Config{}, images.Layer{Tar: images.TarOf(t, map[string]string{"etc/hostname": "fs"})}))
	h := newHarness(t, cm.URL(), testToken)
	h.set("registry.insecure", []string{reg.Host})
	root := t.TempDir()
	h.env["CUBE_ARTIFACT_STORE_BACKEND"] = "fs"
	h.env["CUBE_ARTIFACT_STORE_FS_ROOT"] = root
	agent := h.startAgent("agent (fs blob store)")
	submitPlain(t, h.baseURL(), "fs-build", ref)
	cb := waitTerminal(t, cm, "fs-build")
	if cb.Field("status") != "BUILT" || cb.Field("storage_backend") != "fs" || cb.Field("artifact_url") != "" {
		t.Fatalf("terminal report = %v, want BUILT on fs without a URL", cb.Body)
	}
	obj, err := os.ReadFile(root + "/" + cb.Field("object_key"))
	local, _ := os.ReadFile(cb.Field("ext4_path"))
	if err != nil || !bytes.Equal(obj, local) {
		t.Errorf("fs object: %d bytes, %v; want the image", len(obj), err)
	}
	agent.stop(t)
}

// TestS3ProblemsInHealth: with a wrong secret, a missing bucket or an
// unreachable endpoint the agent still serves, /health names the blob
// store's problem, and the secret shows nowhere.
func TestS3ProblemsInHealth(t *testing.T) {
	t.Parallel()
	srv := s3srv.Get(t)
	const wrong = "wrong-secret-never-shown-0123456789"
	cases := []struct {
		name, key, value, want string
	}{
		{"WrongSecret", "CUBE_S3_SECRET_ACCESS_KEY", wrong, "access denied"},
		{"MissingBucket", "CUBE_S3_BUCKET", "no-such-bucket", "no-such-bucket"},
		{"Unreachable", "CUBE_S3_ENDPOINT", "http://127.0.0.1:1", "unreachable"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, "", testToken)
			for k, v := range s3Env(srv, srv.Endpoint, "") {
				h.env[k] = v
			}
			h.env[c.key] = c.value
			agent := h.startAgent("agent (" + c.name + ")")
			code, body := call(t, "GET", h.baseURL()+"/health", testToken, nil)
			checks, _ := body["checks"].(map[string]any)
			warnings, _ := body["warnings"].(map[string]any)
			warning, _ := warnings["blobstore"].(string)
			if code != 200 || checks["blobstore"] != false || !strings.Contains(warning, c.want) {
				t.Errorf("/health = %d %v, want 200 with the blob store check failing, saying %q", code, body, c.want)
			}
			raw, _ := json.Marshal(body)
			if strings.Contains(agent.out.String(), srv.SecretKey) || strings.Contains(string(raw), srv.SecretKey) ||
				strings.Contains(agent.out.String(), wrong) || strings.Contains(string(raw), wrong) {
				t.Errorf("a secret shows in the log or /health")
			}
			agent.stop(t)
		})
	}
}

// TestS3DownMidUploadFallsBack: S3 goes away in the middle of an upload
// (the proxy in front of it drops every connection and refuses new ones):
// the build still ends BUILT, with the local artifact only, as upstream.
// The fs backend, whose root can no longer be written, fails the job
// instead.
func TestS3DownMidUploadFallsBack(t *testing.T) {
	t.Parallel()
	u := newStalledUpload(t, "down")
	cm, h, proxy, ref, reg := u.cm, u.h, u.proxy, u.ref, u.reg
	h.set("artifact_store.attempts", 2)
	agent := h.startAgent("agent (S3 goes down)")
	submitPlain(t, h.baseURL(), "s3-down", ref)
	proxy.waitStalled(t)
	proxy.kill()
	cb := waitTerminal(t, cm, "s3-down")
	if cb.Field("status") != "BUILT" || cb.Field("storage_backend") != "" || cb.Field("object_key") != "" || cb.Field("artifact_url") != "" {
		t.Errorf("terminal report = %v, want BUILT with the local artifact only", cb.Body)
	}
	if _, err := os.Stat(cb.Field("ext4_path")); err != nil {
		t.Errorf("the local artifact of a fallback is missing: %v", err)
	}
	if v, err := scrapeMetric(h.baseURL(), "cube_templatecenter_blobstore_fallbacks_total"); err != nil || v != 1 {
		t.Errorf("fallbacks metric = %v, %v; want 1", v, err)
	}
	agent.stop(t)

	fsh := newHarness(t, cm.URL(), testToken)
	fsh.set("registry.insecure", []string{reg.Host})
	root := filepath.Join(t.TempDir(), "blobs")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	fsh.env["CUBE_ARTIFACT_STORE_BACKEND"] = "fs"
	fsh.env["CUBE_ARTIFACT_STORE_FS_ROOT"] = root
	fsAgent := fsh.startAgent("agent (broken fs blob store)")
	// The root breaks while the agent runs: it becomes a file.
	if err := os.Remove(root); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(root, []byte("not a directory"), 0o644); err != nil {
		t.Fatal(err)
	}
	submitPlain(t, fsh.baseURL(), "fs-broken", ref)
	cb = waitTerminal(t, cm, "fs-broken")
	if cb.Field("status") != "FAILED" || cb.Field("phase") != "BUILDING_EXT4" {
		t.Errorf("terminal report = %v, want FAILED in BUILDING_EXT4", cb.Body)
	}
	fsAgent.stop(t)
}

// stallingProxy forwards TCP to an upstream, and once more than after
// bytes went upstream it stops forwarding until released.
type stallingProxy struct {
	addr    string
	ln      net.Listener
	mu      sync.Mutex
	conns   []net.Conn
	sent    int64
	after   int64
	stalled chan struct{}
	once    sync.Once
	go_     chan struct{}
}

// kill drops every connection and refuses new ones: the upstream is gone.
func (p *stallingProxy) kill() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.release()
}

func startStallingProxy(t *testing.T, upstream string, after int64) *stallingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallingProxy{addr: ln.Addr().String(), ln: ln, after: after, stalled: make(chan struct{}), go_: make(chan struct{})}
	t.Cleanup(func() { ln.Close(); p.release() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c, upstream)
		}
	}()
	return p
}

func (p *stallingProxy) serve(c net.Conn, upstream string) {
	defer c.Close()
	u, err := net.Dial("tcp", upstream)
	if err != nil {
		return
	}
	defer u.Close()
	p.mu.Lock()
	p.conns = append(p.conns, c, u)
	p.mu.Unlock()
	go io.Copy(c, u)
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			p.mu.Lock()
			p.sent += int64(n)
			over := p.sent > p.after
			p.mu.Unlock()
			if over {
				p.once.Do(func() { close(p.stalled) })
				<-p.go_
			}
			if _, werr := u.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *stallingProxy) waitStalled(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	select {
	case <-p.stalled:
	case <-ctx.Done():
		t.Fatal("the upload never reached the proxy's stall point")
	}
}

func (p *stallingProxy) release() {
	select {
	case <-p.go_:
	default:
		close(p.go_)
	}
}
