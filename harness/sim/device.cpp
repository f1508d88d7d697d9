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
    SmallPage& p = small_pages_[found.page];
    Hole* const h = std::lower_bound(p.holes.begin(), p.holes.end(), found.off, [](const Hole& x, std::uint32_t o) { return x.off < o; });
    if (h->size > r) {  // the rest stays a hole, now the youngest
      h->off = found.off + r;
      h->size = found.size - r;
      index.move(id, h->off, h->size);
    } else {
      index.remove(id);
      p.holes.erase(h);
    }
    ++p.live;
    return std::optional<DeviceAlloc>(std::in_place, DeviceAlloc{p.base + found.off, rounded, 0, found.page});  // in place (cuda_malloc)
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
  SmallPage& p = small_pages_[slot];
  p.base = next_addr_;
  p.live = 1;
  p.holes.clear();
  next_addr_ += kDevicePage;
  const std::uint32_t size = static_cast<std::uint32_t>(kDevicePage) - r;
  p.holes.push_back(Hole{r, size, index.add(slot, r, size)});
  return std::optional<DeviceAlloc>(std::in_place, DeviceAlloc{p.base, rounded, 0, slot});
}

void SimDevice::small_free(const DeviceAlloc& a) {
  SmallPage& p = small_pages_[a.page];
  HoleIndex& index = *holes_;  // made by the small_malloc that returned `a`
  std::uint32_t off = static_cast<std::uint32_t>(a.addr - p.base);
  std::uint32_t size = static_cast<std::uint32_t>(a.size);
  // Merge with the hole just below and the one just above.
  Hole* next = std::lower_bound(p.holes.begin(), p.holes.end(), off, [](const Hole& x, std::uint32_t o) { return x.off < o; });
  const bool above = next != p.holes.end() && next->off == off + size;
  Hole* const below = next != p.holes.begin() && (next - 1)->off + (next - 1)->size == off ? next - 1 : nullptr;
  if (--p.live == 0) {  // the whole page is one hole now: give it back
    if (above) index.remove(next->id);
    if (below != nullptr) index.remove(below->id);
    p.holes.clear();
    release(kDevicePage);
    free_slots_.push_back(a.page);
    return;
  }
  // The merged hole keeps a neighbour's entry (in the page and in the index), the youngest now.
  if (below != nullptr) {
    below->size += size;
    if (above) {
      below->size += next->size;
      index.remove(next->id);
      p.holes.erase(next);
    }
    index.move(below->id, below->off, below->size);
  } else if (above) {
    next->off = off;
    next->size += size;
    index.move(next->id, next->off, next->size);
  } else {
    p.holes.insert(next, Hole{off, size, index.add(a.page, off, size)});
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
