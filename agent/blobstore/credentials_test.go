package blobstore_test

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
	"github.com/cubesandbox/cubetemplatecenter/test/s3server"
)

// envOf is a getenv reading m. Every chain in these tests has the
// instance metadata service disabled or on loopback: nothing may ask
// 169.254.169.254.
func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// chainS3 opens an S3 store on srv (or endpoint, when not "") signed by
// the AWS chain built from env, after checking the chain.
func chainS3(t *testing.T, srv *s3server.Server, endpoint string, env map[string]string) *blobstore.S3 {
	t.Helper()
	chain := blobstore.AWSCredentialChain(blobstore.AWSChainOptions{Getenv: envOf(env), Region: "us-east-1"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := chain.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	s, _ := newS3(t, func(o *blobstore.S3Options) {
		o.AccessKeyID, o.SecretAccessKey, o.Credentials = "", "", chain
		if endpoint != "" {
			o.Endpoint = endpoint
		}
	})
	return s
}

// putObject puts a small object named after the test and stats it.
func putObject(t *testing.T, s *blobstore.S3) error {
	t.Helper()
	ctx := context.Background()
	data, sum := randomBytes(1000, 77)
	key := "cred/" + strings.ReplaceAll(t.Name(), "/", "-")
	if err := s.Put(ctx, key, bytes.NewReader(data), int64(len(data)), sum); err != nil {
		return err
	}
	if info, err := s.Stat(ctx, key); err != nil || info.SHA256 != sum {
		return fmt.Errorf("stat = %+v, %v", info, err)
	}
	return nil
}

// chainStore is chainS3 whose store has put and stat an object.
func chainStore(t *testing.T, srv *s3server.Server, endpoint string, env map[string]string) *blobstore.S3 {
	t.Helper()
	s := chainS3(t, srv, endpoint, env)
	if err := putObject(t, s); err != nil {
		t.Fatalf("Put signed by %s: %v", s.CredentialsSource(), err)
	}
	return s
}

// wantTokenRefused: versitygw accepts its root keys only without a
// session token (InvalidToken otherwise), so a refusal for that reason
// shows the token reached the server.
func wantTokenRefused(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, blobstore.ErrAccessDenied) || !strings.Contains(err.Error(), "InvalidToken") {
		t.Errorf("request with a session token = %v; want versitygw's InvalidToken", err)
	}
}

// noIMDS turns the instance metadata service off in env.
func noIMDS(env map[string]string) map[string]string {
	env["AWS_EC2_METADATA_DISABLED"] = "true"
	return env
}

func TestChainEnvAWS(t *testing.T) {
	srv := s3srv.Get(t)
	s := chainStore(t, srv, "", noIMDS(map[string]string{
		"AWS_ACCESS_KEY_ID": srv.AccessKey, "AWS_SECRET_ACCESS_KEY": srv.SecretKey}))
	if got := s.CredentialsSource(); got != blobstore.CredentialsEnvAWS {
		t.Errorf("CredentialsSource() = %q; want %q", got, blobstore.CredentialsEnvAWS)
	}
}

// TestChainEnvAWSWinsOverFile: the AWS_* variables come before the shared
// file, as in the AWS SDKs; a file with wrong keys is never used.
func TestChainEnvAWSWinsOverFile(t *testing.T) {
	srv := s3srv.Get(t)
	home := t.TempDir()
	writeCredentialsFile(t, filepath.Join(home, ".aws", "credentials"), "default", "wrong", "wrong-secret")
	s := chainStore(t, srv, "", noIMDS(map[string]string{"HOME": home,
		"AWS_ACCESS_KEY_ID": srv.AccessKey, "AWS_SECRET_ACCESS_KEY": srv.SecretKey}))
	if got := s.CredentialsSource(); got != blobstore.CredentialsEnvAWS {
		t.Errorf("CredentialsSource() = %q; want %q", got, blobstore.CredentialsEnvAWS)
	}
}

func writeCredentialsFile(t *testing.T, path, profile, id, secret string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	text := fmt.Sprintf("[other]\naws_access_key_id = nope\naws_secret_access_key = nope\n\n[%s]\naws_access_key_id = %s\naws_secret_access_key = %s\n",
		profile, id, secret)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestChainSharedFile reads ~/.aws/credentials, the profile AWS_PROFILE
// names.
func TestChainSharedFile(t *testing.T) {
	srv := s3srv.Get(t)
	home := t.TempDir()
	writeCredentialsFile(t, filepath.Join(home, ".aws", "credentials"), "tc", srv.AccessKey, srv.SecretKey)
	s := chainStore(t, srv, "", noIMDS(map[string]string{"HOME": home, "AWS_PROFILE": "tc"}))
	if got := s.CredentialsSource(); got != blobstore.CredentialsFile {
		t.Errorf("CredentialsSource() = %q; want %q", got, blobstore.CredentialsFile)
	}
}

// recordingProxy forwards to srv and records the session token header of
// each request.
type recordingProxy struct {
	mu     sync.Mutex
	tokens []string
	url    string
}

func startRecordingProxy(t *testing.T, srv *s3server.Server) *recordingProxy {
	t.Helper()
	target, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	p := &recordingProxy{}
	rp := httputil.NewSingleHostReverseProxy(target)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.tokens = append(p.tokens, r.Header.Get("X-Amz-Security-Token"))
		p.mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	p.url = hs.URL
	return p
}

// seen returns the tokens recorded so far.
func (p *recordingProxy) seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.tokens...)
}

// TestChainSessionToken: AWS_SESSION_TOKEN goes with the AWS_* keys, and
// S3Options.SessionToken (CUBE_S3_SESSION_TOKEN) with the static keys, on
// every request. versitygw refuses any session token with its root keys
// (InvalidToken), so a proxy in front of it records the header sent, and
// the refusal shows it arrived.
func TestChainSessionToken(t *testing.T) {
	srv := s3srv.Get(t)
	const token = "session-token-from-sts-0123456789"
	t.Run("EnvAWS", func(t *testing.T) {
		proxy := startRecordingProxy(t, srv)
		s := chainS3(t, srv, proxy.url, noIMDS(map[string]string{
			"AWS_ACCESS_KEY_ID": srv.AccessKey, "AWS_SECRET_ACCESS_KEY": srv.SecretKey, "AWS_SESSION_TOKEN": token}))
		wantTokenRefused(t, putObject(t, s))
		checkTokens(t, proxy.seen(), token)
		if got := s.CredentialsSource(); got != blobstore.CredentialsEnvAWS {
			t.Errorf("CredentialsSource() = %q; want %q", got, blobstore.CredentialsEnvAWS)
		}
	})
	t.Run("Static", func(t *testing.T) {
		proxy := startRecordingProxy(t, srv)
		s, _ := newS3(t, func(o *blobstore.S3Options) { o.Endpoint, o.SessionToken = proxy.url, token })
		wantTokenRefused(t, s.Check(context.Background()))
		checkTokens(t, proxy.seen(), token)
		if got := s.CredentialsSource(); got != blobstore.CredentialsStatic {
			t.Errorf("CredentialsSource() = %q; want %q", got, blobstore.CredentialsStatic)
		}
		opts := testS3Options(srv)
		opts.SessionToken = token
		if out := fmt.Sprintf("%v %+v %#v", opts, opts, opts) + slogLine(opts); strings.Contains(out, token) {
			t.Errorf("the options print the session token: %s", out)
		}
	})
}

func checkTokens(t *testing.T, seen []string, want string) {
	t.Helper()
	if len(seen) == 0 {
		t.Fatal("no request went through the proxy")
	}
	for i, got := range seen {
		if got != want {
			t.Errorf("request %d carried session token %q; want %q", i, got, want)
		}
	}
}

// stsRequest is what the stand-in STS saw.
type stsRequest struct {
	Action, RoleArn, RoleSessionName, WebIdentityToken string
}

// startSTS answers AssumeRoleWithWebIdentity with id and secret (and the
// token, when not empty), recording each request.
func startSTS(t *testing.T, id, secret, sessionToken string) (*httptest.Server, func() []stsRequest) {
	t.Helper()
	var mu sync.Mutex
	var reqs []stsRequest
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		reqs = append(reqs, stsRequest{r.Form.Get("Action"), r.Form.Get("RoleArn"), r.Form.Get("RoleSessionName"), r.Form.Get("WebIdentityToken")})
		mu.Unlock()
		if r.Form.Get("Action") != "AssumeRoleWithWebIdentity" {
			http.Error(w, "unexpected action", http.StatusBadRequest)
			return
		}
		var b bytes.Buffer
		xml.EscapeText(&b, []byte(sessionToken))
		w.Header().Set("Content-Type", "text/xml")
		fmt.Fprintf(w, `<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <Credentials>
      <AccessKeyId>%s</AccessKeyId>
      <SecretAccessKey>%s</SecretAccessKey>
      <SessionToken>%s</SessionToken>
      <Expiration>%s</Expiration>
    </Credentials>
    <SubjectFromWebIdentityToken>system:serviceaccount:cube:templatecenter</SubjectFromWebIdentityToken>
  </AssumeRoleWithWebIdentityResult>
  <ResponseMetadata><RequestId>1</RequestId></ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>`, id, secret, b.String(), time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	}))
	t.Cleanup(hs.Close)
	return hs, func() []stsRequest { mu.Lock(); defer mu.Unlock(); return append([]stsRequest(nil), reqs...) }
}

// TestChainWebIdentity follows IRSA's path to the end: the token file and
// role go to a stand-in STS, whose answer (versitygw's keys) signs a PUT
// that versitygw accepts. STS's session token, which versitygw would
// refuse, is checked apart: it goes with every request.
func TestChainWebIdentity(t *testing.T) {
	srv := s3srv.Get(t)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("eyJ.projected.jwt"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(sts string) map[string]string {
		return noIMDS(map[string]string{"AWS_WEB_IDENTITY_TOKEN_FILE": tokenFile,
			"AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/templatecenter", "AWS_ROLE_SESSION_NAME": "tc-0", "AWS_STS_ENDPOINT": sts})
	}
	want := stsRequest{"AssumeRoleWithWebIdentity", "arn:aws:iam::123456789012:role/templatecenter", "tc-0", "eyJ.projected.jwt"}
	t.Run("Put", func(t *testing.T) {
		sts, requests := startSTS(t, srv.AccessKey, srv.SecretKey, "")
		s := chainStore(t, srv, "", env(sts.URL))
		if got := s.CredentialsSource(); got != blobstore.CredentialsWebIdentity {
			t.Errorf("CredentialsSource() = %q; want %q", got, blobstore.CredentialsWebIdentity)
		}
		if got := requests(); len(got) != 1 || got[0] != want {
			t.Errorf("STS saw %+v; want one %+v (the keys are cached until they near expiry)", got, want)
		}
	})
	t.Run("SessionToken", func(t *testing.T) {
		const sessionToken = "sts-issued-session-token"
		sts, _ := startSTS(t, srv.AccessKey, srv.SecretKey, sessionToken)
		proxy := startRecordingProxy(t, srv)
		wantTokenRefused(t, putObject(t, chainS3(t, srv, proxy.url, env(sts.URL))))
		checkTokens(t, proxy.seen(), sessionToken)
	})
	t.Run("STSRefuses", func(t *testing.T) {
		sts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprint(w, `<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type><Code>AccessDenied</Code><Message>Not authorized to perform sts:AssumeRoleWithWebIdentity</Message></Error></ErrorResponse>`)
		}))
		t.Cleanup(sts.Close)
		_, err := blobstore.AWSCredentialChain(blobstore.AWSChainOptions{Getenv: envOf(env(sts.URL))}).Check(context.Background())
		if !errors.Is(err, blobstore.ErrNoCredentials) || !strings.Contains(err.Error(), "web_identity: ") ||
			!strings.Contains(err.Error(), "Not authorized") {
			t.Errorf("Check with STS refusing = %v; want ErrNoCredentials with STS's reason", err)
		}
	})
}

// TestChainContainer asks a container credentials endpoint with the
// authorization token from its file, as EKS pod identity does.
func TestChainContainer(t *testing.T) {
	srv := s3srv.Get(t)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("pod-identity-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var auth []string
	var mu sync.Mutex
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		fmt.Fprintf(w, `{"AccessKeyId":%q,"SecretAccessKey":%q,"Token":"","Expiration":%q}`,
			srv.AccessKey, srv.SecretKey, time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	}))
	t.Cleanup(hs.Close)
	s := chainStore(t, srv, "", noIMDS(map[string]string{
		"AWS_CONTAINER_CREDENTIALS_FULL_URI": hs.URL + "/v1/credentials", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": tokenFile}))
	if got := s.CredentialsSource(); got != blobstore.CredentialsContainer {
		t.Errorf("CredentialsSource() = %q; want %q", got, blobstore.CredentialsContainer)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(auth) != 1 || auth[0] != "pod-identity-token" {
		t.Errorf("container endpoint saw Authorization %q; want one pod-identity-token", auth)
	}
}

// TestChainInstanceMetadata: the instance metadata service (here a
// stand-in on loopback named by AWS_EC2_METADATA_SERVICE_ENDPOINT) gives
// the role's keys, IMDSv2 token first.
func TestChainInstanceMetadata(t *testing.T) {
	srv := s3srv.Get(t)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
			fmt.Fprint(w, "imds-token")
		case r.Header.Get("X-aws-ec2-metadata-token") != "imds-token":
			http.Error(w, "no token", http.StatusUnauthorized)
		case r.URL.Path == "/latest/meta-data/iam/security-credentials/":
			fmt.Fprint(w, "tc-role\n")
		case r.URL.Path == "/latest/meta-data/iam/security-credentials/tc-role":
			fmt.Fprintf(w, `{"Code":"Success","AccessKeyId":%q,"SecretAccessKey":%q,"Token":"","Expiration":%q}`,
				srv.AccessKey, srv.SecretKey, time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(hs.Close)
	s := chainStore(t, srv, "", map[string]string{"AWS_EC2_METADATA_SERVICE_ENDPOINT": hs.URL})
	if got := s.CredentialsSource(); got != blobstore.CredentialsInstance {
		t.Errorf("CredentialsSource() = %q; want %q", got, blobstore.CredentialsInstance)
	}
}

// TestChainNoCredentials: with nothing to go on, Check fails at once with
// an error that says what to set, whether the metadata service is off,
// answers 404, or never answers (bounded by its short timeout).
func TestChainNoCredentials(t *testing.T) {
	notFound := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(notFound.Close)
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	go func() {
		// Accept and never answer, like a metadata address that swallows
		// packets.
		var held []net.Conn
		for {
			c, err := silent.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	cases := []struct {
		name   string
		env    map[string]string
		opts   blobstore.AWSChainOptions
		detail string
		within time.Duration
	}{
		{"MetadataDisabled", map[string]string{"AWS_EC2_METADATA_DISABLED": "true", "HOME": t.TempDir()}, blobstore.AWSChainOptions{},
			"no source configured", time.Second},
		{"MetadataNotFound", map[string]string{"AWS_EC2_METADATA_SERVICE_ENDPOINT": notFound.URL}, blobstore.AWSChainOptions{},
			"instance: ", 2 * time.Second},
		{"MetadataSilent", map[string]string{"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://" + silent.Addr().String()},
			blobstore.AWSChainOptions{InstanceMetadataTimeout: 200 * time.Millisecond}, "instance: ", 3 * time.Second},
		{"MetadataSilentDefaultTimeout", map[string]string{"AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://" + silent.Addr().String()},
			blobstore.AWSChainOptions{}, "instance: ", 8 * time.Second},
		{"BrokenWebIdentity", map[string]string{"AWS_EC2_METADATA_DISABLED": "true",
			"AWS_WEB_IDENTITY_TOKEN_FILE": filepath.Join(t.TempDir(), "missing"), "AWS_ROLE_ARN": "arn:aws:iam::1:role/r",
			"AWS_STS_ENDPOINT": notFound.URL}, blobstore.AWSChainOptions{}, "web_identity: ", time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.opts.Getenv = envOf(c.env)
			chain := blobstore.AWSCredentialChain(c.opts)
			start := time.Now()
			src, err := chain.Check(context.Background())
			took := time.Since(start)
			if !errors.Is(err, blobstore.ErrNoCredentials) || !strings.Contains(err.Error(), "AWS_ACCESS_KEY_ID") ||
				!strings.Contains(err.Error(), c.detail) {
				t.Errorf("Check = %q, %v; want ErrNoCredentials saying what to set and %q", src, err, c.detail)
			}
			if took > c.within {
				t.Errorf("Check took %s; want under %s", took, c.within)
			}
			if chain.Source() != "" {
				t.Errorf("Source() = %q with no credentials", chain.Source())
			}
		})
	}
}

// TestS3NeedsCredentials: NewS3 wants static keys (both) or a chain.
func TestS3NeedsCredentials(t *testing.T) {
	base := blobstore.S3Options{Endpoint: "127.0.0.1:9", Bucket: "b"}
	if _, err := blobstore.NewS3(base); err == nil || !strings.Contains(err.Error(), "credential chain") {
		t.Errorf("NewS3 without credentials = %v", err)
	}
	half := base
	half.AccessKeyID = "k"
	if _, err := blobstore.NewS3(half); err == nil || !strings.Contains(err.Error(), "together") {
		t.Errorf("NewS3 with a key id alone = %v", err)
	}
	chained := base
	chained.Credentials = blobstore.NewCredentialChain()
	if _, err := blobstore.NewS3(chained); err != nil {
		t.Errorf("NewS3 with a chain = %v", err)
	}
}
