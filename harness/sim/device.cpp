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
  const Bytes rounded = cuda_rounded(size);
  if (rounded == 0) return std::nullopt;  // wrapped: nothing that large exists
  if (rounded >= kDevicePage) {
    // A buffer of its own pages: charged in whole 2 MiB pages, 2 MiB-aligned address.
    const DeviceAlloc a = allocation(next_addr_, size, kNoPage);
    if (a.charge < rounded || !charge(a.charge)) return std::nullopt;  // the pages wrapped
    next_addr_ += a.charge;
    // Built in the caller's result from the fields: returning `a` built it on the stack with 8-
    // and 4-byte stores and copied it out with 16-byte loads, which those stores cannot forward
    // to (the stall core/scalar_load.h describes; most of this function's time in a campaign).
    return std::optional<DeviceAlloc>(std::in_place, DeviceAlloc{a.addr, a.size, a.charge, a.page});
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

std::optional<DeviceAlloc> SimDevice::small_malloc(Bytes rounded) {
  const std::uint32_t r = static_cast<std::uint32_t>(rounded);  // < 2 MiB here
  if (!holes_) holes_ = std::make_unique<HoleIndex>();
  HoleIndex& index = *holes_;
  if (const HoleIndex::Id id = index.best_fit(r); id != HoleIndex::kNone) {
    const HoleIndex::Hole found = index[id];
    // The page's record is neither read nor written here: in a large model it is a cache miss. A
    // split's rest keeps its id and its place among the page's holes; an exact fit's id stays
    // there as the buffer's marker (retire). The record is fetched now for the buffer's free,
    // which most often follows soon.
    __builtin_prefetch(&small_pages_[found.page]);
    if (found.size > r) {
      index.move(id, found.addr + r, found.size - r);  // the rest, the youngest hole now
    } else {
      index.retire(id);
    }
    return std::optional<DeviceAlloc>(std::in_place, DeviceAlloc{found.addr, rounded, 0, found.page});  // in place (cuda_malloc)
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
  PageHoles& holes = small_pages_[slot].holes;
  holes.clear();
  holes.push_back(index.add(slot, base + r, static_cast<std::uint32_t>(kDevicePage) - r));
  return std::optional<DeviceAlloc>(std::in_place, DeviceAlloc{base, rounded, 0, slot});
}

void SimDevice::small_free(const DeviceAlloc& a) {
  PageHoles& holes = small_pages_[a.page].holes;
  HoleIndex& index = *holes_;  // made by the small_malloc that returned `a`
  // The first entry at or above a.addr: the buffer's own marker when it filled a hole exactly (no
  // hole starts where a live buffer does), which goes now.
  PageHoles::Id* next = std::lower_bound(holes.begin(), holes.end(), a.addr, [&](HoleIndex::Id h, DeviceAddr at) { return index[h].addr < at; });
  if (next != holes.end() && index[*next].addr == a.addr) {
    index.release(*next);
    next = holes.erase(next);
  }
  // Merge with the hole just below and the one just above. Another buffer's marker is never
  // either: one just above starts a live buffer (size 0 tells it from a hole), and one below ends
  // at its own address, below a.addr.
  const bool above = next != holes.end() && index[*next].addr == a.addr + a.size && index[*next].size != 0;
  PageHoles::Id* const below = next != holes.begin() && index[next[-1]].addr + index[next[-1]].size == a.addr ? next - 1 : nullptr;
  const DeviceAddr lo = below != nullptr ? index[*below].addr : a.addr;
  const DeviceAddr hi = above ? index[*next].addr + index[*next].size : a.addr + a.size;
  const auto merged = static_cast<std::uint32_t>(hi - lo);
  if (merged == kDevicePage) {  // the whole page is one hole now: give it back
    if (above) index.remove(*next);
    if (below != nullptr) index.remove(*below);
    holes.clear();
    release(kDevicePage);
    free_slots_.push_back(a.page);
    return;
  }
  // The merged hole keeps a neighbour's entry (in the page and in the index), the youngest now.
  if (below != nullptr) {
    if (above) {
      index.remove(*next);
      holes.erase(next);
    }
    index.move(*below, lo, merged);
  } else if (above) {
    index.move(*next, lo, merged);
  } else {
    holes.insert(next, index.add(a.page, a.addr, merged));
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
