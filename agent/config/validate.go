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
