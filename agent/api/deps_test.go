package api

import (
	"go/build"
	"strings"
	"testing"
)

// TestImportsOnlyStandardLibrary keeps the wire contract a leaf: it must not
// import rootfs or spool (or any other package of this module), so a change
// there cannot change what goes over the wire.
func TestImportsOnlyStandardLibrary(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatalf("ImportDir: %v", err)
	}
	for _, imp := range pkg.Imports {
		if strings.Contains(strings.SplitN(imp, "/", 2)[0], ".") {
			t.Errorf("agent/api imports %s; it may use the standard library only", imp)
		}
	}
}
