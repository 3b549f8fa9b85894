// Package health runs the agent's readiness checks in the background and
// keeps the last round: /health, /readyz, the systemd status line and the
// check_success series all read that one round, so a check that hangs
// never makes a request wait, a probe fan out to S3, the database or
// Redis, or two endpoints disagree about what was checked.
//
// Each check has a severity: a failing Fail check makes the node not
// ready; a failing Degrade check is a warning (a blob store that falls
// back to local artifacts, live progress in Redis). A round too old to
// trust makes the node not ready too.
//
// Liveness is another question, answered by Loops: whether the agent's
// own loops go round within their bounds, never anything past the node.
package health
