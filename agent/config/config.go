// Package config loads the agent's configuration: built-in defaults, then the
// YAML file named by CUBE_TEMPLATE_CENTER_CONFIG_PATH, then environment
// overrides, then one validation pass whose errors name the offending key.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// PathEnv names the environment variable that locates the config file.
const PathEnv = "CUBE_TEMPLATE_CENTER_CONFIG_PATH"

// Config is the whole agent configuration.
type Config struct {
	Common   Common   `yaml:"common"`
	Log      Log      `yaml:"log"`
	Master   Master   `yaml:"master"`
	Store    Store    `yaml:"store"`
	Spool    Spool    `yaml:"spool"`
	Build    Build    `yaml:"build"`
	Registry Registry `yaml:"registry"`
	Shutdown Shutdown `yaml:"shutdown"`
	// ArtifactStore is the blob store for durable artifact copies.
	ArtifactStore ArtifactStore `yaml:"artifact_store"`
	// InstanceDB is CubeMaster's database; off unless its driver is set.
	InstanceDB InstanceDB `yaml:"instance_db_config"`
	// Replicas tunes the coordination with other replicas.
	Replicas Replicas `yaml:"replicas"`
	// Redis is CubeMaster's Redis, for live pull progress; off unless
	// nodes are listed.
	Redis Redis `yaml:"redis"`
	// ConfigFile tunes how the file itself is read (config:).
	ConfigFile ConfigFile `yaml:"config"`

	// envErrs collects environment values that failed to parse, reported
	// by Validate with the rest.
	envErrs []error
}

// Common holds the listener settings, under upstream's key names.
type Common struct {
	HTTPBind          string        `yaml:"http_bind"`
	HTTPPort          int           `yaml:"http_port"`
	MaxBodyBytes      ByteSize      `yaml:"max_body_bytes"`
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	ReadTimeout       time.Duration `yaml:"read_timeout"`
	// WriteTimeout bounds writing a response; streams (uploads) set their
	// own deadline.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// MaxUploadBytes and UploadTimeout bound POST /tc/api/v1/artifact/upload.
	MaxUploadBytes ByteSize      `yaml:"max_upload_bytes"`
	UploadTimeout  time.Duration `yaml:"upload_timeout"`
	// MaxConcurrentUploads bounds uploads in progress; more are answered
	// 429 with a Retry-After.
	MaxConcurrentUploads int `yaml:"max_concurrent_uploads"`
}

// ConfigFile tunes how the configuration file is read.
type ConfigFile struct {
	// Strict makes unknown keys fatal instead of warnings.
	Strict bool `yaml:"strict"`
}

// Log holds logging settings.
type Log struct {
	// Level is debug, info, warn or error.
	Level string `yaml:"level"`
	// Format is text or json.
	Format string `yaml:"format"`
}

// Master describes how status reports reach CubeMaster.
type Master struct {
	// Addr is CubeMaster's base URL for callbacks.
	Addr string `yaml:"addr"`
	// Token is the shared secret; normally set through the environment.
	Token string `yaml:"-"`
	// InsecureNoToken allows running without a shared secret.
	InsecureNoToken bool `yaml:"-"`
	// CallbackTimeout bounds one callback attempt.
	CallbackTimeout time.Duration `yaml:"callback_timeout"`
	// RetryInitial and RetryMax shape the exponential backoff.
	RetryInitial time.Duration `yaml:"retry_initial"`
	RetryMax     time.Duration `yaml:"retry_max"`
	// ProgressAttempts caps attempts for non-terminal reports; terminal
	// reports are retried until delivered.
	ProgressAttempts int `yaml:"progress_attempts"`
}

// Store is the shared artifact directory.
type Store struct {
	Dir string `yaml:"dir"`
	// WorkDir holds the layer cache and per-job scratch files.
	WorkDir string `yaml:"work_dir"`
	// MinFree is kept free on the store's filesystem: a build that would
	// write into it fails.
	MinFree Reserve `yaml:"min_free"`
}

// Spool locates the durable job database.
type Spool struct {
	Path string `yaml:"path"`
	// Retention is how long finished jobs are kept for re-submissions and
	// inspection.
	Retention time.Duration `yaml:"retention"`
	// MinFree is kept free on the spool's filesystem: below it /health
	// is not ready and submits answer 503, before a commit fails on a
	// full disk.
	MinFree Reserve `yaml:"min_free"`
}

// maxConcurrentBuilds is build.max_concurrent_builds' limit.
const maxConcurrentBuilds = 64

// Build tunes the executor and the rootfs builder.
type Build struct {
	MaxConcurrentBuilds int           `yaml:"max_concurrent_builds"`
	QueueSize           int           `yaml:"queue_size"`
	HeartbeatInterval   time.Duration `yaml:"heartbeat_interval"`
	// Timeout ends a job's build that runs longer: it fails, whatever it
	// waits on (a slow registry, an identical build in flight).
	Timeout time.Duration `yaml:"timeout"`
	// MaxAttempts fails a job that was interrupted (crash, stop) this many
	// times, so a job that kills the agent cannot loop forever.
	MaxAttempts     int      `yaml:"max_attempts"`
	CAPath          string   `yaml:"ca_path"`
	Platform        string   `yaml:"platform"`
	LayerCacheQuota ByteSize `yaml:"layer_cache_quota"`
	// LayerCacheZstd re-encodes cached gzip layers as zstd in the
	// background, so later builds of the same layers inflate them faster.
	LayerCacheZstd bool `yaml:"layer_cache_zstd"`
	DownloadJobs   int  `yaml:"download_jobs"`
	// DirectIO writes images of 128 MiB or more compressed, and reads them
	// back for their sha256, with direct I/O; off, every image goes
	// through the page cache (for a store whose file system accepts
	// O_DIRECT but serves it slowly).
	DirectIO bool `yaml:"direct_io"`
	// HeadroomPercent and HeadroomInodes leave room for the guest to write.
	HeadroomPercent int `yaml:"headroom_percent"`
	HeadroomInodes  int `yaml:"headroom_inodes"`
	// MaxEntries bounds the tar entries of one image, over all layers.
	MaxEntries int64 `yaml:"max_entries"`
	// MaxTreeMemory bounds the estimated memory of one image's file tree.
	MaxTreeMemory ByteSize `yaml:"max_tree_memory"`
	// MaxImageSize bounds the file content one image may expand to.
	MaxImageSize ByteSize `yaml:"max_image_size"`
	// StallTimeout ends a registry download that brings no data for this
	// long, or less than MinTransferRate over this long; it is tried once
	// more, then the build fails. Small documents (ping, token, manifest,
	// config) must also be complete within twice this.
	StallTimeout time.Duration `yaml:"stall_timeout"`
	// MinTransferRate is the slowest a registry response may deliver, in
	// bytes per second averaged over StallTimeout: one that trickles a byte
	// now and then would otherwise hold a build slot until Timeout.
	MinTransferRate ByteSize `yaml:"min_transfer_rate"`
	// StartCheck is what a build does when the template's start command
	// certainly cannot run in the built tree: "fail" the job, "warn" in
	// the BUILT report's template_check, or "off" (no check).
	StartCheck string `yaml:"start_check"`
}

// The values of build.start_check.
const (
	StartCheckFail = "fail"
	StartCheckWarn = "warn"
	StartCheckOff  = "off"
)

// Registry holds pull settings.
type Registry struct {
	// Mirrors maps a registry host to mirror hosts tried first.
	Mirrors map[string][]string `yaml:"mirrors"`
	// Insecure lists registry hosts reached over plain HTTP.
	Insecure []string `yaml:"insecure"`
	// LocalRoots are the directories offline sources (oci-layout:,
	// docker-archive:) may be read from; none by default.
	LocalRoots []string `yaml:"local_roots"`
	// DenyNetworks lists CIDRs no registry connection may reach
	// (registry, token endpoint, blob redirects), checked on the resolved
	// address, besides DefaultDenyNetworks, which always apply (see
	// reach.go). Loopback and the host's other addresses are denied apart
	// from both, unless the registry is in Insecure or Mirrors or
	// AllowNetworks holds the address.
	DenyNetworks []string `yaml:"deny_networks"`
	// LiftDefaultDeny lists entries of DefaultDenyNetworks that do not
	// apply; each is logged at start.
	LiftDefaultDeny []string `yaml:"lift_default_deny"`
	// AllowNetworks, when not empty, is the only CIDRs registry
	// connections may reach; a CIDR in it also lifts the deny of the
	// host's own addresses it holds (127.0.0.0/8 for loopback).
	AllowNetworks []string `yaml:"allow_networks"`
}

// Shutdown bounds a graceful stop.
type Shutdown struct {
	// Timeout bounds the whole stop, the final flushes included; it must
	// stay below the unit's TimeoutStopSec and the pod's
	// terminationGracePeriodSeconds.
	Timeout time.Duration `yaml:"timeout"`
}

// DefaultShutdownTimeout bounds a stop by default: 5 s inside Kubernetes'
// default 30 s grace period, for the signal and the exit.
const DefaultShutdownTimeout = 25 * time.Second

// Default returns the built-in configuration.
func Default() *Config {
	return &Config{
		Common: Common{HTTPBind: "0.0.0.0", HTTPPort: 8090, MaxBodyBytes: 24 << 20,
			ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 2 * time.Minute, WriteTimeout: time.Minute,
			MaxUploadBytes: 64 << 30, UploadTimeout: time.Hour, MaxConcurrentUploads: 2},
		Log: Log{Level: "info", Format: "text"},
		Master: Master{Addr: "http://127.0.0.1:8089", CallbackTimeout: 10 * time.Second,
			RetryInitial: 500 * time.Millisecond, RetryMax: 30 * time.Second, ProgressAttempts: 6},
		Store: Store{Dir: "/data/CubeMaster/storage", WorkDir: "/var/cache/cube-templatecenter", MinFree: Reserve{Percent: 5}},
		Spool: Spool{Path: "/var/lib/cube-templatecenter/spool.db", Retention: 7 * 24 * time.Hour, MinFree: Reserve{Bytes: 64 << 20}},
		Build: Build{MaxConcurrentBuilds: 2, QueueSize: 64, HeartbeatInterval: 30 * time.Second, Timeout: 2 * time.Hour,
			MaxAttempts: 5, CAPath: "/etc/cube/ca/cube-root-ca.crt", Platform: "linux/" + runtime.GOARCH,
			LayerCacheQuota: 20 << 30, LayerCacheZstd: true, DirectIO: true, DownloadJobs: 6, HeadroomPercent: 2, HeadroomInodes: 4096,
			MaxEntries: 1_000_000, MaxTreeMemory: 192 << 20, MaxImageSize: 64 << 30,
			StallTimeout: 5 * time.Minute, MinTransferRate: 1 << 10, StartCheck: StartCheckFail},
		Registry: Registry{},
		Shutdown: Shutdown{Timeout: DefaultShutdownTimeout},
		// The artifact store's defaults live beside it, in artifactstore.go.
		ArtifactStore: defaultArtifactStore(),
		InstanceDB:    defaultInstanceDB(),
		Replicas:      defaultReplicas(),
		Redis:         defaultRedis(),
	}
}

// Env looks up an environment variable; os.LookupEnv in production.
type Env func(name string) (string, bool)

// LegacyPathEnv is upstream's name for PathEnv, still read after it.
const LegacyPathEnv = "CUBE_MASTER_CONFIG_PATH"

// StrictEnv, when true, makes unknown keys in the file fatal, as
// config.strict: true and the --strict-config flag do.
const StrictEnv = "CUBE_TEMPLATE_CENTER_STRICT_CONFIG"

// Path returns the configuration file the environment names ("" for
// none): PathEnv, else upstream's LegacyPathEnv, with a warning then.
func Path(env Env) (path, warning string) {
	if p, ok := env(PathEnv); ok && strings.TrimSpace(p) != "" {
		return strings.TrimSpace(p), ""
	}
	if p, ok := env(LegacyPathEnv); ok && strings.TrimSpace(p) != "" {
		return strings.TrimSpace(p), fmt.Sprintf("%s is deprecated, use %s", LegacyPathEnv, PathEnv)
	}
	return "", ""
}

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

// Report is what a load found besides the values: the file read, where
// each setting came from, and the warnings.
type Report struct {
	// Path is the file read, "" when none.
	Path string
	// Warnings are in the order found: file, environment, validation.
	Warnings []Warning
	// sources maps a setting's key to where its value came from; a key
	// not in it has its default.
	sources map[string]string
}

func (r *Report) warn(env bool, format string, args ...any) {
	r.Warnings = append(r.Warnings, Warning{Text: fmt.Sprintf(format, args...), Env: env})
}

func (r *Report) setSource(key, source string) {
	if r.sources == nil {
		r.sources = map[string]string{}
	}
	r.sources[key] = source
}

// Source says where the setting key got its value: "default", the file
// and line ("/etc/x/conf.yaml:12"), or the variable ("env CUBE_MASTER_ADDR").
func (r *Report) Source(key string) string {
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
func (r *Report) Log(logger *slog.Logger, withEnv bool) {
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
func Read(env Env, opts Options) (*Config, *Report, error) {
	rep := &Report{}
	cfg := Default()
	path, warning := Path(env)
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

// Parse decodes YAML over the defaults, returning warnings for unknown keys
// and upstream names.
func Parse(r io.Reader) (*Config, []string, error) {
	cfg := Default()
	rep := &Report{}
	if err := cfg.parse(r, "config", false, rep); err != nil {
		return nil, nil, err
	}
	var warnings []string
	for _, w := range rep.Warnings {
		warnings = append(warnings, w.Text)
	}
	return cfg, warnings, nil
}

// parse decodes the file over c. Upstream's keys are applied under TC's
// names or reported ignored (upstream.go); unknown keys are warnings, or
// errors when strict (or config.strict) says so. name labels the sources.
func (c *Config) parse(r io.Reader, name string, strict bool, rep *Report) error {
	var doc yaml.Node
	if err := yaml.NewDecoder(r).Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty file means defaults
		}
		return fmt.Errorf("parse YAML: %w", err)
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return errors.New("parse YAML: the top level must be a mapping of sections")
	}
	if err := doc.Decode(c); err != nil {
		if keyed := decodeErrors(doc.Content[0], reflect.TypeOf(*c), ""); len(keyed) > 0 {
			return errors.Join(keyed...)
		}
		return fmt.Errorf("decode: %w", err)
	}
	w := &walker{name: name, rep: rep, upstream: map[string]*yaml.Node{}}
	w.walk(doc.Content[0], reflect.TypeOf(*c), "")
	errs := w.applyUpstream(c)
	for _, u := range w.unknown {
		hint := ""
		if u.hint != "" {
			hint = "; " + u.hint
		}
		if strict || c.ConfigFile.Strict {
			errs = append(errs, fmt.Errorf("%s: unknown keys are errors in strict mode%s", u.what, hint))
		} else {
			rep.warn(false, "%s ignored%s", u.what, hint)
		}
	}
	return errors.Join(errs...)
}

// decodeErrors decodes each value of the mapping n on its own into its
// field of t, and returns an error for each value that does not fit, naming
// its key and line, as every other error about the file does: yaml names
// the line alone, and stops at the first value one of our types refuses.
// Keys t has no field for are the walker's.
func decodeErrors(n *yaml.Node, t reflect.Type, prefix string) []error {
	if n.Kind != yaml.MappingNode || t.Kind() != reflect.Struct {
		return nil
	}
	fields := yamlFields(t)
	var errs []error
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		ft, ok := fields[k.Value]
		if !ok {
			continue
		}
		key := prefix + k.Value
		if v.Kind == yaml.MappingNode && ft.Kind() == reflect.Struct && !reflect.PointerTo(ft).Implements(unmarshalerType) {
			errs = append(errs, decodeErrors(v, ft, key+".")...)
			continue
		}
		if err := v.Decode(reflect.New(ft).Interface()); err != nil {
			errs = append(errs, fmt.Errorf("%s (line %d): %s", key, v.Line, decodeMessage(err)))
		}
	}
	return errs
}

// decodeMessage is what a failed decode says, without the line yaml puts
// in front of each of its own errors.
func decodeMessage(err error) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err.Error()
	}
	msgs := make([]string, len(te.Errors))
	for i, e := range te.Errors {
		if line, rest, ok := strings.Cut(e, ": "); ok && strings.HasPrefix(line, "line ") {
			e = rest
		}
		msgs[i] = e
	}
	return strings.Join(msgs, "; ")
}

// yamlFields maps the YAML keys of struct type t to their fields' types.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name != "" && name != "-" {
			fields[name] = t.Field(i).Type
		}
	}
	return fields
}

// walker walks the file's mappings against the configuration's types: it
// records each key's line as its source, collects upstream's keys and
// describes unknown ones.
type walker struct {
	name     string
	rep      *Report
	upstream map[string]*yaml.Node // upstream key → its key node
	values   map[string]*yaml.Node // upstream key → its value node
	unknown  []unknownKey
	// dbSection is set when instance_db_config is a mapping.
	dbSection bool
}

func (w *walker) walk(n *yaml.Node, t reflect.Type, prefix string) {
	if n.Kind != yaml.MappingNode {
		return
	}
	fields := map[string]reflect.Type{}
	if t != nil && t.Kind() == reflect.Struct {
		fields = yamlFields(t)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key := prefix + k.Value
		if _, ok := upstreamKeys[key]; ok {
			w.upstream[key] = k
			if w.values == nil {
				w.values = map[string]*yaml.Node{}
			}
			w.values[key] = v
			continue
		}
		ft, ok := fields[k.Value]
		switch {
		case ok:
			w.rep.setSource(key, fmt.Sprintf("%s:%d", w.name, k.Line))
			if key == "instance_db_config" && v.Kind == yaml.MappingNode {
				w.dbSection = true
			}
			if ft.Kind() == reflect.Struct {
				w.walk(v, ft, key+".")
			}
		case upstreamSection(key) && v.Kind == yaml.MappingNode:
			w.walk(v, nil, key+".")
		default:
			w.unknown = append(w.unknown, unknownKey{fmt.Sprintf("unknown key %q (line %d)", key, k.Line), hintFor(key)})
		}
	}
}

// unknownKey is a key of the file that matches no setting, with what the
// file may have meant ("" for nothing close).
type unknownKey struct{ what, hint string }

// hintFor says what a file meant by the unknown key: the variable of a
// setting only the environment holds, or the closest known key, never the
// key itself.
func hintFor(key string) string {
	if h := envOnlyHint(key); h != "" {
		return h
	}
	if s := suggest(key); s != "" && s != key {
		return fmt.Sprintf("did you mean %q?", s)
	}
	return ""
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

// EnvNames returns the environment variables that set the setting key,
// the preferred name first; none for a setting only the file holds.
func EnvNames(key string) []string {
	var names []string
	for _, o := range slices.Concat(envOverrides, artifactStoreEnv, replicasEnv, upstreamEnv) {
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
func (c *Config) applyEnv(env Env, rep *Report) {
	for _, o := range slices.Concat(envOverrides, artifactStoreEnv, replicasEnv, upstreamEnv) {
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
	for _, ig := range ignoredEnv {
		for _, name := range ig.names {
			if v, ok := env(name); ok && strings.TrimSpace(v) != "" {
				rep.warn(true, "%s is set but ignored: %s", name, ig.why)
			}
		}
	}
	// Secrets come before resolve, which needs the S3 keys.
	c.envErrs = append(c.envErrs, c.applySecrets(env, rep)...)
	for _, w := range c.ArtifactStore.resolve(c.Store.Dir) {
		rep.warn(false, "%s", w)
	}
}

// Validate checks every value and returns all problems at once, each naming
// its key.
func (c *Config) Validate() error {
	errs := append([]error(nil), c.envErrs...)
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	if c.Common.HTTPPort < 1 || c.Common.HTTPPort > 65535 {
		bad("common.http_port", "%d is not a TCP port", c.Common.HTTPPort)
	}
	if c.Common.MaxBodyBytes < 1<<20 {
		bad("common.max_body_bytes", "%d is below 1MiB", c.Common.MaxBodyBytes)
	}
	if c.Common.MaxUploadBytes < 1<<20 {
		bad("common.max_upload_bytes", "%d is below 1MiB", c.Common.MaxUploadBytes)
	}
	if _, err := ParseLevel(c.Log.Level); err != nil {
		bad("log.level", "%v", err)
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		bad("log.format", "%q is not text or json", c.Log.Format)
	}
	if u, err := url.Parse(c.Master.Addr); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("master.addr", "%q is not an http(s) URL", safetext.Redact(c.Master.Addr))
	}
	positive := map[string]time.Duration{
		"common.read_header_timeout": c.Common.ReadHeaderTimeout, "common.read_timeout": c.Common.ReadTimeout,
		"common.write_timeout":    c.Common.WriteTimeout,
		"common.upload_timeout":   c.Common.UploadTimeout,
		"master.callback_timeout": c.Master.CallbackTimeout, "master.retry_initial": c.Master.RetryInitial,
		"master.retry_max": c.Master.RetryMax, "spool.retention": c.Spool.Retention,
		"build.heartbeat_interval": c.Build.HeartbeatInterval, "build.timeout": c.Build.Timeout,
		"shutdown.timeout": c.Shutdown.Timeout,
	}
	positive["build.stall_timeout"] = c.Build.StallTimeout
	for _, key := range slices.Sorted(maps.Keys(positive)) {
		if positive[key] <= 0 {
			bad(key, "must be a positive duration")
		}
	}
	if c.Master.RetryMax < c.Master.RetryInitial {
		bad("master.retry_max", "%s is below master.retry_initial %s", c.Master.RetryMax, c.Master.RetryInitial)
	}
	ranges := []struct {
		key       string
		v, lo, hi int
	}{
		{"master.progress_attempts", c.Master.ProgressAttempts, 1, 100},
		{"common.max_concurrent_uploads", c.Common.MaxConcurrentUploads, 1, 64},
		{"build.max_concurrent_builds", c.Build.MaxConcurrentBuilds, 1, maxConcurrentBuilds},
		{"build.queue_size", c.Build.QueueSize, 1, 100000},
		{"build.max_attempts", c.Build.MaxAttempts, 1, 100},
		{"build.download_jobs", c.Build.DownloadJobs, 1, maxDownloadJobs},
		{"build.headroom_percent", c.Build.HeadroomPercent, 0, 100},
		{"build.headroom_inodes", c.Build.HeadroomInodes, 0, 1 << 24},
	}
	for _, r := range ranges {
		if r.v < r.lo || r.v > r.hi {
			bad(r.key, "%d is outside %d..%d", r.v, r.lo, r.hi)
		}
	}
	if c.Build.MinTransferRate < 1 {
		bad("build.min_transfer_rate", "%d is not a positive rate (bytes per second, e.g. 1KiB)", c.Build.MinTransferRate)
	}
	if c.Build.MaxEntries < 1 {
		bad("build.max_entries", "%d is not a positive count", c.Build.MaxEntries)
	}
	for key, v := range map[string]ByteSize{"build.max_tree_memory": c.Build.MaxTreeMemory, "build.max_image_size": c.Build.MaxImageSize} {
		if v < 1<<20 {
			bad(key, "%s is below 1MiB", v)
		}
	}
	for key, path := range map[string]string{"store.dir": c.Store.Dir, "store.work_dir": c.Store.WorkDir,
		"spool.path": c.Spool.Path, "build.ca_path": c.Build.CAPath} {
		if !strings.HasPrefix(path, "/") {
			bad(key, "%q is not an absolute path", path)
		}
	}
	if _, err := c.Registry.Networks(); err != nil {
		errs = append(errs, err)
	}
	for _, root := range c.Registry.LocalRoots {
		if !strings.HasPrefix(root, "/") {
			bad("registry.local_roots", "%q is not an absolute path", root)
		}
	}
	switch c.Build.StartCheck {
	case StartCheckFail, StartCheckWarn, StartCheckOff:
	default:
		bad("build.start_check", "%q is not fail, warn or off", c.Build.StartCheck)
	}
	if parts := strings.Split(c.Build.Platform, "/"); len(parts) < 2 || len(parts) > 3 || slices.Contains(parts, "") {
		bad("build.platform", "%q is not os/arch[/variant]", c.Build.Platform)
	}
	errs = append(errs, c.ArtifactStore.validate()...)
	errs = append(errs, c.InstanceDB.validate()...)
	errs = append(errs, c.Replicas.validate()...)
	errs = append(errs, c.Redis.validate()...)
	return errors.Join(errs...)
}

// ParseLevel maps a level name to a slog level.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("%q is not debug, info, warn or error", s)
	}
	return l, nil
}

// ListenAddr is the address to listen on when systemd passes no socket.
func (c *Config) ListenAddr() string {
	return joinHostPort(c.Common.HTTPBind, c.Common.HTTPPort)
}

func joinHostPort(host string, port int) string {
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return host + ":" + strconv.Itoa(port)
}

// RestartOnly lists settings that changed between c and next but only take
// effect after a restart.
func (c *Config) RestartOnly(next *Config) []string {
	var keys []string
	if c.Common != next.Common {
		keys = append(keys, "common")
	}
	if c.Store != next.Store {
		keys = append(keys, "store")
	}
	if c.Spool.Path != next.Spool.Path {
		keys = append(keys, "spool.path")
	}
	if c.Master.Token != next.Master.Token || c.Master.InsecureNoToken != next.Master.InsecureNoToken {
		keys = append(keys, "shared token")
	}
	// The rootfs builder (layer cache, registry access, CA, image layout)
	// is opened once at start.
	b, n := c.Build, next.Build
	if b.CAPath != n.CAPath || b.Platform != n.Platform || b.LayerCacheQuota != n.LayerCacheQuota ||
		b.LayerCacheZstd != n.LayerCacheZstd || b.DirectIO != n.DirectIO || b.DownloadJobs != n.DownloadJobs ||
		b.HeadroomPercent != n.HeadroomPercent || b.HeadroomInodes != n.HeadroomInodes ||
		b.MaxEntries != n.MaxEntries || b.MaxTreeMemory != n.MaxTreeMemory || b.MaxImageSize != n.MaxImageSize ||
		b.StallTimeout != n.StallTimeout || b.MinTransferRate != n.MinTransferRate {
		keys = append(keys, "build (ca_path, platform, layer_cache_*, direct_io, download_jobs, headroom_*, max_entries, max_tree_memory, max_image_size, stall_timeout, min_transfer_rate)")
	}
	if !reflect.DeepEqual(c.Registry, next.Registry) {
		keys = append(keys, "registry")
	}
	if c.ArtifactStore != next.ArtifactStore {
		keys = append(keys, "artifact_store")
	}
	if c.InstanceDB != next.InstanceDB {
		keys = append(keys, "instance_db_config")
	}
	if !c.Redis.equal(next.Redis) {
		keys = append(keys, "redis")
	}
	return keys
}
