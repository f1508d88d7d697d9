#!/usr/bin/env bash
# ci/gpu-check.sh: the GPU check, one script, one call, under 8 minutes on a GPU machine.
#
# BUILD (on a machine with nvcc and the Debian packages of ci/install-deps.sh; no GPU needed):
#     cmake --preset gpu-check && cmake --build --preset gpu-check
#   gives build-gpu/vramfuzz: cudart_static, libstdc++/libgcc static, spdlog/fmt header-only,
#   kernels for sm_90 plus PTX. `ldd build-gpu/vramfuzz` lists only libc, libm, libdl, libpthread,
#   librt (and the loader). It needs an NVIDIA driver at run time and nothing else: libcuda is
#   reached through cudaGetDriverEntryPointByVersion, libnvidia-ml through dlopen (optional).
#
# RUN (on the GPU machine, from the repository root, with build-gpu/vramfuzz carried there):
#     ci/gpu-check.sh --out "$OUT"
#   writes
#     $OUT/gpu-check.json        the results (schema vramfuzz.gpu-check/1): calibration, kernels,
#                                agreement, fuzz, and under "script" each section's exit code
#     $OUT/gpu-check.md          the short Markdown table of the same
#     $OUT/gpu-check.log         everything the binary printed, nvidia-smi, timings
#     $OUT/gpu-check-fuzz.tar.gz the fuzz section's findings and shrunk repros
#   reports/gpu/README.md says what to do with them.
#
# Each section runs in its own process (a crash or a sticky CUDA error costs one section, and
# the context overhead is measured in a fresh process), under the binary's own time box and a
# hard `timeout` 15 s above it: 30 + 40 + 120 + 195 s of boxes, at most 445 s with the hard
# limits. Results are copied to --out after every section, so a kill loses only the running one.
#
# Options:
#   --out DIR        where the results go (required)
#   --bin PATH       the binary (default: build-gpu/vramfuzz of this repository)
#   --fuzz-time SEC  the fuzz campaign's budget, shrinking included (default 180)
#   --cases N        agreement: scenarios per allocator mode (default 50)
#   --fake           run on the simulator-backed fake runtime (checks this script without a GPU)
#   --quick          short time boxes and small tensors (with --fake: the CI test of the script)
# Exit: 0 every section ran; 3 one did not (see gpu-check.log); 2 bad arguments.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=""
bin="$repo/build-gpu/vramfuzz"
fuzz_time=180
cases=50
quick=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:-}; shift 2 ;;
    --bin) bin=${2:-}; shift 2 ;;
    --fuzz-time) fuzz_time=${2:-}; shift 2 ;;
    --cases) cases=${2:-}; shift 2 ;;
    --fake) extra+=(--fake 1); shift ;;
    --quick) extra+=(--quick); quick=1; shift ;;
    -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
    *) echo "gpu-check.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$out" ]; then echo "gpu-check.sh: --out DIR is required" >&2; exit 2; fi
case "$fuzz_time" in ''|*[!0-9]*) echo "gpu-check.sh: --fuzz-time takes whole seconds, got '$fuzz_time'" >&2; exit 2 ;; esac
case "$cases" in ''|*[!0-9]*) echo "gpu-check.sh: --cases takes a number, got '$cases'" >&2; exit 2 ;; esac

mkdir -p "$out" || exit 3
log="$out/gpu-check.log"
: >"$log"
work=$(mktemp -d "${TMPDIR:-/tmp}/vramfuzz-gpu-check.XXXXXX") || exit 3
trap 'rm -rf "$work"' EXIT
start=$(date +%s)

say() { echo "[gpu-check.sh +$(( $(date +%s) - start ))s] $*" | tee -a "$log" >&2; }
publish() {
  cp -f "$work/gpu-check.json" "$work/gpu-check.md" "$out/" 2>/dev/null || true
  if [ -d "$work/fuzz" ]; then tar -czf "$out/gpu-check-fuzz.tar.gz" -C "$work" fuzz 2>>"$log" || true; fi
}

say "repository $repo, binary $bin, results in $out"
if [ ! -x "$bin" ]; then
  say "no binary at $bin: build it first (cmake --preset gpu-check && cmake --build --preset gpu-check) and carry build-gpu/vramfuzz"
  exit 3
fi
if ! "$bin" --version >>"$log" 2>&1; then
  say "the binary does not start; its libraries:"
  ldd "$bin" >>"$log" 2>&1
  exit 3
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi >>"$log" 2>&1 || say "nvidia-smi failed (continuing)"
fi

# name and hard limit (the binary's own box + 15 s).
if [ "$quick" = 1 ]; then
  sections=("calibration 25" "kernels 25" "agreement 35" "fuzz $((fuzz_time + 17))")
else
  sections=("calibration 45" "kernels 55" "agreement 135" "fuzz $((fuzz_time + 30))")
fi
records=()
status=0
for entry in "${sections[@]}"; do
  read -r name limit <<<"$entry"
  say "section $name (hard limit ${limit}s)"
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$bin" gpu-check --out "$work" --section "$name" --cases "$cases" \
    --fuzz-time "${fuzz_time}s" "${extra[@]}" >>"$log" 2>&1
  rc=$?
  case $rc in
    0) say "section $name done in $(( $(date +%s) - t0 ))s" ;;
    124|137) say "section $name hit its hard limit and was killed (exit $rc)"; status=3 ;;
    *) say "section $name failed (exit $rc)"; status=3 ;;
  esac
  records+=(--record "$name.exit=$rc" --record "$name.seconds=$(( $(date +%s) - t0 ))")
  publish
done
records+=(--record "total_seconds=$(( $(date +%s) - start ))")
"$bin" gpu-check --out "$work" --section report "${records[@]}" >>"$log" 2>&1 || status=3
publish
say "done in $(( $(date +%s) - start ))s (exit $status): $out/gpu-check.json, $out/gpu-check.md"
exit $status
