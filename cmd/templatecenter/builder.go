package main

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/layercodec"
)

// inflateEnv names the environment variable that forces the pure-Go gzip
// inflater when set to "go"; any other value leaves the choice automatic
// (ISA-L when libisal loads).
const inflateEnv = "CUBE_TEMPLATE_CENTER_INFLATE"

// gzipInflater resolves the gzip inflater inflateEnv asks for, once per
// command, and says why it is not ISA-L ("" when it is) for the startup
// log.
func gzipInflater(getenv func(string) string) (gz *layercodec.GzipInflater, whyNotISAL string) {
	if getenv(inflateEnv) == string(layercodec.InflaterGo) {
		return layercodec.NewGzipInflater(layercodec.InflaterGo), inflateEnv + "=go"
	}
	gz = layercodec.NewGzipInflater(layercodec.InflaterAuto)
	return gz, gz.Reason()
}

// newBuilder opens the rootfs builder the configuration describes, with
// the process's gzip inflater and memory pacer; its layer cache lives in
// <work_dir>/layers.
func newBuilder(cfg *config.Config, logger *slog.Logger, gz *layercodec.GzipInflater, pacer *rootfs.MemoryPacer) (*rootfs.Builder, error) {
	nets, err := cfg.Registry.Networks()
	if err != nil {
		return nil, fmt.Errorf("open builder: %w", err)
	}
	return rootfs.NewBuilder(rootfs.Options{
		Store:           rootfs.Store(cfg.Store.Dir),
		CAPath:          cfg.Build.CAPath,
		HeadroomPercent: cfg.Build.HeadroomPercent,
		HeadroomInodes:  cfg.Build.HeadroomInodes,
		DirectIO:        cfg.Build.DirectIO,
		Limits:          builderLimits(cfg),
		Pacer:           pacer,
		Pull: rootfs.PullOptions{
			Gzip:                gz,
			CacheDir:            filepath.Join(cfg.Store.WorkDir, "layers"),
			CacheQuotaBytes:     int64(cfg.Build.LayerCacheQuota),
			TranscodeZstd:       cfg.Build.LayerCacheZstd,
			Logger:              logger,
			Platform:            platformOf(cfg.Build.Platform),
			Mirrors:             cfg.Registry.Mirrors,
			Insecure:            cfg.Registry.Insecure,
			Jobs:                cfg.Build.DownloadJobs,
			DownloadConnections: cfg.Build.DownloadConnections,
			LayerConnections:    cfg.Build.LayerConnections,
			LocalRoots:          cfg.Registry.LocalRoots,
			DenyNetworks:        nets.Deny,
			LiftDefaultDeny:     nets.Lift,
			AllowNetworks:       nets.Allow,
			StallTimeout:        cfg.Build.StallTimeout,
			MinTransferRate:     int64(cfg.Build.MinTransferRate),
		},
	})
}

// platformOf parses os/arch[/variant].
func platformOf(s string) v1.Platform {
	parts := strings.SplitN(s, "/", 3)
	p := v1.Platform{OS: parts[0]}
	if len(parts) > 1 {
		p.Architecture = parts[1]
	}
	if len(parts) == 3 {
		p.Variant = parts[2]
	}
	return p
}
