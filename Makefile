# The two commands of the README's quick start, and the pieces they are made of.
#   make run   - install deps, build, run a default fuzz campaign on the best backend -> vramfuzz-out/
#   make test  - install deps, build, run every test (unit, properties, CLI), then the ASan/UBSan suite
#                (properties, fuzz targets, hostile input)
.PHONY: all deps build run test test-unit test-asan bench clean comfyui-setup test-comfyui

JOBS ?= $(shell nproc)
RUN_TIME ?= 60s
RUN_ARGS ?=

all: build

deps:
	@ci/install-deps.sh

build: deps
	cmake --preset default >/dev/null
	cmake --build --preset default -j $(JOBS)

# A default campaign: what ComfyUI runs by default today (comfy:sep2026, dynamic VRAM) and the
# newest classic accounting (comfy:dec2025, what --disable-dynamic-vram and legacy patchers run),
# one drawn per case, with every allocator mode each can run, devices drawn from 6 GiB to 141 GiB.
# Exit code 1 means findings (the campaign worked); anything else fails make.
run: build
	@rm -rf vramfuzz-out
	@./build/vramfuzz fuzz --backend auto --policy comfy:sep2026,comfy:dec2025 --time $(RUN_TIME) --out vramfuzz-out \
	  --corpus fuzz/corpus/regressions $(RUN_ARGS); \
	  rc=$$?; if [ $$rc -gt 1 ]; then exit $$rc; fi

# The HTML report test renders report.html in a headless Chromium (skipped where it is missing).
TEST_PACKAGES ?= chromium

test-unit: build
	@ci/install-deps.sh $(TEST_PACKAGES)
	ctest --preset default -j $(JOBS)

# Under clang's ASan + UBSan: the properties, the fuzz targets (their corpora replayed, then ~30 s
# of fuzzing each) and the hostile-input suite (every reader and flag on malformed input, report
# and merge on damaged summaries, SIGKILL then recovery, run through the sanitized CLI) and the
# storage recycling's tests (label memory); only those binaries are built in this configuration.
test-asan: deps
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS) --target vf_sanitized_suite
	ctest --preset asan -j $(JOBS) -L 'property|fuzz|hostile|memory'

test: test-unit test-asan

bench: build
	./build/bench/vf_bench_pipeline --benchmark_min_time=1
	./build/bench/vf_bench_allocators --benchmark_min_time=1
	./build/bench/vf_bench_protocol

# The ComfyUI adapter (adapters/comfyui/README.md): a venv with torch from PyPI (~3 GB download),
# then its test against your ComfyUI checkout: make test-comfyui COMFYUI_PATH=/path/to/ComfyUI
COMFYUI_VENV ?= /work/comfy-venv
COMFYUI_PATH ?= /work/comfyui-tree
comfyui-setup:
	COMFYUI_PATH=$(COMFYUI_PATH) adapters/comfyui/setup.sh $(COMFYUI_VENV)

test-comfyui: build
	COMFYUI_PATH=$(COMFYUI_PATH) COMFYUI_PYTHON=$(COMFYUI_VENV)/bin/python VRAMFUZZ=build/vramfuzz adapters/comfyui/test_adapter.sh

clean:
	rm -rf build build-asan build-gpu vramfuzz-out
