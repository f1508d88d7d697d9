// The `cuda` backend: runs a lowered program on a real GPU (or on the fake runtime) and measures
// it the way the `sim` backend does, so the two can be compared op for op.
//
// Per case:
//   1. the ballast is fitted so free memory is what the scenario's card leaves the case
//      (device.total - used_by_others - context_overhead), whatever the real card is;
//   2. every op really happens: allocations in the scenario's allocator mode (raw cudaMalloc;
//      cudaMallocAsync on a pool; the simulator's caching model driving real cudaMalloc /
//      cuMemMap), H2D copies from one pinned buffer (or cudaMemsetAsync with --transfer skip),
//      upcast / dequant kernels on real-sized buffers, the activation touched by a kernel,
//      cross-stream waits as events, frees on the stream the program names;
//   3. after each op the allocator's reserved / allocated bytes are read (raw: the drop in
//      cudaMemGetInfo free; async: ReservedMemCurrent / UsedMemCurrent; caching: the model's
//      stats), giving the same peaks and per-stage peaks as sim (transition ops excluded); a
//      sampling thread and NVML give the device view over time for the report;
//   4. a real OOM is the case's finding at its op; a sticky error ends the case as `error` and
//      marks the result fatal (the process cannot run another case);
//   5. cleanup: synchronize, free what the case left, trim, and check free memory is back to the
//      baseline (a leak is a warning of the result, and the ballast is refitted next case).
// docs/cuda.md explains every figure and its caveats.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/cuda/ballast.h"
#include "harness/cuda/runtime.h"
#include "harness/exec.h"

namespace vf::cuda {

// One line about the device measurements of a cuda run (for `vramfuzz run`).
std::string format_device_report(const DeviceReport& d);

enum class Transfer : std::uint8_t { copy, skip };
Transfer parse_transfer(std::string_view text, std::string_view what);  // "copy" | "skip"

struct CudaBackendConfig {
  int device = 0;
  Transfer transfer = Transfer::copy;
  // async: a fresh pool per case (cudaMemPoolCreate; its statistics are the case's alone). false:
  // the device's default pool, as PyTorch uses it, trimmed to 0 before each case.
  bool dedicated_pool = true;
  double sample_interval_ms = 1.0;  // the cudaMemGetInfo sampling thread; 0: none
  double nvml_interval_ms = 100.0;  // NVML per-process usage; 0: never
  Bytes leak_tolerance = 2 * MiB;   // free memory may come back this much short without a warning
};

class CudaBackend final : public Backend {
 public:
  // Creates the context on the device, measures it, and warms every kernel up (lazy module
  // loading would otherwise charge device memory inside the first case). Throws InfraError with
  // a one-line reason when the device cannot be used.
  CudaBackend(Runtime& rt, CudaBackendConfig cfg = {});
  CudaBackend(std::unique_ptr<Runtime> rt, CudaBackendConfig cfg = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view name() const override { return "cuda"; }
  ExecResult execute(const Scenario& s, const Program& p, const ExecOptions& opt) override;

  const DeviceInfo& device() const { return info_; }
  Bytes free_after_context() const { return free_after_context_; }  // right after cudaFree(0)
  Bytes free_after_warmup() const { return free_after_warmup_; }    // after every kernel ran once
  Bytes ballast_bytes() const { return ballast_.bytes(); }
  Bytes pinned_bytes() const { return pinned_bytes_; }
  std::uint64_t pinned_allocations() const { return pinned_allocations_; }
  // Set after a sticky error: every later case is an immediate fatal error.
  const std::optional<std::string>& poisoned() const { return poisoned_; }
  Runtime& runtime() { return rt_; }

 private:
  class Case;  // one execution (backend.cpp)

  void init();
  void warm_up();
  Status ensure_pinned(Bytes bytes);
  void release_all() noexcept;

  std::unique_ptr<Runtime> owned_;
  Runtime& rt_;
  CudaBackendConfig cfg_;
  DeviceInfo info_;
  Bytes free_after_context_ = 0;
  Bytes free_after_warmup_ = 0;
  std::vector<Stream> streams_;  // [0] compute, [1..] offload streams
  std::vector<Event> events_;    // one per stream, for cross-stream waits
  DevPtr scratch_ = 0;           // warm-up buffer, kept
  void* pinned_ = nullptr;       // the H2D source, reused across cases
  Bytes pinned_bytes_ = 0;
  std::uint64_t pinned_allocations_ = 0;
  Ballast ballast_;
  std::optional<std::string> poisoned_;
};

}  // namespace vf::cuda
