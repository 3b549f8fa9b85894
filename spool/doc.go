// Package spool is the agent's durable state: a SQLite database holding the
// build jobs CubeMaster handed over, the outbox of status reports still to be
// delivered, and the artifacts this node has published.
//
// Everything the agent has acknowledged lives here first, so a crash or a
// restart loses nothing: a job is committed before the HTTP 200, a report is
// committed before it is sent, and a terminal report is committed in the same
// transaction that ends its job. Accepting and ending a job wait for the
// disk (they survive a power cut); the commits in between survive a crash
// of the process, and a power cut at worst resumes a job or re-sends a
// report. The package knows nothing of HTTP or OCI; it stores opaque
// request and report bodies.
package spool
