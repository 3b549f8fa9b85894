# The container image; the top-level Makefile includes this file
# (include packaging/image.mk).
#
#   make image    dist/image/ (OCI image layout, tags latest and $(VERSION))
#                 and dist/image.tar (the same as an OCI archive)
#
# No container engine: cmd/tcimage assembles the root filesystem from the
# Debian packages the binary needs at run time (IMAGE_PACKAGES, fetched
# with apt-get download into IMAGE_DEBS/ARCH and reused from there, so
# the same .deb files give the same image) plus the binary, and writes it
# with go-containerregistry. Every file time and the image's creation time
# are SOURCE_DATE_EPOCH (default: the last commit's time), so the same
# inputs give the same digest. IMAGE_ARCHS lists the platforms (GOARCH);
# a foreign one needs a cross C compiler for cgo (CC_<arch>, e.g.
# CC_arm64=aarch64-linux-gnu-gcc) and `dpkg --add-architecture` for its
# packages. Push with skopeo, e.g.
#   skopeo copy --all oci:dist/image:latest docker://REGISTRY/cube-templatecenter:$(VERSION)

tc_image_saved_goal := $(.DEFAULT_GOAL)

GO               ?= go
DIST             ?= dist
IMAGE_ARCHS      ?= amd64
IMAGE_PACKAGES   ?= libc6,libisal2,ca-certificates
IMAGE_DEBS       ?= $(DIST)/image-debs
IMAGE_STAGE      = $(DIST)/image-stage
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
IMAGE_LDFLAGS    = -s -w -X main.Version=$(VERSION) -X main.Revision=$(REVISION) -extldflags=-Wl,-z,relro,-z,now

.PHONY: image

## image: the OCI image, built without a container engine (see packaging/image.mk).
image: build-deps
	@mkdir -p $(IMAGE_STAGE)
	$(foreach a,$(IMAGE_ARCHS),CGO_ENABLED=1 GOOS=linux GOARCH=$(a) CC=$(or $(CC_$(a)),$(CC)) \
	  $(GO) build -trimpath -buildmode=pie -ldflags "$(IMAGE_LDFLAGS)" \
	  -o $(IMAGE_STAGE)/templatecenter-$(a) ./cmd/templatecenter &&) true
	$(GO) run ./cmd/tcimage -out $(DIST)/image -tar $(DIST)/image.tar \
	  -version '$(VERSION)' -revision '$(REVISION)' -debs $(IMAGE_DEBS) -packages '$(IMAGE_PACKAGES)' \
	  -source-date-epoch '$(SOURCE_DATE_EPOCH)' \
	  $(foreach a,$(IMAGE_ARCHS),-platform $(a)=$(IMAGE_STAGE)/templatecenter-$(a))

.DEFAULT_GOAL := $(tc_image_saved_goal)
