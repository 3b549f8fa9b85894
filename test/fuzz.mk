# Native Go fuzzing; the top-level Makefile includes this file
# (include test/fuzz.mk).
#
#   make fuzz                 runs every fuzz target for FUZZTIME each
#   make fuzz FUZZTIME=10s    what CI runs after make test
#
# go test runs one fuzz target per invocation, so the targets run in turn;
# the first crasher stops make fuzz with an error, and go test writes the
# input under the package's testdata/fuzz/FuzzName/, where it becomes part
# of the seed corpus that make test runs once the bug is fixed.

# Keep the includer's default goal, whether this file is included before or
# after its first rule.
tc_fuzz_saved_goal := $(.DEFAULT_GOAL)

GO       ?= go
FUZZTIME ?= 30s

# FUZZ_TARGETS lists package:FuzzName pairs.
FUZZ_TARGETS := \
	./rootfs/flatten:FuzzApplyLayer \
	./agent/api:FuzzParseBuild \
	./rootfs/oci:FuzzValidateImageRef \
	./rootfs/oci:FuzzReadArchive \
	./rootfs/oci:FuzzLayoutIndex \
	./rootfs/oci:FuzzParseInetAton \
	./agent/config:FuzzParseByteSize \
	./agent/config:FuzzParseReserve \
	./rootfs/inspect:FuzzOpen \
	./rootfs/layercodec:FuzzGzipInflaters \
	./rootfs/startcheck:FuzzParseELF \
	./rootfs/startcheck:FuzzParseShebang \
	./rootfs/startcheck:FuzzCheck \
	./rootfs/startcheck:FuzzParseDynamic \
	./rootfs/startcheck:FuzzParseVersions \
	./rootfs/startcheck:FuzzParseLDCache \
	./rootfs/safetext:FuzzClip

.PHONY: fuzz

## fuzz: run each fuzz target for FUZZTIME (default 30s); a crasher fails.
## Go 1.26's fuzz coordinator can end a run at its -fuzztime deadline with a
## bare "context deadline exceeded" (go.dev/issue/75804, fixed in Go 1.27):
## a run that fails that way and wrote no crasher is reported, not failed.
fuzz:
	@set -e; out=$$(mktemp); trap 'rm -f "$$out"' EXIT; \
	for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; name=$${t##*:}; corpus=$$pkg/testdata/fuzz/$$name; \
	  before=$$(ls "$$corpus" 2>/dev/null | wc -l); \
	  echo "fuzz $$name in $$pkg for $(FUZZTIME)"; \
	  if $(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg >"$$out" 2>&1; then cat "$$out"; continue; fi; \
	  cat "$$out"; \
	  after=$$(ls "$$corpus" 2>/dev/null | wc -l); \
	  if [ "$$after" = "$$before" ] && grep -q '^    context deadline exceeded$$' "$$out" && ! grep -q 'Failing input written' "$$out"; then \
	    echo "fuzz $$name: stopped by the fuzz coordinator's deadline race (go.dev/issue/75804), no crasher: not a failure"; \
	  else exit 1; fi; \
	done

.DEFAULT_GOAL := $(tc_fuzz_saved_goal)
