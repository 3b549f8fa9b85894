# Tools the tests run that are Go programs outside this module; the
# top-level Makefile includes this file (include test/tools.mk).
#
#   make tools         installs them into .tools/bin (git-ignored) when missing
#   make staticcheck   lints the module (make test runs it)
#
# versitygw is a real S3 server for test/s3server (agent/blobstore's tests);
# staticcheck is the linter `make staticcheck` runs; helm lints and renders
# the chart in packaging/helm for test/helmchart (TC_HELM). All are installed
# from outside the module (cd /tmp, GOFLAGS=-mod=mod), so this repository's
# go.mod and go.sum never see their dependencies. Each is built once, when
# missing (helm takes a few minutes on a cold module cache).

# Keep the includer's default goal, whether this file is included before or
# after its first rule.
tc_tools_saved_goal := $(.DEFAULT_GOAL)

GO              ?= go
TOOLS_BIN       := $(CURDIR)/.tools/bin
VERSITYGW_VER   := v1.8.0
# honnef.co/go/tools v0.8.2 is staticcheck release 2026.2.2, which knows
# Go 1.26.
STATICCHECK_VER := v0.8.2
HELM_VER        := v3.22.0

.PHONY: tools staticcheck

## tools: install the Go test tools (versitygw, staticcheck, helm) and the
## packager (nfpm, packaging/packaging.mk) into .tools/bin if missing.
tools: $(TOOLS_BIN)/versitygw $(TOOLS_BIN)/staticcheck $(TOOLS_BIN)/helm nfpm

$(TOOLS_BIN)/versitygw:
	cd /tmp && GOBIN=$(TOOLS_BIN) GOFLAGS=-mod=mod $(GO) install github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VER)

## staticcheck: lint the module with the pinned staticcheck (test runs it);
## a deliberate exception carries a //lint:ignore directive saying why.
# build-deps because rootfs/layercodec's cgo file needs ISA-L's header to
# type-check.
staticcheck: build-deps $(TOOLS_BIN)/staticcheck
	$(TOOLS_BIN)/staticcheck ./...

$(TOOLS_BIN)/staticcheck:
	cd /tmp && GOBIN=$(TOOLS_BIN) GOFLAGS=-mod=mod $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VER)

$(TOOLS_BIN)/helm:
	cd /tmp && GOBIN=$(TOOLS_BIN) GOFLAGS=-mod=mod $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VER)

.DEFAULT_GOAL := $(tc_tools_saved_goal)
