package config

import (
	"reflect"
)

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
