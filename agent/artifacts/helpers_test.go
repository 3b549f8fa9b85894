package artifacts

import (
	"os"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore/blobstoretest"
	"github.com/cubesandbox/cubetemplatecenter/test/s3server"
)

// testRecordSecret signs the artifact records of the tests.
const testRecordSecret = "record-secret-of-the-test-replicas"

// s3srv is the package's one versitygw, started on first use.
var s3srv s3server.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	s3srv.Close()
	os.Exit(code)
}

// s3Store opens the package's S3 server as a blob store.
func s3Store(t *testing.T, edit func(*blobstore.S3Options)) (blobstore.Store, *s3server.Server) {
	t.Helper()
	srv := s3srv.Get(t)
	return blobstoretest.S3(t, srv, edit), srv
}
