package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
)

const (
	// sysconfDirEnv names the directory where the CLI looks for the
	// installed configuration instead of defaultSysconfDir: for a
	// relocated install, and for tests.
	sysconfDirEnv = "CUBE_TEMPLATE_CENTER_SYSCONF_DIR"
	// defaultSysconfDir is where the deb, the rpm and install.sh put
	// conf.yaml and templatecenter.env.
	defaultSysconfDir = "/etc/cube-templatecenter"
	// installedConfig and installedEnvFile are the service's files in the
	// sysconf directory (the unit's CUBE_TEMPLATE_CENTER_CONFIG_PATH and
	// EnvironmentFile=).
	installedConfig  = "conf.yaml"
	installedEnvFile = "templatecenter.env"
)

// installedEnv is the environment a CLI command run from a shell reads its
// configuration from, as the service would: the process's own variables
// first, then the installed env file, then the installed conf.yaml as
// CUBE_TEMPLATE_CENTER_CONFIG_PATH. configPath and envFile, when set (the
// --config and --env-file flags), replace the installed files and must be
// readable. Installed files that exist but cannot be read (not root) are
// skipped with a note saying what is missing and why; notes never hold a
// value.
func installedEnv(lookup config.Env, configPath, envFile string) (env config.Env, notes []string, err error) {
	dir := defaultSysconfDir
	if d, ok := lookup(sysconfDirEnv); ok && strings.TrimSpace(d) != "" {
		dir = strings.TrimSpace(d)
	}
	fileVars := map[string]string{}
	if envFile != "" {
		if fileVars, err = readEnvFile(envFile); err != nil {
			return nil, nil, err
		}
	} else {
		path := filepath.Join(dir, installedEnvFile)
		vars, err := readEnvFile(path)
		switch {
		case err == nil:
			fileVars = vars
		case errors.Is(err, fs.ErrNotExist):
		case errors.Is(err, fs.ErrPermission):
			notes = append(notes, fmt.Sprintf("cannot read %s (permission denied; run as root, or pass --env-file): "+
				"its variables, such as %s, are not used", path, api.TokenEnv))
		default:
			return nil, nil, err
		}
	}
	if configPath == "" {
		if p, ok := lookup(config.PathEnv); ok && strings.TrimSpace(p) != "" {
			configPath = p
		} else if p := fileVars[config.PathEnv]; strings.TrimSpace(p) != "" {
			configPath = p
		} else {
			path := filepath.Join(dir, installedConfig)
			f, err := os.Open(path)
			switch {
			case err == nil:
				f.Close()
				configPath = path
			case errors.Is(err, fs.ErrNotExist):
			case errors.Is(err, fs.ErrPermission):
				notes = append(notes, fmt.Sprintf("cannot read %s (permission denied; run as root or as a member of "+
					"the group cube-templatecenter, or pass --config): built-in defaults apply", path))
			default:
				return nil, nil, fmt.Errorf("read config %s: %w", path, err)
			}
		}
	}
	env = func(name string) (string, bool) {
		if name == config.PathEnv && configPath != "" {
			return configPath, true
		}
		if v, ok := lookup(name); ok {
			return v, true
		}
		v, ok := fileVars[name]
		return v, ok
	}
	return env, notes, nil
}

// readEnvFile reads a systemd EnvironmentFile=: VAR=VALUE lines, "#" and
// ";" comments, values optionally in single or double quotes.
func readEnvFile(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read environment file: %w", err)
	}
	vars := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" || strings.ContainsAny(name, " \t") {
			// Not the value: the line may hold a secret.
			return nil, fmt.Errorf("environment file %s line %d: want VARIABLE=VALUE", path, n)
		}
		value = strings.TrimSpace(value)
		if len(value) >= 2 && (value[0] == '"' || value[0] == '\'') && value[len(value)-1] == value[0] {
			q := value[0]
			value = value[1 : len(value)-1]
			if q == '"' {
				value = strings.NewReplacer(`\"`, `"`, `\\`, `\`).Replace(value)
			}
		}
		vars[name] = value
	}
	return vars, sc.Err()
}
