// Package spool is the agent's durable state: a SQLite database holding the
// build jobs CubeMaster handed over, the outbox of status reports still to be
// delivered, and the artifacts this node has published.
//
// Everything the agent has acknowledged lives here first, so a crash or a
// restart loses nothing: a job is committed before the HTTP 200, a report is
// committed before it is sent, and a terminal report is committed in the same
// transaction that ends its job. The package knows nothing of HTTP or OCI; it
// stores opaque request and report bodies.
package spool
