package api

// Storage backends: the storage_backend values of a BUILT report, the
// names artifact_store.backend takes, and what blob stores call
// themselves.
const (
	BackendS3 = "s3"
	BackendFS = "fs"
)
