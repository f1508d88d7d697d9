// Device budget emulation: one large card becomes any consumer card. The ballast is device
// memory the backend holds (plain cudaMalloc chunks) so that cudaMemGetInfo's free memory is
// exactly what the emulated card would leave the case: total - used by others - context. It is
// kept across cases and only grown or shrunk by the difference, since re-allocating 100+ GiB per
// case would cost more than the case.
#pragma once

#include <utility>
#include <vector>

#include "harness/cuda/runtime.h"

namespace vf::cuda {

// cudaMalloc charges whole 2 MiB pages, so the ballast moves in 2 MiB steps and the free memory
// it leaves is the target plus less than one page.
inline constexpr Bytes kBallastStep = 2 * MiB;
// The largest single ballast allocation (big allocations can fail below the reported free
// memory, cuda-allocators.md §3.2; chunks halve on failure).
inline constexpr Bytes kBallastChunk = 8 * GiB;

class Ballast {
 public:
  explicit Ballast(Runtime& rt) : rt_(rt) {}
  ~Ballast() { release(); }
  Ballast(const Ballast&) = delete;
  Ballast& operator=(const Ballast&) = delete;

  // Grows or shrinks the ballast until free memory is in [target, target + kBallastStep), or, when
  // the driver charges a chunk more than its size, as close above the target as whole steps get
  // (within a step plus that extra charge). Never below the target.
  // `free_at_start` gets the free memory before, `free_now` after. An error when the device
  // cannot leave that much free at all (the emulated card is larger than what is free).
  Status fit(Bytes target, Bytes& free_at_start, Bytes& free_now);
  void release();
  Bytes bytes() const { return bytes_; }
  std::size_t chunks() const { return chunks_.size(); }

 private:
  Runtime& rt_;
  std::vector<std::pair<DevPtr, Bytes>> chunks_;
  Bytes bytes_ = 0;
};

}  // namespace vf::cuda
