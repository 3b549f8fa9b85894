# Tools the tests run that are Go programs outside this module; the
# top-level Makefile includes this file (include test/tools.mk).
#
#   make tools   installs them into .tools/bin (git-ignored) when missing
#
# versitygw is a real S3 server for test/s3server (agent/blobstore's tests).
# It is installed from outside the module (cd /tmp, GOFLAGS=-mod=mod), so
# this repository's go.mod and go.sum never see its dependencies.

# Keep the includer's default goal, whether this file is included before or
# after its first rule.
tc_tools_saved_goal := $(.DEFAULT_GOAL)

GO            ?= go
TOOLS_BIN     := $(CURDIR)/.tools/bin
VERSITYGW_VER := v1.8.0

.PHONY: tools

## tools: install the Go test tools (versitygw) into .tools/bin if missing.
tools: $(TOOLS_BIN)/versitygw

$(TOOLS_BIN)/versitygw:
	cd /tmp && GOBIN=$(TOOLS_BIN) GOFLAGS=-mod=mod $(GO) install github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VER)

.DEFAULT_GOAL := $(tc_tools_saved_goal)
