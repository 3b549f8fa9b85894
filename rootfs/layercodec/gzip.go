package layercodec

import (
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/gzip"
)

// The gzip inflaters a GzipInflater may use, as Backend names them.
const (
	// BackendISAL is ISA-L's inflate, loaded from libisal at run time.
	BackendISAL = "isal"
	// BackendGo is the pure-Go inflater (klauspost/compress).
	BackendGo = "go"
)

// Inflater is the caller's choice of gzip inflater, given to
// NewGzipInflater.
type Inflater string

// The inflater choices.
const (
	// InflaterAuto uses ISA-L when libisal loads, else the pure-Go
	// inflater.
	InflaterAuto Inflater = "auto"
	// InflaterGo forces the pure-Go inflater.
	InflaterGo Inflater = "go"
)

// isalLibName is the soname of Debian's libisal2 (and of isa-l in RPM
// distributions).
const isalLibName = "libisal.so.2"

// gzipReservedFlags are the FLG bits RFC 1952 reserves (5-7).
const gzipReservedFlags = 0xe0

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

// GzipInflater is an Inflater choice resolved: the backend it settled on
// and, for ISA-L, the loaded library, which is never unloaded. Make one per
// process (NewGzipInflater) and pass it to every reader. A nil
// *GzipInflater inflates with the pure-Go inflater.
type GzipInflater struct {
	backend string
	lib     *isalLib // nil for BackendGo
	reason  string   // why ISA-L is not used, for BackendGo
}

// NewGzipInflater resolves choice: InflaterGo forces the pure-Go inflater;
// any other value loads libisal and falls back to the pure-Go inflater if
// that fails.
func NewGzipInflater(choice Inflater) *GzipInflater {
	return chooseInflater(choice, func() (*isalLib, error) { return loadISAL(isalLibName) })
}

// chooseInflater picks ISA-L unless choice asks for the pure-Go inflater
// or load fails.
func chooseInflater(choice Inflater, load func() (*isalLib, error)) *GzipInflater {
	if choice == InflaterGo {
		return &GzipInflater{backend: BackendGo, reason: "pure-Go inflater requested"}
	}
	lib, err := load()
	if err != nil {
		return &GzipInflater{backend: BackendGo, reason: err.Error()}
	}
	return &GzipInflater{backend: BackendISAL, lib: lib}
}

// Backend names the inflater g uses, BackendISAL or BackendGo, for the
// caller's startup log and metrics.
func (g *GzipInflater) Backend() string {
	if g == nil {
		return BackendGo
	}
	return g.backend
}

// Reason says why g uses the pure-Go inflater ("" with ISA-L): the
// request, or the error loading libisal.
func (g *GzipInflater) Reason() string {
	if g == nil {
		return "no inflater chosen"
	}
	return g.reason
}

// NewGzipReader opens a gzip stream, multi-member streams included, with
// inflater g. It is the only place a gzip inflater is made: every gzip
// layer read in rootfs goes through it. Both backends check every
// member's CRC-32 and size, and both reject data after the last member
// that is not another member.
func NewGzipReader(r io.Reader, g *GzipInflater) (io.ReadCloser, error) {
	if g != nil && g.backend == BackendISAL {
		return newISALReader(g.lib, r) // its errors start with "gzip: "
	}
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil, fmt.Errorf("gzip: %w", err)
	}
	return zr, nil
}
