// Package config loads the agent's configuration: built-in defaults, then the
// YAML file named by CUBE_TEMPLATE_CENTER_CONFIG_PATH, then environment
// overrides, then one validation pass whose errors name the offending key.
package config

import (
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"time"
)

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
	// DownloadConnections bounds the response bodies all builds read at
	// once; LayerConnections those of one layer, fetched as parallel
	// ranged chunks (registries behind CDNs cap each connection).
	DownloadConnections int `yaml:"download_connections"`
	LayerConnections    int `yaml:"layer_connections"`
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
			LayerCacheQuota: 20 << 30, LayerCacheZstd: true, DirectIO: true, DownloadJobs: 6, DownloadConnections: 8, LayerConnections: 8, HeadroomPercent: 2, HeadroomInodes: 4096,
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
