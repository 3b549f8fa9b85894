package config

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
)

// Options tune a load.
type Options struct {
	// Strict makes unknown keys fatal (the --strict-config flag); the file's
	// config.strict and StrictEnv can also ask for it.
	Strict bool
}

// Warning is one thing a load found worth telling but not fatal.
type Warning struct {
	// Text names the key or variable and what TC does with it.
	Text string
	// Env marks a warning about the environment, which a reload cannot
	// change: it is logged once, at start.
	Env bool
}

// Provenance is what a load found besides the values: the file read, where
// each setting came from, and the warnings.
type Provenance struct {
	// Path is the file read, "" when none.
	Path string
	// Warnings are in the order found: file, environment, validation.
	Warnings []Warning
	// sources maps a setting's key to where its value came from; a key
	// not in it has its default.
	sources map[string]string
}

func (r *Provenance) warn(env bool, format string, args ...any) {
	r.Warnings = append(r.Warnings, Warning{Text: fmt.Sprintf(format, args...), Env: env})
}

func (r *Provenance) setSource(key, source string) {
	if r.sources == nil {
		r.sources = map[string]string{}
	}
	r.sources[key] = source
}

// Source says where the setting key got its value: "default", the file
// and line ("/etc/x/conf.yaml:12"), or the variable ("env CUBE_MASTER_ADDR").
func (r *Provenance) Source(key string) string {
	if s, ok := r.sources[key]; ok {
		return s
	}
	return "default"
}

// Load builds the configuration from the file named by PathEnv (defaults
// alone when unset) and the environment. Warnings (unknown keys, deprecated
// and ignored names) are logged to logger; errors name the key at fault.
func Load(env Env, logger *slog.Logger) (*Config, error) {
	cfg, rep, err := Read(env, Options{})
	rep.Log(logger, true)
	return cfg, err
}

// Log writes the report's warnings to logger; withEnv false leaves out
// those about the environment, already logged at start.
func (r *Provenance) Log(logger *slog.Logger, withEnv bool) {
	for _, w := range r.Warnings {
		switch {
		case w.Env && !withEnv:
		case w.Env || r.Path == "":
			logger.Warn("config: " + w.Text)
		default:
			logger.Warn("config: "+w.Text, "path", r.Path)
		}
	}
}

// Read builds the configuration as Load does and returns it with its
// Report, which is never nil, also when the configuration is invalid:
// `templatecenter check-config` and serve both read through it.
func Read(env Env, opts Options) (*Config, *Provenance, error) {
	rep := &Provenance{}
	cfg := Default()
	path, warning := configPath(env)
	if warning != "" {
		rep.warn(true, "%s", warning)
	}
	strict, strictSource := opts.Strict, "flag --strict-config"
	if v, ok := env(StrictEnv); ok && strings.TrimSpace(v) != "" {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return nil, rep, fmt.Errorf("%s: %q is not a boolean", StrictEnv, v)
		}
		if b && !strict {
			strict, strictSource = true, "env "+StrictEnv
		}
	}
	if path != "" {
		rep.Path = path
		data, fi, err := readConfigFile(path)
		if err != nil {
			return nil, rep, fmt.Errorf("read config %s: %w", path, err)
		}
		if err := cfg.parse(bytes.NewReader(data), path, strict, rep); err != nil {
			return nil, rep, fmt.Errorf("config %s: %w", path, err)
		}
		for _, w := range cfg.fileSecretWarnings(path, fi) {
			rep.warn(false, "%s", w)
		}
	}
	if strict {
		// What is in force, as every setting shows: the flag or the
		// variable wins over the file's config.strict.
		cfg.ConfigFile.Strict = true
		rep.setSource("config.strict", strictSource)
	}
	cfg.applyEnv(env, rep)
	if err := cfg.Validate(); err != nil {
		return nil, rep, err
	}
	for _, w := range cfg.plainTransportWarnings() {
		rep.warn(false, "%s", w)
	}
	for _, w := range cfg.Registry.reachWarnings() {
		rep.warn(false, "%s", w)
	}
	return cfg, rep, nil
}

// readConfigFile returns the file's content and its mode, from the same
// open file.
func readConfigFile(path string) ([]byte, os.FileInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	data, err := io.ReadAll(f)
	return data, fi, err
}
