// Internals of `vramfuzz gpu-check` shared by its source files (gpu_check.cpp: the driver, the
// agreement and fuzz sections, the Markdown; gpu_check_device.cpp: calibration and kernels).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/cuda/gpu_check.h"
#include "harness/cuda/runtime.h"

namespace vf::cuda::detail {

using Json = nlohmann::ordered_json;

// Set by SIGTERM / SIGINT while gpu-check runs (ci/gpu-check.sh's hard limit sends SIGTERM, then
// SIGKILL 10 s later): every deadline then counts as passed, so a section stops at its next check
// and its results are written with status "partial".
inline std::atomic<bool> g_stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

class Deadline {
 public:
  explicit Deadline(double seconds) : start_(Clock::now()), seconds_(seconds) {}
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  double left() const { return g_stop_requested.load(std::memory_order_relaxed) ? 0.0 : seconds_ - elapsed(); }
  bool passed() const { return left() <= 0; }
  double seconds() const { return seconds_; }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
  double seconds_;
};

// A runtime call a section cannot do without failed: the section ends with status "error" and
// whatever it had measured so far.
class SectionFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
inline void need(const Status& s) {
  if (!s) throw SectionFailure(s.describe());
}

// The device's free memory after a synchronize (so every queued allocation and free is in it).
inline Bytes free_now(Runtime& rt) {
  need(rt.device_synchronize());
  Bytes free = 0;
  Bytes total = 0;
  need(rt.mem_get_info(free, total));
  return free;
}
// How much `after` is below `before` (negative when memory came back).
inline std::int64_t delta(Bytes before, Bytes after) { return static_cast<std::int64_t>(before) - static_cast<std::int64_t>(after); }

struct CheckContext {
  const GpuCheckConfig& cfg;
  Runtime& rt;
  bool fake = false;
  // Writes the running section's data so far to the results file (status "running"), so a
  // process killed mid-section keeps what it measured. Sections call it after each measurement.
  std::function<void(const Json&)> checkpoint = [](const Json&) {};
};

// Each section fills `out` as it goes (so a failure keeps the partial results) and may throw.
void section_calibration(CheckContext& c, const Deadline& dl, Json& out);
void section_kernels(CheckContext& c, const Deadline& dl, Json& out);
void section_agreement(CheckContext& c, const Deadline& dl, Json& out);
void section_fuzz(CheckContext& c, const Deadline& dl, Json& out);

Json device_json(const DeviceInfo& d);
double to_mib_d(Bytes b);

}  // namespace vf::cuda::detail
