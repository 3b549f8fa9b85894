package layercodec

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/klauspost/compress/gzip"
)

// The gzip inflaters NewGzipReader chooses from, as GzipBackend names them.
const (
	// BackendISAL is ISA-L's inflate, loaded from libisal at run time.
	BackendISAL = "isal"
	// BackendGo is the pure-Go inflater (klauspost/compress).
	BackendGo = "go"
)

// InflateEnv names the environment variable that forces the pure-Go
// inflater when set to "go"; any other value leaves the choice automatic.
const InflateEnv = "CUBE_TEMPLATE_CENTER_INFLATE"

// isalLibName is the soname of Debian's libisal2 (and of isa-l in RPM
// distributions).
const isalLibName = "libisal.so.2"

// ISA-L reader geometry and loop guards.
const (
	isalInBuffer  = 256 << 10 // compressed bytes read ahead of ISA-L
	isalMaxOut    = 1 << 20   // most bytes one Read inflates
	gzipHeaderLen = 10        // the fixed part of a gzip member header
	maxEmptyReads = 100       // reads in a row that may return nothing
)

var (
	errCorrupt      = errors.New("gzip: corrupt deflate data")
	errReaderClosed = errors.New("gzip: reader closed")
)

// gzipInflater is the choice made once per process: the library is a
// process-wide resource, loaded at most once and never unloaded.
type gzipInflater struct {
	backend string
	lib     *isalLib // nil for BackendGo
	reason  string   // why ISA-L is not used, for BackendGo
}

// chooseInflater picks ISA-L unless env asks for the pure-Go inflater or
// load fails.
func chooseInflater(env string, load func() (*isalLib, error)) gzipInflater {
	if env == BackendGo {
		return gzipInflater{backend: BackendGo, reason: InflateEnv + "=go"}
	}
	lib, err := load()
	if err != nil {
		return gzipInflater{backend: BackendGo, reason: err.Error()}
	}
	return gzipInflater{backend: BackendISAL, lib: lib}
}

// defaultInflater reads InflateEnv and loads libisal on first use. It is
// the one place this package reads the environment: the choice has to
// hold for every gzip reader in the process, tests of other packages
// included, without threading an option through every caller.
var defaultInflater = sync.OnceValue(func() gzipInflater {
	return chooseInflater(os.Getenv(InflateEnv), func() (*isalLib, error) { return loadISAL(isalLibName) })
})

// GzipBackend names the inflater NewGzipReader uses in this process,
// BackendISAL or BackendGo, for the caller's startup log and metrics.
func GzipBackend() string { return defaultInflater().backend }

// GzipBackendReason says why the pure-Go inflater is used ("" with ISA-L):
// the override, or the error loading libisal.
func GzipBackendReason() string { return defaultInflater().reason }

// NewGzipReader opens a gzip stream, multi-member streams included. It is
// the only place a gzip inflater is made: every gzip layer read in rootfs
// goes through it. It inflates with ISA-L when libisal loads, else with
// klauspost/compress; both check every member's CRC-32 and size, and both
// reject data after the last member that is not another member.
func NewGzipReader(r io.Reader) (io.ReadCloser, error) {
	return newGzipReader(r, defaultInflater())
}

// newGzipReader opens r with the given inflater; tests call it with each.
func newGzipReader(r io.Reader, inf gzipInflater) (io.ReadCloser, error) {
	if inf.backend == BackendISAL {
		return newISALReader(inf.lib, r) // its errors start with "gzip: "
	}
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil, fmt.Errorf("gzip: %w", err)
	}
	return zr, nil
}
