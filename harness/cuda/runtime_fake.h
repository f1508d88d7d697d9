// A CPU fake of the CUDA runtime, built on the simulator so that whatever runs on it behaves the
// way the `sim` backend says a GPU would:
//   - device memory is a SimDevice (cudaMalloc charged in 2 MiB pages, small buffers packed;
//     VMM pages charged exactly), with the context cost charged when the context is created and a
//     module cost at the first kernel launch (lazy loading);
//   - every memory pool (the default one and cudaMemPoolCreate'd ones) is the async pool model
//     (harness/sim/async_pool.h) on that device; attributes, event edges, synchronize and trim are
//     forwarded to it;
//   - kernels, copies and memsets do nothing unless the destination is "backed": allocations up to
//     `backing_limit` bytes get host memory, and then copies, memsets and the kernels (the host
//     reference, kernels/reference.h) really run, so gpu-check's correctness code is exercised;
//   - a virtual clock advances by bytes / bandwidth per operation, for event timing;
//   - faults can be injected: OOM at the Nth allocation, a sticky illegal address (or an abort)
//     at the Nth kernel launch, a leak on every pool trim.
// Thread-safe (one mutex): the backend's sampling thread calls mem_get_info concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "harness/cuda/runtime.h"
#include "harness/sim/async_pool.h"
#include "harness/sim/device.h"

namespace vf::cuda {

struct FakeConfig {
  int device_count = 1;
  std::string name = "vramfuzz fake GPU (sim-backed)";
  Bytes total = 141 * GiB;
  Bytes used_by_others = 0;
  Bytes context_cost = 512 * MiB;  // charged by init_device (the primary context)
  Bytes module_cost = 2 * MiB;     // charged at the first kernel launch (lazy module loading)
  Bytes vmm_granularity = 2 * MiB;
  bool nvml = true;
  // Faults, counted from the first begin_case() (the first op of the first case), 0 = off.
  std::uint64_t oom_at_alloc = 0;      // the Nth device allocation (malloc, mallocAsync, cuMemCreate) fails
  std::uint64_t sticky_at_launch = 0;  // the Nth kernel launch hits an illegal address (sticky)
  std::uint64_t abort_at_launch = 0;   // the Nth kernel launch aborts the process (a crashing child)
  Bytes leak_on_trim = 0;              // every cudaMemPoolTrimTo leaks this much device memory
  // Not counted from a case (the device layer and the ballast run outside cases too):
  std::uint64_t set_access_fault = 0;  // the Nth cuMemSetAccess fails (invalid value, not sticky)
  Bytes malloc_overcharge = 0;         // every cudaMalloc charges this much more than it was asked
  // Allocations up to `backing_limit` bytes get host memory behind them (0: none), as long as
  // all backed allocations together stay under `backing_budget`.
  Bytes backing_limit = 0;
  Bytes backing_budget = 256 * MiB;
  // The virtual clock (GB/s = 1e9 bytes per second).
  double d2d_gbps = 3000;
  double h2d_gbps = 50;
  double kernel_gbps = 2600;
  double launch_us = 3;
};

// "fake", "fake:sticky_launch=3,leak_on_trim=4MiB,total=80GiB". Keys: total, others, context,
// module, oom_alloc, sticky_launch, abort_launch, leak_on_trim, set_access_fault, overcharge,
// backing, nvml (0/1), devices. Throws InputError(what) on a bad key or value.
FakeConfig parse_fake_spec(std::string_view spec, std::string_view what);
bool is_fake_spec(std::string_view name);

// What the fake saw, for tests.
struct FakeCounters {
  std::uint64_t mallocs = 0;
  std::uint64_t frees = 0;
  std::uint64_t async_mallocs = 0;
  std::uint64_t async_frees = 0;
  std::uint64_t vmm_creates = 0;
  std::uint64_t vmm_releases = 0;
  std::uint64_t h2d_copies = 0;
  std::uint64_t d2h_copies = 0;
  std::uint64_t d2d_copies = 0;
  std::uint64_t memsets = 0;
  std::uint64_t launches = 0;
  std::uint64_t host_allocs = 0;
  std::uint64_t host_frees = 0;
  std::uint64_t pools_created = 0;
  std::uint64_t pools_destroyed = 0;
  std::uint64_t syncs = 0;
  std::uint64_t trims = 0;
  std::uint64_t cases = 0;
  Bytes leaked = 0;  // by leak_on_trim and by destroyed pools that still held memory
};

class FakeRuntime final : public Runtime {
 public:
  explicit FakeRuntime(FakeConfig cfg = {});
  ~FakeRuntime() override;
  FakeRuntime(const FakeRuntime&) = delete;
  FakeRuntime& operator=(const FakeRuntime&) = delete;

  std::string_view kind() const override { return "fake"; }
  Status device_count(int& n) override;
  Status init_device(int ordinal) override;
  Status device_info(DeviceInfo& out) override;
  Status mem_get_info(Bytes& free, Bytes& total) override;
  Status device_synchronize() override;
  Status last_error() override;

  Status malloc(DevPtr& p, Bytes n) override;
  Status free(DevPtr p) override;

  Status stream_create(Stream& s) override;
  Status stream_destroy(Stream s) override;
  Status event_create(Event& e, bool timing) override;
  Status event_destroy(Event e) override;
  Status event_record(Event e, Stream s) override;
  Status stream_wait_event(Stream s, Event e) override;
  Status event_synchronize(Event e) override;
  Status event_elapsed_ms(float& ms, Event start, Event end) override;

  Status default_pool(Pool& p) override;
  Status pool_create(Pool& p) override;
  Status pool_destroy(Pool p) override;
  Status pool_get(Pool p, PoolAttr a, std::uint64_t& v) override;
  Status pool_set(Pool p, PoolAttr a, std::uint64_t v) override;
  Status pool_trim(Pool p, Bytes keep) override;
  Status malloc_async(DevPtr& p, Bytes n, Pool pool, Stream s) override;
  Status free_async(DevPtr p, Stream s) override;

  Status host_alloc(void*& p, Bytes n) override;
  Status host_free(void* p) override;
  Status memcpy_h2d_async(DevPtr dst, const void* src, Bytes n, Stream s) override;
  Status memcpy_d2h(void* dst, DevPtr src, Bytes n) override;
  Status memset_async(DevPtr p, std::uint8_t value, Bytes n, Stream s) override;

  Status vmm_granularity(Bytes& g, bool recommended) override;
  Status vmm_create(MemHandle& h, Bytes n) override;
  Status vmm_release(MemHandle h) override;
  Status vmm_reserve(DevPtr& p, Bytes n, Bytes align) override;
  Status vmm_free_range(DevPtr p, Bytes n) override;
  Status vmm_map(DevPtr p, Bytes n, MemHandle h) override;
  Status vmm_set_access(DevPtr p, Bytes n) override;
  Status vmm_unmap(DevPtr p, Bytes n) override;

  Status upcast(DevPtr src, Dtype from, DevPtr dst, Dtype to, std::uint64_t n, float scale, Stream s) override;
  Status dequant(DevPtr src, Dtype type, DevPtr dst, Dtype to, std::uint64_t n, Stream s) override;
  Status touch(DevPtr dst, Bytes n, std::uint8_t value, Stream s) override;
  Status copy_kernel(DevPtr dst, DevPtr src, Bytes n, Stream s) override;
  Status copy_d2d(DevPtr dst, DevPtr src, Bytes n, Stream s) override;

  bool nvml_available() const override { return cfg_.nvml; }
  std::string nvml_note() const override;
  Status nvml_memory(NvmlMemory& out) override;
  Status nvml_processes(NvmlProcesses& out) override;

  void begin_case(const ModelHints& hints) override;

  // ---- for tests ----
  FakeCounters counters() const;
  // The Nth device allocation / kernel launch from now fails (OOM / sticky illegal address).
  void arm_oom(std::uint64_t nth);
  void arm_sticky(std::uint64_t nth);
  void set_leak_on_trim(Bytes b);
  Bytes charged() const;  // physical bytes held by this process (context included)
  const FakeConfig& config() const { return cfg_; }

 private:
  struct PoolState {
    std::unique_ptr<sim::AsyncPoolAllocator> model;
    std::uint64_t release_threshold = 0;  // CUDA's default
    bool follow = true;
    bool opportunistic = true;
    bool internal = true;
    Bytes reserved_high = 0;
    Bytes used_high = 0;
    std::vector<sim::BlockKey> spare_keys;
    sim::BlockKey next_key = 0;
  };
  struct AsyncAlloc {
    std::uint64_t pool = 0;
    sim::BlockKey key = 0;
  };
  struct VmmHandle {
    Bytes bytes = 0;
    std::uint32_t mappings = 0;
    bool released = false;
  };
  struct Mapping {
    Bytes bytes = 0;
    std::uint64_t handle = 0;
    bool access = false;
  };
  struct Backing {
    std::vector<std::byte> bytes;
  };

  Status fail(Err e, int code, std::string where, std::string message);
  Status check_alive(std::string_view where);  // the sticky error, once there is one
  bool whole_mappings(DevPtr p, Bytes n) const;  // callers hold m_
  bool alloc_fault();                          // counts an allocation; true: fail it with OOM
  Status launch(std::string_view what, Bytes bytes_moved);
  void ensure_context();
  PoolState* pool_of(Pool p);
  void update_highs(PoolState& ps);
  void ensure_hints_pool(PoolState& ps);
  std::byte* backed(DevPtr p, Bytes n);  // host memory behind [p, p + n), or null
  void add_backing(DevPtr p, Bytes n);
  void drop_backing(DevPtr p);
  void advance(double bytes, double gbps);

  FakeConfig cfg_;
  mutable std::mutex m_;
  sim::SimDevice dev_;
  bool context_ = false;
  bool modules_loaded_ = false;
  std::optional<Status> sticky_;
  std::optional<Status> pending_;  // the non-sticky error cudaGetLastError would return
  ModelHints hints_;
  bool armed_ = false;  // spec faults start counting at the first begin_case
  std::uint64_t allocs_ = 0;
  std::uint64_t launches_ = 0;
  std::uint64_t oom_at_ = 0;     // absolute allocation number that fails (0: none)
  std::uint64_t sticky_at_ = 0;  // absolute launch number
  std::uint64_t abort_at_ = 0;
  std::map<DevPtr, sim::DeviceAlloc> raw_;
  std::map<DevPtr, sim::DeviceAlloc> overcharged_;  // malloc_overcharge's hidden part, per pointer
  std::uint64_t set_access_calls_ = 0;
  std::map<std::uint64_t, PoolState> pools_;
  std::uint64_t next_pool_ = 1;
  std::map<DevPtr, AsyncAlloc> async_;
  std::map<std::uint64_t, VmmHandle> handles_;
  std::uint64_t next_handle_ = 1;
  std::map<DevPtr, Bytes> ranges_;
  std::map<DevPtr, Mapping> mappings_;
  std::map<DevPtr, Backing> backing_;
  Bytes backed_bytes_ = 0;
  std::vector<bool> streams_;  // index = handle; true = live (0 = the legacy stream)
  std::map<std::uint64_t, std::pair<std::uint64_t, double>> events_;  // handle -> (stream, clock)
  std::uint64_t next_event_ = 1;
  double clock_us_ = 0;
  FakeCounters counters_;
};

}  // namespace vf::cuda
