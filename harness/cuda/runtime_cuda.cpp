// The real CUDA runtime behind harness/cuda/runtime.h. Built only with nvcc present
// (VF_HAVE_CUDA); plain host C++ (g++) against cudart_static:
//   - the runtime API for devices, memory, pools, streams, events and copies;
//   - the driver's VMM calls (cuMemCreate / cuMemMap / ...) through
//     cudaGetDriverEntryPointByVersion, so there is no link dependency on libcuda (the binary
//     links and starts on a machine without a driver, and says so in one line);
//   - NVML through dlopen("libnvidia-ml.so.1"), optional: absent, every NVML figure is "n/a";
//   - the kernels of kernels/convert_kernels.h.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "harness/core/error.h"
#include "harness/cuda/runtime.h"
#include "kernels/convert_kernels.h"

namespace vf::cuda {

namespace {

// ---- error classification ---------------------------------------------------------------------

Err classify(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return Err::ok;
    case cudaErrorMemoryAllocation: return Err::out_of_memory;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorInitializationError: return Err::no_device;
    case cudaErrorNotSupported: return Err::not_supported;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle: return Err::invalid;
    // The errors after which the context cannot be used again (each later call repeats them):
    // every one driver_types.h documents as "the process must be terminated and relaunched",
    // plus ECC and unknown errors.
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorContained:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorExternalDevice:
    case cudaErrorMpsClientTerminated:
    case cudaErrorECCUncorrectable:
    case cudaErrorUnknown: return Err::sticky;
    default: return Err::other;
  }
}

Err classify(CUresult e) {
  switch (e) {
    case CUDA_SUCCESS: return Err::ok;
    case CUDA_ERROR_OUT_OF_MEMORY: return Err::out_of_memory;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED: return Err::no_device;
    case CUDA_ERROR_NOT_SUPPORTED: return Err::not_supported;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE: return Err::invalid;
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_CONTAINED:
    case CUDA_ERROR_TENSOR_MEMORY_LEAK:
    case CUDA_ERROR_EXTERNAL_DEVICE:
    case CUDA_ERROR_MPS_CLIENT_TERMINATED:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_UNKNOWN: return Err::sticky;
    default: return Err::other;
  }
}

Status rt_status(cudaError_t e, std::string where) {
  if (e == cudaSuccess) return ok_status();
  return Status{classify(e), static_cast<int>(e), std::move(where), cudaGetErrorString(e)};
}

void* as_ptr(DevPtr p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }
DevPtr as_dev(const void* p) { return static_cast<DevPtr>(reinterpret_cast<std::uintptr_t>(p)); }
cudaStream_t as_stream(Stream s) { return reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(s.h)); }
cudaEvent_t as_event(Event e) { return reinterpret_cast<cudaEvent_t>(static_cast<std::uintptr_t>(e.h)); }
cudaMemPool_t as_pool(Pool p) { return reinterpret_cast<cudaMemPool_t>(static_cast<std::uintptr_t>(p.h)); }

std::optional<cudaMemPoolAttr> attr_of(PoolAttr a) {
  switch (a) {
    case PoolAttr::release_threshold: return cudaMemPoolAttrReleaseThreshold;
    case PoolAttr::reuse_follow_event_dependencies: return cudaMemPoolReuseFollowEventDependencies;
    case PoolAttr::reuse_allow_opportunistic: return cudaMemPoolReuseAllowOpportunistic;
    case PoolAttr::reuse_allow_internal_dependencies: return cudaMemPoolReuseAllowInternalDependencies;
    case PoolAttr::reserved_current: return cudaMemPoolAttrReservedMemCurrent;
    case PoolAttr::reserved_high: return cudaMemPoolAttrReservedMemHigh;
    case PoolAttr::used_current: return cudaMemPoolAttrUsedMemCurrent;
    case PoolAttr::used_high: return cudaMemPoolAttrUsedMemHigh;
  }
  return std::nullopt;
}

// The reuse policies are `int` attributes; the rest are cuuint64_t.
bool is_int_attr(PoolAttr a) {
  return a == PoolAttr::reuse_follow_event_dependencies || a == PoolAttr::reuse_allow_opportunistic ||
         a == PoolAttr::reuse_allow_internal_dependencies;
}

// ---- NVML, declared here (no nvml.h in the toolkit image): the documented C ABI --------------

using nvmlReturn = int;
struct NvmlDeviceSt;
using NvmlDevice = NvmlDeviceSt*;
constexpr nvmlReturn kNvmlSuccess = 0;
constexpr nvmlReturn kNvmlInsufficientSize = 7;
// NVML_VALUE_NOT_AVAILABLE in usedGpuMemory: the driver has no figure for that process (WDDM, or
// no permission to see it). Not a size.
constexpr unsigned long long kNvmlValueNotAvailable = ~0ull;
struct NvmlMemoryV1 {  // nvmlMemory_t
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct NvmlProcessInfo {  // nvmlProcessInfo_t (the v2 layout nvmlDeviceGetComputeRunningProcesses_v3 fills)
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

class Nvml {
 public:
  Nvml() {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) {
      const char* e = dlerror();
      note_ = fmt::format("NVML unavailable: {}", e ? e : "dlopen(libnvidia-ml.so.1) failed");
      return;
    }
    if (!sym(init_, "nvmlInit_v2") || !sym(shutdown_, "nvmlShutdown") || !sym(by_bus_, "nvmlDeviceGetHandleByPciBusId_v2") ||
        !sym(by_index_, "nvmlDeviceGetHandleByIndex_v2") || !sym(memory_, "nvmlDeviceGetMemoryInfo") ||
        !sym(procs_, "nvmlDeviceGetComputeRunningProcesses_v3") || !sym(error_string_, "nvmlErrorString")) {
      note_ = "NVML unavailable: libnvidia-ml.so.1 lacks a needed symbol";
      dlclose(lib_);
      lib_ = nullptr;
      return;
    }
    sym(driver_version_, "nvmlSystemGetDriverVersion");
    const nvmlReturn r = init_();
    if (r != kNvmlSuccess) {
      note_ = fmt::format("NVML unavailable: nvmlInit_v2 failed: {}", error_string_(r));
      dlclose(lib_);
      lib_ = nullptr;
      return;
    }
    std::array<char, 96> v{};
    if (driver_version_ != nullptr && driver_version_(v.data(), static_cast<unsigned>(v.size())) == kNvmlSuccess) {
      note_ = fmt::format("NVML, driver {}", v.data());
    } else {
      note_ = "NVML";
    }
  }
  ~Nvml() {
    if (lib_ == nullptr) return;
    shutdown_();
    dlclose(lib_);
  }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool available() const { return lib_ != nullptr; }
  const std::string& note() const { return note_; }

  Status memory(int ordinal, NvmlMemory& out) {
    NvmlDevice d = nullptr;
    if (Status s = device(ordinal, d); !s) return s;
    NvmlMemoryV1 m{};
    if (const nvmlReturn r = memory_(d, &m); r != kNvmlSuccess) return fail(r, "nvmlDeviceGetMemoryInfo");
    out = NvmlMemory{m.total, m.used, m.free};
    return ok_status();
  }

  Status processes(int ordinal, NvmlProcesses& out) {
    NvmlDevice d = nullptr;
    if (Status s = device(ordinal, d); !s) return s;
    std::vector<NvmlProcessInfo> infos(16);
    unsigned int count = static_cast<unsigned int>(infos.size());
    nvmlReturn r = procs_(d, &count, infos.data());
    for (int tries = 0; r == kNvmlInsufficientSize && tries < 4; ++tries) {
      infos.resize(count + 16);
      count = static_cast<unsigned int>(infos.size());
      r = procs_(d, &count, infos.data());
    }
    if (r != kNvmlSuccess) return fail(r, "nvmlDeviceGetComputeRunningProcesses_v3");
    out = NvmlProcesses{};
    out.count = count;
    const unsigned int self = static_cast<unsigned int>(getpid());
    for (unsigned int i = 0; i < count && i < infos.size(); ++i) {
      const unsigned long long used = infos[i].usedGpuMemory;
      if (used == kNvmlValueNotAvailable) continue;
      out.all += used;
      if (infos[i].pid == self) out.self = used;
    }
    return ok_status();
  }

 private:
  template <class F>
  bool sym(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(lib_, name));
    return f != nullptr;
  }
  Status fail(nvmlReturn r, const char* where) { return Status{Err::other, r, where, error_string_(r)}; }
  // The NVML device of CUDA device `ordinal`, found by PCI bus id (CUDA_VISIBLE_DEVICES renumbers
  // CUDA devices, NVML never does); by index when the bus id is not available.
  Status device(int ordinal, NvmlDevice& d) {
    if (!available()) return Status{Err::not_supported, 0, "NVML", note_};
    std::lock_guard lock(m_);
    if (dev_ != nullptr && ordinal == ordinal_) {
      d = dev_;
      return ok_status();
    }
    std::array<char, 64> bus{};
    nvmlReturn r = 1;
    if (cudaDeviceGetPCIBusId(bus.data(), static_cast<int>(bus.size()), ordinal) == cudaSuccess) r = by_bus_(bus.data(), &dev_);
    if (r != kNvmlSuccess) r = by_index_(static_cast<unsigned int>(ordinal), &dev_);
    if (r != kNvmlSuccess) return fail(r, "nvmlDeviceGetHandleBy*");
    ordinal_ = ordinal;
    d = dev_;
    return ok_status();
  }

  void* lib_ = nullptr;
  std::string note_;
  std::mutex m_;
  NvmlDevice dev_ = nullptr;
  int ordinal_ = -1;
  nvmlReturn (*init_)() = nullptr;
  nvmlReturn (*shutdown_)() = nullptr;
  nvmlReturn (*by_bus_)(const char*, NvmlDevice*) = nullptr;
  nvmlReturn (*by_index_)(unsigned int, NvmlDevice*) = nullptr;
  nvmlReturn (*memory_)(NvmlDevice, NvmlMemoryV1*) = nullptr;
  nvmlReturn (*procs_)(NvmlDevice, unsigned int*, NvmlProcessInfo*) = nullptr;
  nvmlReturn (*driver_version_)(char*, unsigned int) = nullptr;
  const char* (*error_string_)(nvmlReturn) = nullptr;
};

// ---- the runtime ------------------------------------------------------------------------------

class CudaRuntime final : public Runtime {
 public:
  std::string_view kind() const override { return "cuda"; }

  Status device_count(int& n) override { return rt_status(cudaGetDeviceCount(&n), "cudaGetDeviceCount"); }

  Status init_device(int ordinal) override {
    ordinal_ = ordinal;
    if (Status s = rt_status(cudaSetDevice(ordinal), fmt::format("cudaSetDevice({})", ordinal)); !s) return s;
    return rt_status(cudaFree(nullptr), "cudaFree(0) (context creation)");
  }

  Status device_info(DeviceInfo& out) override {
    cudaDeviceProp prop{};
    if (Status s = rt_status(cudaGetDeviceProperties(&prop, ordinal_), "cudaGetDeviceProperties"); !s) return s;
    out = DeviceInfo{};
    out.ordinal = ordinal_;
    out.name = prop.name;
    out.total = prop.totalGlobalMem;
    out.cc_major = prop.major;
    out.cc_minor = prop.minor;
    out.sm_count = prop.multiProcessorCount;
    (void)cudaDriverGetVersion(&out.driver_version);
    (void)cudaRuntimeGetVersion(&out.runtime_version);
    std::array<char, 64> bus{};
    if (cudaDeviceGetPCIBusId(bus.data(), static_cast<int>(bus.size()), ordinal_) == cudaSuccess) out.pci_bus_id = bus.data();
    int pools = 0;
    (void)cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, ordinal_);
    out.pools_supported = pools != 0;
    int vmm = 0;
    if (driver() && drv_.get_attribute != nullptr) {
      drv_.get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, ordinal_);
    }
    out.vmm_supported = vmm != 0;
    return ok_status();
  }

  Status mem_get_info(Bytes& free, Bytes& total) override {
    // The current device is per thread: the sampling thread must name ours.
    if (Status s = rt_status(cudaSetDevice(ordinal_), "cudaSetDevice"); !s) return s;
    std::size_t f = 0;
    std::size_t t = 0;
    Status s = rt_status(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
    free = f;
    total = t;
    return s;
  }
  Status device_synchronize() override { return rt_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
  Status last_error() override { return rt_status(cudaGetLastError(), "cudaGetLastError"); }

  Status malloc(DevPtr& p, Bytes n) override {
    void* v = nullptr;
    Status s = rt_status(cudaMalloc(&v, n), fmt::format("cudaMalloc({})", format_mib(n)));
    p = as_dev(v);
    return s;
  }
  Status free(DevPtr p) override { return rt_status(cudaFree(as_ptr(p)), "cudaFree"); }

  Status stream_create(Stream& s) override {
    cudaStream_t st = nullptr;
    Status r = rt_status(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    s.h = as_dev(st);
    return r;
  }
  Status stream_destroy(Stream s) override { return rt_status(cudaStreamDestroy(as_stream(s)), "cudaStreamDestroy"); }
  Status event_create(Event& e, bool timing) override {
    cudaEvent_t ev = nullptr;
    Status r = rt_status(cudaEventCreateWithFlags(&ev, timing ? cudaEventDefault : cudaEventDisableTiming),
                         "cudaEventCreateWithFlags");
    e.h = as_dev(ev);
    return r;
  }
  Status event_destroy(Event e) override { return rt_status(cudaEventDestroy(as_event(e)), "cudaEventDestroy"); }
  Status event_record(Event e, Stream s) override {
    return rt_status(cudaEventRecord(as_event(e), as_stream(s)), "cudaEventRecord");
  }
  Status stream_wait_event(Stream s, Event e) override {
    return rt_status(cudaStreamWaitEvent(as_stream(s), as_event(e), 0), "cudaStreamWaitEvent");
  }
  Status event_synchronize(Event e) override { return rt_status(cudaEventSynchronize(as_event(e)), "cudaEventSynchronize"); }
  Status event_elapsed_ms(float& ms, Event start, Event end) override {
    return rt_status(cudaEventElapsedTime(&ms, as_event(start), as_event(end)), "cudaEventElapsedTime");
  }

  Status default_pool(Pool& p) override {
    cudaMemPool_t pool = nullptr;
    Status s = rt_status(cudaDeviceGetDefaultMemPool(&pool, ordinal_), "cudaDeviceGetDefaultMemPool");
    p.h = as_dev(pool);
    return s;
  }
  Status pool_create(Pool& p) override {
    cudaMemPoolProps props;
    std::memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = ordinal_;
    props.maxSize = 0;  // the system-dependent default
    cudaMemPool_t pool = nullptr;
    Status s = rt_status(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
    p.h = as_dev(pool);
    return s;
  }
  Status pool_destroy(Pool p) override { return rt_status(cudaMemPoolDestroy(as_pool(p)), "cudaMemPoolDestroy"); }
  Status pool_get(Pool p, PoolAttr a, std::uint64_t& v) override {
    const std::string where = fmt::format("cudaMemPoolGetAttribute({})", pool_attr_name(a));
    if (is_int_attr(a)) {
      int x = 0;
      Status s = rt_status(cudaMemPoolGetAttribute(as_pool(p), *attr_of(a), &x), where);
      v = static_cast<std::uint64_t>(x);
      return s;
    }
    cuuint64_t x = 0;
    Status s = rt_status(cudaMemPoolGetAttribute(as_pool(p), *attr_of(a), &x), where);
    v = x;
    return s;
  }
  Status pool_set(Pool p, PoolAttr a, std::uint64_t v) override {
    const std::string where = fmt::format("cudaMemPoolSetAttribute({}, {})", pool_attr_name(a), v);
    if (is_int_attr(a)) {
      int x = v != 0 ? 1 : 0;
      return rt_status(cudaMemPoolSetAttribute(as_pool(p), *attr_of(a), &x), where);
    }
    cuuint64_t x = v;
    return rt_status(cudaMemPoolSetAttribute(as_pool(p), *attr_of(a), &x), where);
  }
  Status pool_trim(Pool p, Bytes keep) override {
    return rt_status(cudaMemPoolTrimTo(as_pool(p), keep), fmt::format("cudaMemPoolTrimTo({})", format_mib(keep)));
  }
  Status malloc_async(DevPtr& p, Bytes n, Pool pool, Stream s) override {
    void* v = nullptr;
    Status r = rt_status(cudaMallocFromPoolAsync(&v, n, as_pool(pool), as_stream(s)),
                         fmt::format("cudaMallocFromPoolAsync({})", format_mib(n)));
    p = as_dev(v);
    return r;
  }
  Status free_async(DevPtr p, Stream s) override {
    return rt_status(cudaFreeAsync(as_ptr(p), as_stream(s)), "cudaFreeAsync");
  }

  Status host_alloc(void*& p, Bytes n) override {
    return rt_status(cudaHostAlloc(&p, n, cudaHostAllocDefault), fmt::format("cudaHostAlloc({})", format_mib(n)));
  }
  Status host_free(void* p) override { return rt_status(cudaFreeHost(p), "cudaFreeHost"); }
  Status memcpy_h2d_async(DevPtr dst, const void* src, Bytes n, Stream s) override {
    return rt_status(cudaMemcpyAsync(as_ptr(dst), src, n, cudaMemcpyHostToDevice, as_stream(s)), "cudaMemcpyAsync(H2D)");
  }
  Status memcpy_d2h(void* dst, DevPtr src, Bytes n) override {
    return rt_status(cudaMemcpy(dst, as_ptr(src), n, cudaMemcpyDeviceToHost), "cudaMemcpy(D2H)");
  }
  Status memset_async(DevPtr p, std::uint8_t value, Bytes n, Stream s) override {
    return rt_status(cudaMemsetAsync(as_ptr(p), value, n, as_stream(s)), "cudaMemsetAsync");
  }

  // ---- VMM through the driver's entry points ----
  Status vmm_granularity(Bytes& g, bool recommended) override {
    if (Status s = need_driver("cuMemGetAllocationGranularity"); !s) return s;
    CUmemAllocationProp prop = device_prop();
    std::size_t x = 0;
    Status s = cu(drv_.granularity(&x, &prop, recommended ? CU_MEM_ALLOC_GRANULARITY_RECOMMENDED : CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                  "cuMemGetAllocationGranularity");
    g = x;
    return s;
  }
  Status vmm_create(MemHandle& h, Bytes n) override {
    if (Status s = need_driver("cuMemCreate"); !s) return s;
    CUmemAllocationProp prop = device_prop();
    CUmemGenericAllocationHandle handle = 0;
    Status s = cu(drv_.create(&handle, n, &prop, 0), fmt::format("cuMemCreate({})", format_mib(n)));
    h.h = handle;
    return s;
  }
  Status vmm_release(MemHandle h) override {
    if (Status s = need_driver("cuMemRelease"); !s) return s;
    return cu(drv_.release(h.h), "cuMemRelease");
  }
  Status vmm_reserve(DevPtr& p, Bytes n, Bytes align) override {
    if (Status s = need_driver("cuMemAddressReserve"); !s) return s;
    CUdeviceptr ptr = 0;
    Status s = cu(drv_.reserve(&ptr, n, align, 0, 0), fmt::format("cuMemAddressReserve({})", format_mib(n)));
    p = ptr;
    return s;
  }
  Status vmm_free_range(DevPtr p, Bytes n) override {
    if (Status s = need_driver("cuMemAddressFree"); !s) return s;
    return cu(drv_.address_free(p, n), "cuMemAddressFree");
  }
  Status vmm_map(DevPtr p, Bytes n, MemHandle h) override {
    if (Status s = need_driver("cuMemMap"); !s) return s;
    return cu(drv_.map(p, n, 0, h.h, 0), "cuMemMap");
  }
  Status vmm_set_access(DevPtr p, Bytes n) override {
    if (Status s = need_driver("cuMemSetAccess"); !s) return s;
    CUmemAccessDesc desc;
    std::memset(&desc, 0, sizeof desc);
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = ordinal_;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return cu(drv_.set_access(p, n, &desc, 1), "cuMemSetAccess");
  }
  Status vmm_unmap(DevPtr p, Bytes n) override {
    if (Status s = need_driver("cuMemUnmap"); !s) return s;
    return cu(drv_.unmap(p, n), "cuMemUnmap");
  }

  // ---- kernels ----
  Status upcast(DevPtr src, Dtype from, DevPtr dst, Dtype to, std::uint64_t n, float scale, Stream s) override {
    const std::string where = fmt::format("launch_upcast({} -> {}, {} elements)", dtype_name(from), dtype_name(to), n);
    return launch(where, [&] { return kernels::launch_upcast(as_ptr(src), from, as_ptr(dst), to, n, scale, as_stream(s)); });
  }
  Status dequant(DevPtr src, Dtype type, DevPtr dst, Dtype to, std::uint64_t n, Stream s) override {
    const std::string where = fmt::format("launch_dequant({} -> {}, {} elements)", dtype_name(type), dtype_name(to), n);
    return launch(where, [&] { return kernels::launch_dequant(as_ptr(src), type, as_ptr(dst), to, n, as_stream(s)); });
  }
  Status touch(DevPtr dst, Bytes n, std::uint8_t value, Stream s) override {
    return launch("launch_touch", [&] { return kernels::launch_touch(as_ptr(dst), n, value, as_stream(s)); });
  }
  Status copy_kernel(DevPtr dst, DevPtr src, Bytes n, Stream s) override {
    return launch("launch_copy", [&] { return kernels::launch_copy(as_ptr(dst), as_ptr(src), n, as_stream(s)); });
  }
  Status copy_d2d(DevPtr dst, DevPtr src, Bytes n, Stream s) override {
    return launch("copy_d2d", [&] { return kernels::copy_d2d(as_ptr(dst), as_ptr(src), n, as_stream(s)); });
  }

  bool nvml_available() const override { return nvml_.available(); }
  std::string nvml_note() const override { return nvml_.note(); }
  Status nvml_memory(NvmlMemory& out) override { return nvml_.memory(ordinal_, out); }
  Status nvml_processes(NvmlProcesses& out) override { return nvml_.processes(ordinal_, out); }

 private:
  struct Driver {
    PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
    PFN_cuMemCreate_v10020 create = nullptr;
    PFN_cuMemRelease_v10020 release = nullptr;
    PFN_cuMemAddressReserve_v10020 reserve = nullptr;
    PFN_cuMemAddressFree_v10020 address_free = nullptr;
    PFN_cuMemMap_v10020 map = nullptr;
    PFN_cuMemSetAccess_v10020 set_access = nullptr;
    PFN_cuMemUnmap_v10020 unmap = nullptr;
    PFN_cuDeviceGetAttribute_v2000 get_attribute = nullptr;
    PFN_cuGetErrorString_v6000 error_string = nullptr;
  };

  template <class F>
  static bool entry(F& f, const char* symbol, unsigned int version) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion(symbol, &p, version, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      return false;
    }
    f = reinterpret_cast<F>(p);
    return true;
  }

  // Resolves the driver calls once (after the runtime is initialized).
  bool driver() {
    std::call_once(driver_once_, [this] {
      driver_ok_ = entry(drv_.granularity, "cuMemGetAllocationGranularity", 10020) &&
                   entry(drv_.create, "cuMemCreate", 10020) && entry(drv_.release, "cuMemRelease", 10020) &&
                   entry(drv_.reserve, "cuMemAddressReserve", 10020) &&
                   entry(drv_.address_free, "cuMemAddressFree", 10020) && entry(drv_.map, "cuMemMap", 10020) &&
                   entry(drv_.set_access, "cuMemSetAccess", 10020) && entry(drv_.unmap, "cuMemUnmap", 10020);
      (void)entry(drv_.get_attribute, "cuDeviceGetAttribute", 2000);
      (void)entry(drv_.error_string, "cuGetErrorString", 6000);
    });
    return driver_ok_;
  }
  Status need_driver(const char* what) {
    if (driver()) return ok_status();
    return Status{Err::not_supported, 0, what, "the driver's VMM entry points could not be resolved"};
  }
  Status cu(CUresult r, std::string where) {
    if (r == CUDA_SUCCESS) return ok_status();
    const char* msg = nullptr;
    if (drv_.error_string != nullptr) drv_.error_string(r, &msg);
    return Status{classify(r), static_cast<int>(r), std::move(where), msg ? msg : "driver error"};
  }
  CUmemAllocationProp device_prop() const {
    CUmemAllocationProp prop;
    std::memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal_;
    return prop;
  }
  // A kernel launch: bad arguments are the launcher's InputError, launch failures its cudaError_t.
  template <class F>
  Status launch(const std::string& where, F&& f) {
    try {
      return rt_status(f(), where);
    } catch (const InputError& e) {
      return Status{Err::invalid, 0, where, e.what()};
    }
  }

  int ordinal_ = 0;
  Nvml nvml_;
  Driver drv_;
  std::once_flag driver_once_;
  bool driver_ok_ = false;
};

}  // namespace

bool cuda_usable(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return true;
  if (why != nullptr) {
    *why = e != cudaSuccess ? fmt::format("no usable GPU: cudaGetDeviceCount failed: {} (code {})", cudaGetErrorString(e),
                                          static_cast<int>(e))
                            : std::string("no usable GPU: cudaGetDeviceCount found no device");
  }
  return false;
}

std::unique_ptr<Runtime> open_cuda_runtime() {
  std::string why;
  if (!cuda_usable(&why)) throw InfraError(fmt::format("cuda backend: {}; use --backend sim", why));
  return std::make_unique<CudaRuntime>();
}

}  // namespace vf::cuda
