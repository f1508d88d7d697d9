// `vramfuzz gpu-check`: everything ci/gpu-check.sh measures on a GPU machine, written to ONE
// results file, `gpu-check.json` (schema vramfuzz.gpu-check/1), and a short Markdown table,
// `gpu-check.md`. Four sections, each time-boxed, each written to disk as soon as it is done (a
// later section that fails or crashes loses nothing):
//   calibration - context overhead, cudaMalloc charging 1 B .. 64 MiB, the async pool's growth
//                 step (release threshold 0 and UINT64_MAX), VMM granularity, NVML vs the
//                 device view and NVML's latency;
//   kernels     - every upcast / dequant kernel against the host reference on random data
//                 (every output element written) and its bandwidth against a D2D copy;
//   agreement   - random scenarios per allocator mode on sim and on the device, the allocator
//                 peaks side by side;
//   fuzz        - a real campaign at the emulated card, findings shrunk within the budget.
// With `fake` set, the same code runs on the fake runtime (CI tests the check and its schema).
// reports/gpu/README.md says how the results update the simulator's calibrated defaults.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "harness/core/bytes.h"
#include "harness/cuda/runtime_fake.h"

namespace vf::cuda {

inline constexpr std::string_view kGpuCheckSchema = "vramfuzz.gpu-check/1";
inline constexpr std::string_view kGpuCheckSections[] = {"calibration", "kernels", "agreement", "fuzz"};

struct GpuCheckConfig {
  std::string out_dir;
  // Any of kGpuCheckSections, or "report" (only re-render gpu-check.md); empty: all four.
  std::vector<std::string> sections;
  std::optional<FakeConfig> fake;  // run on the fake runtime instead of the GPU
  bool quick = false;              // small tensors and short time boxes (the CI test)
  std::uint32_t agreement_cases = 50;  // per allocator mode
  double fuzz_seconds = 180;           // the fuzz section's whole budget, shrinking included
  std::uint64_t seed = 1;
  Bytes vram = 24 * GiB;
  // KEY=VALUE pairs stored under "script" (ci/gpu-check.sh records each section's exit code).
  std::vector<std::pair<std::string, std::string>> records;
};

// Runs the sections, merging them into OUT/gpu-check.json (written after every section) and
// rendering OUT/gpu-check.md. Exit code: 0 when every section ran, 3 when one could not.
int run_gpu_check(const GpuCheckConfig& cfg);

// The Markdown summary of a gpu-check document.
std::string gpu_check_markdown(const nlohmann::ordered_json& doc);

// The growth step of the simulator's async pool (sim::AsyncOptions::pool_granularity) that
// reproduces one pool sweep of the calibration section (`sections.calibration.async_pool[i]`:
// release_threshold, reserved_at_start, steps [{size, reserved}]): the sweep's requests are
// replayed through sim::AsyncPoolAllocator for every step of 2 MiB .. 128 MiB (and the sweep's
// smallest growth), and a step fits when the model's reserved equals the device's after every
// request. Returns {steps_compared, candidates, matches: [...], step: the one match or null,
// closest (when none matches): {step, matched_requests, first_mismatch {size, device, model}}}.
// A gcd of the growths is no substitute: a driver that grows small requests by 32 MiB and large
// ones by their size rounded to 2 MiB has growths whose gcd is 2 MiB.
nlohmann::ordered_json fit_pool_step(const nlohmann::ordered_json& sweep);

}  // namespace vf::cuda
