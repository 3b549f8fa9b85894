package main

import (
	"context"
	"errors"

	"github.com/cubesandbox/cubetemplatecenter/agent"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

// errNotImplemented is what jobs fail with until the rootfs builder lands.
var errNotImplemented = errors.New("rootfs build is not implemented in this version of templatecenter")

// pendingBuilder fails every build with a clear message.
type pendingBuilder struct{}

var _ agent.Builder = pendingBuilder{}

func (pendingBuilder) Resolve(context.Context, rootfs.Source) (*rootfs.Image, error) {
	return nil, errNotImplemented
}

func (pendingBuilder) LoadCA(context.Context) (*rootfs.CA, error) { return nil, errNotImplemented }

func (pendingBuilder) Build(context.Context, rootfs.Spec, rootfs.ProgressFunc) (*rootfs.Artifact, error) {
	return nil, errNotImplemented
}

func newBuilder(*config.Config) (agent.Builder, error) { return pendingBuilder{}, nil }
