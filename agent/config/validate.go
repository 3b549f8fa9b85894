package config

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// Validate checks every value and returns all problems at once, each naming
// its key. The problems come in the order of the checks below, which is
// what check-config prints.
func (c *Config) Validate() error {
	errs := problems(append([]error(nil), c.envErrs...))
	c.Common.validateListener(&errs)
	c.Log.validate(&errs)
	c.Master.validateAddr(&errs)
	c.validateDurations(&errs)
	c.validateRanges(&errs)
	c.Build.validateBounds(&errs)
	c.validatePaths(&errs)
	c.Registry.validate(&errs)
	c.Build.validateChoices(&errs)
	errs = append(errs, c.ArtifactStore.validate()...)
	errs = append(errs, c.InstanceDB.validate()...)
	errs = append(errs, c.Replicas.validate()...)
	errs = append(errs, c.Redis.validate()...)
	return errors.Join(errs...)
}

// problems collects what Validate finds, in the order found.
type problems []error

// add records that key's value is wrong, and why.
func (p *problems) add(key, format string, args ...any) {
	*p = append(*p, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
}

// validateListener checks the port and the request body bounds.
func (c Common) validateListener(p *problems) {
	if c.HTTPPort < 1 || c.HTTPPort > 65535 {
		p.add("common.http_port", "%d is not a TCP port", c.HTTPPort)
	}
	if c.MaxBodyBytes < 1<<20 {
		p.add("common.max_body_bytes", "%d is below 1MiB", c.MaxBodyBytes)
	}
	if c.MaxUploadBytes < 1<<20 {
		p.add("common.max_upload_bytes", "%d is below 1MiB", c.MaxUploadBytes)
	}
}

func (l Log) validate(p *problems) {
	if _, err := ParseLevel(l.Level); err != nil {
		p.add("log.level", "%v", err)
	}
	if l.Format != "text" && l.Format != "json" {
		p.add("log.format", "%q is not text or json", l.Format)
	}
}

func (m Master) validateAddr(p *problems) {
	if u, err := url.Parse(m.Addr); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p.add("master.addr", "%q is not an http(s) URL", safetext.Redact(m.Addr))
	}
}

// validateDurations checks that every timeout and interval is positive, in
// the order of their keys, and that the callback backoff grows.
func (c *Config) validateDurations(p *problems) {
	positive := map[string]time.Duration{
		"common.read_header_timeout": c.Common.ReadHeaderTimeout, "common.read_timeout": c.Common.ReadTimeout,
		"common.write_timeout":    c.Common.WriteTimeout,
		"common.upload_timeout":   c.Common.UploadTimeout,
		"master.callback_timeout": c.Master.CallbackTimeout, "master.retry_initial": c.Master.RetryInitial,
		"master.retry_max": c.Master.RetryMax, "spool.retention": c.Spool.Retention,
		"build.heartbeat_interval": c.Build.HeartbeatInterval, "build.timeout": c.Build.Timeout,
		"build.stall_timeout": c.Build.StallTimeout,
		"shutdown.timeout":    c.Shutdown.Timeout,
	}
	for _, key := range slices.Sorted(maps.Keys(positive)) {
		if positive[key] <= 0 {
			p.add(key, "must be a positive duration")
		}
	}
	if c.Master.RetryMax < c.Master.RetryInitial {
		p.add("master.retry_max", "%s is below master.retry_initial %s", c.Master.RetryMax, c.Master.RetryInitial)
	}
}

// maxDownloadConnections is the limit of build.download_connections and
// build.layer_connections: beyond it a node competes with itself.
const maxDownloadConnections = 64

// validateRanges checks the counts that have both a floor and a ceiling.
func (c *Config) validateRanges(p *problems) {
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
		{"build.download_connections", c.Build.DownloadConnections, 1, maxDownloadConnections},
		{"build.layer_connections", c.Build.LayerConnections, 1, maxDownloadConnections},
		{"build.headroom_percent", c.Build.HeadroomPercent, 0, 100},
		{"build.headroom_inodes", c.Build.HeadroomInodes, 0, 1 << 24},
	}
	for _, r := range ranges {
		if r.v < r.lo || r.v > r.hi {
			p.add(r.key, "%d is outside %d..%d", r.v, r.lo, r.hi)
		}
	}
}

// validateBounds checks the floors of the limits one image's build runs
// under.
func (b Build) validateBounds(p *problems) {
	if b.MinTransferRate < 1 {
		p.add("build.min_transfer_rate", "%d is not a positive rate (bytes per second, e.g. 1KiB)", b.MinTransferRate)
	}
	if b.MaxEntries < 1 {
		p.add("build.max_entries", "%d is not a positive count", b.MaxEntries)
	}
	sizes := []struct {
		key string
		v   ByteSize
	}{{"build.max_tree_memory", b.MaxTreeMemory}, {"build.max_image_size", b.MaxImageSize}}
	for _, s := range sizes {
		if s.v < 1<<20 {
			p.add(s.key, "%s is below 1MiB", s.v)
		}
	}
}

// validatePaths checks that the files and directories TC opens are named by
// absolute paths.
func (c *Config) validatePaths(p *problems) {
	// A slice, not a map: problems come in the same order every time.
	paths := []struct{ key, path string }{{"store.dir", c.Store.Dir}, {"store.work_dir", c.Store.WorkDir},
		{"spool.path", c.Spool.Path}, {"build.ca_path", c.Build.CAPath}}
	for _, f := range paths {
		if !strings.HasPrefix(f.path, "/") {
			p.add(f.key, "%q is not an absolute path", f.path)
		}
	}
}

// validate checks the registry's networks and local roots.
func (r Registry) validate(p *problems) {
	if _, err := r.Networks(); err != nil {
		*p = append(*p, err)
	}
	for _, root := range r.LocalRoots {
		if !strings.HasPrefix(root, "/") {
			p.add("registry.local_roots", "%q is not an absolute path", root)
		}
	}
}

// validateChoices checks the build settings that take one of a set of
// values or a fixed form.
func (b Build) validateChoices(p *problems) {
	switch b.StartCheck {
	case StartCheckFail, StartCheckWarn, StartCheckOff:
	default:
		p.add("build.start_check", "%q is not fail, warn or off", b.StartCheck)
	}
	if parts := strings.Split(b.Platform, "/"); len(parts) < 2 || len(parts) > 3 || slices.Contains(parts, "") {
		p.add("build.platform", "%q is not os/arch[/variant]", b.Platform)
	}
}
