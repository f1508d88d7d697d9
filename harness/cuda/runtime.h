// The thin CUDA runtime interface the `cuda` backend and `gpu-check` are written against: exactly
// the calls they need, in plain C++ types (no CUDA header), with two implementations:
//   - runtime_cuda.cpp: the real one (cudart_static, the driver's VMM calls through
//     cudaGetDriverEntryPointByVersion, NVML through dlopen); built only with nvcc (VF_HAVE_CUDA);
//   - runtime_fake.cpp: a CPU fake built on the simulator (SimDevice for memory, the async pool
//     model for cudaMallocAsync) with injectable faults, so every piece of orchestration above it
//     is unit-tested in CI without a GPU.
// Every call returns a Status; nothing throws except a broken invariant of the caller
// (InfraError). Handles are opaque integers: 0 is "none" (stream 0 = the legacy default stream).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/core/bytes.h"
#include "harness/core/dtype.h"

namespace vf::cuda {

// What a failed call means for the caller. `sticky` errors (illegal address, launch failure,
// ECC ...) poison the context: every later call fails, the process must be restarted.
enum class Err : std::uint8_t {
  ok,
  out_of_memory,  // cudaErrorMemoryAllocation / CUDA_ERROR_OUT_OF_MEMORY: not sticky, cleared
  sticky,         // the context is unusable
  no_device,      // no driver, no GPU, or the driver is too old for this runtime
  not_supported,  // the device or driver lacks the feature (VMM, pools)
  invalid,        // a bad argument (a bug of the caller)
  other,
};
std::string_view err_name(Err e);

struct Status {
  Err err = Err::ok;
  int code = 0;        // the raw cudaError_t / CUresult / nvmlReturn_t
  std::string where;   // the call that failed ("cudaMallocAsync(1.00 MiB)")
  std::string message; // the library's own error string
  bool ok() const { return err == Err::ok; }
  explicit operator bool() const { return ok(); }
  std::string describe() const;  // "cudaMalloc(2.00 MiB): out of memory (code 2: out of memory)"
};
Status ok_status();

using DevPtr = std::uint64_t;
struct Stream {
  std::uint64_t h = 0;
  bool operator==(const Stream&) const = default;
};
struct Event {
  std::uint64_t h = 0;
};
struct Pool {
  std::uint64_t h = 0;
  bool operator==(const Pool&) const = default;
};
struct MemHandle {  // a VMM physical allocation (CUmemGenericAllocationHandle)
  std::uint64_t h = 0;
};

// cudaMemPoolAttr, the ones we read or set.
enum class PoolAttr : std::uint8_t {
  release_threshold,
  reuse_follow_event_dependencies,
  reuse_allow_opportunistic,
  reuse_allow_internal_dependencies,
  reserved_current,
  reserved_high,
  used_current,
  used_high,
};
std::string_view pool_attr_name(PoolAttr a);

struct DeviceInfo {
  int ordinal = 0;
  std::string name;          // "NVIDIA H200"
  Bytes total = 0;           // totalGlobalMem
  int cc_major = 0;
  int cc_minor = 0;
  int sm_count = 0;
  int driver_version = 0;    // cudaDriverGetVersion (13000 = 13.0)
  int runtime_version = 0;   // cudaRuntimeGetVersion
  std::string pci_bus_id;    // "0000:3B:00.0" (matches the NVML device)
  bool vmm_supported = false;
  bool pools_supported = false;
  std::string describe() const;  // "NVIDIA H200 (140.4 GiB, cc 9.0, 132 SMs), driver 13.0, runtime 13.0"
};

// NVML's view of one device (nvmlDeviceGetMemoryInfo) and of this process
// (nvmlDeviceGetComputeRunningProcesses_v3).
struct NvmlMemory {
  Bytes total = 0;
  Bytes used = 0;
  Bytes free = 0;
};
struct NvmlProcesses {
  std::optional<Bytes> self;  // usedGpuMemory of our pid, if listed (host pids in containers: not)
  Bytes all = 0;              // sum over every compute process on the device
  std::uint32_t count = 0;
};

// The scenario's sim-only modelling knobs. The fake's pool model takes them so a fake run
// reproduces a sim run bit for bit; the real driver is not seedable and ignores them.
struct ModelHints {
  std::uint64_t seed = 0;
  Bytes pool_granularity = 2 * MiB;
  double opportunistic_probability = 0.5;
};

class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual std::string_view kind() const = 0;  // "cuda" or "fake"

  // ---- device and context ----
  virtual Status device_count(int& n) = 0;
  // cudaSetDevice + cudaFree(0): creates the primary context (the context cost is paid here).
  virtual Status init_device(int ordinal) = 0;
  virtual Status device_info(DeviceInfo& out) = 0;
  virtual Status mem_get_info(Bytes& free, Bytes& total) = 0;  // thread-safe
  virtual Status device_synchronize() = 0;
  // cudaGetLastError: returns and clears a non-sticky error (a sticky one stays).
  virtual Status last_error() = 0;

  // ---- cudaMalloc ----
  virtual Status malloc(DevPtr& p, Bytes n) = 0;
  virtual Status free(DevPtr p) = 0;

  // ---- streams and events ----
  virtual Status stream_create(Stream& s) = 0;  // non-blocking w.r.t. the legacy stream
  virtual Status stream_destroy(Stream s) = 0;
  virtual Status event_create(Event& e, bool timing) = 0;
  virtual Status event_destroy(Event e) = 0;
  virtual Status event_record(Event e, Stream s) = 0;
  virtual Status stream_wait_event(Stream s, Event e) = 0;
  virtual Status event_synchronize(Event e) = 0;
  virtual Status event_elapsed_ms(float& ms, Event start, Event end) = 0;

  // ---- stream-ordered allocator ----
  virtual Status default_pool(Pool& p) = 0;
  virtual Status pool_create(Pool& p) = 0;  // device-located, maxSize 0 (system default)
  virtual Status pool_destroy(Pool p) = 0;
  virtual Status pool_get(Pool p, PoolAttr a, std::uint64_t& v) = 0;
  // Reuse attributes take 0/1; the High attributes accept only 0 (reset to current).
  virtual Status pool_set(Pool p, PoolAttr a, std::uint64_t v) = 0;
  virtual Status pool_trim(Pool p, Bytes keep) = 0;
  virtual Status malloc_async(DevPtr& p, Bytes n, Pool pool, Stream s) = 0;  // cudaMallocFromPoolAsync
  virtual Status free_async(DevPtr p, Stream s) = 0;

  // ---- host memory and transfers ----
  virtual Status host_alloc(void*& p, Bytes n) = 0;  // pinned (cudaHostAlloc)
  virtual Status host_free(void* p) = 0;
  virtual Status memcpy_h2d_async(DevPtr dst, const void* src, Bytes n, Stream s) = 0;
  virtual Status memcpy_d2h(void* dst, DevPtr src, Bytes n) = 0;  // synchronous
  virtual Status memset_async(DevPtr p, std::uint8_t value, Bytes n, Stream s) = 0;

  // ---- virtual memory management (driver API) ----
  virtual Status vmm_granularity(Bytes& g, bool recommended) = 0;
  virtual Status vmm_create(MemHandle& h, Bytes n) = 0;  // physical memory is charged here
  virtual Status vmm_release(MemHandle h) = 0;           // freed once also unmapped
  virtual Status vmm_reserve(DevPtr& p, Bytes n, Bytes align) = 0;
  virtual Status vmm_free_range(DevPtr p, Bytes n) = 0;
  virtual Status vmm_map(DevPtr p, Bytes n, MemHandle h) = 0;
  virtual Status vmm_set_access(DevPtr p, Bytes n) = 0;  // read/write for this device
  virtual Status vmm_unmap(DevPtr p, Bytes n) = 0;

  // ---- kernels (kernels/convert_kernels.h) ----
  virtual Status upcast(DevPtr src, Dtype from, DevPtr dst, Dtype to, std::uint64_t n, float scale, Stream s) = 0;
  virtual Status dequant(DevPtr src, Dtype type, DevPtr dst, Dtype to, std::uint64_t n, Stream s) = 0;
  virtual Status touch(DevPtr dst, Bytes n, std::uint8_t value, Stream s) = 0;
  virtual Status copy_kernel(DevPtr dst, DevPtr src, Bytes n, Stream s) = 0;  // launch_copy
  virtual Status copy_d2d(DevPtr dst, DevPtr src, Bytes n, Stream s) = 0;     // cudaMemcpyAsync

  // ---- NVML (optional: absent when libnvidia-ml.so.1 is not there) ----
  virtual bool nvml_available() const = 0;
  virtual std::string nvml_note() const = 0;  // why it is unavailable, or the driver version
  virtual Status nvml_memory(NvmlMemory& out) = 0;
  virtual Status nvml_processes(NvmlProcesses& out) = 0;

  // The backend calls this right before a case's first op. The fake seeds its pool model with the
  // scenario's sim-only knobs (so a fake run reproduces a sim run) and starts counting its
  // injected faults at the first call; the real runtime ignores it.
  virtual void begin_case(const ModelHints&) {}
};

// The real runtime for device `ordinal`. Throws vf::InfraError with a one-line reason when the
// build has no CUDA, the driver cannot be loaded, or there is no device (no context is created).
std::unique_ptr<Runtime> open_cuda_runtime();
// Whether open_cuda_runtime() would succeed; `why` gets the one-line reason when it would not.
bool cuda_usable(std::string* why);

}  // namespace vf::cuda
