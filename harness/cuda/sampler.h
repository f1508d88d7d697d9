// The device view over time: a thread that reads cudaMemGetInfo every `interval` (1 ms) while a
// case runs, and NVML's per-process usage every `nvml_interval` (NVML's process query takes
// milliseconds and the driver's lock, so it is sampled far less often). Polling cannot catch a
// spike shorter than its interval: these figures go to the report next to the allocator's own
// peaks, the verdict never uses them.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <thread>

#include "harness/cuda/runtime.h"

namespace vf::cuda {

struct SampleResult {
  Bytes min_free = 0;
  std::uint64_t samples = 0;
  std::optional<Bytes> nvml_self_max;
  std::uint64_t nvml_samples = 0;
};

class MemSampler {
 public:
  MemSampler(Runtime& rt, double interval_ms, double nvml_interval_ms);
  ~MemSampler();
  MemSampler(const MemSampler&) = delete;
  MemSampler& operator=(const MemSampler&) = delete;

  void start(Bytes free_now);  // no-op when the interval is 0
  SampleResult stop();         // joins the thread; safe to call twice

 private:
  void loop();

  Runtime& rt_;
  std::chrono::microseconds interval_;
  std::chrono::microseconds nvml_interval_;
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  SampleResult result_;
  std::thread thread_;
};

}  // namespace vf::cuda
