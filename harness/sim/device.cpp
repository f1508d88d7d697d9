#include "harness/sim/device.h"

#include <algorithm>

namespace vf::sim {

SimDevice::SimDevice(const DeviceSpec& spec) : spec_(spec), capacity_(spec.available()) {}

bool SimDevice::charge(Bytes b) {
  if (b > capacity_ - charged_) return false;
  charged_ += b;
  if (charged_ > peak_charged_) peak_charged_ = charged_;
  return true;
}

void SimDevice::release(Bytes b) { charged_ -= b; }

std::optional<DeviceAlloc> SimDevice::cuda_malloc(Bytes size) {
  const Bytes rounded = round_up(size == 0 ? 1 : size, kCudaMallocAlign);
  if (rounded < size) return std::nullopt;  // wrapped: nothing that large exists
  if (rounded >= kDevicePage) {
    // A buffer of its own pages: charged in whole 2 MiB pages, 2 MiB-aligned address.
    const Bytes pages = round_up(rounded, kDevicePage);
    if (pages < rounded || !charge(pages)) return std::nullopt;
    const DeviceAlloc a{next_addr_, rounded, pages, kNoPage};
    next_addr_ += pages;
    return a;
  }
  // Small buffers are packed into shared 2 MiB pages; a new page is charged only when the open
  // one cannot hold the request. Freed space inside a page is not reused until the whole page is
  // free (pessimistic about the driver's sub-allocator; see cuda-allocators.md §3.2).
  if (open_page_ == kNoPage || small_pages_[open_page_].used + rounded > kDevicePage) {
    if (!charge(kDevicePage)) return std::nullopt;
    std::uint32_t slot;
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      slot = static_cast<std::uint32_t>(small_pages_.size());
      small_pages_.emplace_back();
    }
    small_pages_[slot] = SmallPage{next_addr_, 0, 0};
    next_addr_ += kDevicePage;
    open_page_ = slot;
  }
  SmallPage& p = small_pages_[open_page_];
  const DeviceAlloc a{p.base + p.used, rounded, 0, open_page_};
  p.used += rounded;
  ++p.live;
  return a;
}

void SimDevice::cuda_free(const DeviceAlloc& a) {
  if (a.page == kNoPage) {
    release(a.charge);
    return;
  }
  SmallPage& p = small_pages_[a.page];
  if (--p.live == 0) {
    release(kDevicePage);
    if (open_page_ == a.page) open_page_ = kNoPage;
    free_slots_.push_back(a.page);
  }
}

DeviceAddr SimDevice::reserve_address_range(Bytes size) {
  const DeviceAddr base = next_addr_;
  next_addr_ += round_up(size, kDevicePage);
  return base;
}

bool SimDevice::map(Bytes bytes) {
  if (!charge(bytes)) return false;
  mapped_ += bytes;
  return true;
}

void SimDevice::unmap(Bytes bytes) {
  release(bytes);
  mapped_ -= bytes;
}

bool SimDevice::others_take(Bytes bytes) {
  if (bytes > capacity_ - charged_) return false;
  capacity_ -= bytes;
  spec_.used_by_others += bytes;
  return true;
}

void SimDevice::others_release(Bytes bytes) {
  const Bytes b = std::min(bytes, spec_.used_by_others);
  spec_.used_by_others -= b;
  capacity_ += b;
}

}  // namespace vf::sim
