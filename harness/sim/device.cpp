#include "harness/sim/device.h"

#include <algorithm>
#include <iterator>

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
  return small_malloc(rounded);
}

void SimDevice::cuda_free(const DeviceAlloc& a) {
  if (a.page == kNoPage) {
    release(a.charge);
    return;
  }
  small_free(a);
}

void SimDevice::add_hole(DeviceAddr addr, Bytes size, std::uint32_t page) {
  const std::uint64_t seq = hole_seq_++;
  holes_.emplace(addr, Hole{size, seq, page});
  holes_by_size_.emplace(size, seq, addr);
}

void SimDevice::erase_hole(std::map<DeviceAddr, Hole>::iterator it) {
  holes_by_size_.erase({it->second.size, it->second.seq, it->first});
  holes_.erase(it);
}

std::optional<DeviceAlloc> SimDevice::small_malloc(Bytes rounded) {
  const auto best = holes_by_size_.lower_bound({rounded, 0, 0});
  if (best != holes_by_size_.end()) {
    const DeviceAddr addr = std::get<2>(*best);
    const auto it = holes_.find(addr);
    const Hole hole = it->second;
    erase_hole(it);
    if (hole.size > rounded) add_hole(addr + rounded, hole.size - rounded, hole.page);
    ++small_pages_[hole.page].live;
    return DeviceAlloc{addr, rounded, 0, hole.page};
  }
  if (!charge(kDevicePage)) return std::nullopt;
  std::uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<std::uint32_t>(small_pages_.size());
    small_pages_.emplace_back();
  }
  const DeviceAddr base = next_addr_;
  next_addr_ += kDevicePage;
  small_pages_[slot] = SmallPage{base, 1};
  add_hole(base + rounded, kDevicePage - rounded, slot);  // rounded < kDevicePage here
  return DeviceAlloc{base, rounded, 0, slot};
}

void SimDevice::small_free(const DeviceAlloc& a) {
  SmallPage& p = small_pages_[a.page];
  DeviceAddr addr = a.addr;
  Bytes size = a.size;
  // Merge with the hole just below and the one just above, if they are in this page.
  auto next = holes_.lower_bound(addr);
  if (next != holes_.begin()) {
    const auto prev = std::prev(next);
    if (prev->second.page == a.page && prev->first + prev->second.size == addr) {
      addr = prev->first;
      size += prev->second.size;
      erase_hole(prev);
    }
  }
  next = holes_.find(a.addr + a.size);
  if (next != holes_.end() && next->second.page == a.page) {
    size += next->second.size;
    erase_hole(next);
  }
  if (--p.live == 0) {  // the whole page is one hole now: give it back
    release(kDevicePage);
    free_slots_.push_back(a.page);
    return;
  }
  add_hole(addr, size, a.page);
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
