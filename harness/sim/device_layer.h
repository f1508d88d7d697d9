// What the caching allocator model needs from the device below it: whole cudaMalloc segments
// (native mode), and reserved address ranges with physical pages mapped into them (expandable
// segments). One model, two device layers:
//   - SimDevice (device.h): the simulated device, page charging and synthetic addresses;
//   - vf::cuda::CudaDeviceLayer (harness/cuda/device_layer.h): real cudaMalloc and
//     cuMemCreate / cuMemMap on a GPU, so the `cuda` backend runs the very same model on real memory.
// A layer call is rare (one per segment or page run, never per block), so a virtual call is fine.
#pragma once

#include <cstdint>
#include <optional>

#include "harness/core/bytes.h"
#include "harness/scenario.h"

namespace vf::sim {

using DeviceAddr = std::uint64_t;

inline constexpr std::uint32_t kNoPage = 0xffffffffu;

// One cudaMalloc allocation as the layer hands it out.
struct DeviceAlloc {
  DeviceAddr addr = 0;
  Bytes size = 0;                   // as requested, rounded up to 512 B
  Bytes charge = 0;                 // physical bytes charged for it alone (0 when packed; sim only)
  std::uint32_t page = kNoPage;     // the shared small page it was packed into (sim only)
};

class DeviceLayer {
 public:
  virtual ~DeviceLayer() = default;

  // cudaMalloc(size) of a whole segment: nullopt when the device is out of memory.
  virtual std::optional<DeviceAlloc> segment_malloc(Bytes size) = 0;
  virtual void segment_free(const DeviceAlloc& a) = 0;

  // cuMemAddressReserve: `size` bytes of virtual addresses without memory, `align`-aligned.
  virtual DeviceAddr reserve_va(Bytes size, Bytes align) = 0;
  virtual void release_va(DeviceAddr base, Bytes size) = 0;
  // Backs [addr, addr + bytes) with physical memory in pages of `page` bytes (cuMemCreate +
  // cuMemMap + cuMemSetAccess per page); bytes is a multiple of page. False (nothing mapped)
  // when the memory is not there.
  virtual bool map_pages(DeviceAddr addr, Bytes bytes, Bytes page) = 0;
  // Unmaps and frees pages mapped by map_pages (whole pages, same page size).
  virtual void unmap_pages(DeviceAddr addr, Bytes bytes, Bytes page) = 0;

  // What cudaMemGetInfo would call free now (OOM reports only).
  virtual Bytes free_bytes() const = 0;
  // The device the model believes it runs on (its total sizes expandable VA and the memory
  // fraction).
  virtual const DeviceSpec& spec() const = 0;
};

}  // namespace vf::sim
