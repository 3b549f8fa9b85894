// Package api is the wire contract between CubeMaster and this agent: the
// build request CubeMaster posts, its validation, the template fingerprint
// both sides must agree on byte for byte, the status reports the agent posts
// back, and the shared-token rule guarding both directions.
//
// The shapes follow the upstream TemplateCenter contract; see
// docs/api.md for the routes and codes.
package api
