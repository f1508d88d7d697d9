// The parts of the runtime interface shared by both implementations, and the "no CUDA in this
// build" answer of open_cuda_runtime().
#include "harness/cuda/runtime.h"

#include <fmt/format.h>

#include "harness/core/error.h"

namespace vf::cuda {

std::string_view err_name(Err e) {
  switch (e) {
    case Err::ok: return "ok";
    case Err::out_of_memory: return "out of memory";
    case Err::sticky: return "sticky error (context unusable)";
    case Err::no_device: return "no usable device";
    case Err::not_supported: return "not supported";
    case Err::invalid: return "invalid argument";
    case Err::other: return "error";
  }
  return "?";
}

Status ok_status() { return Status{}; }

std::string Status::describe() const {
  if (ok()) return "ok";
  return fmt::format("{}: {} (code {}{}{})", where.empty() ? "CUDA" : where, err_name(err), code,
                     message.empty() ? "" : ": ", message);
}

std::string_view pool_attr_name(PoolAttr a) {
  switch (a) {
    case PoolAttr::release_threshold: return "ReleaseThreshold";
    case PoolAttr::reuse_follow_event_dependencies: return "ReuseFollowEventDependencies";
    case PoolAttr::reuse_allow_opportunistic: return "ReuseAllowOpportunistic";
    case PoolAttr::reuse_allow_internal_dependencies: return "ReuseAllowInternalDependencies";
    case PoolAttr::reserved_current: return "ReservedMemCurrent";
    case PoolAttr::reserved_high: return "ReservedMemHigh";
    case PoolAttr::used_current: return "UsedMemCurrent";
    case PoolAttr::used_high: return "UsedMemHigh";
  }
  return "?";
}

std::string DeviceInfo::describe() const {
  return fmt::format("{} ({}, cc {}.{}, {} SMs), driver {}.{}, runtime {}.{}", name, format_size(total), cc_major,
                     cc_minor, sm_count, driver_version / 1000, driver_version % 1000 / 10, runtime_version / 1000,
                     runtime_version % 1000 / 10);
}

#ifndef VF_HAVE_CUDA
std::unique_ptr<Runtime> open_cuda_runtime() {
  throw InfraError("this build has no CUDA backend (configured without nvcc); use --backend sim");
}

bool cuda_usable(std::string* why) {
  if (why) *why = "this build has no CUDA backend (configured without nvcc)";
  return false;
}
#endif

}  // namespace vf::cuda
