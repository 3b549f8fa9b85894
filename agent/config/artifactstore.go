package config

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// Blob store backends, as artifact_store.backend and
// CUBE_ARTIFACT_STORE_BACKEND spell them: the wire contract's.
const (
	BackendS3 = api.BackendS3
	BackendFS = api.BackendFS
)

// ArtifactStore configures the blob store that keeps the durable copy of
// each artifact (artifact_store:). Upstream's environment names override
// the file.
type ArtifactStore struct {
	// Backend is s3 (the default; unknown values also mean s3, with a
	// warning) or fs.
	Backend string `yaml:"backend"`
	// FSRoot is the fs backend's root; store.dir when unset.
	FSRoot string `yaml:"fs_root"`
	// S3 locates the bucket; the S3 backend is on when endpoint and
	// bucket are set. Without static keys it takes the AWS credential
	// chain (AWS_* variables, ~/.aws, web identity, container and
	// instance roles).
	S3 S3 `yaml:"s3"`
	// PresignTTL is how long presigned download URLs stay valid (at most
	// 7 days, S3's limit).
	PresignTTL time.Duration `yaml:"presign_ttl"`
	// PartSize and UploadConcurrency shape multipart uploads; an upload
	// holds about part_size x upload_concurrency in memory.
	PartSize          ByteSize `yaml:"part_size"`
	UploadConcurrency int      `yaml:"upload_concurrency"`
	// Attempts bounds tries per S3 request on transient failures.
	Attempts int `yaml:"attempts"`
	// PartStallTimeout cancels (and retries, within Attempts) an S3 part
	// upload whose body is not read for this long.
	PartStallTimeout time.Duration `yaml:"part_stall_timeout"`
	// KeepLocal keeps the local .ext4 after a successful upload.
	KeepLocal bool `yaml:"keep_local"`
	// RecordSecret authenticates the record stored beside each object,
	// so that a replica adopts only objects another TC replica uploaded,
	// never one planted by whoever else can write to the bucket. Every
	// replica needs the same value; unset, replicas adopt nothing from
	// the bucket before CubeMaster registers it.
	RecordSecret Secret `yaml:"record_secret"`
}

// S3 holds the S3 (or MinIO) connection settings.
type S3 struct {
	// Endpoint is host:port, or an http(s) URL whose scheme decides TLS.
	Endpoint string `yaml:"endpoint"`
	Bucket   string `yaml:"bucket"`
	// AccessKeyID and SecretAccessKey are static credentials, with
	// SessionToken when STS issued them; the secrets never print (see
	// Secret). Unset, the AWS credential chain applies.
	AccessKeyID     string `yaml:"access_key_id"`
	SecretAccessKey Secret `yaml:"secret_access_key"`
	SessionToken    Secret `yaml:"session_token"`
	Region          string `yaml:"region"`
	// UsePathStyle addresses buckets as endpoint/bucket (MinIO).
	UsePathStyle bool `yaml:"use_path_style"`
	// UseSSL selects TLS for a host:port endpoint.
	UseSSL bool `yaml:"use_ssl"`
	// Prefix is prepended to object keys: [prefix/]<artifact_id>.ext4.
	Prefix string `yaml:"prefix"`
}

// Artifact store limits and defaults.
const (
	minPartSize          = 5 << 20
	maxPartSize          = 5 << 30
	maxPresignTTL        = 7 * 24 * time.Hour
	defaultPartSize      = 16 << 20
	defaultConcurrency   = 4
	defaultStoreAttempts = 5
	defaultPartStall     = 2 * time.Minute
	// minRecordSecret is the shortest artifact_store.record_secret: a
	// guessable key would let anyone sign records.
	minRecordSecret = 16
)

func defaultArtifactStore() ArtifactStore {
	return ArtifactStore{Backend: BackendS3, PresignTTL: maxPresignTTL, PartSize: defaultPartSize,
		UploadConcurrency: defaultConcurrency, Attempts: defaultStoreAttempts, PartStallTimeout: defaultPartStall, KeepLocal: true}
}

// Secret is a credential. It decodes from YAML like a string, but every way
// of printing it (fmt verbs, slog, YAML, JSON) shows "REDACTED", or "" when
// unset; Reveal returns the value.
type Secret string

// redacted replaces a set secret when printed.
const redacted = "REDACTED"

// Reveal returns the secret itself, for the one place that uses it.
func (s Secret) Reveal() string { return string(s) }

// String shows whether the secret is set, never its value.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString is String, for %#v.
func (s Secret) GoString() string { return `"` + s.String() + `"` }

// LogValue is String, for slog.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalYAML is String, so a dumped config holds no secret.
func (s Secret) MarshalYAML() (any, error) { return s.String(), nil }

// MarshalJSON is String, so a dumped config holds no secret.
func (s Secret) MarshalJSON() ([]byte, error) { return json.Marshal(s.String()) }

// artifactStoreEnv are the artifact store's environment overrides,
// upstream's names first; the S3 keys are in secrets (secrets.go).
var artifactStoreEnv = []envOverride{
	{key: "artifact_store.backend", names: []string{"CUBE_ARTIFACT_STORE_BACKEND"}, set: func(c *Config, _, v string) error { c.ArtifactStore.Backend = v; return nil }},
	{key: "artifact_store.fs_root", names: []string{"CUBE_ARTIFACT_STORE_FS_ROOT"}, set: func(c *Config, _, v string) error { c.ArtifactStore.FSRoot = v; return nil }},
	{key: "artifact_store.s3.endpoint", names: []string{"CUBE_S3_ENDPOINT"}, set: func(c *Config, _, v string) error {
		if !validEndpoint(v) {
			// Upstream's S3 client fails on it and every artifact stays
			// local: so does TC's, unless the file names a good one.
			return ignored("not host:port or an http(s) URL without path; upstream's uploads fail with it and artifacts stay local "+
				"(artifact_store.s3.endpoint stays %q)", safetext.Redact(c.ArtifactStore.S3.Endpoint))
		}
		c.ArtifactStore.S3.Endpoint = v
		return nil
	}},
	{key: "artifact_store.s3.bucket", names: []string{"CUBE_S3_BUCKET"}, set: func(c *Config, _, v string) error { c.ArtifactStore.S3.Bucket = v; return nil }},
	{key: "artifact_store.s3.region", names: []string{"CUBE_S3_REGION"}, set: func(c *Config, _, v string) error { c.ArtifactStore.S3.Region = v; return nil }},
	{key: "artifact_store.s3.use_path_style", names: []string{"CUBE_S3_USE_PATH_STYLE"}, set: func(c *Config, _, v string) error {
		return parseFlag(v, &c.ArtifactStore.S3.UsePathStyle)
	}},
	{key: "artifact_store.s3.use_ssl", names: []string{"CUBE_S3_USE_SSL"}, set: func(c *Config, _, v string) error {
		return parseFlag(v, &c.ArtifactStore.S3.UseSSL)
	}},
	{key: "artifact_store.s3.prefix", names: []string{"CUBE_S3_ARTIFACT_PREFIX"}, set: func(c *Config, _, v string) error { c.ArtifactStore.S3.Prefix = v; return nil }},
}

// parseFlag reads a boolean variable as upstream does (upstreamFlag): a
// value upstream reads as false without a word is false, with a warning.
func parseFlag(v string, dst *bool) error {
	b, known := upstreamFlag(v)
	*dst = b
	if !known {
		return &fellBack{note: "not one of 1, true, yes, on, 0, false, no, off: upstream reads it as false, so does TC", applied: true}
	}
	return nil
}

// validEndpoint reports whether e is host:port or an http(s) URL without
// path, query or user.
func validEndpoint(e string) bool {
	if !strings.Contains(e, "://") {
		return !strings.ContainsAny(e, "/?#@")
	}
	u, err := url.Parse(e)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" &&
		(u.Path == "" || u.Path == "/") && u.RawQuery == "" && u.User == nil
}

// s3Missing names the settings the S3 backend needs that are unset.
func (a *ArtifactStore) s3Missing() []string {
	var missing []string
	for _, r := range []struct {
		set  bool
		name string
	}{
		{a.S3.Endpoint != "", "endpoint (CUBE_S3_ENDPOINT)"},
		{a.S3.Bucket != "", "bucket (CUBE_S3_BUCKET)"},
		// The static keys go together; neither means the AWS chain.
		{a.S3.AccessKeyID != "" || a.S3.SecretAccessKey == "", "access_key_id (CUBE_S3_ACCESS_KEY_ID)"},
		{a.S3.SecretAccessKey != "" || a.S3.AccessKeyID == "", "secret_access_key (CUBE_S3_SECRET_ACCESS_KEY)"},
	} {
		if !r.set {
			missing = append(missing, r.name)
		}
	}
	return missing
}

// s3AnySet reports whether any S3 setting that s3Missing checks is set.
func (a *ArtifactStore) s3AnySet() bool {
	return a.S3.Endpoint != "" || a.S3.Bucket != "" || a.S3.AccessKeyID != "" || a.S3.SecretAccessKey != ""
}

// resolve settles the backend and the fs root once file and environment
// are applied, returning warnings (never values): an unknown backend means
// s3, as upstream; an incomplete S3 set turns the S3 store off.
func (a *ArtifactStore) resolve(storeDir string) []string {
	var warnings []string
	switch b := strings.ToLower(strings.TrimSpace(a.Backend)); b {
	case BackendS3, BackendFS:
		a.Backend = b
	case "":
		a.Backend = BackendS3
	default:
		warnings = append(warnings, fmt.Sprintf("artifact_store.backend %q is neither s3 nor fs; using s3", a.Backend))
		a.Backend = BackendS3
	}
	if a.FSRoot == "" {
		a.FSRoot = storeDir
	}
	if a.Backend == BackendS3 {
		if missing := a.s3Missing(); len(missing) > 0 && a.s3AnySet() {
			warnings = append(warnings, "artifact_store.s3 is incomplete, the S3 blob store is off; missing: "+
				strings.Join(missing, ", "))
		}
		if a.S3.SessionToken != "" && a.S3.AccessKeyID == "" {
			warnings = append(warnings, "artifact_store.s3.session_token (CUBE_S3_SESSION_TOKEN) is set without the static keys "+
				"and is ignored; the AWS chain takes AWS_SESSION_TOKEN")
		}
	}
	return warnings
}

// Enabled returns the backend to open: BackendFS, BackendS3 when endpoint
// and bucket are set (with both static keys or neither), or "" when no
// blob store is configured. It is blobstore.Options.Backend; the package
// stays free of blobstore, whose Open returns no store for "".
func (a *ArtifactStore) Enabled() string {
	switch {
	case strings.EqualFold(strings.TrimSpace(a.Backend), BackendFS):
		return BackendFS
	case len(a.s3Missing()) == 0: // s3, and any unknown backend, as resolve
		return BackendS3
	}
	return ""
}

// validate returns the artifact store's problems, each naming its key.
func (a *ArtifactStore) validate() []error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("artifact_store.%s: %s", key, fmt.Sprintf(format, args...)))
	}
	if a.PresignTTL <= 0 || a.PresignTTL > maxPresignTTL {
		bad("presign_ttl", "%s is outside (0, %s]", a.PresignTTL, maxPresignTTL)
	}
	if a.PartSize < minPartSize || a.PartSize > maxPartSize {
		bad("part_size", "%s is outside %s..%s", a.PartSize, ByteSize(minPartSize), ByteSize(maxPartSize))
	}
	if a.UploadConcurrency < 1 || a.UploadConcurrency > 64 {
		bad("upload_concurrency", "%d is outside 1..64", a.UploadConcurrency)
	}
	if a.Attempts < 1 || a.Attempts > 100 {
		bad("attempts", "%d is outside 1..100", a.Attempts)
	}
	if a.PartStallTimeout < time.Second {
		bad("part_stall_timeout", "%s is below 1s", a.PartStallTimeout)
	}
	if n := len(a.RecordSecret); n > 0 && n < minRecordSecret {
		bad("record_secret", "is %d bytes, want at least %d (for example the output of openssl rand -hex 32)", n, minRecordSecret)
	}
	if a.FSRoot != "" && !strings.HasPrefix(a.FSRoot, "/") {
		bad("fs_root", "%q is not an absolute path", a.FSRoot)
	}
	if e := a.S3.Endpoint; e != "" && !validEndpoint(e) {
		bad("s3.endpoint", "%q is not host:port or an http(s) URL without path", safetext.Redact(e))
	}
	return errs
}
