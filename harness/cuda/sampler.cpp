#include "harness/cuda/sampler.h"

#include <algorithm>

namespace vf::cuda {

MemSampler::MemSampler(Runtime& rt, double interval_ms, double nvml_interval_ms)
    : rt_(rt),
      interval_(static_cast<std::int64_t>(interval_ms * 1000)),
      nvml_interval_(static_cast<std::int64_t>(nvml_interval_ms * 1000)) {}

MemSampler::~MemSampler() { (void)stop(); }

void MemSampler::start(Bytes free_now) {
  (void)stop();
  result_ = SampleResult{};
  result_.min_free = free_now;
  stop_ = false;
  if (interval_.count() <= 0) return;
  thread_ = std::thread([this] { loop(); });
}

SampleResult MemSampler::stop() {
  {
    std::lock_guard lock(m_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  return result_;
}

void MemSampler::loop() {
  const bool nvml = nvml_interval_.count() > 0 && rt_.nvml_available();
  auto next_nvml = std::chrono::steady_clock::now();
  std::unique_lock lock(m_);
  // At least one reading, however short the case.
  for (bool first = true; first || !stop_; first = false) {
    lock.unlock();
    Bytes free = 0;
    Bytes total = 0;
    const bool ok = static_cast<bool>(rt_.mem_get_info(free, total));
    std::optional<Bytes> self;
    const auto now = std::chrono::steady_clock::now();
    if (nvml && now >= next_nvml) {
      next_nvml = now + nvml_interval_;
      NvmlProcesses procs;
      if (rt_.nvml_processes(procs)) self = procs.self;
    }
    lock.lock();
    if (ok) {
      result_.min_free = std::min(result_.min_free, free);
      ++result_.samples;
    }
    if (self) {
      result_.nvml_self_max = std::max(result_.nvml_self_max.value_or(0), *self);
      ++result_.nvml_samples;
    }
    cv_.wait_for(lock, interval_, [this] { return stop_; });
  }
}

}  // namespace vf::cuda
