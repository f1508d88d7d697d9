#include "harness/cuda/runtime_fake.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <span>

#include <fmt/format.h>

#include "harness/core/error.h"
#include "kernels/reference.h"

namespace vf::cuda {

namespace {

// The fake's error codes are the CUDA runtime's, so messages read the same on both.
constexpr int kCodeInvalid = 1;         // cudaErrorInvalidValue
constexpr int kCodeOom = 2;             // cudaErrorMemoryAllocation
constexpr int kCodeNoDevice = 100;      // cudaErrorNoDevice
constexpr int kCodeIllegal = 700;       // cudaErrorIllegalAddress
constexpr int kCodeNotSupported = 801;  // cudaErrorNotSupported
// The sim's async pool tracks event edges for this many stream ids.
constexpr std::uint64_t kMaxStreams = sim::kMaxAsyncStreams;

DeviceSpec fake_spec(const FakeConfig& c) {
  DeviceSpec s;
  s.name = c.name;
  s.total = c.total;
  s.used_by_others = c.used_by_others;
  s.context_overhead = 0;  // charged by init_device instead, so free memory drops when it happens
  return s;
}

std::uint64_t parse_count(std::string_view v, const std::string& field) {
  std::uint64_t n = 0;
  if (v.empty()) throw InputError(field, "expected a number");
  for (char ch : v) {
    if (ch < '0' || ch > '9' || n > (~std::uint64_t{0} - 9) / 10) throw InputError(field, fmt::format("not a count: \"{}\"", v));
    n = n * 10 + static_cast<std::uint64_t>(ch - '0');
  }
  return n;
}

}  // namespace

bool is_fake_spec(std::string_view name) { return name == "fake" || name.starts_with("fake:"); }

FakeConfig parse_fake_spec(std::string_view spec, std::string_view what) {
  FakeConfig c;
  if (!is_fake_spec(spec)) throw InputError(std::string(what), fmt::format("not a fake runtime spec: \"{}\"", spec));
  std::string_view rest = spec.size() > 4 ? spec.substr(5) : std::string_view{};
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view kv = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const std::size_t eq = kv.find('=');
    if (eq == std::string_view::npos) throw InputError(std::string(what), fmt::format("expected key=value, got \"{}\"", kv));
    const std::string_view key = kv.substr(0, eq);
    const std::string_view v = kv.substr(eq + 1);
    const std::string field = fmt::format("{}.{}", what, key);
    if (key == "total") c.total = parse_size(v, field);
    else if (key == "others") c.used_by_others = parse_size(v, field);
    else if (key == "context") c.context_cost = parse_size(v, field);
    else if (key == "module") c.module_cost = parse_size(v, field);
    else if (key == "oom_alloc") c.oom_at_alloc = parse_count(v, field);
    else if (key == "sticky_launch") c.sticky_at_launch = parse_count(v, field);
    else if (key == "abort_launch") c.abort_at_launch = parse_count(v, field);
    else if (key == "leak_on_trim") c.leak_on_trim = parse_size(v, field);
    else if (key == "set_access_fault") c.set_access_fault = parse_count(v, field);
    else if (key == "overcharge") c.malloc_overcharge = parse_size(v, field);
    else if (key == "backing") c.backing_limit = parse_size(v, field);
    else if (key == "nvml") c.nvml = parse_count(v, field) != 0;
    else if (key == "devices") c.device_count = static_cast<int>(std::min<std::uint64_t>(parse_count(v, field), 16));
    else {
      throw InputError(field, "unknown key (known: total, others, context, module, oom_alloc, sticky_launch, "
                              "abort_launch, leak_on_trim, set_access_fault, overcharge, backing, nvml, devices)");
    }
  }
  if (c.total < GiB) throw InputError(fmt::format("{}.total", what), "a fake device needs at least 1 GiB");
  return c;
}

FakeRuntime::FakeRuntime(FakeConfig cfg) : cfg_(std::move(cfg)), dev_(fake_spec(cfg_)) {
  streams_.push_back(true);  // handle 0: the legacy default stream
}

FakeRuntime::~FakeRuntime() = default;

// ---- errors and faults ------------------------------------------------------------------------

Status FakeRuntime::fail(Err e, int code, std::string where, std::string message) {
  Status s{e, code, std::move(where), std::move(message)};
  if (e == Err::sticky) {
    sticky_ = s;
  } else {
    pending_ = s;
  }
  return s;
}

Status FakeRuntime::check_alive(std::string_view where) {
  if (!sticky_) return ok_status();
  Status s = *sticky_;
  s.where = std::string(where);
  return s;
}

bool FakeRuntime::alloc_fault() {
  ++allocs_;
  if (oom_at_ != 0 && allocs_ == oom_at_) {
    oom_at_ = 0;
    return true;
  }
  return false;
}

void FakeRuntime::advance(double bytes, double gbps) { clock_us_ += bytes / (gbps * 1e3); }

Status FakeRuntime::launch(std::string_view what, Bytes bytes_moved) {
  if (Status s = check_alive(what); !s) return s;
  ensure_context();
  ++launches_;
  ++counters_.launches;
  if (!modules_loaded_) {
    modules_loaded_ = true;
    (void)dev_.map(cfg_.module_cost);  // the kernels' module, loaded at the first launch
  }
  if (abort_at_ != 0 && launches_ == abort_at_) std::abort();  // injected: a crashing child
  if (sticky_at_ != 0 && launches_ == sticky_at_) {
    sticky_at_ = 0;
    return fail(Err::sticky, kCodeIllegal, std::string(what), "an illegal memory access was encountered (injected)");
  }
  clock_us_ += cfg_.launch_us;
  advance(static_cast<double>(bytes_moved), cfg_.kernel_gbps);
  return ok_status();
}

void FakeRuntime::ensure_context() {
  if (context_) return;
  context_ = true;
  (void)dev_.map(cfg_.context_cost);
  pools_[next_pool_++] = PoolState{};  // handle 1: the device's default pool
}

std::byte* FakeRuntime::backed(DevPtr p, Bytes n) {
  auto it = backing_.upper_bound(p);
  if (it == backing_.begin()) return nullptr;
  --it;
  const DevPtr base = it->first;
  if (p + n > base + it->second.bytes.size()) return nullptr;
  return it->second.bytes.data() + (p - base);
}

void FakeRuntime::add_backing(DevPtr p, Bytes n) {
  if (n == 0 || n > cfg_.backing_limit || backed_bytes_ + n > cfg_.backing_budget) return;
  backing_[p].bytes.assign(n, std::byte{0xa5});  // not zero: a kernel that skips elements shows
  backed_bytes_ += n;
}

void FakeRuntime::drop_backing(DevPtr p) {
  const auto it = backing_.find(p);
  if (it == backing_.end()) return;
  backed_bytes_ -= it->second.bytes.size();
  backing_.erase(it);
}

// ---- device -----------------------------------------------------------------------------------

Status FakeRuntime::device_count(int& n) {
  std::lock_guard lock(m_);
  n = cfg_.device_count;
  if (n == 0) return fail(Err::no_device, kCodeNoDevice, "cudaGetDeviceCount", "no CUDA-capable device is detected (fake)");
  return ok_status();
}

Status FakeRuntime::init_device(int ordinal) {
  std::lock_guard lock(m_);
  if (Status s = check_alive("cudaSetDevice"); !s) return s;
  if (ordinal < 0 || ordinal >= cfg_.device_count) {
    return fail(Err::no_device, kCodeNoDevice, fmt::format("cudaSetDevice({})", ordinal), "no such device (fake)");
  }
  ensure_context();
  return ok_status();
}

Status FakeRuntime::device_info(DeviceInfo& out) {
  std::lock_guard lock(m_);
  out = DeviceInfo{};
  out.name = cfg_.name;
  out.total = cfg_.total;
  out.cc_major = 9;
  out.cc_minor = 0;
  out.sm_count = 132;
  out.driver_version = 13000;
  out.runtime_version = 13000;
  out.pci_bus_id = "00000000:00:00.0";
  out.vmm_supported = true;
  out.pools_supported = true;
  return ok_status();
}

Status FakeRuntime::mem_get_info(Bytes& free, Bytes& total) {
  std::lock_guard lock(m_);
  if (Status s = check_alive("cudaMemGetInfo"); !s) return s;
  ensure_context();  // as cudaMemGetInfo, it creates the context
  free = dev_.free();
  total = cfg_.total;
  return ok_status();
}

Status FakeRuntime::device_synchronize() {
  std::lock_guard lock(m_);
  if (Status s = check_alive("cudaDeviceSynchronize"); !s) return s;
  ++counters_.syncs;
  for (auto& [h, ps] : pools_) {
    if (!ps.model) continue;
    ps.model->synchronize();
    update_highs(ps);
  }
  return ok_status();
}

Status FakeRuntime::last_error() {
  std::lock_guard lock(m_);
  if (sticky_) return *sticky_;
  if (!pending_) return ok_status();
  Status s = *pending_;
  pending_.reset();
  return s;
}

// ---- cudaMalloc -------------------------------------------------------------------------------

Status FakeRuntime::malloc(DevPtr& p, Bytes n) {
  std::lock_guard lock(m_);
  const std::string where = fmt::format("cudaMalloc({})", format_mib(n));
  if (Status s = check_alive(where); !s) return s;
  ensure_context();
  ++counters_.mallocs;
  if (alloc_fault()) return fail(Err::out_of_memory, kCodeOom, where, "out of memory (injected)");
  const auto a = dev_.cuda_malloc(n);
  if (!a) return fail(Err::out_of_memory, kCodeOom, where, "out of memory");
  if (cfg_.malloc_overcharge > 0) {
    const auto extra = dev_.cuda_malloc(cfg_.malloc_overcharge);
    if (!extra) {
      dev_.cuda_free(*a);
      return fail(Err::out_of_memory, kCodeOom, where, "out of memory");
    }
    overcharged_[a->addr] = *extra;
  }
  p = a->addr;
  raw_[p] = *a;
  add_backing(p, n);
  return ok_status();
}

Status FakeRuntime::free(DevPtr p) {
  std::lock_guard lock(m_);
  if (Status s = check_alive("cudaFree"); !s) return s;
  if (p == 0) return ok_status();
  const auto it = raw_.find(p);
  if (it == raw_.end()) return fail(Err::invalid, kCodeInvalid, "cudaFree", fmt::format("{:#x} is not a cudaMalloc pointer", p));
  dev_.cuda_free(it->second);
  raw_.erase(it);
  if (const auto extra = overcharged_.find(p); extra != overcharged_.end()) {
    dev_.cuda_free(extra->second);
    overcharged_.erase(extra);
  }
  drop_backing(p);
  ++counters_.frees;
  return ok_status();
}

// ---- streams and events -------------------------------------------------------------------------

Status FakeRuntime::stream_create(Stream& s) {
  std::lock_guard lock(m_);
  if (Status st = check_alive("cudaStreamCreate"); !st) return st;
  for (std::size_t i = 1; i < streams_.size(); ++i) {
    if (!streams_[i]) {
      streams_[i] = true;
      s.h = i;
      return ok_status();
    }
  }
  if (streams_.size() >= kMaxStreams) return fail(Err::other, kCodeInvalid, "cudaStreamCreate", "too many streams (fake)");
  streams_.push_back(true);
  s.h = streams_.size() - 1;
  return ok_status();
}

Status FakeRuntime::stream_destroy(Stream s) {
  std::lock_guard lock(m_);
  if (s.h == 0 || s.h >= streams_.size() || !streams_[s.h]) return fail(Err::invalid, kCodeInvalid, "cudaStreamDestroy", "unknown stream");
  streams_[s.h] = false;
  return ok_status();
}

Status FakeRuntime::event_create(Event& e, bool) {
  std::lock_guard lock(m_);
  if (Status st = check_alive("cudaEventCreate"); !st) return st;
  e.h = next_event_++;
  events_[e.h] = {0, -1.0};  // never recorded
  return ok_status();
}

Status FakeRuntime::event_destroy(Event e) {
  std::lock_guard lock(m_);
  if (events_.erase(e.h) == 0) return fail(Err::invalid, kCodeInvalid, "cudaEventDestroy", "unknown event");
  return ok_status();
}

Status FakeRuntime::event_record(Event e, Stream s) {
  std::lock_guard lock(m_);
  if (Status st = check_alive("cudaEventRecord"); !st) return st;
  const auto it = events_.find(e.h);
  if (it == events_.end()) return fail(Err::invalid, kCodeInvalid, "cudaEventRecord", "unknown event");
  it->second = {s.h, clock_us_};
  return ok_status();
}

Status FakeRuntime::stream_wait_event(Stream s, Event e) {
  std::lock_guard lock(m_);
  if (Status st = check_alive("cudaStreamWaitEvent"); !st) return st;
  const auto it = events_.find(e.h);
  if (it == events_.end()) return fail(Err::invalid, kCodeInvalid, "cudaStreamWaitEvent", "unknown event");
  if (it->second.second < 0) return ok_status();  // waiting on a never-recorded event is a no-op
  // The event edge, as every pool's ReuseFollowEventDependencies sees it.
  for (auto& [h, ps] : pools_) {
    if (ps.model) ps.model->stream_wait(static_cast<sim::StreamId>(s.h), static_cast<sim::StreamId>(it->second.first));
  }
  return ok_status();
}

Status FakeRuntime::event_synchronize(Event e) {
  std::lock_guard lock(m_);
  if (Status st = check_alive("cudaEventSynchronize"); !st) return st;
  if (events_.count(e.h) == 0) return fail(Err::invalid, kCodeInvalid, "cudaEventSynchronize", "unknown event");
  return ok_status();
}

Status FakeRuntime::event_elapsed_ms(float& ms, Event start, Event end) {
  std::lock_guard lock(m_);
  const auto a = events_.find(start.h);
  const auto b = events_.find(end.h);
  if (a == events_.end() || b == events_.end() || a->second.second < 0 || b->second.second < 0) {
    return fail(Err::invalid, kCodeInvalid, "cudaEventElapsedTime", "event not recorded");
  }
  ms = static_cast<float>((b->second.second - a->second.second) / 1000.0);
  return ok_status();
}

// ---- pools ------------------------------------------------------------------------------------

FakeRuntime::PoolState* FakeRuntime::pool_of(Pool p) {
  const auto it = pools_.find(p.h);
  return it == pools_.end() ? nullptr : &it->second;
}

void FakeRuntime::update_highs(PoolState& ps) {
  if (!ps.model) return;
  ps.reserved_high = std::max(ps.reserved_high, ps.model->stats().reserved.current);
  ps.used_high = std::max(ps.used_high, ps.model->stats().allocated.current);
}

// The pool model is built at the pool's first allocation, with the hints of the case running
// then (a real pool's behaviour is fixed by the driver; the model's needs the scenario's knobs).
void FakeRuntime::ensure_hints_pool(PoolState& ps) {
  if (ps.model) return;
  sim::AsyncOptions o;
  o.release_threshold = ps.release_threshold;
  o.pool_granularity = hints_.pool_granularity;
  o.reuse_follow_event_dependencies = ps.follow;
  o.reuse_allow_opportunistic = ps.opportunistic;
  o.reuse_allow_internal_dependencies = ps.internal;
  o.opportunistic_probability = hints_.opportunistic_probability;
  ps.model = std::make_unique<sim::AsyncPoolAllocator>(dev_, o, hints_.seed);
}

Status FakeRuntime::default_pool(Pool& p) {
  std::lock_guard lock(m_);
  if (Status st = check_alive("cudaDeviceGetDefaultMemPool"); !st) return st;
  ensure_context();
  p.h = 1;
  return ok_status();
}

Status FakeRuntime::pool_create(Pool& p) {
  std::lock_guard lock(m_);
  if (Status st = check_alive("cudaMemPoolCreate"); !st) return st;
  ensure_context();
  p.h = next_pool_++;
  pools_[p.h] = PoolState{};
  ++counters_.pools_created;
  return ok_status();
}

Status FakeRuntime::pool_destroy(Pool p) {
  std::lock_guard lock(m_);
  if (Status st = check_alive("cudaMemPoolDestroy"); !st) return st;
  PoolState* ps = pool_of(p);
  if (ps == nullptr || p.h == 1) return fail(Err::invalid, kCodeInvalid, "cudaMemPoolDestroy", "unknown pool (or the default pool)");
  if (ps->model) {
    // Whatever is still allocated from the pool outlives it: in the fake that memory is lost.
    ps->model->synchronize();
    ps->model->trim_to(0);
    counters_.leaked += ps->model->stats().reserved.current;
  }
  for (auto it = async_.begin(); it != async_.end();) {
    if (it->second.pool == p.h) {
      drop_backing(it->first);
      it = async_.erase(it);
    } else {
      ++it;
    }
  }
  pools_.erase(p.h);
  ++counters_.pools_destroyed;
  return ok_status();
}

Status FakeRuntime::pool_get(Pool p, PoolAttr a, std::uint64_t& v) {
  std::lock_guard lock(m_);
  const std::string where = fmt::format("cudaMemPoolGetAttribute({})", pool_attr_name(a));
  if (Status st = check_alive(where); !st) return st;
  PoolState* ps = pool_of(p);
  if (ps == nullptr) return fail(Err::invalid, kCodeInvalid, where, "unknown pool");
  const sim::AllocStats* st = ps->model ? &ps->model->stats() : nullptr;
  switch (a) {
    case PoolAttr::release_threshold: v = ps->release_threshold; break;
    case PoolAttr::reuse_follow_event_dependencies: v = ps->follow; break;
    case PoolAttr::reuse_allow_opportunistic: v = ps->opportunistic; break;
    case PoolAttr::reuse_allow_internal_dependencies: v = ps->internal; break;
    case PoolAttr::reserved_current: v = st ? st->reserved.current : 0; break;
    case PoolAttr::reserved_high: v = ps->reserved_high; break;
    case PoolAttr::used_current: v = st ? st->allocated.current : 0; break;
    case PoolAttr::used_high: v = ps->used_high; break;
  }
  return ok_status();
}

Status FakeRuntime::pool_set(Pool p, PoolAttr a, std::uint64_t v) {
  std::lock_guard lock(m_);
  const std::string where = fmt::format("cudaMemPoolSetAttribute({}, {})", pool_attr_name(a), v);
  if (Status st = check_alive(where); !st) return st;
  PoolState* ps = pool_of(p);
  if (ps == nullptr) return fail(Err::invalid, kCodeInvalid, where, "unknown pool");
  switch (a) {
    case PoolAttr::release_threshold:
      ps->release_threshold = v;
      if (ps->model) ps->model->set_release_threshold(v);
      return ok_status();
    case PoolAttr::reuse_follow_event_dependencies: ps->follow = v != 0; break;
    case PoolAttr::reuse_allow_opportunistic: ps->opportunistic = v != 0; break;
    case PoolAttr::reuse_allow_internal_dependencies: ps->internal = v != 0; break;
    case PoolAttr::reserved_high:
    case PoolAttr::used_high: {
      if (v != 0) return fail(Err::invalid, kCodeInvalid, where, "a high watermark can only be reset with 0");
      const sim::AllocStats* st = ps->model ? &ps->model->stats() : nullptr;
      if (a == PoolAttr::reserved_high) ps->reserved_high = st ? st->reserved.current : 0;
      else ps->used_high = st ? st->allocated.current : 0;
      return ok_status();
    }
    case PoolAttr::reserved_current:
    case PoolAttr::used_current: return fail(Err::invalid, kCodeInvalid, where, "read-only attribute");
  }
  if (ps->model) ps->model->set_reuse_policy(ps->follow, ps->opportunistic, ps->internal);
  return ok_status();
}

Status FakeRuntime::pool_trim(Pool p, Bytes keep) {
  std::lock_guard lock(m_);
  if (Status st = check_alive("cudaMemPoolTrimTo"); !st) return st;
  PoolState* ps = pool_of(p);
  if (ps == nullptr) return fail(Err::invalid, kCodeInvalid, "cudaMemPoolTrimTo", "unknown pool");
  ++counters_.trims;
  if (ps->model) ps->model->trim_to(keep);
  if (cfg_.leak_on_trim > 0 && dev_.map(cfg_.leak_on_trim)) counters_.leaked += cfg_.leak_on_trim;  // injected
  return ok_status();
}

Status FakeRuntime::malloc_async(DevPtr& p, Bytes n, Pool pool, Stream s) {
  std::lock_guard lock(m_);
  const std::string where = fmt::format("cudaMallocFromPoolAsync({}, stream {})", format_mib(n), s.h);
  if (Status st = check_alive(where); !st) return st;
  PoolState* ps = pool_of(pool);
  if (ps == nullptr) return fail(Err::invalid, kCodeInvalid, where, "unknown pool");
  ++counters_.async_mallocs;
  if (n == 0) {
    p = 0;
    return ok_status();
  }
  if (alloc_fault()) return fail(Err::out_of_memory, kCodeOom, where, "out of memory (injected)");
  ensure_hints_pool(*ps);
  sim::BlockKey key;
  if (!ps->spare_keys.empty()) {
    key = ps->spare_keys.back();
    ps->spare_keys.pop_back();
  } else {
    key = ps->next_key++;
  }
  if (!ps->model->malloc(key, n, static_cast<sim::StreamId>(s.h))) {
    ps->spare_keys.push_back(key);
    return fail(Err::out_of_memory, kCodeOom, where, "out of memory");
  }
  update_highs(*ps);
  p = *ps->model->address(key);
  async_[p] = AsyncAlloc{pool.h, key};
  add_backing(p, n);
  return ok_status();
}

Status FakeRuntime::free_async(DevPtr p, Stream s) {
  std::lock_guard lock(m_);
  const std::string where = fmt::format("cudaFreeAsync(stream {})", s.h);
  if (Status st = check_alive(where); !st) return st;
  if (p == 0) return ok_status();
  const auto it = async_.find(p);
  if (it == async_.end()) return fail(Err::invalid, kCodeInvalid, where, fmt::format("{:#x} is not a pool allocation", p));
  PoolState* ps = pool_of(Pool{it->second.pool});
  // The model frees on the allocation stream; the backend always frees there too.
  ps->model->free(it->second.key);
  ps->spare_keys.push_back(it->second.key);
  async_.erase(it);
  drop_backing(p);
  ++counters_.async_frees;
  return ok_status();
}

// ---- host memory and transfers ------------------------------------------------------------------

Status FakeRuntime::host_alloc(void*& p, Bytes n) {
  std::lock_guard lock(m_);
  if (Status st = check_alive("cudaHostAlloc"); !st) return st;
  // Untouched pages of a large malloc cost no host memory: the fake reads it only when backed.
  p = std::malloc(std::max<Bytes>(n, 1));
  if (p == nullptr) return fail(Err::out_of_memory, kCodeOom, fmt::format("cudaHostAlloc({})", format_mib(n)), "host out of memory");
  ++counters_.host_allocs;
  return ok_status();
}

Status FakeRuntime::host_free(void* p) {
  std::lock_guard lock(m_);
  std::free(p);
  ++counters_.host_frees;
  return ok_status();
}

Status FakeRuntime::memcpy_h2d_async(DevPtr dst, const void* src, Bytes n, Stream) {
  std::lock_guard lock(m_);
  if (Status st = check_alive("cudaMemcpyAsync(H2D)"); !st) return st;
  ++counters_.h2d_copies;
  advance(static_cast<double>(n), cfg_.h2d_gbps);
  if (std::byte* b = backed(dst, n)) std::memcpy(b, src, n);
  return ok_status();
}

Status FakeRuntime::memcpy_d2h(void* dst, DevPtr src, Bytes n) {
  std::lock_guard lock(m_);
  if (Status st = check_alive("cudaMemcpy(D2H)"); !st) return st;
  ++counters_.d2h_copies;
  advance(static_cast<double>(n), cfg_.h2d_gbps);
  const std::byte* b = backed(src, n);
  if (b == nullptr) return fail(Err::invalid, kCodeInvalid, "cudaMemcpy(D2H)", "the fake has no data behind this range");
  std::memcpy(dst, b, n);
  return ok_status();
}

Status FakeRuntime::memset_async(DevPtr p, std::uint8_t value, Bytes n, Stream) {
  std::lock_guard lock(m_);
  if (Status st = check_alive("cudaMemsetAsync"); !st) return st;
  ++counters_.memsets;
  advance(static_cast<double>(n), cfg_.d2d_gbps);
  if (std::byte* b = backed(p, n)) std::memset(b, value, n);
  return ok_status();
}

// ---- VMM ----------------------------------------------------------------------------------------

Status FakeRuntime::vmm_granularity(Bytes& g, bool) {
  std::lock_guard lock(m_);
  g = cfg_.vmm_granularity;
  return ok_status();
}

Status FakeRuntime::vmm_create(MemHandle& h, Bytes n) {
  std::lock_guard lock(m_);
  const std::string where = fmt::format("cuMemCreate({})", format_mib(n));
  if (Status st = check_alive(where); !st) return st;
  ensure_context();
  if (n == 0 || n % cfg_.vmm_granularity != 0) return fail(Err::invalid, kCodeInvalid, where, "size is not a multiple of the granularity");
  ++counters_.vmm_creates;
  if (alloc_fault()) return fail(Err::out_of_memory, kCodeOom, where, "out of memory (injected)");
  if (!dev_.map(n)) return fail(Err::out_of_memory, kCodeOom, where, "out of memory");
  h.h = next_handle_++;
  handles_[h.h] = VmmHandle{n, 0, false};
  return ok_status();
}

Status FakeRuntime::vmm_release(MemHandle h) {
  std::lock_guard lock(m_);
  const auto it = handles_.find(h.h);
  if (it == handles_.end()) return fail(Err::invalid, kCodeInvalid, "cuMemRelease", "unknown handle");
  ++counters_.vmm_releases;
  it->second.released = true;
  if (it->second.mappings == 0) {
    dev_.unmap(it->second.bytes);
    handles_.erase(it);
  }
  return ok_status();
}

Status FakeRuntime::vmm_reserve(DevPtr& p, Bytes n, Bytes align) {
  std::lock_guard lock(m_);
  if (Status st = check_alive("cuMemAddressReserve"); !st) return st;
  const Bytes a = std::max<Bytes>(align, sim::kDevicePage);
  p = round_up(dev_.reserve_address_range(n + a), a);
  ranges_[p] = n;
  return ok_status();
}

Status FakeRuntime::vmm_free_range(DevPtr p, Bytes n) {
  std::lock_guard lock(m_);
  const auto it = ranges_.find(p);
  if (it == ranges_.end() || it->second != n) return fail(Err::invalid, kCodeInvalid, "cuMemAddressFree", "not a reserved range");
  const auto m = mappings_.lower_bound(p);
  if (m != mappings_.end() && m->first < p + n) return fail(Err::invalid, kCodeInvalid, "cuMemAddressFree", "the range is still mapped");
  ranges_.erase(it);
  return ok_status();
}

Status FakeRuntime::vmm_map(DevPtr p, Bytes n, MemHandle h) {
  std::lock_guard lock(m_);
  if (Status st = check_alive("cuMemMap"); !st) return st;
  const auto hit = handles_.find(h.h);
  if (hit == handles_.end() || hit->second.bytes != n) return fail(Err::invalid, kCodeInvalid, "cuMemMap", "unknown handle or size mismatch");
  auto r = ranges_.upper_bound(p);
  if (r == ranges_.begin() || p + n > std::prev(r)->first + std::prev(r)->second) {
    return fail(Err::invalid, kCodeInvalid, "cuMemMap", "outside a reserved range");
  }
  const auto next = mappings_.lower_bound(p);
  if (next != mappings_.end() && next->first < p + n) return fail(Err::invalid, kCodeInvalid, "cuMemMap", "overlaps a mapping");
  if (next != mappings_.begin() && std::prev(next)->first + std::prev(next)->second.bytes > p) {
    return fail(Err::invalid, kCodeInvalid, "cuMemMap", "overlaps a mapping");
  }
  mappings_[p] = Mapping{n, h.h, false};
  ++hit->second.mappings;
  return ok_status();
}

// [p, p + n) is a run of whole mappings, back to back (what cuMemSetAccess and cuMemUnmap take).
bool FakeRuntime::whole_mappings(DevPtr p, Bytes n) const {
  DevPtr at = p;
  for (auto it = mappings_.find(p); at < p + n; ++it) {
    if (it == mappings_.end() || it->first != at) return false;
    at += it->second.bytes;
  }
  return at == p + n;
}

Status FakeRuntime::vmm_set_access(DevPtr p, Bytes n) {
  std::lock_guard lock(m_);
  if (Status st = check_alive("cuMemSetAccess"); !st) return st;
  if (!whole_mappings(p, n)) return fail(Err::invalid, kCodeInvalid, "cuMemSetAccess", "range not fully mapped");
  if (++set_access_calls_ == cfg_.set_access_fault) return fail(Err::invalid, kCodeInvalid, "cuMemSetAccess", "injected");
  for (auto it = mappings_.find(p); it != mappings_.end() && it->first < p + n; ++it) it->second.access = true;
  return ok_status();
}

Status FakeRuntime::vmm_unmap(DevPtr p, Bytes n) {
  std::lock_guard lock(m_);
  if (Status st = check_alive("cuMemUnmap"); !st) return st;
  if (!whole_mappings(p, n)) return fail(Err::invalid, kCodeInvalid, "cuMemUnmap", "not whole mappings");
  for (auto it = mappings_.find(p); it != mappings_.end() && it->first < p + n;) {
    const auto hit = handles_.find(it->second.handle);
    if (hit != handles_.end() && --hit->second.mappings == 0 && hit->second.released) {
      dev_.unmap(hit->second.bytes);
      handles_.erase(hit);
    }
    it = mappings_.erase(it);
  }
  return ok_status();
}

// ---- kernels ------------------------------------------------------------------------------------

Status FakeRuntime::upcast(DevPtr src, Dtype from, DevPtr dst, Dtype to, std::uint64_t n, float scale, Stream) {
  std::lock_guard lock(m_);
  const std::string where = fmt::format("upcast {} -> {} ({} elements)", dtype_name(from), dtype_name(to), n);
  kernels::ConvertBytes cb;
  try {
    cb = kernels::check_upcast(from, to, n, scale);
  } catch (const InputError& e) {
    return fail(Err::invalid, kCodeInvalid, where, e.what());
  }
  if (Status st = launch(where, cb.src + cb.dst); !st) return st;
  const std::byte* s = backed(src, cb.src);
  std::byte* d = backed(dst, cb.dst);
  if (s != nullptr && d != nullptr) {
    kernels::upcast(std::span<const std::byte>(s, cb.src), from, n, scale, std::span<std::byte>(d, cb.dst), to);
  }
  return ok_status();
}

Status FakeRuntime::dequant(DevPtr src, Dtype type, DevPtr dst, Dtype to, std::uint64_t n, Stream) {
  std::lock_guard lock(m_);
  const std::string where = fmt::format("dequant {} -> {} ({} elements)", dtype_name(type), dtype_name(to), n);
  kernels::ConvertBytes cb;
  try {
    cb = kernels::check_dequant(type, to, n);
  } catch (const InputError& e) {
    return fail(Err::invalid, kCodeInvalid, where, e.what());
  }
  if (Status st = launch(where, cb.src + cb.dst); !st) return st;
  const std::byte* s = backed(src, cb.src);
  std::byte* d = backed(dst, cb.dst);
  if (s != nullptr && d != nullptr) {
    kernels::dequant(std::span<const std::byte>(s, cb.src), type, n, std::span<std::byte>(d, cb.dst), to);
  }
  return ok_status();
}

Status FakeRuntime::touch(DevPtr dst, Bytes n, std::uint8_t value, Stream) {
  std::lock_guard lock(m_);
  if (Status st = launch(fmt::format("touch ({})", format_mib(n)), n); !st) return st;
  if (std::byte* d = backed(dst, n)) std::memset(d, value, n);
  return ok_status();
}

Status FakeRuntime::copy_kernel(DevPtr dst, DevPtr src, Bytes n, Stream) {
  std::lock_guard lock(m_);
  if (Status st = launch(fmt::format("copy kernel ({})", format_mib(n)), 2 * n); !st) return st;
  const std::byte* s = backed(src, n);
  std::byte* d = backed(dst, n);
  if (s != nullptr && d != nullptr) std::memmove(d, s, n);
  return ok_status();
}

Status FakeRuntime::copy_d2d(DevPtr dst, DevPtr src, Bytes n, Stream) {
  std::lock_guard lock(m_);
  if (Status st = check_alive("cudaMemcpyAsync(D2D)"); !st) return st;
  ++counters_.d2d_copies;
  advance(2.0 * static_cast<double>(n), cfg_.d2d_gbps);
  const std::byte* s = backed(src, n);
  std::byte* d = backed(dst, n);
  if (s != nullptr && d != nullptr) std::memmove(d, s, n);
  return ok_status();
}

// ---- NVML ---------------------------------------------------------------------------------------

std::string FakeRuntime::nvml_note() const {
  return cfg_.nvml ? "fake NVML: the sim device's used memory" : "NVML disabled in the fake (nvml=0)";
}

Status FakeRuntime::nvml_memory(NvmlMemory& out) {
  std::lock_guard lock(m_);
  if (!cfg_.nvml) return fail(Err::not_supported, kCodeNotSupported, "nvmlDeviceGetMemoryInfo", "NVML disabled (fake)");
  out.total = cfg_.total;
  out.free = dev_.free();
  out.used = cfg_.total - out.free;
  return ok_status();
}

Status FakeRuntime::nvml_processes(NvmlProcesses& out) {
  std::lock_guard lock(m_);
  if (!cfg_.nvml) return fail(Err::not_supported, kCodeNotSupported, "nvmlDeviceGetComputeRunningProcesses_v3", "NVML disabled (fake)");
  out = NvmlProcesses{};
  if (cfg_.used_by_others > 0) {  // `others`: one other process holding that much
    out.all += cfg_.used_by_others;
    ++out.count;
  }
  if (context_) {
    out.self = dev_.charged();
    out.all += dev_.charged();
    ++out.count;
  }
  return ok_status();
}

// ---- cases and test hooks -----------------------------------------------------------------------

void FakeRuntime::begin_case(const ModelHints& hints) {
  std::lock_guard lock(m_);
  hints_ = hints;
  ++counters_.cases;
  if (armed_) return;
  armed_ = true;
  if (cfg_.oom_at_alloc != 0) oom_at_ = allocs_ + cfg_.oom_at_alloc;
  if (cfg_.sticky_at_launch != 0) sticky_at_ = launches_ + cfg_.sticky_at_launch;
  if (cfg_.abort_at_launch != 0) abort_at_ = launches_ + cfg_.abort_at_launch;
}

FakeCounters FakeRuntime::counters() const {
  std::lock_guard lock(m_);
  return counters_;
}

void FakeRuntime::arm_oom(std::uint64_t nth) {
  std::lock_guard lock(m_);
  armed_ = true;
  oom_at_ = nth == 0 ? 0 : allocs_ + nth;
}

void FakeRuntime::arm_sticky(std::uint64_t nth) {
  std::lock_guard lock(m_);
  armed_ = true;
  sticky_at_ = nth == 0 ? 0 : launches_ + nth;
}

void FakeRuntime::set_leak_on_trim(Bytes b) {
  std::lock_guard lock(m_);
  cfg_.leak_on_trim = b;
}

Bytes FakeRuntime::charged() const {
  std::lock_guard lock(m_);
  return dev_.charged();
}

}  // namespace vf::cuda
