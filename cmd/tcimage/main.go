// Command tcimage builds the OCI image of templatecenter without a container
// engine: a root filesystem assembled from the Debian packages the binary
// needs at run time (unpacked without their maintainer scripts) plus the
// binary, written as an OCI image layout and an OCI archive of it. The
// output depends only on its inputs (the binaries, the .deb files, the
// version strings and SOURCE_DATE_EPOCH): building twice gives the same
// digests.
//
// Usage:
//
//	tcimage -out dist/image -tar dist/image.tar -version V -revision R \
//	    -debs dist/image-debs -platform amd64=bin/templatecenter [-platform arm64=...]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// defaultPackages are the Debian packages the image holds: the C library
// the cgo binary links (ldd lists libc.so.6 and the loader only), ISA-L for
// the fast gzip inflater (dlopened, so ldd does not list it), and the CA
// certificates registries and S3 endpoints are verified with. TC writes
// ext4 itself and runs no other program: nothing else is needed.
var defaultPackages = []string{"libc6", "libisal2", "ca-certificates"}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(ctx, os.Args[1:], os.Getenv, logger, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "tcimage:", err)
		var u usageError
		if errors.As(err, &u) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// tagPattern is the grammar of an image tag (OCI distribution spec).
var tagPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)

// usageError is a command-line mistake (exit 2).
type usageError struct{ error }

// platformFlag collects -platform GOARCH=BINARY pairs.
type platformFlag []platformInput

func (p *platformFlag) String() string { return fmt.Sprint(*p) }

func (p *platformFlag) Set(v string) error {
	arch, bin, ok := strings.Cut(v, "=")
	if !ok || arch == "" || bin == "" {
		return fmt.Errorf("%q is not GOARCH=BINARY (e.g. amd64=bin/templatecenter)", v)
	}
	goarch, variant, _ := strings.Cut(arch, "/")
	if _, err := debianArch(goarch, variant); err != nil {
		return err
	}
	*p = append(*p, platformInput{goarch: goarch, variant: variant, binary: bin})
	return nil
}

func run(ctx context.Context, args []string, getenv func(string) string, logger *slog.Logger, stdout io.Writer) error {
	fs := flag.NewFlagSet("tcimage", flag.ContinueOnError)
	var platforms platformFlag
	out := fs.String("out", "dist/image", "OCI image layout directory to write (replaced)")
	tarPath := fs.String("tar", "dist/image.tar", "OCI archive of the layout to write (empty: none)")
	version := fs.String("version", "", "version of the binary: a tag of the image and its org.opencontainers.image.version")
	revision := fs.String("revision", "", "source revision (org.opencontainers.image.revision)")
	source := fs.String("source", "https://github.com/cubesandbox/cubetemplatecenter", "source repository (org.opencontainers.image.source)")
	debs := fs.String("debs", "dist/image-debs", "directory of the .deb files, one subdirectory per Debian architecture; missing packages are fetched there with apt-get download")
	pkgs := fs.String("packages", strings.Join(defaultPackages, ","), "comma-separated Debian packages of the root filesystem")
	epoch := fs.String("source-date-epoch", getenv("SOURCE_DATE_EPOCH"), "Unix time of every file and of the image (default $SOURCE_DATE_EPOCH)")
	fs.Var(&platforms, "platform", "GOARCH[/VARIANT]=BINARY: a platform of the image and its templatecenter binary (repeatable)")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	if len(platforms) == 0 {
		return usageError{errors.New("no -platform GOARCH=BINARY given")}
	}
	if *version == "" {
		return usageError{errors.New("-version is required: it tags the image")}
	}
	if !tagPattern.MatchString(*version) {
		return usageError{fmt.Errorf("-version %q cannot be an image tag (letters, digits, '_', '.', '-'; at most 128)", *version)}
	}
	if *epoch == "" {
		return usageError{errors.New("no -source-date-epoch and SOURCE_DATE_EPOCH is unset: the file times would not be reproducible")}
	}
	secs, err := strconv.ParseInt(*epoch, 10, 64)
	if err != nil || secs < 0 {
		return usageError{fmt.Errorf("source date epoch %q is not a Unix time in seconds", *epoch)}
	}
	var names []string
	for _, n := range strings.Split(*pkgs, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	spec := buildSpec{
		platforms: platforms,
		packages:  names,
		debDir:    *debs,
		version:   *version,
		revision:  *revision,
		source:    *source,
		mtime:     time.Unix(secs, 0).UTC(),
	}
	idx, err := build(ctx, spec, logger)
	if err != nil {
		return err
	}
	digest, err := writeLayout(*out, idx, []string{"latest", *version})
	if err != nil {
		return err
	}
	if *tarPath != "" {
		if err := writeArchive(*out, *tarPath, spec.mtime); err != nil {
			return err
		}
	}
	logger.Info("image written", "layout", *out, "archive", *tarPath, "index", digest, "tags", "latest,"+*version)
	fmt.Fprintln(stdout, digest)
	return nil
}
