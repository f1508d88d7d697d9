// Internals of `vramfuzz gpu-check` shared by its source files (gpu_check.cpp: the driver, the
// agreement and fuzz sections, the Markdown; gpu_check_device.cpp: calibration and kernels).
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/cuda/gpu_check.h"
#include "harness/cuda/runtime.h"

namespace vf::cuda::detail {

using Json = nlohmann::ordered_json;

class Deadline {
 public:
  explicit Deadline(double seconds) : start_(Clock::now()), seconds_(seconds) {}
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  double left() const { return seconds_ - elapsed(); }
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

struct CheckContext {
  const GpuCheckConfig& cfg;
  Runtime& rt;
  bool fake = false;
};

// Each section fills `out` as it goes (so a failure keeps the partial results) and may throw.
void section_calibration(CheckContext& c, const Deadline& dl, Json& out);
void section_kernels(CheckContext& c, const Deadline& dl, Json& out);
void section_agreement(CheckContext& c, const Deadline& dl, Json& out);
void section_fuzz(CheckContext& c, const Deadline& dl, Json& out);

Json device_json(const DeviceInfo& d);
double to_mib_d(Bytes b);

}  // namespace vf::cuda::detail
