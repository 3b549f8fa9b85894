// Package bench measures CubeTemplateCenter against upstream's "dockerless"
// build pipeline on the same machine: it generates its images, serves them
// from Debian's docker-registry on loopback, runs upstream's steps
// (skopeo, umoci, mkfs.ext4 -d, e2fsck, resize2fs) and the templatecenter
// agent through its HTTP API in alternation, and reports wall and CPU time,
// peak RSS, bytes written and output size as one table (Run, Results). The
// command bench/cmd/tcbench drives it for `make bench`; the package's
// Benchmark functions cover the hot paths with `go test -bench`.
package bench
