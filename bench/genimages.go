package bench

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// ScaleSteps are the layer counts of the scale curve's images: with
// layers of 256 MiB of content, images of 0.25, 0.5, 1 and 2 GiB.
var ScaleSteps = [...]int{1, 2, 4, 8}

// DefaultScaleLayerBytes is the content of one scale layer.
const DefaultScaleLayerBytes = 256 << 20

// DefaultManyFiles is the file count of the many-files image.
const DefaultManyFiles = 1_000_000

// scalePool is the set of layers the scale and concurrency images are made
// of: layer k holds layerBytes of mixedData (its own seed) under
// opt/scale/k. The scale image of n layers is the first n; the
// concurrency images are one layer each, the last four, so they share no
// blob with each other (they do with the largest scale image, which is
// measured on its own agent).
func scalePool(ctx context.Context, dir string, layerBytes int64, log io.Writer) ([]*layerFile, error) {
	n := ScaleSteps[len(ScaleSteps)-1]
	out := filepath.Join(dir, fmt.Sprintf("scale-%dk", layerBytes>>10))
	meta := filepath.Join(out, "layers.json")
	var pool struct {
		Version int          `json:"version"`
		Layers  []*layerFile `json:"layers"`
	}
	if b, err := os.ReadFile(meta); err == nil && json.Unmarshal(b, &pool) == nil && pool.Version == genVersion && len(pool.Layers) == n {
		ok := true
		for _, l := range pool.Layers {
			ok = ok && l.valid()
		}
		if ok {
			return pool.Layers, nil
		}
	}
	if err := os.RemoveAll(out); err != nil {
		return nil, fmt.Errorf("prepare scale layers: %w", err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, fmt.Errorf("prepare scale layers: %w", err)
	}
	began := time.Now()
	layers := make([]*layerFile, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 2) // the machine's cores; more only thrashes
	var wg sync.WaitGroup
	for k := range layers {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if ctx.Err() != nil {
				errs[k] = ctx.Err()
				return
			}
			layers[k], errs[k] = writeLayer(filepath.Join(out, fmt.Sprintf("layer%d.tar.gz", k)), func(tw *countingTar) error {
				return mixedData(tw, fmt.Sprintf("opt/scale/%d", k), layerBytes, uint64(100+k))
			})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("prepare scale layers: %w", err)
	}
	pool.Version, pool.Layers = genVersion, layers
	if err := saveJSON(meta, pool); err != nil {
		return nil, err
	}
	var blob, raw int64
	for _, l := range layers {
		blob, raw = blob+l.Blob, raw+l.Tar
	}
	fmt.Fprintf(log, "generated %d scale layers: %.1f MiB compressed, %.1f MiB of tar (%s)\n",
		n, mib(blob), mib(raw), time.Since(began).Round(time.Millisecond))
	return layers, nil
}

// scaleImageName names the scale image of content bytes.
func scaleImageName(content int64) string {
	return fmt.Sprintf("scale-%dm", content>>20)
}

// manyFilesImage returns the image of n small files in directories of
// 1000 (one layer), made on first use and kept under dir.
func manyFilesImage(ctx context.Context, dir string, n int, log io.Writer) (*benchImage, error) {
	name := fmt.Sprintf("files-%d", n)
	out := filepath.Join(dir, name)
	meta := filepath.Join(out, "image.json")
	if b, err := os.ReadFile(meta); err == nil {
		var img benchImage
		if json.Unmarshal(b, &img) == nil && img.Version == genVersion && len(img.Layers) == 1 && img.Layers[0].valid() {
			return &img, nil
		}
	}
	if err := os.RemoveAll(out); err != nil {
		return nil, fmt.Errorf("prepare image %s: %w", name, err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, fmt.Errorf("prepare image %s: %w", name, err)
	}
	began := time.Now()
	l, err := writeLayer(filepath.Join(out, "files.tar.gz"), func(tw *countingTar) error {
		return manyFiles(ctx, tw, n)
	})
	if err != nil {
		return nil, fmt.Errorf("prepare image %s: %w", name, err)
	}
	img := &benchImage{Name: name, Version: genVersion, Layers: []*layerFile{l}}
	if err := saveJSON(meta, img); err != nil {
		return nil, err
	}
	fmt.Fprintf(log, "generated image %s: %.1f MiB compressed, %.1f MiB of tar, %d entries (%s)\n",
		name, mib(l.Blob), mib(l.Tar), l.Entries, time.Since(began).Round(time.Millisecond))
	return img, nil
}

// manyFiles writes n files of 1 to 64 bytes in directories of 1000 under
// srv/many, plus etc/os-release.
func manyFiles(ctx context.Context, tw *countingTar, n int) error {
	mtime := imageCreated
	for _, d := range []string{"./", "etc/", "srv/", "srv/many/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: mtime}); err != nil {
			return err
		}
	}
	if err := writeFile(tw, "etc/os-release", 0o644, []byte("PRETTY_NAME=\"tcbench many files\"\nID=tcbench\n")); err != nil {
		return err
	}
	body := []byte("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ+/")
	for i := range n {
		if i%1000 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: fmt.Sprintf("srv/many/d%04d/", i/1000), Mode: 0o755, ModTime: mtime}); err != nil {
				return err
			}
		}
		if err := writeFile(tw, fmt.Sprintf("srv/many/d%04d/f%03d", i/1000, i%1000), 0o644, body[:1+i%64]); err != nil {
			return err
		}
	}
	return nil
}
