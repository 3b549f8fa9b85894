package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// awsOnlyEnv is s3Env without TC's own keys: the AWS chain signs. HOME is
// empty of ~/.aws and the instance metadata service is a loopback stand-in
// answering 404, so nothing asks 169.254.169.254.
func awsOnlyEnv(t *testing.T, h *harness, env map[string]string) {
	t.Helper()
	imds := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(imds.Close)
	delete(h.env, "CUBE_S3_ACCESS_KEY_ID")
	delete(h.env, "CUBE_S3_SECRET_ACCESS_KEY")
	h.env["HOME"] = t.TempDir()
	h.env["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = imds.URL
	for k, v := range env {
		h.env[k] = v
	}
}

// TestS3CredentialsFromAWSEnvironment: with no CUBE_S3_* keys the agent
// signs with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, says so in its log
// and in /health, and shows the secret in neither.
func TestS3CredentialsFromAWSEnvironment(t *testing.T) {
	t.Parallel()
	srv := s3srv.Get(t)
	h := newHarness(t, "", testToken)
	for k, v := range s3Env(srv, srv.Endpoint, "") {
		h.env[k] = v
	}
	awsOnlyEnv(t, h, map[string]string{"AWS_ACCESS_KEY_ID": srv.AccessKey, "AWS_SECRET_ACCESS_KEY": srv.SecretKey})
	agent := h.startAgent("agent (AWS_* keys)")
	agent.waitLine(t, "artifacts kept in the blob store", "credentials=env_aws")
	code, body := call(t, "GET", h.baseURL()+"/health", testToken, nil)
	checks, _ := body["checks"].(map[string]any)
	if code != 200 || checks["blobstore"] != true || body["blobstore_credentials"] != "env_aws" {
		t.Errorf("/health = %d %v; want 200, the blob store check passing and blobstore_credentials env_aws", code, body)
	}
	raw, _ := json.Marshal(body)
	if strings.Contains(agent.out.String(), srv.SecretKey) || strings.Contains(string(raw), srv.SecretKey) {
		t.Errorf("the secret shows in the log or /health")
	}
	agent.stop(t)
}

// TestS3StaticKeysWin: TC's own keys sign even when AWS_* variables (here
// wrong ones) are set, and /health says static.
func TestS3StaticKeysWin(t *testing.T) {
	t.Parallel()
	srv := s3srv.Get(t)
	h := newHarness(t, "", testToken)
	for k, v := range s3Env(srv, srv.Endpoint, "") {
		h.env[k] = v
	}
	h.env["AWS_ACCESS_KEY_ID"], h.env["AWS_SECRET_ACCESS_KEY"] = "wrong", "wrong-secret-0123456789"
	agent := h.startAgent("agent (static keys and AWS_*)")
	code, body := call(t, "GET", h.baseURL()+"/health", testToken, nil)
	checks, _ := body["checks"].(map[string]any)
	if code != 200 || checks["blobstore"] != true || body["blobstore_credentials"] != "static" {
		t.Errorf("/health = %d %v; want 200, the blob store check passing and blobstore_credentials static", code, body)
	}
	agent.stop(t)
}

// TestS3NoCredentialsFailsFast: S3 configured but no credentials anywhere
// (no keys, no AWS_*, no ~/.aws, no role, the metadata service saying
// 404): the agent does not start, within seconds, saying what to set.
func TestS3NoCredentialsFailsFast(t *testing.T) {
	t.Parallel()
	srv := s3srv.Get(t)
	h := newHarness(t, "", testToken)
	for k, v := range s3Env(srv, srv.Endpoint, "") {
		h.env[k] = v
	}
	awsOnlyEnv(t, h, nil)
	h.writeConfig()
	start := time.Now()
	p := startProc(t, "agent (no S3 credentials)", h.environ(), agentBuild.Path(t))
	if code := p.waitExit(t, 10*time.Second); code == 0 {
		t.Fatalf("the agent exited 0 without S3 credentials")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the agent took %s to give up; want seconds", took)
	}
	out := p.out.String()
	for _, want := range []string{"no S3 credentials", "CUBE_S3_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID", "instance: "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
