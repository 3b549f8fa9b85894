package blobstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Credential sources, as the log and /health name them.
const (
	// CredentialsStatic: keys given to TC itself (CUBE_S3_ACCESS_KEY_ID,
	// CUBE_S3_SECRET_ACCESS_KEY, CUBE_S3_SESSION_TOKEN or conf.yaml).
	CredentialsStatic = "static"
	// CredentialsEnvAWS: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
	// AWS_SESSION_TOKEN.
	CredentialsEnvAWS = "env_aws"
	// CredentialsFile: the shared credentials file (~/.aws/credentials or
	// AWS_SHARED_CREDENTIALS_FILE), profile AWS_PROFILE.
	CredentialsFile = "shared_file"
	// CredentialsWebIdentity: AssumeRoleWithWebIdentity with the token in
	// AWS_WEB_IDENTITY_TOKEN_FILE for AWS_ROLE_ARN (IRSA, workload
	// identity).
	CredentialsWebIdentity = "web_identity"
	// CredentialsContainer: the container credentials endpoint (ECS task
	// role, EKS pod identity).
	CredentialsContainer = "container"
	// CredentialsInstance: the instance metadata service (EC2 instance
	// role).
	CredentialsInstance = "instance"
)

// ErrNoCredentials: no source of the credential chain yielded keys.
var ErrNoCredentials = errors.New("no S3 credentials: set CUBE_S3_ACCESS_KEY_ID and CUBE_S3_SECRET_ACCESS_KEY, " +
	"or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or run with a role (web identity, container or instance)")

// Timeouts of the credential sources that ask a server.
const (
	// DefaultCredentialsTimeout bounds one request to STS or a container
	// credentials endpoint.
	DefaultCredentialsTimeout = 10 * time.Second
	// DefaultInstanceMetadataTimeout bounds one request to the instance
	// metadata service, as short as the AWS SDKs': off a cloud instance
	// 169.254.169.254 usually does not answer at all, and a host without
	// credentials must fail at start in seconds, not minutes.
	DefaultInstanceMetadataTimeout = time.Second
)

// CredentialSource is one link of a CredentialChain.
type CredentialSource struct {
	// Name is what the log and /health show (the Credentials* constants).
	Name string
	// Provider yields the keys.
	Provider credentials.Provider
}

// CredentialChain signs S3 requests with the keys of the first source that
// yields some, and remembers which one did. Sources that expire (STS,
// roles) are asked again, from the first, when their keys near expiry.
type CredentialChain struct {
	sources []CredentialSource
	creds   *credentials.Credentials
	// current is the index of the source in use, -1 before the first
	// success.
	current atomic.Int32
}

// NewCredentialChain returns a chain of sources tried in order.
func NewCredentialChain(sources ...CredentialSource) *CredentialChain {
	c := &CredentialChain{sources: sources}
	c.current.Store(-1)
	c.creds = credentials.New(c)
	return c
}

// Credentials returns the chain as minio-go takes it; it caches the keys
// until they expire.
func (c *CredentialChain) Credentials() *credentials.Credentials { return c.creds }

// Source names the source in use, "" before the first retrieval.
func (c *CredentialChain) Source() string {
	if i := c.current.Load(); i >= 0 {
		return c.sources[i].Name
	}
	return ""
}

// Sources names the chain's sources in order.
func (c *CredentialChain) Sources() []string {
	names := make([]string, len(c.sources))
	for i, s := range c.sources {
		names[i] = s.Name
	}
	return names
}

// Check retrieves the keys once, bounded by ctx, so that a host without
// credentials fails at start; it returns the source's name. The error
// matches ErrNoCredentials and says what each source answered.
func (c *CredentialChain) Check(ctx context.Context) (string, error) {
	if _, err := c.creds.GetWithContext(&credentials.CredContext{Context: ctx}); err != nil {
		return "", err
	}
	return c.Source(), nil
}

// RetrieveWithCredContext implements credentials.Provider.
func (c *CredentialChain) RetrieveWithCredContext(cc *credentials.CredContext) (credentials.Value, error) {
	var tried []string
	for i, s := range c.sources {
		v, err := s.Provider.RetrieveWithCredContext(cc)
		if err == nil && (v.AccessKeyID == "" || v.SecretAccessKey == "") {
			err = errors.New("no keys")
		}
		if err != nil {
			tried = append(tried, s.Name+": "+err.Error())
			continue
		}
		c.current.Store(int32(i))
		return v, nil
	}
	if len(tried) == 0 {
		return credentials.Value{}, fmt.Errorf("%w (no source configured)", ErrNoCredentials)
	}
	return credentials.Value{}, fmt.Errorf("%w; tried %s", ErrNoCredentials, strings.Join(tried, "; "))
}

// Retrieve implements credentials.Provider.
func (c *CredentialChain) Retrieve() (credentials.Value, error) {
	return c.RetrieveWithCredContext(nil)
}

// IsExpired implements credentials.Provider: the source in use decides.
func (c *CredentialChain) IsExpired() bool {
	i := c.current.Load()
	return i < 0 || c.sources[i].Provider.IsExpired()
}

// AWSChainOptions shape the sources AWSCredentialChain builds.
type AWSChainOptions struct {
	// Getenv reads the environment (os.Getenv in the binary, a map in
	// tests); the package reads none itself.
	Getenv func(string) string
	// Region is the bucket's region, the STS region when AWS_REGION is
	// unset.
	Region string
	// Transport replaces the HTTP transport for STS and the role
	// endpoints (custom CAs, tests).
	Transport http.RoundTripper
	// Timeout bounds one request to STS or a container endpoint;
	// DefaultCredentialsTimeout when zero.
	Timeout time.Duration
	// InstanceMetadataTimeout bounds one request to the instance metadata
	// service; DefaultInstanceMetadataTimeout when zero.
	InstanceMetadataTimeout time.Duration
}

// AWSCredentialChain returns the AWS SDKs' default chain as configured by
// the environment: AWS_* variables, the shared credentials file, web
// identity, the container endpoint, then the instance metadata service
// (unless AWS_EC2_METADATA_DISABLED is true). A source whose variables are
// unset is left out; so is the shared file when it does not exist.
func AWSCredentialChain(o AWSChainOptions) *CredentialChain {
	getenv := o.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	first := func(names ...string) string {
		for _, n := range names {
			if v := getenv(n); v != "" {
				return v
			}
		}
		return ""
	}
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = DefaultCredentialsTimeout
	}
	imdsTimeout := o.InstanceMetadataTimeout
	if imdsTimeout <= 0 {
		imdsTimeout = DefaultInstanceMetadataTimeout
	}
	transport := o.Transport
	if transport == nil {
		transport = http.DefaultTransport
	}
	client := &http.Client{Transport: transport, Timeout: timeout}
	var sources []CredentialSource

	if id, secret := first("AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY"), first("AWS_SECRET_ACCESS_KEY", "AWS_SECRET_KEY"); id != "" || secret != "" {
		sources = append(sources, CredentialSource{CredentialsEnvAWS, &credentials.Static{Value: credentials.Value{
			AccessKeyID: id, SecretAccessKey: secret, SessionToken: getenv("AWS_SESSION_TOKEN"), SignerType: credentials.SignatureV4}}})
	}

	file := getenv("AWS_SHARED_CREDENTIALS_FILE")
	if file == "" && getenv("HOME") != "" {
		file = filepath.Join(getenv("HOME"), ".aws", "credentials")
	}
	if file != "" {
		if _, err := os.Stat(file); err == nil {
			profile := first("AWS_PROFILE")
			if profile == "" {
				profile = "default"
			}
			sources = append(sources, CredentialSource{CredentialsFile, &credentials.FileAWSCredentials{Filename: file, Profile: profile}})
		}
	}

	if tokenFile := getenv("AWS_WEB_IDENTITY_TOKEN_FILE"); tokenFile != "" {
		region := first("AWS_REGION", "AWS_DEFAULT_REGION")
		if region == "" {
			region = o.Region
		}
		endpoint := getenv("AWS_STS_ENDPOINT")
		switch {
		case endpoint != "":
		case strings.HasPrefix(region, "cn-"):
			endpoint = "https://sts." + region + ".amazonaws.com.cn"
		case region != "":
			endpoint = "https://sts." + region + ".amazonaws.com"
		default:
			endpoint = credentials.DefaultSTSRoleEndpoint
		}
		// minio-go's IAM provider is the one that takes a role session
		// name; with the token file set it asks STS only.
		p := &credentials.IAM{Client: client, Endpoint: endpoint, Region: region}
		p.EKSIdentity.TokenFile = tokenFile
		p.EKSIdentity.RoleARN = getenv("AWS_ROLE_ARN")
		p.EKSIdentity.RoleSessionName = getenv("AWS_ROLE_SESSION_NAME")
		sources = append(sources, CredentialSource{CredentialsWebIdentity, p})
	}

	if rel, full := getenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"), getenv("AWS_CONTAINER_CREDENTIALS_FULL_URI"); rel != "" || full != "" {
		sources = append(sources, CredentialSource{CredentialsContainer, &containerProvider{client: client, relativeURI: rel, fullURI: full,
			token: getenv("AWS_CONTAINER_AUTHORIZATION_TOKEN"), tokenFile: getenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")}})
	}

	if !strings.EqualFold(getenv("AWS_EC2_METADATA_DISABLED"), "true") {
		endpoint := getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT")
		if endpoint == "" {
			endpoint = credentials.DefaultIAMRoleEndpoint
		}
		// Its own client: a short timeout per request, whatever the
		// caller's context allows.
		sources = append(sources, CredentialSource{CredentialsInstance, &credentials.IAM{
			Client: &http.Client{Transport: transport, Timeout: imdsTimeout}, Endpoint: endpoint}})
	}
	return NewCredentialChain(sources...)
}

// containerProvider asks the container credentials endpoint (ECS task
// roles, EKS pod identity) as the AWS SDKs do. minio-go's IAM provider
// reads the token file's variable from the process environment only.
type containerProvider struct {
	credentials.Expiry
	client               *http.Client
	relativeURI, fullURI string
	token, tokenFile     string
}

// ecsEndpoint is the ECS agent's address for relative URIs.
const ecsEndpoint = "http://169.254.170.2"

// containerHosts are the non-loopback hosts a full URI may name (ECS and
// EKS pod identity agents), as the AWS SDKs allow.
var containerHosts = []string{"169.254.170.2", "169.254.170.23", "fd00:ec2::23"}

func (p *containerProvider) endpoint() (string, error) {
	if p.relativeURI != "" {
		return ecsEndpoint + p.relativeURI, nil
	}
	u, err := url.Parse(p.fullURI)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("AWS_CONTAINER_CREDENTIALS_FULL_URI %q is not an http(s) URL", p.fullURI)
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); (ip != nil && ip.IsLoopback()) || host == "localhost" {
		return p.fullURI, nil
	}
	for _, h := range containerHosts {
		if host == h {
			return p.fullURI, nil
		}
	}
	if u.Scheme == "https" {
		return p.fullURI, nil
	}
	return "", fmt.Errorf("AWS_CONTAINER_CREDENTIALS_FULL_URI %q: plain http only to loopback or the container agent", p.fullURI)
}

// RetrieveWithCredContext implements credentials.Provider.
func (p *containerProvider) RetrieveWithCredContext(cc *credentials.CredContext) (credentials.Value, error) {
	endpoint, err := p.endpoint()
	if err != nil {
		return credentials.Value{}, err
	}
	ctx := context.Background()
	if cc != nil && cc.Context != nil {
		ctx = cc.Context
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint, nil)
	if err != nil {
		return credentials.Value{}, err
	}
	token := p.token
	if p.tokenFile != "" {
		// Re-read each time: pod identity tokens rotate.
		b, err := os.ReadFile(p.tokenFile)
		if err != nil {
			return credentials.Value{}, fmt.Errorf("container authorization token: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	if token != "" {
		req.Header.Set("Authorization", token)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return credentials.Value{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return credentials.Value{}, fmt.Errorf("container credentials endpoint: %s", resp.Status)
	}
	var body struct {
		AccessKeyID     string `json:"AccessKeyId"`
		SecretAccessKey string
		Token           string
		Expiration      time.Time
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return credentials.Value{}, fmt.Errorf("container credentials endpoint: %w", err)
	}
	expires := body.Expiration
	if expires.IsZero() {
		// Without an expiry the keys would count as expired at once and
		// be fetched for every request.
		expires = time.Now().Add(15 * time.Minute)
	}
	p.SetExpiration(expires, credentials.DefaultExpiryWindow)
	return credentials.Value{AccessKeyID: body.AccessKeyID, SecretAccessKey: body.SecretAccessKey,
		SessionToken: body.Token, Expiration: body.Expiration, SignerType: credentials.SignatureV4}, nil
}

// Retrieve implements credentials.Provider.
func (p *containerProvider) Retrieve() (credentials.Value, error) {
	return p.RetrieveWithCredContext(nil)
}
