//go:build cgo && linux

package layercodec

/*
#include <dlfcn.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <isa-l/igzip_lib.h>

// The library is opened with dlopen, never linked: the binary has no
// NEEDED entry for it and runs, on the pure-Go inflater, where it is
// missing. The header gives the exact layout of struct inflate_state.

typedef void (*tc_isal_init_fn)(struct inflate_state *);
typedef int (*tc_isal_inflate_fn)(struct inflate_state *);

typedef struct {
	void *handle;
	tc_isal_init_fn init;
	tc_isal_inflate_fn inflate;
} tc_isal;

// tc_isal_open loads the library at path and its two entry points. It
// returns NULL and a message in err (of errlen bytes) on failure.
static tc_isal *tc_isal_open(const char *path, char *err, size_t errlen) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *m = dlerror();
		snprintf(err, errlen, "%s", m ? m : "dlopen failed");
		return NULL;
	}
	tc_isal_init_fn init = (tc_isal_init_fn)dlsym(h, "isal_inflate_init");
	tc_isal_inflate_fn inflate = (tc_isal_inflate_fn)dlsym(h, "isal_inflate");
	if (init == NULL || inflate == NULL) {
		snprintf(err, errlen, "%s: isal_inflate_init or isal_inflate not found", path);
		dlclose(h);
		return NULL;
	}
	tc_isal *lib = malloc(sizeof *lib);
	if (lib == NULL) {
		snprintf(err, errlen, "out of memory");
		dlclose(h);
		return NULL;
	}
	lib->handle = h;
	lib->init = init;
	lib->inflate = inflate;
	return lib;
}

// tc_isal_new allocates a state for a gzip member (header, deflate data
// and trailer, whose CRC-32 and size ISA-L checks).
static struct inflate_state *tc_isal_new(tc_isal *lib) {
	struct inflate_state *s = malloc(sizeof *s);
	if (s != NULL) {
		lib->init(s);
		s->crc_flag = ISAL_GZIP;
	}
	return s;
}

// tc_isal_member starts the next member, keeping the pending input.
static void tc_isal_member(tc_isal *lib, struct inflate_state *s) {
	uint8_t *in = s->next_in;
	uint32_t avail = s->avail_in;
	lib->init(s);
	s->crc_flag = ISAL_GZIP;
	s->next_in = in;
	s->avail_in = avail;
}

static void tc_isal_set_input(struct inflate_state *s, uint8_t *in, uint32_t n) {
	s->next_in = in;
	s->avail_in = n;
}

typedef struct {
	int ret;          // isal_inflate's return value
	uint32_t out;     // bytes written to the output buffer
	uint32_t in;      // input bytes consumed
	int finished;     // the member's trailer has been read and checked
} tc_isal_result;

static int tc_has_avx;

static void tc_cpu_init(void) {
	__builtin_cpu_init();
	tc_has_avx = __builtin_cpu_supports("avx");
}

// tc_isal_run inflates into out (Go memory, valid only during the call:
// the state never keeps the pointer, ISA-L keeps its history window in
// the state itself).
static tc_isal_result tc_isal_run(tc_isal *lib, struct inflate_state *s, uint8_t *out, uint32_t outlen) {
	tc_isal_result r;
	uint32_t avail = s->avail_in;
	s->next_out = out;
	s->avail_out = outlen;
	r.ret = lib->inflate(s);
	if (tc_has_avx) {
		__asm__ volatile("vzeroupper" ::: "memory");
	}
	r.out = outlen - s->avail_out;
	r.in = avail > s->avail_in ? avail - s->avail_in : 0;
	r.finished = s->block_state == ISAL_BLOCK_FINISH;
	s->next_out = NULL;
	s->avail_out = 0;
	return r;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"io"
	"unsafe"

	"github.com/klauspost/compress/gzip"
)

// isalLib is a loaded libisal: the dlopen handle and its entry points,
// kept for the life of the process.
type isalLib struct{ c *C.tc_isal }

// loadISAL opens the ISA-L shared library at path.
func loadISAL(path string) (*isalLib, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var msg [512]C.char
	C.tc_cpu_init()
	lib := C.tc_isal_open(cpath, &msg[0], C.size_t(len(msg)))
	if lib == nil {
		return nil, fmt.Errorf("load %s: %s", path, C.GoString(&msg[0]))
	}
	return &isalLib{c: lib}, nil
}

// isalReader inflates a gzip stream of one or more members with ISA-L. Its
// input buffer and state live in C memory (ISA-L keeps pointers into the
// input between calls); output goes straight into the caller's buffer.
type isalReader struct {
	lib   *isalLib
	src   io.Reader
	st    *C.struct_inflate_state
	in    []byte // C memory
	eof   bool   // src returned io.EOF
	done  bool   // the current member is finished
	empty int    // consecutive calls that neither read nor wrote anything
	err   error  // sticky
}

var (
	_ io.ReadCloser = (*isalReader)(nil)
	_ io.WriterTo   = (*isalReader)(nil)
)

// newISALReader reads the first member's header magic and returns a
// reader over the whole stream.
func newISALReader(lib *isalLib, src io.Reader) (io.ReadCloser, error) {
	return newISALReaderSize(lib, src, isalInBuffer)
}

// newISALReaderSize is newISALReader with an input buffer of size bytes
// (at least gzipHeaderLen); tests shrink it to move every boundary.
func newISALReaderSize(lib *isalLib, src io.Reader, size int) (io.ReadCloser, error) {
	size = max(size, gzipHeaderLen)
	st := C.tc_isal_new(lib.c)
	if st == nil {
		return nil, errors.New("isal: allocate inflate state: out of memory")
	}
	buf := C.malloc(C.size_t(size))
	if buf == nil {
		C.free(unsafe.Pointer(st))
		return nil, errors.New("isal: allocate input buffer: out of memory")
	}
	z := &isalReader{lib: lib, src: src, st: st, in: unsafe.Slice((*byte)(buf), size)}
	C.tc_isal_set_input(st, (*C.uint8_t)(buf), 0)
	if err := z.member(true); err != nil {
		z.Close()
		return nil, err
	}
	return z, nil
}

// pending is the input ISA-L has not consumed yet. ok is false if ISA-L's
// input pointer left the buffer, which would be a decoder bug: the reader
// then fails instead of reading out of bounds.
func (z *isalReader) pending() (in []byte, ok bool) {
	n := uintptr(z.st.avail_in)
	if n == 0 {
		return nil, true
	}
	base, next := uintptr(unsafe.Pointer(&z.in[0])), uintptr(unsafe.Pointer(z.st.next_in))
	if next < base || next-base+n > uintptr(len(z.in)) {
		return nil, false
	}
	return z.in[next-base : next-base+n], true
}

var errInputBounds = errors.New("gzip: isal inflate: input pointer outside its buffer")

// fill moves the pending input to the front of the buffer and reads until
// the buffer is full or src ends: ISA-L pays a fixed cost per call (it
// saves its history window), so it is fed large chunks however short the
// reads of src are. A run of maxEmptyReads reads returning nothing is
// io.ErrNoProgress.
func (z *isalReader) fill() error {
	rest, ok := z.pending()
	if !ok {
		return errInputBounds
	}
	n := copy(z.in, rest)
	defer func() { C.tc_isal_set_input(z.st, (*C.uint8_t)(unsafe.Pointer(&z.in[0])), C.uint32_t(n)) }()
	for empty := 0; n < len(z.in) && !z.eof; {
		m, err := z.src.Read(z.in[n:])
		n += m
		switch {
		case errors.Is(err, io.EOF):
			z.eof = true
		case err != nil:
			return fmt.Errorf("gzip: read: %w", err)
		case m > 0:
			empty = 0
		default:
			if empty++; empty >= maxEmptyReads {
				return fmt.Errorf("gzip: read: %w", io.ErrNoProgress)
			}
		}
	}
	return nil
}

// member checks that a gzip member header starts at the pending input, as
// the pure-Go reader does: at the start of the stream an empty input is
// io.EOF; after a member it is the clean end (io.EOF, done stays set), a
// partial header is io.ErrUnexpectedEOF, and anything but the gzip magic
// and the deflate method, or a reserved flag, is gzip.ErrHeader.
func (z *isalReader) member(first bool) error {
	for int(z.st.avail_in) < gzipHeaderLen && !z.eof {
		if err := z.fill(); err != nil {
			return err
		}
	}
	hdr, ok := z.pending()
	switch {
	case !ok:
		return errInputBounds
	case len(hdr) == 0:
		if first {
			return fmt.Errorf("gzip: %w", io.EOF)
		}
		return io.EOF
	case len(hdr) < gzipHeaderLen:
		return fmt.Errorf("gzip: header: %w", io.ErrUnexpectedEOF)
	case hdr[0] != 0x1f || hdr[1] != 0x8b || hdr[2] != 8:
		return gzip.ErrHeader
	case hdr[3]&gzipReservedFlags != 0:
		// RFC 1952: a decoder must refuse reserved flags. ISA-L skips
		// them; the pure-Go reader refuses them, and both must agree.
		return gzip.ErrHeader
	}
	C.tc_isal_member(z.lib.c, z.st)
	z.done = false
	return nil
}

// Read implements io.Reader.
func (z *isalReader) Read(p []byte) (int, error) {
	if z.err != nil {
		return 0, z.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if len(p) > isalMaxOut {
		p = p[:isalMaxOut]
	}
	for {
		if z.done {
			if z.err = z.member(false); z.err != nil {
				return 0, z.err
			}
		}
		if z.st.avail_in == 0 {
			if z.err = z.fill(); z.err != nil {
				return 0, z.err
			}
		}
		r := C.tc_isal_run(z.lib.c, z.st, (*C.uint8_t)(unsafe.Pointer(&p[0])), C.uint32_t(len(p)))
		if r.ret < 0 {
			z.err = isalError(int(r.ret))
			return 0, z.err
		}
		z.done = r.finished != 0
		if r.out > 0 {
			z.empty = 0
			return int(r.out), nil
		}
		if z.done {
			continue
		}
		if r.in > 0 {
			z.empty = 0
			continue
		}
		if z.eof && z.st.avail_in == 0 {
			z.err = fmt.Errorf("gzip: %w", io.ErrUnexpectedEOF)
			return 0, z.err
		}
		// Neither input taken nor output made with input at hand: ISA-L
		// is stuck; a guard, so a decoder bug cannot spin forever.
		if z.st.avail_in > 0 {
			if z.empty++; z.empty > maxEmptyReads {
				z.err = fmt.Errorf("gzip: isal inflate: %w", io.ErrNoProgress)
				return 0, z.err
			}
		}
	}
}

// Close frees the C state and buffer; it does not close src.
func (z *isalReader) Close() error {
	if z.st != nil {
		C.free(unsafe.Pointer(z.st))
		C.free(unsafe.Pointer(&z.in[0]))
		z.st, z.in = nil, nil
	}
	if z.err == nil {
		z.err = errReaderClosed
	}
	return nil
}

// isalError maps an ISA-L inflate error to the error the pure-Go reader
// gives for the same damage.
func isalError(ret int) error {
	switch ret {
	case C.ISAL_INCORRECT_CHECKSUM:
		return gzip.ErrChecksum
	case C.ISAL_INVALID_WRAPPER, C.ISAL_UNSUPPORTED_METHOD:
		return gzip.ErrHeader
	case C.ISAL_INVALID_BLOCK, C.ISAL_INVALID_SYMBOL, C.ISAL_INVALID_LOOKBACK:
		return fmt.Errorf("%w (isal %d)", errCorrupt, ret)
	default:
		return fmt.Errorf("gzip: isal inflate: error %d", ret)
	}
}

// WriteTo implements io.WriterTo, inflating through a buffer of its own
// (isalMaxOut bytes) so io.Copy does not drive ISA-L in small reads.
func (z *isalReader) WriteTo(w io.Writer) (int64, error) {
	buf := make([]byte, isalMaxOut)
	var total int64
	for {
		n, err := z.Read(buf)
		if n > 0 {
			m, werr := w.Write(buf[:n])
			total += int64(m)
			if werr != nil {
				return total, werr
			}
			if m != n {
				return total, io.ErrShortWrite
			}
		}
		if errors.Is(err, io.EOF) {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}
