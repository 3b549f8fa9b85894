// Package registrytest is test/registry's StartForTest under its old name,
// kept only until rootfs/oci's tests use test/registry directly: new tests
// import test/registry.
package registrytest
