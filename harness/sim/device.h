// The simulated device: what the driver does below every allocator. Capacity is
// total - used by others - context; cudaMalloc charges physical memory in 2 MiB pages
// (small allocations sub-allocated from shared pages); VMM pages (expandable segments) are
// charged exactly. Addresses are modelled so that overlap of live blocks can be checked.
// Rules: ../shared/reference/cuda-allocators.md §3.2, §7.1-7.2; the sub-allocator of small
// buffers is the one recorded on an H200 (reports/gpu/h200-2026-12-04.json, sequences_raw:
// 4,500 cudaMalloc / cudaFree calls, every free-memory reading reproduced).
// It is also the caching model's simulated DeviceLayer (device_layer.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "harness/core/bytes.h"
#include "harness/scenario.h"
#include "harness/sim/device_layer.h"
#include "harness/sim/hole_index.h"

namespace vf::sim {

// cudaMalloc returns memory aligned to (and spaced by) at least 512 B.
inline constexpr Bytes kCudaMallocAlign = 512;
// Physical memory is backed in 2 MiB pages: buffers >= 2 MiB are charged in whole pages of
// their own; smaller ones are sub-allocated from shared pages, as the driver does (measured on
// an H200, driver 580): best fit over the free holes of every page (the smallest hole that
// holds the 512 B-rounded request; among equal sizes the hole that has been a hole longest),
// placed at the hole's start; a free merges with the holes beside it in its page; a page is
// given back the moment its last buffer is freed, and a new one is taken only when no hole fits.
inline constexpr Bytes kDevicePage = 2 * MiB;

class SimDevice final : public DeviceLayer {
 public:
  explicit SimDevice(const DeviceSpec& spec);

  // cudaMalloc(size): nullopt when the pages it needs are not free (cudaErrorMemoryAllocation).
  std::optional<DeviceAlloc> cuda_malloc(Bytes size);
  // The size cudaMalloc(size) takes (512 B-rounded; 0 when no such size exists), and the
  // DeviceAlloc of a request placed at `addr` in `page` (kNoPage: pages of its own, charged
  // whole), from the request alone: cuda_malloc builds a large buffer's with it, and a caller
  // need not keep the result to free it.
  static Bytes cuda_rounded(Bytes size) {
    const Bytes rounded = round_up(size == 0 ? 1 : size, kCudaMallocAlign);
    return rounded < size ? 0 : rounded;
  }
  static DeviceAlloc allocation(DeviceAddr addr, Bytes request, std::uint32_t page) {
    const Bytes rounded = cuda_rounded(request);
    return DeviceAlloc{addr, rounded, page == kNoPage ? round_up(rounded, kDevicePage) : 0, page};
  }
  void cuda_free(const DeviceAlloc& a);

  // Virtual address space without physical backing (cuMemAddressReserve), and physical pages
  // mapped into it (cuMemCreate + cuMemMap), charged exactly (callers pass page multiples).
  DeviceAddr reserve_address_range(Bytes size);
  bool map(Bytes bytes);
  void unmap(Bytes bytes);

  Bytes capacity() const { return capacity_; }   // total - others - context
  Bytes charged() const { return charged_; }     // physical bytes our process holds
  // Of those, the bytes mapped into reserved ranges (VMM pages) rather than cudaMalloc'd.
  Bytes mapped() const { return mapped_; }
  Bytes malloc_charged() const { return charged_ - mapped_; }
  // Another process takes `bytes` (false, nothing changes, when they are not free: its own
  // allocation fails) or gives back `bytes` it held.
  bool others_take(Bytes bytes);
  void others_release(Bytes bytes);
  Bytes peak_charged() const { return peak_charged_; }
  Bytes free() const { return capacity_ - charged_; }
  // The device-wide view (what NVML / cudaMemGetInfo would report as used): others + context +
  // what we hold.
  Bytes baseline_used() const { return spec_.used_by_others + spec_.context_overhead; }
  Bytes device_used() const { return baseline_used() + charged_; }
  const DeviceSpec& spec() const override { return spec_; }

  // DeviceLayer: the caching model's segments and pages, charged by the rules above.
  std::optional<DeviceAlloc> segment_malloc(Bytes size) override { return cuda_malloc(size); }
  void segment_free(const DeviceAlloc& a) override { cuda_free(a); }
  DeviceAddr reserve_va(Bytes size, Bytes) override { return reserve_address_range(size); }
  void release_va(DeviceAddr, Bytes) override {}  // synthetic addresses are never reused
  bool map_pages(DeviceAddr, Bytes bytes, Bytes) override { return map(bytes); }
  void unmap_pages(DeviceAddr, Bytes bytes, Bytes) override { unmap(bytes); }
  Bytes free_bytes() const override { return free(); }

 private:
  bool charge(Bytes b);
  void release(Bytes b);

  // A small page's holes, by address: their ids in the index, whose nodes hold the bounds, and
  // the markers of buffers that filled a hole exactly (HoleIndex::retire). Few (holes are
  // separated by live buffers: in a 1,000,000-module case 98% of the pages a buffer is placed in
  // have one), so up to five are kept in the page's record, and only a page that has more keeps
  // them on the heap. A page has no other state: holes and buffers carry their device addresses,
  // and a page is empty when a free leaves it one hole of 2 MiB. A placement in a page that has a
  // hole reads and writes the index's node alone: when the page record also held each hole's bounds, the page's base and a
  // count of its live buffers, reading it was a cache miss on 60% of a 1,000,000-module case's
  // placements.
  class PageHoles {
   public:
    using Id = HoleIndex::Id;
    Id* begin() { return cap_ != 0 ? heap_.get() : inline_; }
    Id* end() { return begin() + n_; }
    void clear() { n_ = 0; }  // a heap array stays for the slot's next page
    Id* insert(Id* pos, Id h) {
      const std::uint32_t at = static_cast<std::uint32_t>(pos - begin());
      if (n_ == capacity()) grow();
      Id* d = begin();
      std::copy_backward(d + at, d + n_, d + n_ + 1);
      d[at] = h;
      ++n_;
      return d + at;
    }
    Id* erase(Id* pos) {
      std::copy(pos + 1, end(), pos);
      --n_;
      return pos;
    }
    void push_back(Id h) { insert(end(), h); }

   private:
    static constexpr std::uint16_t kInline = 5;
    std::uint32_t capacity() const { return cap_ != 0 ? cap_ : kInline; }
    void grow() {
      const std::uint32_t cap = 2 * std::max<std::uint32_t>(capacity(), 8);  // at most 2,048 holes, or 4,096 markers
      auto bigger = std::make_unique<Id[]>(cap);
      std::copy(begin(), end(), bigger.get());
      heap_ = std::move(bigger);
      cap_ = static_cast<std::uint16_t>(cap);
    }
    std::uint16_t n_ = 0;
    std::uint16_t cap_ = 0;  // 0: the holes are inline
    Id inline_[kInline];
    std::unique_ptr<Id[]> heap_;
  };
  struct alignas(32) SmallPage {
    PageHoles holes;
  };
  static_assert(sizeof(SmallPage) == 32);
  static_assert(HoleIndex::kUnit == kCudaMallocAlign && HoleIndex::kSizes * HoleIndex::kUnit == kDevicePage);
  std::optional<DeviceAlloc> small_malloc(Bytes rounded);
  void small_free(const DeviceAlloc& a);

  DeviceSpec spec_;
  Bytes capacity_ = 0;
  Bytes charged_ = 0;
  Bytes mapped_ = 0;
  Bytes peak_charged_ = 0;
  DeviceAddr next_addr_ = 0x7f0000000000ull;
  std::vector<SmallPage> small_pages_;   // slots are reused once a page is released
  std::vector<std::uint32_t> free_slots_;  // released page slots
  // Every page's holes in best-fit order; made by the first small buffer (32 KiB of list heads
  // and tails that a run of large buffers, or of the caching model's 2 MiB segments, never needs).
  std::unique_ptr<HoleIndex> holes_;
};

}  // namespace vf::sim
