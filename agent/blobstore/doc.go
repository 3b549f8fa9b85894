// Package blobstore keeps the durable copy of each artifact as an object in
// a blob store: an S3 bucket (AWS, MinIO or any S3-compatible server) or a
// directory tree on a filesystem ("fs"). Callers see one small Store
// interface; Open picks the backend from plain Options, so this package never
// reads configuration files or the environment.
//
// Objects are uploaded with their sha256 in the object's metadata (S3 user
// metadata "sha256"; fs: a sha256sum-format sidecar file), verified while
// streaming: an object whose bytes do not match the sha256 or the size given
// to Put is never published. Errors are *Error values that callers test with
// errors.Is against the sentinels (ErrNotFound, ErrBucketMissing,
// ErrAccessDenied, ErrUnreachable, ...); they never carry secrets or
// presigned signatures.
package blobstore
