# The two commands of the README's quick start, and the pieces they are made of.
#   make run   - install deps, build, run a default fuzz campaign on the best backend -> vramfuzz-out/
#   make test  - install deps, build, run every test (unit, properties, CLI), then the ASan/UBSan suite
.PHONY: all deps build run test test-unit test-asan bench clean

JOBS ?= $(shell nproc)
RUN_TIME ?= 60s
RUN_ARGS ?=

all: build

deps:
	@ci/install-deps.sh

build: deps
	cmake --preset default >/dev/null
	cmake --build --preset default -j $(JOBS)

# A default campaign: comfy:dec2025 and every allocator mode drawn per case, devices drawn from
# 6 GiB to 141 GiB. Exit code 1 means findings (the campaign worked); anything else fails make.
run: build
	@rm -rf vramfuzz-out
	@./build/vramfuzz fuzz --backend auto --policy comfy:dec2025 --time $(RUN_TIME) --out vramfuzz-out $(RUN_ARGS); \
	  rc=$$?; if [ $$rc -gt 1 ]; then exit $$rc; fi

test-unit: build
	ctest --preset default -j $(JOBS)

test-asan: deps
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan -j $(JOBS) -L 'property|fuzz'

test: test-unit test-asan

bench: build
	./build/bench/vf_bench_pipeline --benchmark_min_time=1
	./build/bench/vf_bench_allocators --benchmark_min_time=1

clean:
	rm -rf build build-asan build-gpu vramfuzz-out
