// Package depcheck pins the project's import graph: which of its packages
// may import which. Its test fails on an import the architecture forbids
// (cmd → agent → {spool, rootfs}; spool and rootfs never import agent or
// each other; agent/api, the wire contract, imports neither).
package depcheck
