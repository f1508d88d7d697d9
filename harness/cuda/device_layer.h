// The caching allocator model's device layer on a real (or fake) CUDA runtime: segments are
// cudaMalloc allocations, expandable segments are cuMemAddressReserve ranges with one
// cuMemCreate'd physical page per model page (2 MiB small pool / 20 MiB large pool), mapped with
// cuMemMap + cuMemSetAccess and unmapped page by page (cuMemUnmap wants whole mappings). The model
// above (harness/sim/caching.*) is the very one the simulator runs, so the `cuda` backend's
// caching modes allocate exactly the segments and pages the simulator says they would.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include "harness/cuda/runtime.h"
#include "harness/sim/device_layer.h"

namespace vf::cuda {

// A runtime failure other than out-of-memory inside the layer (a sticky error, a bug): the model
// cannot go on; the backend catches it and ends the case.
class CudaFault : public std::runtime_error {
 public:
  explicit CudaFault(Status s) : std::runtime_error(s.describe()), status_(std::move(s)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

class CudaDeviceLayer final : public sim::DeviceLayer {
 public:
  // `emulated` is the scenario's device: its total sizes the expandable VA and the memory
  // fraction, exactly as in the simulator.
  CudaDeviceLayer(Runtime& rt, const DeviceSpec& emulated);
  ~CudaDeviceLayer() override;
  CudaDeviceLayer(const CudaDeviceLayer&) = delete;
  CudaDeviceLayer& operator=(const CudaDeviceLayer&) = delete;

  std::optional<sim::DeviceAlloc> segment_malloc(Bytes size) override;
  void segment_free(const sim::DeviceAlloc& a) override;
  sim::DeviceAddr reserve_va(Bytes size, Bytes align) override;
  void release_va(sim::DeviceAddr base, Bytes size) override;
  bool map_pages(sim::DeviceAddr addr, Bytes bytes, Bytes page) override;
  void unmap_pages(sim::DeviceAddr addr, Bytes bytes, Bytes page) override;
  Bytes free_bytes() const override;
  const DeviceSpec& spec() const override { return spec_; }

  // Physical bytes the layer holds now (segments + mapped pages).
  Bytes held() const { return segment_bytes_ + page_bytes_; }
  std::size_t va_ranges() const { return ranges_.size(); }
  // Frees everything still held (pages, ranges, segments) without throwing; returns the physical
  // bytes it had to free (0 when the model gave everything back itself) and why in `note`.
  Bytes release_all(std::string* note);
  std::uint64_t device_calls() const { return calls_; }

 private:
  void check(const Status& s);  // throws CudaFault unless ok
  Bytes granularity();          // cuMemGetAllocationGranularity (minimum), cached

  Runtime& rt_;
  DeviceSpec spec_;
  Bytes granularity_ = 0;
  std::map<DevPtr, Bytes> segments_;
  std::map<DevPtr, Bytes> pages_;   // mapped page -> its size
  std::map<DevPtr, Bytes> ranges_;  // reserved VA -> its size
  Bytes segment_bytes_ = 0;
  Bytes page_bytes_ = 0;
  std::uint64_t calls_ = 0;
};

}  // namespace vf::cuda
