// Package tcimage tests the container image `make image` builds (cmd/tcimage):
// that it is reproducible, what it holds, and that the agent in it works
// under a real OCI runtime (runc) as a non-root user with a read-only root
// filesystem, its state on mounted volumes, the way Kubernetes runs it.
// The tests need root (runc, and umoci keeping the image's ownership) and
// skip without it.
package tcimage
