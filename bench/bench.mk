# Benchmarks of CubeTemplateCenter against upstream's dockerless pipeline;
# the top-level Makefile includes this file (include bench/bench.mk).
#
#   make bench         tcbench: upstream vs the agent (cold, warm-now, warm,
#                      reuse) and the floor on three generated images, served
#                      by a loopback docker-registry; the agent cold through
#                      a link model (test/linkproxy), end to end; then the
#                      agent's scale curve, 4 images at once and a
#                      1,000,000-file image;
#                      then two replicas on one MariaDB and blob store;
#                      prints the tables and targets (docs/performance.md)
#   make bench-micro   go test -bench in bench/: decompression, sha256, the
#                      Builder end to end (with a phase breakdown)
#   make bench-profile CPU profile of a warm Builder build of the Debian image
#
# Needs root. Missing tools (skopeo, umoci, docker-registry, e2fsprogs,
# debootstrap, time) are installed with apt-get; the Debian tree is made
# once with debootstrap and cached in /var/cache/cube-templatecenter-test.
# Knobs: BENCH_N runs per pipeline and image, BENCH_IMAGES (debian, large,
# small, tiny), BENCH_WORK (generated images are kept there between runs),
# BENCH_SCALE_MIB, BENCH_FILES, BENCH_LINKS.

# Keep the includer's default goal, whether this file is included before or
# after its first rule.
tc_bench_saved_goal := $(.DEFAULT_GOAL)

GO           ?= go
BIN          ?= bin/templatecenter
BENCH_N      ?= 3
BENCH_IMAGES ?= debian,large,small
BENCH_WORK   ?= /var/tmp/cube-templatecenter-bench
BENCH_TIME   ?= 3x
# MiB per layer of the scale curve and the concurrency images (0 skips
# them); files of the many-files image (0 skips it).
BENCH_SCALE_MIB ?= 256
BENCH_FILES     ?= 1000000
# Link models of the link rows: cold builds of the debian and large images
# through a proxy sharing one bandwidth between all connections, 20 ms per
# new connection, timed from the build's POST to its BUILT report. Each is
# Mbit/s shared, optionally /Mbit/s per connection: 1000/200 caps each
# connection at 200 Mbit/s within 1 Gbit/s ("" skips them).
BENCH_LINKS     ?= 400,1000/200

.PHONY: bench bench-micro bench-profile

## bench: measure upstream's pipeline and the agent side by side (root; about 7 minutes with BENCH_N=3 once the images are generated).
bench: build
	$(GO) run ./bench/cmd/tcbench -templatecenter $(BIN) -n $(BENCH_N) -images $(BENCH_IMAGES) -work $(BENCH_WORK) \
		-scale-layer-mib $(BENCH_SCALE_MIB) -many-files $(BENCH_FILES) -links "$(BENCH_LINKS)"

## bench-micro: Go benchmarks of the hot paths in bench/ (see also rootfs/ext4, rootfs/flatten, rootfs/oci).
bench-micro:
	$(GO) test -run '^$$' -bench . -benchtime $(BENCH_TIME) ./bench/

## bench-profile: CPU profile of warm Debian builds through rootfs.Builder (bench-cpu.out; includes the warm-up build and its zstd re-encode).
bench-profile:
	$(GO) test -run '^$$' -bench '^BenchmarkBuilder$$/^debian$$/^warm$$' -benchtime 5x -cpuprofile bench-cpu.out -o bench.test ./bench/ -args -images $(BENCH_WORK)/images
	$(GO) tool pprof -top -nodecount 30 bench.test bench-cpu.out

.DEFAULT_GOAL := $(tc_bench_saved_goal)
