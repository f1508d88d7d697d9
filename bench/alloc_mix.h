// The allocator benchmarks' request mix (bench_allocators.cpp, alloc_pairs.cpp): a fixed-seed
// stream shaped like model loads and activations: many small tensors (biases, norms, scales),
// some 1-10 MiB, a few large weights, each step freeing one of 64 live blocks and allocating a
// new one in its place: one malloc+free pair.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "harness/core/splitmix.h"
#include "harness/sim/allocator.h"
#include "harness/sim/device.h"

namespace vf::sim::bench {

constexpr std::size_t kLive = 64;         // blocks alive at a time
constexpr std::size_t kSteps = 1u << 16;  // the pre-generated op stream, replayed in a loop

struct Step {
  Bytes size;
  std::uint32_t slot;  // which live block is freed and replaced (also its key)
  StreamId stream;
};

using Rng = SplitMix64;

inline Bytes draw_size(Rng& rng) {
  const std::uint64_t bucket = rng.below(100);
  if (bucket < 60) {  // small: log-uniform 256 B .. 1 MiB
    const unsigned shift = 8 + static_cast<unsigned>(rng.below(12));
    return (Bytes{1} << shift) + rng.below(Bytes{1} << shift);
  }
  if (bucket < 75) {  // the exact sizes models repeat: 3072-wide bf16 vectors, 4 KiB scales
    constexpr Bytes kCommon[] = {6144, 4096, 12288, 65536, 262144};
    return kCommon[rng.below(5)];
  }
  if (bucket < 95) return 1 * MiB + rng.below(9 * MiB);  // 1-10 MiB: activations, small linears
  return 10 * MiB + rng.below(150 * MiB);                // large weights and attention buffers
}

inline std::vector<Step> make_steps(unsigned streams) {
  Rng rng{0x5eed0000u + streams};
  std::vector<Step> steps(kSteps);
  for (Step& s : steps) {
    s.size = draw_size(rng);
    s.slot = static_cast<std::uint32_t>(rng.below(kLive));
    s.stream = streams > 1 && rng.below(10) == 0 ? static_cast<StreamId>(1 + rng.below(streams - 1)) : 0;
  }
  return steps;
}

// One allocator model replaying the mix on an 80 GiB device: each pair() frees the step's live
// block, if any, and allocates its replacement; false when that malloc failed.
class PairReplay {
 public:
  PairReplay(AllocatorConfig cfg, unsigned streams)
      : steps_(make_steps(streams)), device_(spec()), alloc_(make_allocator(cfg, device_, 1)) {}

  bool pair() {
    const Step& s = steps_[i_];
    if (++i_ == steps_.size()) i_ = 0;
    if (live_[s.slot]) alloc_->free(s.slot);
    live_[s.slot] = alloc_->malloc(s.slot, s.size, s.stream);
    return live_[s.slot];
  }
  const Allocator& allocator() const { return *alloc_; }

 private:
  static DeviceSpec spec() {
    DeviceSpec d;
    d.total = 80 * GiB;
    return d;
  }

  std::vector<Step> steps_;
  SimDevice device_;
  std::unique_ptr<Allocator> alloc_;
  std::array<bool, kLive> live_{};
  std::size_t i_ = 0;
};

}  // namespace vf::sim::bench
