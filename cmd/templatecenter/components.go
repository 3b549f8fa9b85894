package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/agent/liveprogress"
	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

// The components the configuration names, opened here so that the agent
// and the libraries take values, never the configuration's shape.

// credentialsCheckTimeout bounds the first retrieval of S3 keys from the
// AWS chain at start: STS or a role endpoint that does not answer, or a
// host with no credentials at all, fails start within it.
const credentialsCheckTimeout = 15 * time.Second

// openObjectStore opens the blob store the configuration names, or returns
// nil when none is configured (S3 needs endpoint and bucket). Without
// static keys, S3 takes the AWS credential chain from getenv, and fails
// here when no source yields keys.
func openObjectStore(ctx context.Context, cfg *config.Config, getenv func(string) string) (blobstore.Store, error) {
	as := cfg.ArtifactStore
	opts := blobstore.Options{Backend: as.Enabled(), FSRoot: as.FSRoot, S3: blobstore.S3Options{
		Endpoint: as.S3.Endpoint, Bucket: as.S3.Bucket, Region: as.S3.Region, AccessKeyID: as.S3.AccessKeyID,
		SecretAccessKey: as.S3.SecretAccessKey.Reveal(), SessionToken: as.S3.SessionToken.Reveal(),
		UsePathStyle: as.S3.UsePathStyle, UseSSL: as.S3.UseSSL,
		PartSize: int64(as.PartSize), Concurrency: as.UploadConcurrency, Attempts: as.Attempts,
		PartStallTimeout: as.PartStallTimeout}}
	if opts.Backend == blobstore.BackendS3 && as.S3.AccessKeyID == "" {
		chain := blobstore.AWSCredentialChain(blobstore.AWSChainOptions{Getenv: getenv, Region: as.S3.Region})
		checkCtx, cancel := context.WithTimeout(ctx, credentialsCheckTimeout)
		_, err := chain.Check(checkCtx)
		cancel()
		if err != nil {
			return nil, err
		}
		opts.S3.Credentials = chain
	}
	return blobstore.Open(opts)
}

// credentialsSource names where the blob store's keys come from, "" for a
// store without any (fs).
func credentialsSource(s blobstore.Store) string {
	if c, ok := s.(interface{ CredentialsSource() string }); ok {
		return c.CredentialsSource()
	}
	return ""
}

// openDatabase opens CubeMaster's database as instance_db_config names it,
// or returns nil when none is configured. An unreachable server is no
// error (builds get 503 until it answers); a refused login is.
func openDatabase(ctx context.Context, cfg *config.Config) (*masterdb.DB, error) {
	d := cfg.InstanceDB
	if !d.Enabled() {
		return nil, nil
	}
	second := func(n int) time.Duration { return time.Duration(n) * time.Second }
	tlsConfig, err := d.TLS.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("instance_db_config: %w", err)
	}
	return masterdb.Open(ctx, masterdb.Options{TLS: tlsConfig, Driver: d.Driver, Addr: d.Addr, User: d.User, Password: d.Pwd.Reveal(),
		DBName: d.DBName, ConnTimeout: second(d.ConnTimeout), ReadTimeout: second(d.ReadTimeout),
		WriteTimeout: second(d.WriteTimeout), MaxIdleConns: d.MaxIdleConns, MaxOpenConns: d.MaxOpenConns,
		MaxConnLifetime: second(d.MaxConnLifeTimeSeconds), SSLMode: d.SSLMode})
}

// openLiveProgress opens the writer of live pull progress to
// CubeMaster's Redis as redis: names it, or returns nil when none is
// configured. It does not connect: Redis being down never stops TC.
func openLiveProgress(cfg *config.Config, logger *slog.Logger) (*liveprogress.Writer, error) {
	r := cfg.Redis
	if !r.Enabled() {
		return nil, nil
	}
	tlsConfig, err := r.TLS.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	return liveprogress.New(liveprogress.Options{Nodes: r.Nodes, Password: r.Password.Reveal(), DB: r.DBNo, TLS: tlsConfig},
		logger.With("component", "liveprogress"))
}

// builderLimits are the per-build limits the configuration sets.
func builderLimits(cfg *config.Config) rootfs.Limits {
	return rootfs.Limits{
		MaxEntries:     cfg.Build.MaxEntries,
		MaxTreeMemory:  int64(cfg.Build.MaxTreeMemory),
		MaxImageSize:   int64(cfg.Build.MaxImageSize),
		MinFreeBytes:   int64(cfg.Store.MinFree.Bytes),
		MinFreePercent: cfg.Store.MinFree.Percent,
	}
}
