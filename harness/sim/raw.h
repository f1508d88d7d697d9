// `raw`: every tensor is its own cudaMalloc / cudaFree (PYTORCH_NO_CUDA_MEMORY_CACHING=1).
// cudaFree synchronizes the device, so memory is back the moment the free is issued. Reserved is
// what the driver charged (2 MiB pages, small buffers packed); allocated is the 512 B-rounded size.
#pragma once

#include <vector>

#include "harness/core/recycle.h"
#include "harness/sim/allocator.h"

namespace vf::sim {

class RawAllocator final : public Allocator {
 public:
  explicit RawAllocator(SimDevice& device) : device_(device) {}
  RawAllocator(const RawAllocator&) = delete;
  RawAllocator& operator=(const RawAllocator&) = delete;
  ~RawAllocator() override { recycle_keep(blocks_); }  // core/recycle.h

  AllocatorMode mode() const override { return AllocatorMode::raw; }
  bool malloc(BlockKey key, Bytes size, StreamId stream) override;
  void free(BlockKey key) override;
  void record_stream(BlockKey, StreamId) override {}
  void stream_wait(StreamId, StreamId) override {}
  void synchronize() override {}
  void empty_cache() override {}
  const AllocStats& stats() const override { return stats_; }
  void reset_peak_stats() override;
  void live_blocks(std::vector<BlockView>& out) const override;
  const std::optional<OomInfo>& last_oom() const override { return last_oom_; }
  void reserve_keys(std::size_t keys) override { recycle_reserve(blocks_, keys); }

 private:
  // 24 bytes a key (the table is written once per buffer: 3 M buffers in a 1,000,000-module case):
  // the driver's rounding and charge follow from the request and the page (SimDevice::allocation).
  // (Streams are below 65,536: a program's fit in a byte, a trace's are at most 63.)
  struct Live {
    DeviceAddr addr = 0;
    Bytes requested = 0;
    std::uint32_t page = kNoPage;
    std::uint16_t stream = 0;
    bool live = false;
  };
  static_assert(sizeof(Live) == 24);
  void sync_reserved();

  SimDevice& device_;
  std::vector<Live> blocks_;  // indexed by key
  AllocStats stats_;
  std::optional<OomInfo> last_oom_;
};

}  // namespace vf::sim
