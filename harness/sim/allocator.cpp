#include "harness/sim/allocator.h"

#include <fmt/format.h>

#include "harness/core/error.h"
#include "harness/sim/alloc_options.h"
#include "harness/sim/async_pool.h"
#include "harness/sim/caching.h"
#include "harness/sim/raw.h"

namespace vf::sim {

void validate_allocator_config(const AllocatorConfig& config, std::string_view path) {
  (void)parse_alloc_options(config, path);
}

void normalize_allocator_config(AllocatorConfig& config, std::string_view path) {
  config.mode = parse_alloc_options(config, path).mode;
}

void validate_allocator_config(const AllocatorConfig& config, const std::function<std::string(std::string_view)>& field_of) {
  (void)parse_alloc_options(config, field_of);
}

void normalize_allocator_config(AllocatorConfig& config, const std::function<std::string(std::string_view)>& field_of) {
  config.mode = parse_alloc_options(config, field_of).mode;
}

std::unique_ptr<Allocator> make_allocator(const AllocatorConfig& config, SimDevice& device, std::uint64_t seed) {
  const AllocOptions options = parse_alloc_options(config, "allocator");
  switch (options.mode) {
    case AllocatorMode::raw: return std::make_unique<RawAllocator>(device);
    case AllocatorMode::caching:
    case AllocatorMode::caching_expandable: return std::make_unique<CachingAllocator>(device, options.caching);
    case AllocatorMode::async: return std::make_unique<AsyncPoolAllocator>(device, options.async, seed);
  }
  throw InfraError(fmt::format("allocator mode {} has no model", allocator_mode_name(options.mode)));
}

}  // namespace vf::sim

namespace vf {

std::string_view allocator_mode_name(AllocatorMode m) {
  switch (m) {
    case AllocatorMode::raw: return "raw";
    case AllocatorMode::caching: return "caching";
    case AllocatorMode::caching_expandable: return "caching-expandable";
    case AllocatorMode::async: return "async";
  }
  return "?";
}

std::optional<AllocatorMode> parse_allocator_mode(std::string_view s) {
  for (AllocatorMode m : kAllAllocatorModes) {
    if (s == allocator_mode_name(m)) return m;
  }
  // PyTorch's PYTORCH_CUDA_ALLOC_CONF backend names. Its expandable segments are an option of
  // the native backend (expandable_segments:True), not a backend, so it has no name to mirror.
  if (s == "native") return AllocatorMode::caching;
  if (s == "cudaMallocAsync") return AllocatorMode::async;
  return std::nullopt;
}

std::string allocator_mode_choices() {
  return "raw, caching, caching-expandable or async (or PyTorch's backend names: native = caching, cudaMallocAsync = async)";
}

AllocatorMode parse_allocator_mode_field(std::string_view s, std::string_view path) {
  const auto m = parse_allocator_mode(s);
  if (!m) throw InputError(std::string(path), fmt::format("unknown allocator mode \"{}\" (use {})", s, allocator_mode_choices()));
  return *m;
}

}  // namespace vf
