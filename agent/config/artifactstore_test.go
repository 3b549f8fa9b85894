package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// loadWith loads a config file with the given text (none when empty) and
// environment, returning the config and the log output.
func loadWith(t *testing.T, file string, env map[string]string) (*Config, string, error) {
	t.Helper()
	all := map[string]string{}
	if file != "" {
		path := filepath.Join(t.TempDir(), "conf.yaml")
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		all[PathEnv] = path
	}
	for k, v := range env {
		all[k] = v
	}
	var logs bytes.Buffer
	c, err := Load(envOf(all), slog.New(slog.NewTextHandler(&logs, nil)))
	return c, logs.String(), err
}

func TestArtifactStoreDefaults(t *testing.T) {
	c, logs, err := loadWith(t, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := ArtifactStore{Backend: "s3", FSRoot: "/data/CubeMaster/storage", PresignTTL: 168 * time.Hour,
		PartSize: 16 << 20, UploadConcurrency: 4, Attempts: 5, PartStallTimeout: 2 * time.Minute, KeepLocal: true}
	if c.ArtifactStore != want {
		t.Errorf("defaults = %+v; want %+v", c.ArtifactStore, want)
	}
	if got := c.ArtifactStore.Enabled(); got != "" {
		t.Errorf("Enabled() with nothing configured = %q; want \"\"", got)
	}
	if logs != "" {
		t.Errorf("defaults logged warnings:\n%s", logs)
	}
}

func TestArtifactStoreFileAndEnv(t *testing.T) {
	const file = `
store:
  dir: /srv/store
artifact_store:
  backend: s3
  fs_root: /srv/blobs
  presign_ttl: 24h
  part_size: 64MiB
  upload_concurrency: 2
  attempts: 7
  part_stall_timeout: 30s
  keep_local: false
  s3:
    endpoint: https://s3.file.example
    bucket: file-bucket
    access_key_id: file-key
    secret_access_key: file-secret
    region: eu-west-1
    use_path_style: true
    use_ssl: true
    prefix: file/prefix
`
	fromFile := ArtifactStore{Backend: "s3", FSRoot: "/srv/blobs", PresignTTL: 24 * time.Hour, PartSize: 64 << 20,
		UploadConcurrency: 2, Attempts: 7, PartStallTimeout: 30 * time.Second, KeepLocal: false, S3: S3{Endpoint: "https://s3.file.example",
			Bucket: "file-bucket", AccessKeyID: "file-key", SecretAccessKey: "file-secret", Region: "eu-west-1",
			UsePathStyle: true, UseSSL: true, Prefix: "file/prefix"}}
	cases := []struct {
		name string
		env  map[string]string
		edit func(*ArtifactStore)
		warn string
	}{
		{"FileOnly", nil, func(*ArtifactStore) {}, ""},
		{"Backend", map[string]string{"CUBE_ARTIFACT_STORE_BACKEND": "FS"}, func(a *ArtifactStore) { a.Backend = "fs" }, ""},
		{"FSRoot", map[string]string{"CUBE_ARTIFACT_STORE_FS_ROOT": "/env/root"}, func(a *ArtifactStore) { a.FSRoot = "/env/root" }, ""},
		{"Endpoint", map[string]string{"CUBE_S3_ENDPOINT": "minio:9000"}, func(a *ArtifactStore) { a.S3.Endpoint = "minio:9000" }, ""},
		{"Bucket", map[string]string{"CUBE_S3_BUCKET": "env-bucket"}, func(a *ArtifactStore) { a.S3.Bucket = "env-bucket" }, ""},
		{"AccessKeyID", map[string]string{"CUBE_S3_ACCESS_KEY_ID": "env-key", "CUBE_S3_ACCESS_KEY": "legacy-key"},
			func(a *ArtifactStore) { a.S3.AccessKeyID = "env-key" }, ""},
		{"LegacyAccessKey", map[string]string{"CUBE_S3_ACCESS_KEY": "legacy-key"},
			func(a *ArtifactStore) { a.S3.AccessKeyID = "legacy-key" }, "CUBE_S3_ACCESS_KEY is deprecated, use CUBE_S3_ACCESS_KEY_ID"},
		{"Secret", map[string]string{"CUBE_S3_SECRET_ACCESS_KEY": "env-secret"},
			func(a *ArtifactStore) { a.S3.SecretAccessKey = "env-secret" }, ""},
		{"LegacySecret", map[string]string{"CUBE_S3_SECRET_KEY": "legacy-secret"},
			func(a *ArtifactStore) { a.S3.SecretAccessKey = "legacy-secret" }, "CUBE_S3_SECRET_KEY is deprecated, use CUBE_S3_SECRET_ACCESS_KEY"},
		{"SessionToken", map[string]string{"CUBE_S3_SESSION_TOKEN": "env-token"},
			func(a *ArtifactStore) { a.S3.SessionToken = "env-token" }, ""},
		{"Region", map[string]string{"CUBE_S3_REGION": "us-east-1"}, func(a *ArtifactStore) { a.S3.Region = "us-east-1" }, ""},
		{"PathStyle", map[string]string{"CUBE_S3_USE_PATH_STYLE": "off"}, func(a *ArtifactStore) { a.S3.UsePathStyle = false }, ""},
		{"SSL", map[string]string{"CUBE_S3_USE_SSL": "no"}, func(a *ArtifactStore) { a.S3.UseSSL = false }, ""},
		{"Prefix", map[string]string{"CUBE_S3_ARTIFACT_PREFIX": "/env/"}, func(a *ArtifactStore) { a.S3.Prefix = "/env/" }, ""},
		{"UnknownBackend", map[string]string{"CUBE_ARTIFACT_STORE_BACKEND": "gcs"}, func(*ArtifactStore) {},
			`artifact_store.backend \"gcs\" is neither s3 nor fs; using s3`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, logs, err := loadWith(t, file, c.env)
			if err != nil {
				t.Fatal(err)
			}
			want := fromFile
			c.edit(&want)
			if cfg.ArtifactStore != want {
				t.Errorf("ArtifactStore = %+v\nwant %+v", cfg.ArtifactStore, want)
			}
			if c.warn != "" && !strings.Contains(logs, c.warn) {
				t.Errorf("logs lack %q:\n%s", c.warn, logs)
			}
			if c.warn == "" && logs != "" {
				t.Errorf("unexpected warnings:\n%s", logs)
			}
		})
	}
}

func TestArtifactStoreFlags(t *testing.T) {
	for v, want := range map[string]bool{"1": true, "true": true, "YES": true, "on": true, "0": false, "false": false, "no": false, "Off": false} {
		for _, name := range []string{"CUBE_S3_USE_SSL", "CUBE_S3_USE_PATH_STYLE"} {
			c, _, err := loadWith(t, "artifact_store:\n  s3:\n    use_ssl: "+fmt.Sprint(!want)+"\n    use_path_style: "+fmt.Sprint(!want)+"\n",
				map[string]string{name: v})
			if err != nil {
				t.Fatalf("%s=%s: %v", name, v, err)
			}
			got := c.ArtifactStore.S3.UseSSL
			if name == "CUBE_S3_USE_PATH_STYLE" {
				got = c.ArtifactStore.S3.UsePathStyle
			}
			if got != want {
				t.Errorf("%s=%s gave %v; want %v", name, v, got, want)
			}
		}
	}
	// Upstream reads any other value as false: so does TC, with a word.
	c, logs, err := loadWith(t, "artifact_store:\n  s3:\n    use_ssl: true\n", map[string]string{"CUBE_S3_USE_SSL": "maybe"})
	if err != nil || c.ArtifactStore.S3.UseSSL || !strings.Contains(logs, `CUBE_S3_USE_SSL=\"maybe\" is not one of`) {
		t.Errorf("CUBE_S3_USE_SSL=maybe: %v, use_ssl %v; want false and a warning naming the variable:\n%s", err,
			c != nil && c.ArtifactStore.S3.UseSSL, logs)
	}
}

// TestSessionTokenWithoutKeys: a session token alone would be dropped
// silently; it is named instead.
func TestSessionTokenWithoutKeys(t *testing.T) {
	const token = "session-token-value"
	_, logs, err := loadWith(t, "", map[string]string{"CUBE_S3_ENDPOINT": "minio:9000", "CUBE_S3_BUCKET": "b",
		"CUBE_S3_SESSION_TOKEN": token})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs, "CUBE_S3_SESSION_TOKEN") || !strings.Contains(logs, "ignored") || strings.Contains(logs, token) {
		t.Errorf("logs = %s; want a warning naming CUBE_S3_SESSION_TOKEN, without its value", logs)
	}
}

func TestArtifactStoreEnabled(t *testing.T) {
	full := map[string]string{"CUBE_S3_ENDPOINT": "minio:9000", "CUBE_S3_BUCKET": "b",
		"CUBE_S3_ACCESS_KEY_ID": "key-value", "CUBE_S3_SECRET_ACCESS_KEY": "secret-value"}
	without := func(name string) map[string]string {
		m := map[string]string{}
		for k, v := range full {
			if k != name {
				m[k] = v
			}
		}
		return m
	}
	cases := []struct {
		name    string
		env     map[string]string
		want    string
		missing string
	}{
		{"Full", full, "s3", ""},
		{"Nothing", nil, "", ""},
		{"NoEndpoint", without("CUBE_S3_ENDPOINT"), "", "endpoint (CUBE_S3_ENDPOINT)"},
		{"NoBucket", without("CUBE_S3_BUCKET"), "", "bucket (CUBE_S3_BUCKET)"},
		{"NoKeyID", without("CUBE_S3_ACCESS_KEY_ID"), "", "access_key_id (CUBE_S3_ACCESS_KEY_ID)"},
		{"NoSecret", without("CUBE_S3_SECRET_ACCESS_KEY"), "", "secret_access_key (CUBE_S3_SECRET_ACCESS_KEY)"},
		// Without static keys the AWS credential chain signs.
		{"NoKeys", map[string]string{"CUBE_S3_ENDPOINT": "minio:9000", "CUBE_S3_BUCKET": "b"}, "s3", ""},
		{"KeysOnly", map[string]string{"CUBE_S3_ACCESS_KEY_ID": "key-value", "CUBE_S3_SECRET_ACCESS_KEY": "secret-value"},
			"", "endpoint (CUBE_S3_ENDPOINT)"},
		{"FS", map[string]string{"CUBE_ARTIFACT_STORE_BACKEND": "fs"}, "fs", ""},
		{"FSWithPartialS3", map[string]string{"CUBE_ARTIFACT_STORE_BACKEND": "fs", "CUBE_S3_BUCKET": "b"}, "fs", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, logs, err := loadWith(t, "", c.env)
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.ArtifactStore.Enabled(); got != c.want {
				t.Errorf("Enabled() = %q; want %q", got, c.want)
			}
			if c.missing != "" && (!strings.Contains(logs, "incomplete") || !strings.Contains(logs, c.missing)) {
				t.Errorf("logs do not name the missing %s:\n%s", c.missing, logs)
			}
			if c.missing == "" && logs != "" {
				t.Errorf("unexpected warnings:\n%s", logs)
			}
			for _, value := range []string{"minio:9000", "key-value", "secret-value"} {
				if strings.Contains(logs, value) {
					t.Errorf("logs show the value %q:\n%s", value, logs)
				}
			}
		})
	}
}

func TestArtifactStoreInvalidValuesNameTheirKey(t *testing.T) {
	for doc, want := range map[string]string{
		"artifact_store:\n  presign_ttl: 0s\n":                      "artifact_store.presign_ttl",
		"artifact_store:\n  presign_ttl: 169h\n":                    "artifact_store.presign_ttl",
		"artifact_store:\n  part_size: 1MiB\n":                      "artifact_store.part_size",
		"artifact_store:\n  part_size: 6GiB\n":                      "artifact_store.part_size",
		"artifact_store:\n  upload_concurrency: 0\n":                "artifact_store.upload_concurrency",
		"artifact_store:\n  attempts: 0\n":                          "artifact_store.attempts",
		"artifact_store:\n  fs_root: relative\n":                    "artifact_store.fs_root",
		"artifact_store:\n  s3:\n    endpoint: ftp://host\n":        "artifact_store.s3.endpoint",
		"artifact_store:\n  s3:\n    endpoint: host:9000/path\n":    "artifact_store.s3.endpoint",
		"artifact_store:\n  s3:\n    endpoint: http://h:1/bucket\n": "artifact_store.s3.endpoint",
		"artifact_store:\n  s3:\n    typo: 1\n":                     "",
	} {
		_, logs, err := loadWith(t, doc, nil)
		if want == "" {
			if err != nil || !strings.Contains(logs, "artifact_store.s3.typo") {
				t.Errorf("config %q: error %v, logs %q; want a warning for the unknown key", doc, err, logs)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config %q: error %v; want it to mention %q", doc, err, want)
		}
	}
	for _, ok := range []string{"minio:9000", "http://minio:9000", "https://s3.example.com/"} {
		if _, _, err := loadWith(t, "artifact_store:\n  s3:\n    endpoint: "+ok+"\n", nil); err != nil {
			t.Errorf("endpoint %q refused: %v", ok, err)
		}
	}
}

func TestArtifactStoreSecretNeverPrints(t *testing.T) {
	const secret = "very-secret-s3-key-0123"
	c, _, err := loadWith(t, "", map[string]string{"CUBE_S3_SECRET_ACCESS_KEY": secret})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.ArtifactStore.S3.SecretAccessKey.Reveal(); got != secret {
		t.Fatalf("Reveal() = %q; want the secret", got)
	}
	var logs bytes.Buffer
	slog.New(slog.NewTextHandler(&logs, nil)).Info("cfg", "store", c.ArtifactStore, "secret", c.ArtifactStore.S3.SecretAccessKey)
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("cfg", "s3", c.ArtifactStore.S3, "secret", c.ArtifactStore.S3.SecretAccessKey)
	y, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	j, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string]string{
		"%v": fmt.Sprintf("%v", c), "%+v": fmt.Sprintf("%+v", c), "%#v": fmt.Sprintf("%#v", c),
		//lint:ignore S1025 the verbs themselves are what is tested
		"%s": fmt.Sprintf("%s", c.ArtifactStore.S3.SecretAccessKey), "%q": fmt.Sprintf("%q", c.ArtifactStore.S3.SecretAccessKey),
		"yaml": string(y), "json": string(j), "slog": logs.String(),
	} {
		if strings.Contains(out, secret) {
			t.Errorf("%s output shows the secret:\n%s", name, out)
		}
		if !strings.Contains(out, "REDACTED") {
			t.Errorf("%s output does not show that a secret is set:\n%s", name, out)
		}
	}
	if s := fmt.Sprint(Secret("")); s != "" {
		t.Errorf("an unset secret prints as %q; want \"\"", s)
	}
}

func TestArtifactStoreRestartOnly(t *testing.T) {
	a, b := Default(), Default()
	b.ArtifactStore.S3.Bucket = "other"
	if keys := a.RestartOnly(b); len(keys) != 1 || keys[0] != "artifact_store" {
		t.Errorf("RestartOnly = %v; want [artifact_store]", keys)
	}
}

func TestArtifactStoreFSRootFollowsStoreDir(t *testing.T) {
	c, _, err := loadWith(t, "", map[string]string{"CUBE_ARTIFACT_STORE_BACKEND": "fs", "CUBE_TEMPLATE_CENTER_ARTIFACT_STORE_DIR": "/srv/store"})
	if err != nil {
		t.Fatal(err)
	}
	if c.ArtifactStore.FSRoot != "/srv/store" || c.ArtifactStore.Enabled() != "fs" {
		t.Errorf("fs_root = %q, Enabled() = %q; want the store dir /srv/store and fs", c.ArtifactStore.FSRoot, c.ArtifactStore.Enabled())
	}
}
