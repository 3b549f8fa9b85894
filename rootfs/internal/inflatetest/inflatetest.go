// Package inflatetest gives the tests of rootfs and its packages the gzip
// inflater their environment asks for, as cmd/templatecenter does for the
// binary: make test expects ISA-L, make test-no-isal forces the pure-Go
// inflater.
package inflatetest

import (
	"os"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/layercodec"
)

// Env names the variable that forces the pure-Go inflater when "go", as
// it does for the binary.
const Env = "CUBE_TEMPLATE_CENTER_INFLATE"

// ExpectISALEnv, set to 1 (make test does, after make deps installed
// libisal2), makes a missing libisal a test failure rather than a run of
// the pure-Go inflater alone.
const ExpectISALEnv = "TC_EXPECT_ISAL"

// Choice maps the environment to an inflater choice as the binary does:
// "go" forces the pure-Go inflater, anything else is automatic.
func Choice() layercodec.Inflater {
	if os.Getenv(Env) == string(layercodec.InflaterGo) {
		return layercodec.InflaterGo
	}
	return layercodec.InflaterAuto
}

// Inflater resolves Choice, failing tb when the environment expects
// ISA-L and it did not load, or forces Go and got something else.
func Inflater(tb testing.TB) *layercodec.GzipInflater {
	tb.Helper()
	g := layercodec.NewGzipInflater(Choice())
	switch {
	case Choice() == layercodec.InflaterGo:
		if g.Backend() != layercodec.BackendGo {
			tb.Fatalf("NewGzipInflater(%s) backend = %s, want %s", layercodec.InflaterGo, g.Backend(), layercodec.BackendGo)
		}
	case os.Getenv(ExpectISALEnv) == "1":
		if g.Backend() != layercodec.BackendISAL {
			tb.Fatalf("%s=1 but the inflater is %s: %s", ExpectISALEnv, g.Backend(), g.Reason())
		}
	}
	return g
}
