# Packaging targets for CubeTemplateCenter; the top-level Makefile includes
# this file (include packaging/packaging.mk).
#
#   make deb        dist/cube-templatecenter_<version>-1_<arch>.deb
#   make rpm        dist/cube-templatecenter-<version>-1.<arch>.rpm
#   make packages   both
#   make check-units  systemd-analyze verify + security gate on systemd/
#
# VERSION (from the top-level Makefile, or the command line) becomes the
# package version: a leading "v" is dropped, "-" becomes "+" (so git describe
# output stays a valid upstream version), and anything that does not start
# with a number ("2", "1.4"), such as a bare commit hash or "dev", gets
# 0.0.0+git in front. DIST= moves the output directory. The packager, nfpm,
# is a pinned Go program installed once into .tools/bin (`make nfpm`, which
# `make tools` and so `make test` run): building a package then fetches
# nothing, so it works offline once the module cache is warm. A clean
# checkout needs only Go, gcc, binutils (objdump) and ISA-L's header
# (libisal-dev; build-deps in the top-level Makefile installs it): the
# binary dlopens libisal.so.2, which the packages only recommend.

# Keep the includer's default goal, whether this file is included before or
# after its first rule.
tc_pkg_saved_goal := $(.DEFAULT_GOAL)

GO                ?= go
VERSION           ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
DIST              ?= dist
NFPM_VER          := v2.45.2
NFPM_BIN          := $(CURDIR)/.tools/bin/nfpm
NFPM              ?= $(NFPM_BIN)
# The package's Maintainer field. Distributors set their own contact
# (make deb PKG_MAINTAINER='Name <mail>'); the default is a documented
# placeholder in the reserved .invalid domain, never a real address.
PKG_MAINTAINER    ?= CubeTemplateCenter maintainers <maintainers@cubetemplatecenter.invalid>
PKG_HOMEPAGE      ?= https://github.com/cubesandbox/cubetemplatecenter
# Security exposure score (systemd-analyze security) the service must not exceed.
UNIT_SECURITY_MAX ?= 3.0

PKG_NAME     = cube-templatecenter
PKG_VERSION  = $(shell printf '%s' '$(VERSION)' | sed -e 's/^v//' -e 's/-/+/g' -e '/^[0-9][0-9]*\(\.\|$$\)/!s/^/0.0.0+git/')
PKG_ARCH     = $(shell $(GO) env GOARCH)
PKG_STAGE    = $(DIST)/stage-$(PKG_VERSION)
PKG_LDFLAGS  = -s -w -X main.Version=$(VERSION) -extldflags=-Wl,-z,relro,-z,now

.PHONY: deb rpm packages check-units pkg-stage nfpm

packages: deb rpm

## nfpm: install the pinned packager into .tools/bin if missing (from
## outside the module, so go.mod never sees its dependencies).
nfpm: $(NFPM_BIN)

$(NFPM_BIN):
	cd /tmp && GOBIN=$(dir $(NFPM_BIN)) GOFLAGS=-mod=mod $(GO) install github.com/goreleaser/nfpm/v2/cmd/nfpm@$(NFPM_VER)

# The packager is a prerequisite only when it is the pinned one: NFPM=
# naming another nfpm skips the install.
deb rpm: pkg-stage $(if $(filter $(NFPM_BIN),$(NFPM)),$(NFPM_BIN))
	@mkdir -p $(DIST)
	TC_PKG_STAGE='$(PKG_STAGE)' TC_PKG_VERSION='$(PKG_VERSION)' TC_PKG_ARCH='$(PKG_ARCH)' \
	TC_PKG_GLIBC="$$(cat $(PKG_STAGE)/glibc)" TC_PKG_MAINTAINER='$(PKG_MAINTAINER)' \
	TC_PKG_HOMEPAGE='$(PKG_HOMEPAGE)' \
	$(NFPM) package --config packaging/nfpm.yaml --packager $@ --target $(DIST)/

# pkg-stage builds the binary (PIE, stripped, with cgo for SQLite and the
# ISA-L loader) and the generated files the manifest takes from $(PKG_STAGE).
pkg-stage: build-deps
	@mkdir -p $(PKG_STAGE)
	CGO_ENABLED=1 $(GO) build -trimpath -buildmode=pie -ldflags "$(PKG_LDFLAGS)" \
		-o $(PKG_STAGE)/templatecenter ./cmd/templatecenter
	@# The newest glibc symbol version the binary needs: the libc dependency.
	@objdump -T $(PKG_STAGE)/templatecenter | sed -n 's/.*GLIBC_\([0-9][0-9.]*\).*/\1/p' \
		| sort -t. -k1,1n -k2,2n -k3,3n | tail -n1 > $(PKG_STAGE)/glibc
	@test -s $(PKG_STAGE)/glibc || { echo "no GLIBC symbols in the binary: is cgo on?" >&2; exit 1; }
	gzip -9n < packaging/templatecenter.8 > $(PKG_STAGE)/templatecenter.8.gz
	@{ printf '%s (%s-1) unstable; urgency=medium\n\n' $(PKG_NAME) '$(PKG_VERSION)'; \
	   printf '  * Build of CubeTemplateCenter %s.\n\n' '$(VERSION)'; \
	   printf ' -- %s  %s\n' '$(PKG_MAINTAINER)' \
	     "$$(git log -1 --format=%cD 2>/dev/null || date -R)"; } \
	  | gzip -9n > $(PKG_STAGE)/changelog.Debian.gz

# check-units runs systemd-analyze on copies of the units whose Exec lines
# point at a freshly built binary (verify needs it to exist): any output of
# verify fails, and so does an exposure score above UNIT_SECURITY_MAX.
check-units: pkg-stage
	packaging/check-units.sh $(PKG_STAGE)/templatecenter $(UNIT_SECURITY_MAX)

.DEFAULT_GOAL := $(tc_pkg_saved_goal)
