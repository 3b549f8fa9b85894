package config

import (
	"reflect"
)

// Reload returns the configuration a reload applies and the settings it
// could not: next, with the restart-only settings that changed (listed as
// RestartOnly lists them) kept at c's values.
func (c *Config) Reload(next *Config) (applied *Config, restartOnly []string) {
	keys := c.RestartOnly(next)
	if len(keys) == 0 {
		return next, nil
	}
	kept := *next
	kept.Common, kept.Store, kept.Spool.Path = c.Common, c.Store, c.Spool.Path
	kept.Master.Token, kept.Master.InsecureNoToken = c.Master.Token, c.Master.InsecureNoToken
	kept.Registry = c.Registry
	kept.Build = c.Build
	kept.Build.MaxConcurrentBuilds, kept.Build.QueueSize = next.Build.MaxConcurrentBuilds, next.Build.QueueSize
	kept.Build.HeartbeatInterval, kept.Build.MaxAttempts = next.Build.HeartbeatInterval, next.Build.MaxAttempts
	kept.Build.Timeout = next.Build.Timeout
	return &kept, keys
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
		b.DownloadConnections != n.DownloadConnections || b.LayerConnections != n.LayerConnections ||
		b.HeadroomPercent != n.HeadroomPercent || b.HeadroomInodes != n.HeadroomInodes ||
		b.MaxEntries != n.MaxEntries || b.MaxTreeMemory != n.MaxTreeMemory || b.MaxImageSize != n.MaxImageSize ||
		b.StallTimeout != n.StallTimeout || b.MinTransferRate != n.MinTransferRate {
		keys = append(keys, "build (ca_path, platform, layer_cache_*, direct_io, download_*, layer_connections, headroom_*, max_entries, max_tree_memory, max_image_size, stall_timeout, min_transfer_rate)")
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
