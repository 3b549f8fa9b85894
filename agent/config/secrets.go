package config

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// CredentialsDirEnv is set by systemd to the directory holding the unit's
// credentials (LoadCredential=, SetCredential=, LoadCredentialEncrypted=).
const CredentialsDirEnv = "CREDENTIALS_DIRECTORY"

// FileSuffix turns a secret's variable into the one naming a file that holds
// the secret: CUBE_TEMPLATE_CENTER_DB_PASSWORD_FILE.
const FileSuffix = "_FILE"

// secretSpec is one credential the agent accepts from several sources. The
// first source that yields a value wins:
//
//  1. the variable Env (then each of Aliases, deprecated);
//  2. the file named by Env+FileSuffix (a trailing newline is trimmed);
//  3. the systemd credential named Env, in $CREDENTIALS_DIRECTORY;
//  4. the config file, at Key.
type secretSpec struct {
	// Env is the variable, and the name of the _FILE variable and of the
	// systemd credential derived from it.
	Env string
	// Aliases are deprecated variable names, read after Env.
	Aliases []string
	// Key is where conf.yaml holds it, "" when the file cannot.
	Key string
	// Public marks an identifier that only works with a secret (an access
	// key id): it takes the same sources, but a world-readable file holding
	// it earns no warning.
	Public bool
	// field points into the configuration; a Secret converts to *string.
	field func(*Config) *string
}

// secrets are every credential of the configuration. A new one is one line
// here (and a Secret field with its yaml key).
var secrets = []secretSpec{
	{Env: "CUBE_TEMPLATE_CALLBACK_TOKEN", Aliases: []string{"CUBE_TC_CALLBACK_TOKEN"},
		field: func(c *Config) *string { return &c.Master.Token }},
	{Env: "CUBE_S3_ACCESS_KEY_ID", Aliases: []string{"CUBE_S3_ACCESS_KEY"}, Key: "artifact_store.s3.access_key_id", Public: true,
		field: func(c *Config) *string { return &c.ArtifactStore.S3.AccessKeyID }},
	{Env: "CUBE_S3_SECRET_ACCESS_KEY", Aliases: []string{"CUBE_S3_SECRET_KEY"}, Key: "artifact_store.s3.secret_access_key",
		field: func(c *Config) *string { return (*string)(&c.ArtifactStore.S3.SecretAccessKey) }},
	{Env: "CUBE_S3_SESSION_TOKEN", Key: "artifact_store.s3.session_token",
		field: func(c *Config) *string { return (*string)(&c.ArtifactStore.S3.SessionToken) }},
	{Env: "CUBE_TEMPLATE_CENTER_DB_PASSWORD", Key: "instance_db_config.pwd",
		field: func(c *Config) *string { return (*string)(&c.InstanceDB.Pwd) }},
	{Env: "CUBE_TEMPLATE_CENTER_REDIS_PASSWORD", Key: "redis.password",
		field: func(c *Config) *string { return (*string)(&c.Redis.Password) }},
	{Env: "CUBE_TEMPLATE_CENTER_RECORD_SECRET", Key: "artifact_store.record_secret",
		field: func(c *Config) *string { return (*string)(&c.ArtifactStore.RecordSecret) }},
}

// worldReadable reports whether others (neither owner nor group) may read
// the file at fi.
func worldReadable(fi fs.FileInfo) bool { return fi.Mode().Perm()&0o004 != 0 }

// fileSecretWarnings names the secrets the config file at path holds when
// any user on the host may read it: they belong in a 0640 file, or in the
// environment or a credential.
func (c *Config) fileSecretWarnings(path string, fi fs.FileInfo) []string {
	if !worldReadable(fi) {
		return nil
	}
	var warnings []string
	for _, s := range secrets {
		if s.Key != "" && !s.Public && *s.field(c) != "" {
			warnings = append(warnings, fmt.Sprintf("%s holds the secret %s and is readable by every user (mode %04o): "+
				"chmod 0640, or move it to %s, %s%s or the credential %s", path, s.Key, fi.Mode().Perm(), s.Env, s.Env, FileSuffix, s.Env))
		}
	}
	return warnings
}

// applySecrets sets every secret from the first source that has it (see
// secretSpec), recording warnings (deprecated names, world-readable files)
// and sources in rep. It returns errors for files named but unreadable;
// neither ever holds a secret's value.
func (c *Config) applySecrets(env Env, rep *Provenance) (errs []error) {
	credDir, _ := env(CredentialsDirEnv)
	credDir = strings.TrimSpace(credDir)
	for _, s := range secrets {
		v, source, warn, err := s.lookup(env, credDir)
		if warn != "" {
			rep.warn(true, "%s", warn)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if v != "" {
			*s.field(c) = v
			rep.setSource(s.settingKey(), source)
		}
	}
	return errs
}

// settingKey is the secret's key in the effective configuration: its file
// key, or master.token for the token the file cannot hold.
func (s secretSpec) settingKey() string {
	if s.Key != "" {
		return s.Key
	}
	return "master.token"
}

// lookup returns the secret from the environment, its _FILE or its
// credential, with where it came from, or "" to keep the config file's
// value.
func (s secretSpec) lookup(env Env, credDir string) (value, source, warning string, err error) {
	for i, name := range append([]string{s.Env}, s.Aliases...) {
		if v, ok := env(name); ok && strings.TrimSpace(v) != "" {
			if i > 0 {
				warning = fmt.Sprintf("%s is deprecated, use %s", name, s.Env)
			}
			return strings.TrimSpace(v), "env " + name, warning, nil
		}
	}
	fileVar := s.Env + FileSuffix
	if path, ok := env(fileVar); ok && strings.TrimSpace(path) != "" {
		path = strings.TrimSpace(path)
		v, fi, err := readSecretFile(path)
		if err != nil {
			return "", "", "", fmt.Errorf("%s: %w", fileVar, err)
		}
		if worldReadable(fi) && !s.Public {
			warning = fmt.Sprintf("%s names %s, which is readable by every user (mode %04o): chmod 0600 or 0640",
				fileVar, path, fi.Mode().Perm())
		}
		return v, "env " + fileVar + " (" + path + ")", warning, nil
	}
	if credDir != "" {
		path := filepath.Join(credDir, s.Env)
		v, _, err := readSecretFile(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return "", "", "", fmt.Errorf("systemd credential %s: %w", s.Env, err)
		default:
			return v, "systemd credential " + s.Env, "", nil
		}
	}
	return "", "", "", nil
}

// readSecretFile reads a secret from path, without its trailing newline.
// Errors name the path, never the content; an empty secret is an error, as
// it is surely a mistake.
func readSecretFile(path string) (string, fs.FileInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", nil, fmt.Errorf("read secret file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", nil, fmt.Errorf("read secret file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return "", nil, fmt.Errorf("read secret file %s: not a regular file", path)
	}
	const maxSecret = 64 << 10 // far above any password or key
	data, err := io.ReadAll(io.LimitReader(f, maxSecret+1))
	if err != nil {
		return "", nil, fmt.Errorf("read secret file %s: %w", path, err)
	}
	if len(data) > maxSecret {
		return "", nil, fmt.Errorf("read secret file %s: larger than %d bytes", path, maxSecret)
	}
	v := strings.TrimRight(string(data), "\r\n")
	if v == "" {
		return "", nil, fmt.Errorf("read secret file %s: empty", path)
	}
	return v, fi, nil
}
