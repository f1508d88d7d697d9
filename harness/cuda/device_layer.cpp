#include "harness/cuda/device_layer.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

namespace vf::cuda {

CudaDeviceLayer::CudaDeviceLayer(Runtime& rt, const DeviceSpec& emulated) : rt_(rt), spec_(emulated) {}

CudaDeviceLayer::~CudaDeviceLayer() { (void)release_all(nullptr); }

void CudaDeviceLayer::check(const Status& s) {
  if (!s) throw CudaFault(s);
}

std::optional<sim::DeviceAlloc> CudaDeviceLayer::segment_malloc(Bytes size) {
  DevPtr p = 0;
  ++calls_;
  const Status s = rt_.malloc(p, size);
  if (s.err == Err::out_of_memory) {
    (void)rt_.last_error();  // not sticky: clear it, the model walks its retry ladder
    return std::nullopt;
  }
  check(s);
  segments_[p] = size;
  segment_bytes_ += size;
  return sim::DeviceAlloc{p, round_up(size, 512), 0, sim::kNoPage};
}

void CudaDeviceLayer::segment_free(const sim::DeviceAlloc& a) {
  const auto it = segments_.find(a.addr);
  if (it == segments_.end()) throw CudaFault(Status{Err::invalid, 0, "cudaFree", "the model freed a segment it does not own"});
  ++calls_;
  check(rt_.free(a.addr));  // cudaFree synchronizes the device first: no kernel still uses it
  segment_bytes_ -= it->second;
  segments_.erase(it);
}

// The VMM minimum granularity, asked once.
Bytes CudaDeviceLayer::granularity() {
  if (granularity_ == 0) {
    check(rt_.vmm_granularity(granularity_, false));
    if (granularity_ == 0) granularity_ = 1;
  }
  return granularity_;
}

sim::DeviceAddr CudaDeviceLayer::reserve_va(Bytes size, Bytes align) {
  DevPtr p = 0;
  ++calls_;
  // Every page is mapped at the range's base plus whole pages, and cuMemMap wants the address to
  // be a multiple of the granularity: the base must be aligned to it at least.
  check(rt_.vmm_reserve(p, size, std::max(align, granularity())));
  ranges_[p] = size;
  return p;
}

void CudaDeviceLayer::release_va(sim::DeviceAddr base, Bytes size) {
  ++calls_;
  check(rt_.vmm_free_range(base, size));
  ranges_.erase(base);
}

bool CudaDeviceLayer::map_pages(sim::DeviceAddr addr, Bytes bytes, Bytes page) {
  const Bytes g = granularity();
  // cuMemMap: the address, the size and the offset must all be multiples of the minimum
  // granularity.
  if (page == 0 || page % g != 0 || bytes % page != 0 || addr % g != 0) {
    throw CudaFault(Status{Err::invalid, 0, "cuMemCreate",
                           fmt::format("{} at {:#x} in pages of {}: not whole pages, or pages or address not a "
                                       "multiple of the VMM granularity {}",
                                       format_mib(bytes), addr, format_mib(page), format_mib(g))});
  }
  std::vector<DevPtr> done;
  auto roll_back = [&] {
    for (DevPtr p : done) {
      (void)rt_.vmm_unmap(p, page);
      pages_.erase(p);
      page_bytes_ -= page;
    }
  };
  for (Bytes off = 0; off < bytes; off += page) {
    const DevPtr at = addr + off;
    MemHandle h;
    ++calls_;
    Status s = rt_.vmm_create(h, page);
    if (s.err == Err::out_of_memory) {
      (void)rt_.last_error();
      roll_back();
      return false;
    }
    bool mapped = false;
    if (s) {
      s = rt_.vmm_map(at, page, h);
      mapped = s.ok();
    }
    if (s) s = rt_.vmm_set_access(at, page);
    // The mapping keeps the physical memory alive; it is freed when the page is unmapped.
    const Status rel = h.h != 0 ? rt_.vmm_release(h) : ok_status();
    if (!s || !rel) {
      // A page mapped but not made accessible is still a mapping: unmap it too, or its memory
      // stays charged and the range cannot be freed (cuMemAddressFree wants it unmapped).
      if (mapped) (void)rt_.vmm_unmap(at, page);
      roll_back();
      check(s ? rel : s);
    }
    done.push_back(at);
    pages_[at] = page;
    page_bytes_ += page;
  }
  return true;
}

void CudaDeviceLayer::unmap_pages(sim::DeviceAddr addr, Bytes bytes, Bytes page) {
  // PyTorch synchronizes before unmapping: a kernel may still be reading a block the model
  // already considers free.
  check(rt_.device_synchronize());
  for (Bytes off = 0; off < bytes; off += page) {
    const DevPtr at = addr + off;
    const auto it = pages_.find(at);
    if (it == pages_.end() || it->second != page) {
      throw CudaFault(Status{Err::invalid, 0, "cuMemUnmap", fmt::format("{:#x} is not a mapped page of {}", at, format_mib(page))});
    }
    ++calls_;
    check(rt_.vmm_unmap(at, page));
    page_bytes_ -= page;
    pages_.erase(it);
  }
}

Bytes CudaDeviceLayer::free_bytes() const {
  Bytes free = 0;
  Bytes total = 0;
  return rt_.mem_get_info(free, total) ? free : 0;
}

Bytes CudaDeviceLayer::release_all(std::string* note) {
  const Bytes held_before = held();
  if (held_before == 0 && ranges_.empty()) return 0;
  (void)rt_.device_synchronize();
  for (const auto& [p, size] : pages_) (void)rt_.vmm_unmap(p, size);
  for (const auto& [p, size] : ranges_) (void)rt_.vmm_free_range(p, size);
  for (const auto& [p, size] : segments_) (void)rt_.free(p);
  if (note != nullptr) {
    *note = fmt::format("the caching model still held {} segment(s) ({}), {} page(s) ({}) and {} address range(s) after "
                        "the case; freed them",
                        segments_.size(), format_mib(segment_bytes_), pages_.size(), format_mib(page_bytes_),
                        ranges_.size());
  }
  pages_.clear();
  ranges_.clear();
  segments_.clear();
  segment_bytes_ = 0;
  page_bytes_ = 0;
  return held_before;
}

}  // namespace vf::cuda
