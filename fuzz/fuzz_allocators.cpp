// libFuzzer target: every allocator model in harness/sim/ under a random sequence of
// alloc / free / record_stream / wait / sync / empty_cache, read from the input with
// FuzzedDataProvider. After every op the invariants must hold, else __builtin_trap():
//   - requested <= active, allocated <= active <= reserved <= physical bytes charged <= capacity
//     (and requested <= allocated for raw and async; the caching models keep a record_stream
//     block's requested bytes until its events complete, as PyTorch does);
//   - live blocks never overlap, each hands out at least what was requested, and together they
//     are the allocated bytes;
//   - every peak is at least its current value and never goes down.
// Freeing everything and calling empty_cache must return the device to zero.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "harness/core/error.h"
#include "harness/sim/allocator.h"

namespace {

using vf::Bytes;
using vf::MiB;
using vf::sim::Allocator;
using vf::sim::BlockKey;
using vf::sim::SimDevice;

struct Variant {
  vf::AllocatorMode mode;
  std::vector<std::pair<std::string, std::string>> options;
};

// A few option sets per mode; a new mode or option set is one line here.
const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {vf::AllocatorMode::raw, {}},
      {vf::AllocatorMode::caching, {}},
      {vf::AllocatorMode::caching, {{"max_split_size_mb", "40"}, {"roundup_power2_divisions", "4"}, {"sim_event_lag", "1"}}},
      {vf::AllocatorMode::caching, {{"per_process_memory_fraction", "0.6"}, {"garbage_collection_threshold", "0.5"}}},
      {vf::AllocatorMode::caching, {{"roundup_power2_divisions", "[1:2,8:4,>:8]"}, {"large_segment_size_mb", "12"}, {"sim_event_lag", "0"}}},
      {vf::AllocatorMode::caching_expandable, {}},
      {vf::AllocatorMode::caching_expandable, {{"large_segment_size_mb", "12"}, {"sim_event_lag", "0"}}},
      {vf::AllocatorMode::caching_expandable, {{"per_process_memory_fraction", "0.7"}, {"max_split_size_mb", "20"}}},
      {vf::AllocatorMode::async, {}},
      {vf::AllocatorMode::async, {{"pool_granularity", "32MiB"}, {"release_threshold", "0"}}},
      {vf::AllocatorMode::async,
       {{"reuse_follow_event_dependencies", "False"}, {"reuse_allow_opportunistic", "False"}, {"reuse_allow_internal_dependencies", "False"}}},
      {vf::AllocatorMode::async, {{"pool_granularity", "6MiB"}, {"release_threshold", "20MiB"}, {"opportunistic_probability", "0.9"}}},
  };
  return v;
}

constexpr std::uint32_t kMaxStream = 8;  // the compute stream plus up to 8 offload streams
constexpr std::size_t kMaxOps = 1024;  // longer sequences add little but time

Bytes draw_size(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 4)) {
    case 0: {  // the rule boundaries of the models
      static constexpr Bytes kEdges[] = {0, 1, 511, 512, 513, 1 * MiB - 1, 1 * MiB, 1 * MiB + 1, 2 * MiB, 2 * MiB + 1,
                                         10 * MiB - 1, 10 * MiB, 20 * MiB, 20 * MiB + 1, 32 * MiB, 64 * MiB + 512};
      return in.PickValueInArray(kEdges);
    }
    case 1: return in.ConsumeIntegralInRange<Bytes>(1, 1 * MiB + 1);
    case 2: return in.ConsumeIntegralInRange<Bytes>(1 * MiB, 10 * MiB + 1);
    case 3: return in.ConsumeIntegralInRange<Bytes>(10 * MiB, 256 * MiB);
    default: return in.ConsumeIntegralInRange<Bytes>(0, Bytes{1} << 50);  // far past any device: OOM paths
  }
}

struct Seen {
  std::array<Bytes, 5> last_peak{};
};

void check(const Allocator& a, const SimDevice& d, vf::AllocatorMode mode, Seen& seen, std::vector<vf::sim::BlockView>& live) {
  const vf::sim::AllocStats& s = a.stats();
  if (s.requested.current > s.active.current) __builtin_trap();
  if (s.allocated.current > s.active.current) __builtin_trap();
  if (s.active.current > s.reserved.current) __builtin_trap();
  if (s.reserved.current > d.charged()) __builtin_trap();
  if (d.charged() > d.capacity()) __builtin_trap();
  if ((mode == vf::AllocatorMode::raw || mode == vf::AllocatorMode::async) && s.requested.current > s.allocated.current) __builtin_trap();
  const std::array<const vf::sim::Stat*, 5> stats = {&s.requested, &s.allocated, &s.active, &s.reserved, &s.inactive_split};
  for (std::size_t i = 0; i < stats.size(); ++i) {
    if (stats[i]->peak < stats[i]->current) __builtin_trap();
    if (stats[i]->peak < seen.last_peak[i]) __builtin_trap();
    seen.last_peak[i] = stats[i]->peak;
  }
  live.clear();
  a.live_blocks(live);
  std::sort(live.begin(), live.end(), [](const auto& x, const auto& y) { return x.addr < y.addr; });
  Bytes total = 0;
  for (std::size_t i = 0; i < live.size(); ++i) {
    if (live[i].size < live[i].requested || live[i].size == 0) __builtin_trap();
    if (i + 1 < live.size() && live[i].addr + live[i].size > live[i + 1].addr) __builtin_trap();
    total += live[i].size;
  }
  if (total != s.allocated.current) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const Variant& v = variants()[in.ConsumeIntegralInRange<std::size_t>(0, variants().size() - 1)];
  vf::DeviceSpec spec;
  spec.total = in.ConsumeIntegralInRange<Bytes>(16, 512) * MiB + (in.ConsumeBool() ? in.ConsumeIntegralInRange<Bytes>(0, MiB) : 0);
  spec.context_overhead = in.ConsumeBool() ? 0 : in.ConsumeIntegralInRange<Bytes>(0, 8) * MiB;
  const std::uint64_t seed = in.ConsumeIntegral<std::uint64_t>();
  SimDevice device(spec);
  vf::AllocatorConfig cfg;
  cfg.mode = v.mode;
  cfg.options = v.options;
  const auto alloc = vf::sim::make_allocator(cfg, device, seed);
  const vf::AllocatorMode mode = alloc->mode();

  Seen seen;
  std::vector<vf::sim::BlockView> scratch;
  std::vector<BlockKey> live;
  // Keys are dense small integers reused after a free, as the lowering hands them out (the models
  // index their block tables by key, so never reusing one would make every scan grow forever).
  std::vector<BlockKey> spare;
  BlockKey next_key = 0;
  for (std::size_t n = 0; n < kMaxOps && in.remaining_bytes() > 0; ++n) {
    switch (in.ConsumeIntegralInRange<int>(0, 9)) {
      case 0:
      case 1:
      case 2:
      case 3: {  // alloc, the most common op
        const Bytes bytes = draw_size(in);
        const auto stream = in.ConsumeIntegralInRange<std::uint32_t>(0, kMaxStream);
        BlockKey key = next_key;
        if (spare.empty()) ++next_key;
        else {
          key = spare.back();
          spare.pop_back();
        }
        if (alloc->malloc(key, bytes, stream)) live.push_back(key);
        else spare.push_back(key);
        break;
      }
      case 4:
      case 5:
      case 6:
        if (!live.empty()) {
          const std::size_t i = in.ConsumeIntegralInRange<std::size_t>(0, live.size() - 1);
          alloc->free(live[i]);
          spare.push_back(live[i]);
          live[i] = live.back();
          live.pop_back();
        }
        break;
      case 7:
        if (!live.empty()) {
          const std::size_t i = in.ConsumeIntegralInRange<std::size_t>(0, live.size() - 1);
          alloc->record_stream(live[i], in.ConsumeIntegralInRange<std::uint32_t>(0, kMaxStream));
        }
        break;
      case 8:
        alloc->stream_wait(in.ConsumeIntegralInRange<std::uint32_t>(0, kMaxStream), in.ConsumeIntegralInRange<std::uint32_t>(0, kMaxStream));
        break;
      default:
        if (in.ConsumeBool()) alloc->synchronize();
        else alloc->empty_cache();
        break;
    }
    check(*alloc, device, mode, seen, scratch);
  }
  for (const BlockKey k : live) {
    alloc->free(k);
    check(*alloc, device, mode, seen, scratch);
  }
  alloc->empty_cache();
  check(*alloc, device, mode, seen, scratch);
  const vf::sim::AllocStats& s = alloc->stats();
  if (s.allocated.current != 0 || s.active.current != 0 || s.requested.current != 0 || s.reserved.current != 0) __builtin_trap();
  if (device.charged() != 0) __builtin_trap();
  return 0;
}
