package system

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/cubesandbox/cubetemplatecenter/test/cubemaster"
	"github.com/cubesandbox/cubetemplatecenter/test/s3server"
)

const (
	// agentURL is where the agent's socket listens: the container shares
	// the host network.
	agentURL = "http://127.0.0.1:8090"
	// token is the secret shared by the agent and the stand-in CubeMaster.
	token = "system-test-shared-token"
	// terminalLimit bounds the wait for a job's terminal report.
	terminalLimit = 90 * time.Second
)

// world is what the installed agent talks to: the CubeMaster stand-in and a
// registry holding the image the builds name, both on the host's loopback.
type world struct {
	t     *testing.T
	cm    *cubemaster.Server
	image string
	// registryHost is the registry's host:port (plain HTTP).
	registryHost string
	// caPEM is the Cube egress CA the agent bakes into images; it goes to
	// caPath inside the container.
	caPEM string
	// jobs are the accepted jobs, checked for exactly one terminal report
	// each when the test ends.
	jobs []string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	cm, err := cubemaster.Start(token)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cm.Stop)
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	host := strings.TrimPrefix(reg.URL, "http://")
	ref, err := name.ParseReference(host+"/system-test/app:latest", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := random.Image(4096, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, cm: cm, image: ref.String(), registryHost: host, caPEM: testCA(t)}
	t.Cleanup(w.checkAllJobs)
	return w
}

// caPath is where the agent reads the Cube egress CA (build.ca_path).
const caPath = "/etc/cube/ca/cube-root-ca.crt"

// testCA makes a self-signed CA certificate in PEM.
func testCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "system-test Cube root CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// envFile is the environment file pointing the agent at the stand-in.
// s3Env is the environment lines that make the agent keep artifacts in
// srv (upstream's variable names).
func s3Env(srv *s3server.Server) string {
	return "CUBE_S3_ENDPOINT=http://" + srv.Endpoint + "\nCUBE_S3_BUCKET=" + srv.Bucket +
		"\nCUBE_S3_ACCESS_KEY_ID=" + srv.AccessKey + "\nCUBE_S3_SECRET_ACCESS_KEY=" + srv.SecretKey +
		"\nCUBE_S3_REGION=us-east-1\nCUBE_S3_USE_PATH_STYLE=true\nCUBE_S3_ARTIFACT_PREFIX=system\n"
}

func (w *world) envFile() string {
	return "CUBE_MASTER_ADDR=" + w.cm.URL() + "\nCUBE_TEMPLATE_CALLBACK_TOKEN=" + token + "\n"
}

// testConfig adapts the shipped configuration: quick callback retries (so a
// released report arrives at once), progress reports given up after two
// refusals (reports of a job go in order, so a held terminal report is
// tried only after them), and the test registry as plain HTTP.
func (w *world) testConfig(shipped string) string {
	w.t.Helper()
	out := strings.Replace(shipped, "retry_initial: 500ms", "retry_initial: 200ms", 1)
	out = strings.Replace(out, "retry_max: 30s", "retry_max: 1s\n  progress_attempts: 2", 1)
	if out == shipped {
		w.t.Fatal("shipped conf.yaml lost its retry_initial/retry_max lines")
	}
	withRegistry := strings.Replace(out, "\nregistry:\n", "\nregistry:\n  insecure: [\""+w.registryHost+"\"]\n", 1)
	if withRegistry == out {
		return out + "\nregistry:\n  insecure: [\"" + w.registryHost + "\"]\n"
	}
	return withRegistry
}

// health GETs /health.
func health() (int, string, error) { return get("/health") }

// get GETs a path from the agent.
func get(path string) (int, string, error) {
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Get(agentURL + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), nil
}

// submit posts a build as CubeMaster does and requires it accepted.
func (w *world) submit(jobID string) {
	w.t.Helper()
	// A distinct exposed port per job gives each its own template
	// fingerprint, so every job builds rather than reusing an artifact.
	body, err := json.Marshal(map[string]any{
		"job_id": jobID,
		"request": map[string]any{"requestID": "req-" + jobID, "source_image_ref": w.image,
			"writable_layer_size": "1Gi", "instance_type": "cubebox", "network_type": "tap",
			"exposed_ports": []int{8000 + len(w.jobs)}},
		"download_base_url": "127.0.0.1:8089",
	})
	if err != nil {
		w.t.Fatalf("encode build request: %v", err)
	}
	req, _ := http.NewRequest(http.MethodPost, agentURL+"/tc/api/v1/build", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Cube-Template-Callback-Token", token)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		w.t.Fatalf("submit %s: %v", jobID, err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(answer), `"accepted"`) {
		w.t.Fatalf("submit %s: %d %s", jobID, resp.StatusCode, answer)
	}
	w.jobs = append(w.jobs, jobID)
}

// hold makes the stand-in refuse every report (503), so reports stay in the
// agent's outbox; release restores normal answers.
func (w *world) hold() {
	w.cm.Respond(func(string, map[string]any) int { return http.StatusServiceUnavailable })
}
func (w *world) release() { w.cm.Respond(nil) }

// waitRefusedTerminal waits until the agent tried to deliver jobID's terminal
// report and the stand-in refused it: the report is in the agent's outbox.
func (w *world) waitRefusedTerminal(jobID string) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.t.Context(), terminalLimit)
	defer cancel()
	_, err := w.cm.WaitFor(ctx, func([]cubemaster.Callback) bool {
		for _, c := range w.cm.All() {
			if c.JobID == jobID && c.Terminal() && c.Status != http.StatusOK {
				return true
			}
		}
		return false
	})
	if err != nil {
		w.t.Fatalf("no refused terminal report for %s: %v", jobID, err)
	}
}

// waitTerminal waits for jobID's accepted terminal report and checks it is
// the only one.
func (w *world) waitTerminal(jobID string) cubemaster.Callback {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.t.Context(), terminalLimit)
	defer cancel()
	cb, err := w.cm.WaitTerminal(ctx, jobID)
	if err != nil {
		w.t.Fatalf("job %s: %v", jobID, err)
	}
	w.t.Logf("job %s: %s %s%s", jobID, cb.Field("status"), cb.Field("ext4_path"), cb.Field("error_message"))
	checkOutcome(w.t, cb)
	w.oneTerminal(jobID)
	return cb
}

// oneTerminal checks that CubeMaster accepted exactly one terminal report for
// jobID.
func (w *world) oneTerminal(jobID string) {
	w.t.Helper()
	var statuses []string
	for _, c := range w.cm.Callbacks(jobID) {
		if c.Terminal() {
			statuses = append(statuses, c.Field("status"))
		}
	}
	if len(statuses) != 1 {
		w.t.Errorf("job %s: %d terminal reports accepted (%v), want exactly 1", jobID, len(statuses), statuses)
	}
}

// checkAllJobs runs at the end of a test: every accepted job has exactly one
// terminal report, none lost and none duplicated by crashes or upgrades.
func (w *world) checkAllJobs() {
	if w.t.Failed() {
		return
	}
	for _, id := range w.jobs {
		w.oneTerminal(id)
	}
}

// checkOutcome requires a build to have ended BUILT with its artifact named.
func checkOutcome(t *testing.T, cb cubemaster.Callback) {
	t.Helper()
	if st := cb.Field("status"); st != "BUILT" {
		t.Errorf("job %s ended %s: %q", cb.JobID, st, cb.Field("error_message"))
		return
	}
	if cb.Field("ext4_path") == "" || cb.Field("artifact_id") == "" {
		t.Errorf("job %s BUILT without ext4_path or artifact_id: %v", cb.JobID, cb.Body)
	}
}
