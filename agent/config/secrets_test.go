package config

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// secretsYAML enables the database, Redis and the S3 store, and puts every
// secret the file may hold (each Key of the table, so a new secret is
// covered too) in it, as "yaml-" and its variable.
func secretsYAML(t *testing.T) string {
	t.Helper()
	doc := map[string]any{
		"instance_db_config": map[string]any{"driver": "mysql", "addr": "db.example:3306", "user": "cube", "db_name": "cube"},
		"redis":              map[string]any{"nodes": []string{"redis.example:6379"}},
		"artifact_store":     map[string]any{"s3": map[string]any{"endpoint": "s3.example:9000", "bucket": "b"}},
	}
	for _, s := range secrets {
		if s.Key == "" {
			continue
		}
		parts := strings.Split(s.Key, ".")
		m := doc
		for _, p := range parts[:len(parts)-1] {
			next, ok := m[p].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[p] = next
			}
			m = next
		}
		m[parts[len(parts)-1]] = "yaml-" + s.Env
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// clearSecretEnv blanks every variable a secret is read from (blank counts
// as unset), so the test's own environment cannot leak in.
func clearSecretEnv(t *testing.T) {
	t.Helper()
	t.Setenv(CredentialsDirEnv, "")
	t.Setenv(PathEnv, "")
	for _, s := range secrets {
		for _, name := range append([]string{s.Env, s.Env + FileSuffix}, s.Aliases...) {
			t.Setenv(name, "")
		}
	}
}

// writeFile writes content at dir/name with mode and returns the path.
func writeFile(t *testing.T, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // past the umask
		t.Fatal(err)
	}
	return path
}

// loadEnv loads the configuration from the process environment (set with
// t.Setenv) and returns it with what was logged.
func loadEnv(t *testing.T) (*Config, string, error) {
	t.Helper()
	var logs bytes.Buffer
	c, err := Load(os.LookupEnv, slog.New(slog.NewTextHandler(&logs, nil)))
	return c, logs.String(), err
}

// TestSecretSourcesAndPrecedence reads every secret from each source, with
// every lower-ranked source also set: variable > _FILE > credential >
// config file.
func TestSecretSourcesAndPrecedence(t *testing.T) {
	for _, s := range secrets {
		t.Run(s.Env, func(t *testing.T) {
			wantYAML := ""
			if s.Key != "" {
				wantYAML = "yaml-" + s.Env
			}
			// Each source adds itself on top of the ones before it.
			sources := []struct {
				name string
				set  func(t *testing.T, dir string)
				want string
			}{
				{"ConfigFile", func(*testing.T, string) {}, wantYAML},
				{"Credential", func(t *testing.T, dir string) {
					creds := filepath.Join(dir, "creds")
					if err := os.Mkdir(creds, 0o700); err != nil {
						t.Fatal(err)
					}
					writeFile(t, creds, s.Env, "cred-"+s.Env+"\n", 0o400)
					t.Setenv(CredentialsDirEnv, creds)
				}, "cred-" + s.Env},
				{"File", func(t *testing.T, dir string) {
					t.Setenv(s.Env+FileSuffix, writeFile(t, dir, "secret", "file-"+s.Env+"\r\n\n", 0o600))
				}, "file-" + s.Env},
				{"Variable", func(t *testing.T, _ string) { t.Setenv(s.Env, " env-"+s.Env+" ") }, "env-" + s.Env},
			}
			for i, src := range sources {
				t.Run(src.name, func(t *testing.T) {
					clearSecretEnv(t)
					dir := t.TempDir()
					t.Setenv(PathEnv, writeFile(t, dir, "conf.yaml", secretsYAML(t), 0o640))
					for _, lower := range sources[:i+1] {
						lower.set(t, dir)
					}
					c, logs, err := loadEnv(t)
					if err != nil {
						t.Fatalf("Load: %v", err)
					}
					if got := *s.field(c); got != src.want {
						t.Errorf("%s = %q, want %q", s.Env, got, src.want)
					}
					if strings.Contains(logs, src.want) && src.want != "" {
						t.Errorf("the log holds the secret %q:\n%s", src.want, logs)
					}
				})
			}
		})
	}
}

// TestSecretFileErrorsNameVariableAndPath fails the load when a _FILE or a
// credential cannot be read, naming where it looked and never a value.
func TestSecretFileErrorsNameVariableAndPath(t *testing.T) {
	for _, s := range secrets {
		t.Run(s.Env, func(t *testing.T) {
			dir := t.TempDir()
			cases := []struct {
				name, path string
			}{
				{"Missing", filepath.Join(dir, "no-such-file")},
				{"Directory", dir},
				{"Empty", writeFile(t, dir, "empty", "\n", 0o600)},
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					clearSecretEnv(t)
					t.Setenv(s.Env+FileSuffix, tc.path)
					_, _, err := loadEnv(t)
					if err == nil {
						t.Fatalf("Load with %s%s=%s succeeded", s.Env, FileSuffix, tc.path)
					}
					for _, want := range []string{s.Env + FileSuffix, tc.path} {
						if !strings.Contains(err.Error(), want) {
							t.Errorf("Load error %q does not name %q", err, want)
						}
					}
				})
			}
			t.Run("Credential", func(t *testing.T) {
				clearSecretEnv(t)
				creds := t.TempDir()
				if err := os.Mkdir(filepath.Join(creds, s.Env), 0o700); err != nil {
					t.Fatal(err)
				}
				t.Setenv(CredentialsDirEnv, creds)
				_, _, err := loadEnv(t)
				if err == nil || !strings.Contains(err.Error(), "credential "+s.Env) {
					t.Fatalf("Load with an unreadable credential = %v, want an error naming credential %s", err, s.Env)
				}
			})
		})
	}
	t.Run("ValueNeverInError", func(t *testing.T) {
		clearSecretEnv(t)
		dir := t.TempDir()
		const value = "hunter2-value"
		t.Setenv("CUBE_TEMPLATE_CENTER_DB_PASSWORD_FILE", writeFile(t, dir, "big", value+strings.Repeat("x", 65<<10), 0o600))
		_, _, err := loadEnv(t)
		if err == nil || strings.Contains(err.Error(), value) {
			t.Fatalf("Load with an oversized secret file = %v, want an error without its content", err)
		}
	})
}

// TestSecretWorldReadableWarnings warns, naming the file and the key or
// variable but never the value, when a secret sits in a file every user
// may read.
func TestSecretWorldReadableWarnings(t *testing.T) {
	t.Run("ConfigFile", func(t *testing.T) {
		clearSecretEnv(t)
		path := writeFile(t, t.TempDir(), "conf.yaml", secretsYAML(t), 0o644)
		t.Setenv(PathEnv, path)
		_, logs, err := loadEnv(t)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range secrets {
			if s.Key == "" {
				continue
			}
			line := lineWith(logs, "secret "+s.Key+" ")
			if s.Public {
				if line != "" {
					t.Errorf("warning for the identifier %s, which is no secret: %s", s.Key, line)
				}
				continue
			}
			if line == "" || !strings.Contains(line, path) || !strings.Contains(line, "level=WARN") {
				t.Errorf("no warning naming %s and %s in:\n%s", path, s.Key, logs)
			}
		}
		if strings.Contains(logs, "yaml-") {
			t.Errorf("a warning holds a secret's value:\n%s", logs)
		}
	})
	t.Run("ConfigFileGroupOnly", func(t *testing.T) {
		clearSecretEnv(t)
		t.Setenv(PathEnv, writeFile(t, t.TempDir(), "conf.yaml", secretsYAML(t), 0o640))
		_, logs, err := loadEnv(t)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(logs, "readable by every user") {
			t.Errorf("warning for a 0640 file:\n%s", logs)
		}
	})
	t.Run("SecretFile", func(t *testing.T) {
		clearSecretEnv(t)
		dir := t.TempDir()
		const value = "redis-file-value"
		path := writeFile(t, dir, "redis-password", value+"\n", 0o644)
		t.Setenv("CUBE_TEMPLATE_CENTER_REDIS_PASSWORD_FILE", path)
		private := writeFile(t, dir, "db-password", "db-file-value\n", 0o600)
		t.Setenv("CUBE_TEMPLATE_CENTER_DB_PASSWORD_FILE", private)
		_, logs, err := loadEnv(t)
		if err != nil {
			t.Fatal(err)
		}
		line := lineWith(logs, "CUBE_TEMPLATE_CENTER_REDIS_PASSWORD_FILE")
		if line == "" || !strings.Contains(line, path) || strings.Contains(logs, value) {
			t.Errorf("want one warning naming the variable and %s, without the value, in:\n%s", path, logs)
		}
		if strings.Contains(logs, private) {
			t.Errorf("warning for a 0600 file:\n%s", logs)
		}
	})
}

// lineWith returns the first line of logs containing s, or "".
func lineWith(logs, s string) string {
	for line := range strings.SplitSeq(logs, "\n") {
		if strings.Contains(line, s) {
			return line
		}
	}
	return ""
}
