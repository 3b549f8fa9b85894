// Package registrytest runs Debian's real registry server (docker-registry,
// distribution 2.8) for end-to-end tests: on a free loopback port, with
// temporary storage and optional htpasswd basic auth, stopped at test cleanup.
package registrytest
