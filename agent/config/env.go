package config

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// PathEnv names the environment variable that locates the config file.
const PathEnv = "CUBE_TEMPLATE_CENTER_CONFIG_PATH"

// Env looks up an environment variable; os.LookupEnv in production.
type Env func(name string) (string, bool)

// LegacyPathEnv is upstream's name for PathEnv, still read after it.
const LegacyPathEnv = "CUBE_MASTER_CONFIG_PATH"

// StrictEnv, when true, makes unknown keys in the file fatal, as
// config.strict: true and the --strict-config flag do.
const StrictEnv = "CUBE_TEMPLATE_CENTER_STRICT_CONFIG"

// configPath returns the configuration file the environment names ("" for
// none): PathEnv, else upstream's LegacyPathEnv, with a warning then.
func configPath(env Env) (path, warning string) {
	if p, ok := env(PathEnv); ok && strings.TrimSpace(p) != "" {
		return strings.TrimSpace(p), ""
	}
	if p, ok := env(LegacyPathEnv); ok && strings.TrimSpace(p) != "" {
		return strings.TrimSpace(p), fmt.Sprintf("%s is deprecated, use %s", LegacyPathEnv, PathEnv)
	}
	return "", ""
}

// envOverride maps an environment variable (and its deprecated aliases) to
// a setter of the setting key.
type envOverride struct {
	key   string
	names []string
	set   func(c *Config, name, value string) error
	// fileOnly marks upstream variables for a setting TC reads from the
	// file only: every name is deprecated, and the warning names the key.
	fileOnly bool
	// raw passes set the value as written, for a variable upstream does
	// not trim; otherwise set gets it trimmed.
	raw bool
}

var envOverrides = []envOverride{
	{key: "master.addr", names: []string{"CUBE_MASTER_ADDR", "CUBE_TEMPLATE_CENTER_MASTER_ENDPOINT", "CUBE_MASTER_ENDPOINT"}, set: func(c *Config, _, v string) error { c.Master.Addr = v; return nil }},
	{key: "master.insecure_no_token", names: []string{"CUBE_TEMPLATE_CALLBACK_INSECURE_NO_TOKEN"}, set: func(c *Config, name, v string) error {
		// Upstream turns authentication off for "true" only: any other
		// value keeps it on, the safe reading.
		b, known := upstreamTrue(v)
		c.Master.InsecureNoToken = b
		if !known {
			return &fellBack{note: "not true, which upstream reads as false: the shared token stays required", applied: true}
		}
		return nil
	}},
	{key: "store.dir", names: []string{"CUBE_TEMPLATE_CENTER_ARTIFACT_STORE_DIR", "CUBEMASTER_ROOTFS_ARTIFACT_STORE_DIR"}, set: func(c *Config, _, v string) error { c.Store.Dir = v; return nil }},
	{key: "store.work_dir", names: []string{"CUBE_TEMPLATE_CENTER_WORK_DIR", "CUBE_TEMPLATE_CENTER_ARTIFACT_WORK_DIR", "CUBEMASTER_ROOTFS_ARTIFACT_DIR"}, set: func(c *Config, _, v string) error { c.Store.WorkDir = v; return nil }},
	{key: "spool.path", names: []string{"CUBE_TEMPLATE_CENTER_SPOOL_PATH"}, set: func(c *Config, _, v string) error { c.Spool.Path = v; return nil }},
	{key: "build.max_concurrent_builds", names: []string{"CUBE_TEMPLATE_CENTER_MAX_CONCURRENT_BUILDS", "CUBE_TC_MAX_CONCURRENT_BUILDS"}, set: func(c *Config, name, v string) error {
		n, ok := upstreamAtoi(v, true)
		if !ok {
			return ignored("not a whole number of at least 1, which upstream also ignores (build.max_concurrent_builds stays %d)",
				c.Build.MaxConcurrentBuilds)
		}
		// Upstream has no cap; TC's bounds what one node may run.
		return capTo(n, maxConcurrentBuilds, &c.Build.MaxConcurrentBuilds, "TC's limit")
	}},
	{key: "build.start_check", names: []string{"CUBE_TEMPLATE_CENTER_START_CHECK"}, set: func(c *Config, _, v string) error { c.Build.StartCheck = v; return nil }},
	// A pod's grace period is set in its spec: the drain follows it
	// without a config file of its own.
	{key: "shutdown.timeout", names: []string{"CUBE_TEMPLATE_CENTER_SHUTDOWN_TIMEOUT"}, set: func(c *Config, name, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("%s: %q is not a duration (such as 50s)", name, v)
		}
		c.Shutdown.Timeout = d
		return nil
	}},
}

// allEnvOverrides are every section's environment overrides, in the order
// they apply.
func allEnvOverrides() []envOverride {
	return slices.Concat(envOverrides, artifactStoreEnv, replicasEnv, upstreamEnv)
}

// EnvNames returns the environment variables that set the setting key,
// the preferred name first; none for a setting only the file holds.
func EnvNames(key string) []string {
	var names []string
	for _, o := range allEnvOverrides() {
		if o.key == key {
			names = append(names, o.names...)
		}
	}
	return names
}

// applyEnv applies environment overrides; the first non-blank name of each
// group wins, and a deprecated name earns a warning, as does a group whose
// names disagree. Upstream variables TC has no use for are reported
// ignored. Parse errors are recorded and surface from Validate.
func (c *Config) applyEnv(env Env, rep *Provenance) {
	for _, o := range allEnvOverrides() {
		c.applyOverride(o, env, rep)
	}
	warnIgnoredEnv(env, rep)
	// Secrets come before resolve, which needs the S3 keys.
	c.envErrs = append(c.envErrs, c.applySecrets(env, rep)...)
	for _, w := range c.ArtifactStore.resolve(c.Store.Dir) {
		rep.warn(false, "%s", w)
	}
}

// applyOverride applies the first non-blank variable of o's group, as
// applyEnv says.
func (c *Config) applyOverride(o envOverride, env Env, rep *Provenance) {
	var used, usedValue string
	for i, name := range o.names {
		v, ok := env(name)
		if !ok || strings.TrimSpace(v) == "" {
			continue
		}
		raw := v
		v = strings.TrimSpace(v)
		if used != "" {
			if v != usedValue {
				rep.warn(true, "%s=%q and %s=%q disagree: %s wins", used, usedValue, name, v, used)
			}
			continue
		}
		used, usedValue = name, v
		if o.raw {
			v = raw
		}
		err := o.set(c, name, v)
		var fb *fellBack
		switch {
		case errors.As(err, &fb):
			// Upstream's rule decided: a warning, never an error.
			rep.warn(true, "%s=%q is %s", name, safetext.Redact(raw), fb.note)
			if !fb.applied {
				continue
			}
		case err != nil:
			c.envErrs = append(c.envErrs, err)
		}
		switch {
		case o.fileOnly:
			rep.warn(true, "%s is deprecated: set %s in the configuration file (the variable is applied meanwhile, over the file)", name, o.key)
		case i > 0:
			rep.warn(true, "%s is deprecated, use %s", name, o.names[0])
		}
		rep.setSource(o.key, "env "+name)
	}
}

// warnIgnoredEnv reports each of upstream's variables TC has no use for
// that is set.
func warnIgnoredEnv(env Env, rep *Provenance) {
	for _, ig := range ignoredEnv {
		for _, name := range ig.names {
			if v, ok := env(name); ok && strings.TrimSpace(v) != "" {
				rep.warn(true, "%s is set but ignored: %s", name, ig.why)
			}
		}
	}
}
