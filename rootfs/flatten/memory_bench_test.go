package flatten_test

import (
	"archive/tar"
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/flatten"
)

// manyFilesTar streams a layer of n files of 1 to 64 bytes in directories
// of 1000, shaped like the many-files image of the bench harness.
func manyFilesTar(n int) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		bw := bufio.NewWriterSize(pw, 1<<20)
		tw := tar.NewWriter(bw)
		mtime := time.Date(2024, 6, 1, 12, 0, 0, 0, time.UTC)
		body := []byte("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ+/")
		err := func() error {
			for _, d := range []string{"./", "srv/", "srv/many/"} {
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: mtime}); err != nil {
					return err
				}
			}
			for i := range n {
				if i%1000 == 0 {
					if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: fmt.Sprintf("srv/many/d%04d/", i/1000), Mode: 0o755, ModTime: mtime}); err != nil {
						return err
					}
				}
				b := body[:1+i%64]
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("srv/many/d%04d/f%03d", i/1000, i%1000), Mode: 0o644, Size: int64(len(b)), ModTime: mtime}); err != nil {
					return err
				}
				if _, err := tw.Write(b); err != nil {
					return err
				}
			}
			if err := tw.Close(); err != nil {
				return err
			}
			return bw.Flush()
		}()
		pw.CloseWithError(err)
	}()
	return pr
}

// vmStatus reads one kB figure of /proc/self/status, in bytes.
func vmStatus(tb testing.TB, key string) int64 {
	tb.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		tb.Skipf("read /proc/self/status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				tb.Fatalf("parse %s: %v", key, err)
			}
			return kb << 10
		}
	}
	tb.Fatalf("no %s in /proc/self/status", key)
	return 0
}

// manyFilesN sizes BenchmarkManyFilesMemory.
var manyFilesN = flag.Int("manyfiles", 200_000, "files in BenchmarkManyFilesMemory's layer")

// manyFilesGOGC, when set, runs BenchmarkManyFilesMemory under that GOGC:
// a low one makes the peak heap close to the peak live heap, a figure
// that does not depend on when collections happen to run.
var manyFilesGOGC = flag.Int("manyfiles.gogc", 0, "GOGC for BenchmarkManyFilesMemory (0: leave it)")

// BenchmarkManyFilesMemory flattens a layer of many tiny files into a real
// ext4 image and reports the peak heap and resident memory per entry over
// the whole build, Finish included: live is the largest heap a collection
// found reachable, heap the largest heap including garbage not yet
// collected, rss the growth of VmHWM. Size it with -args -manyfiles N (the
// bench harness's figure is for 1,000,000); run it alone (-run '^$'
// -bench ManyFilesMemory -benchtime 1x) so VmHWM is this build's.
func BenchmarkManyFilesMemory(b *testing.B) {
	n := *manyFilesN
	if g := *manyFilesGOGC; g > 0 {
		defer debug.SetGCPercent(debug.SetGCPercent(g))
	}
	dir := b.TempDir()
	for i := 0; b.Loop(); i++ {
		runtime.GC()
		rss0 := vmStatus(b, "VmRSS")
		var peakHeap, peakLive atomic.Uint64
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/heap/live:bytes"}}
			t := time.NewTicker(5 * time.Millisecond)
			defer t.Stop()
			for {
				metrics.Read(s)
				if v := s[0].Value.Uint64(); v > peakHeap.Load() {
					peakHeap.Store(v)
				}
				if v := s[1].Value.Uint64(); v > peakLive.Load() {
					peakLive.Store(v)
				}
				select {
				case <-stop:
					return
				case <-t.C:
				}
			}
		}()
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("m%d.ext4", i)))
		if err != nil {
			b.Fatal(err)
		}
		o := ext4Options()
		o.ConsumeTree = true // as rootfs.Builder does
		w, err := ext4.NewWriter(f, o)
		if err != nil {
			b.Fatal(err)
		}
		tree := flatten.New(w, flatten.Options{})
		r := manyFilesTar(n)
		if err := tree.ApplyLayer(context.Background(), 0, r); err != nil {
			b.Fatal(err)
		}
		r.Close()
		if _, err := w.Finish(context.Background(), tree.Root()); err != nil {
			b.Fatal(err)
		}
		runtime.KeepAlive(tree)
		close(stop)
		<-done
		hwm := vmStatus(b, "VmHWM")
		f.Close()
		os.Remove(f.Name())
		entries := float64(n + n/1000 + 3)
		b.ReportMetric(float64(peakLive.Load())/entries, "live-B/entry")
		b.ReportMetric(float64(peakHeap.Load())/entries, "heap-B/entry")
		b.ReportMetric(float64(hwm-rss0)/entries, "rss-B/entry")
	}
}
