# CubeTemplateCenter. `make demo` and `make test` are all a newcomer needs.

GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS := -X main.Version=$(VERSION) -X main.Revision=$(REVISION)
BIN     := bin/templatecenter

# Debian packages the tests use: e2fsprogs (e2fsck, debugfs), systemd
# (systemd-socket-activate), docker-registry (a real registry server),
# apache2-utils (htpasswd for its auth), umoci (an independent reference
# unpacker), attr (getfattr), debootstrap (a real Debian rootfs to build,
# and the root of the systemd-nspawn container the packaging suite boots),
# systemd-container (systemd-nspawn), lintian, rpm, shellcheck and binutils
# (package checks), mariadb-server, postgresql (15 on bookworm) and
# redis-server (CubeMaster's database and Redis, for test/dbserver),
# libisal2 (ISA-L inflate, which make test expects to load),
# libisal-dev (its header, for the build), runc (the OCI runtime
# test/tcimage runs the container image with), prometheus (prometheus and
# promtool: test/alerts checks and unit-tests the alert rules and runs a
# real server against the agent; test/helmchart checks the rendered rules),
# and gcc, musl, musl-tools and busybox-static (the start check's loader
# oracle builds programs and libraries, and an Alpine-like tree, to run the
# real loaders on).
#
# test/dbserver and test/alerts start their own servers (loopback, free
# ports, temp dirs) and never use the services these packages install.
# Where PID 1 is systemd, installing them also starts mariadb,
# postgresql@15-main, redis-server and prometheus (:9090) on their default
# ports: harmless to the tests, and `systemctl disable --now mariadb
# postgresql redis-server prometheus` stops them. In a container without
# systemd (CI, Docker's policy-rc.d) they are never started.
TEST_PACKAGES := e2fsprogs systemd systemd-container docker-registry apache2-utils umoci attr debootstrap debian-archive-keyring gpgv lintian rpm shellcheck binutils skopeo time mariadb-server postgresql redis-server libisal2 libisal-dev runc prometheus gcc musl musl-tools busybox-static
TEST_TOOLS    := e2fsck debugfs systemd-socket-activate systemd-nspawn docker-registry htpasswd umoci getfattr debootstrap lintian rpm shellcheck objdump skopeo mariadbd mariadb-install-db initdb postgres redis-server runc prometheus promtool gcc musl-gcc busybox
# Where Debian keeps PostgreSQL's server programs (initdb, postgres): not on
# PATH; test/dbserver.PostgresBinDir says the same.
PG_BINDIR     := /usr/lib/postgresql/15/bin

# The build compiles rootfs/layercodec's cgo file against ISA-L's header
# (struct inflate_state); the binary dlopens libisal.so.2 at run time and
# runs without it, so only the build needs libisal-dev.
CC             ?= cc
BUILD_PACKAGES := libisal-dev
BUILD_HEADERS  := isa-l/igzip_lib.h
# Shared libraries make test expects to load (TC_EXPECT_ISAL=1).
TEST_LIBS      := libisal.so.2

.PHONY: all build build-deps cgo-check demo test test-unit test-no-isal vet fmt-check tidy-check deps clean

all: build

build: $(BIN)

$(BIN): build-deps cgo-check FORCE
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $@ ./cmd/templatecenter

FORCE:

## demo: build a template from a generated sample image through the agent and a CubeMaster stand-in.
demo: build
	$(GO) run ./cmd/tcdemo -templatecenter $(BIN) -out .demo

## test: everything CI runs (installs missing Debian test packages when root).
## ISA-L must load: its tests fail rather than fall back to Go alone.
test: deps tools fmt-check tidy-check vet staticcheck
	TC_EXPECT_ISAL=1 TC_HELM=$(TOOLS_BIN)/helm $(GO) test -count=1 -timeout 30m ./...

## test-no-isal: the gzip readers' packages with the pure-Go inflater forced,
## as on a machine without libisal2 (CI runs it after make test).
test-no-isal: build-deps
	env -u TC_EXPECT_ISAL CUBE_TEMPLATE_CENTER_INFLATE=go $(GO) test -count=1 -timeout 30m ./rootfs/layercodec ./rootfs/blobcache ./rootfs/

test-unit:
	$(GO) test -count=1 ./...

vet:
	$(GO) vet ./...

## tidy-check: fail when go.mod or go.sum differ from what `go mod tidy` writes.
tidy-check:
	@$(GO) mod tidy -diff >/dev/null || { echo "go.mod/go.sum are not tidy: run go mod tidy"; $(GO) mod tidy -diff; exit 1; }

fmt-check:
	@out=$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## cgo-check: refuse to build without cgo. The agent's SQLite spool needs
## it: a CGO_ENABLED=0 binary compiles, but its agent and jobs stop at the
## spool (only build, inspect and version work).
cgo-check:
	@cgo=$$($(GO) env CGO_ENABLED); test "$$cgo" = 1 || { \
	  echo "cgo is off (go env CGO_ENABLED=$$cgo): the agent's SQLite spool needs it." >&2; \
	  echo "Build with CGO_ENABLED=1 and a C compiler (CC=$(CC)); a CGO_ENABLED=0 binary runs only build, inspect and version." >&2; \
	  exit 1; }

## build-deps: install ISA-L's header (libisal-dev) when it is missing.
build-deps:
	@missing=""; for h in $(BUILD_HEADERS); do \
	  echo "#include <$$h>" | $(CC) -E -x c - >/dev/null 2>&1 || missing="$$missing $$h"; done; \
	if [ -n "$$missing" ]; then \
	  echo "missing build headers:$$missing"; \
	  if [ "$$(id -u)" -ne 0 ]; then echo "run as root, or: sudo apt-get install -y $(BUILD_PACKAGES)"; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(BUILD_PACKAGES); \
	fi

## deps: install the Debian packages the tests need, if any tool or library is missing.
deps: build-deps
	@missing=""; for t in $(TEST_TOOLS); do \
	  command -v $$t >/dev/null 2>&1 || [ -x /usr/sbin/$$t ] || [ -x /sbin/$$t ] || [ -x $(PG_BINDIR)/$$t ] || missing="$$missing $$t"; done; \
	for l in $(TEST_LIBS); do /sbin/ldconfig -p | grep -q "^[[:space:]]*$$l " || missing="$$missing $$l"; done; \
	if [ -n "$$missing" ]; then \
	  echo "missing test tools or libraries:$$missing"; \
	  if [ "$$(id -u)" -ne 0 ]; then echo "run as root, or: sudo apt-get install -y $(TEST_PACKAGES)"; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(TEST_PACKAGES); \
	fi

clean:
	rm -rf bin .demo
include packaging/packaging.mk
include packaging/image.mk
include bench/bench.mk
include test/tools.mk
include test/fuzz.mk
