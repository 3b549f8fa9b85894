package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/klauspost/compress/gzip"
	"golang.org/x/sys/unix"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/layercodec"
)

// floorWriteChunk is the size of the floor's writes.
const floorWriteChunk = 4 << 20

// measureFloor measures what the hardware allows for img: the fastest
// single-core inflate of each layer as served (ISA-L when it loads, and
// klauspost/compress; the best of two tries each, from the page cache),
// plus writing allocated bytes (the agent's image) to a new file in dir
// and fsyncing it.
func measureFloor(ctx context.Context, img *benchImage, allocated int64, dir string) (Measurement, error) {
	m := Measurement{Image: img.Name, Pipeline: PipelineFloor, Load1: loadAvg1()}
	for i, l := range img.Layers {
		best, by := time.Duration(0), ""
		for _, inf := range inflaters(l) {
			for range 2 {
				if err := ctx.Err(); err != nil {
					return m, err
				}
				d, err := timeInflate(l, inf.open)
				if err != nil {
					return m, fmt.Errorf("floor of %s layer %d (%s): %w", img.Name, i, inf.name, err)
				}
				if best == 0 || d < best {
					best, by = d, inf.name
				}
			}
		}
		m.Inflate += best
		m.Inflaters = append(m.Inflaters, by)
	}
	unix.Sync()
	d, err := timeWrite(ctx, dir, allocated)
	if err != nil {
		return m, fmt.Errorf("floor of %s: %w", img.Name, err)
	}
	m.WriteTime, m.Written = d, allocated
	m.Wall = m.Inflate + m.WriteTime
	return m, nil
}

// inflater opens a layer's uncompressed stream.
type inflater struct {
	name string
	open func(io.Reader) (io.ReadCloser, error)
}

// inflaters lists the decoders that apply to a layer.
func inflaters(l *layerFile) []inflater {
	if l.Zstd {
		return []inflater{{"zstd", layercodec.NewZstdReader}}
	}
	out := []inflater{{"go", func(r io.Reader) (io.ReadCloser, error) { return gzip.NewReader(r) }}}
	if gz := layercodec.NewGzipInflater(layercodec.InflaterAuto); gz.Backend() == layercodec.BackendISAL {
		out = append(out, inflater{"isal", func(r io.Reader) (io.ReadCloser, error) { return layercodec.NewGzipReader(r, gz) }})
	}
	return out
}

// timeInflate inflates layer l into io.Discard and returns how long it took.
func timeInflate(l *layerFile, open func(io.Reader) (io.ReadCloser, error)) (time.Duration, error) {
	f, err := os.Open(l.Path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	// Read once so the timing is of the inflate, not of the disk.
	if _, err := io.Copy(io.Discard, f); err != nil {
		return 0, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return 0, err
	}
	began := time.Now()
	zr, err := open(bufio.NewReaderSize(f, 1<<20))
	if err != nil {
		return 0, err
	}
	defer zr.Close()
	n, err := io.CopyBuffer(io.Discard, zr, make([]byte, 1<<20))
	if err != nil {
		return 0, err
	}
	if n != l.Tar {
		return 0, fmt.Errorf("inflated %d bytes, want %d", n, l.Tar)
	}
	return time.Since(began), nil
}

// timeWrite writes n bytes from memory to a new file in dir in 4 MiB
// writes, fsyncs it and returns how long that took; the file is removed.
func timeWrite(ctx context.Context, dir string, n int64) (time.Duration, error) {
	f, err := os.CreateTemp(dir, ".floor-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, floorWriteChunk)
	_, c := newRand(42)
	c.Read(buf)
	began := time.Now()
	for left := n; left > 0; left -= int64(len(buf)) {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if _, err := f.Write(buf[:min(left, int64(len(buf)))]); err != nil {
			return 0, err
		}
	}
	if err := f.Sync(); err != nil {
		return 0, err
	}
	return time.Since(began), nil
}
