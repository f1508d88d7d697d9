#include "harness/sim/raw.h"

#include <fmt/format.h>

#include "harness/core/error.h"

namespace vf::sim {

// Reserved for `raw` is the physical memory the driver charged for our buffers, so it moves in
// whole pages while allocated moves by the 512 B-rounded size.
void RawAllocator::sync_reserved() {
  const Bytes now = device_.malloc_charged();  // VMM pages (dynamic VRAM's) are not ours
  if (now > stats_.reserved.current) {
    stats_.reserved.add(now - stats_.reserved.current);
  } else {
    stats_.reserved.sub(stats_.reserved.current - now);
  }
}

bool RawAllocator::malloc(BlockKey key, Bytes size, StreamId stream) {
  cover_key(blocks_, key);
  if (blocks_[key].live) throw InfraError(fmt::format("raw allocator: block {} allocated twice", key));
  if (stream > 0xffff) throw InfraError(fmt::format("raw allocator: stream {} out of range", stream));
  const auto a = device_.cuda_malloc(size);
  if (!a) {
    ++stats_.num_ooms;
    last_oom_ = OomInfo{size, device_.free(), stats_.reserved.current, stats_.allocated.current,
                        "cudaMalloc failed: not enough free device pages"};
    return false;
  }
  blocks_[key] = Live{a->addr, size, a->page, static_cast<std::uint16_t>(stream), true};
  ++stats_.num_device_alloc;
  stats_.requested.add(size);
  stats_.allocated.add(a->size);
  stats_.active.add(a->size);
  sync_reserved();
  return true;
}

void RawAllocator::free(BlockKey key) {
  if (key >= blocks_.size() || !blocks_[key].live) throw InfraError(fmt::format("raw allocator: free of unknown block {}", key));
  Live& b = blocks_[key];
  const DeviceAlloc a = SimDevice::allocation(b.addr, b.requested, b.page);
  device_.cuda_free(a);
  ++stats_.num_device_free;
  stats_.requested.sub(b.requested);
  stats_.allocated.sub(a.size);
  stats_.active.sub(a.size);
  b.live = false;
  sync_reserved();
}

void RawAllocator::reset_peak_stats() {
  stats_.reset_peaks();
}

void RawAllocator::live_blocks(std::vector<BlockView>& out) const {
  for (BlockKey k = 0; k < blocks_.size(); ++k) {
    const Live& b = blocks_[k];
    if (b.live) out.push_back(BlockView{k, b.addr, SimDevice::cuda_rounded(b.requested), b.requested, b.stream});
  }
}

}  // namespace vf::sim
