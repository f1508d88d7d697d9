#include "harness/cuda/backend.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "harness/core/error.h"
#include "harness/cuda/device_layer.h"
#include "harness/cuda/sampler.h"
#include "harness/dynamic_runtime.h"
#include "harness/sim/aimdo.h"
#include "harness/sim/alloc_options.h"
#include "harness/sim/caching.h"
#include "kernels/reference.h"

namespace vf::cuda {

namespace {

// ComfyUI empties the torch cache when cached-but-unused memory is more than 25% of free memory
// (the same rule as the sim backend, harness/exec.cpp).
constexpr double kCacheFlushShare = 0.25;
// Warm-up: every kernel variant once on this many elements (a whole number of every GGUF block).
constexpr std::uint64_t kWarmElems = 256;
constexpr Bytes kScratch = 2 * MiB;
// The pinned H2D buffer grows in steps of this, so a slightly larger transfer does not realloc.
constexpr Bytes kPinnedStep = 64 * MiB;
// What the touch kernel writes into activations and fallback outputs.
constexpr std::uint8_t kTouchValue = 0x3c;

constexpr Dtype kUpcastFrom[] = {Dtype::fp8_e4m3fn, Dtype::fp8_e5m2, Dtype::fp16, Dtype::bf16};
constexpr Dtype kDequantFrom[] = {Dtype::q8_0, Dtype::q4_0, Dtype::q4_k, Dtype::q6_k};
constexpr Dtype kTargets[] = {Dtype::fp32, Dtype::fp16, Dtype::bf16};

// The dtype a buffer holds: weights and transfers hold the tensor's storage dtype, conversion
// outputs and activations the model's compute dtype, LoRA patch copies the patch dtype.
Dtype buffer_dtype(const Scenario& s, const Program& p, std::uint32_t b) {
  const Buffer& buf = p.buffers[b];
  const ModelRef& ref = s.models[buf.model];
  switch (buf.kind) {
    case BufferKind::weight:
    case BufferKind::transfer:
      // A dynamic VRAM cast buffer holds the whole slice (no one tensor): its weight's dtype.
      return ref.spec->modules[buf.module].tensors[buf.tensor == kNone ? 0 : buf.tensor].dtype;
    case BufferKind::lora: return s.policy.constants.lora_patch_dtype;
    case BufferKind::convert:
    case BufferKind::scaled:
    case BufferKind::activation: return ref.compute;
  }
  return ref.compute;
}

std::uint64_t elems_that_fit(Bytes bytes, Dtype d) {
  const DtypeInfo& i = dtype_info(d);
  return bytes / i.block_bytes * i.block_elems;
}

}  // namespace

std::string format_device_report(const DeviceReport& d) {
  return fmt::format("device: {} free to the case (ballast {}), {} after cleanup{}; sampled peak {} over {} readings{}; "
                     "{} H2D copies, {} memsets, {} kernels ({} fallback touches)",
                     format_mib(d.free_before), format_mib(d.ballast), format_mib(d.free_after_cleanup),
                     d.leaked > 0 ? fmt::format(" ({} missing)", format_mib(d.leaked)) : "", format_mib(d.sampled_used_peak),
                     d.samples, d.nvml_process_peak ? fmt::format(", NVML process peak {}", format_mib(*d.nvml_process_peak)) : "",
                     d.h2d_copies, d.memsets, d.launches, d.fallback_touches);
}

Transfer parse_transfer(std::string_view text, std::string_view what) {
  if (text == "copy") return Transfer::copy;
  if (text == "skip") return Transfer::skip;
  throw InputError(std::string(what), fmt::format("expected copy or skip, got \"{}\"", text));
}

// ---- construction -----------------------------------------------------------------------------

CudaBackend::CudaBackend(Runtime& rt, CudaBackendConfig cfg) : rt_(rt), cfg_(cfg), ballast_(rt) { init(); }

CudaBackend::CudaBackend(std::unique_ptr<Runtime> rt, CudaBackendConfig cfg)
    : owned_(std::move(rt)), rt_(*owned_), cfg_(cfg), ballast_(*owned_) {
  init();
}

CudaBackend::~CudaBackend() { release_all(); }

void CudaBackend::init() {
  auto infra = [](const Status& s, std::string_view what) {
    if (!s) throw InfraError(fmt::format("cuda backend: {}: {}", what, s.describe()));
  };
  int count = 0;
  infra(rt_.device_count(count), "no usable GPU");
  if (count <= cfg_.device) throw InfraError(fmt::format("cuda backend: device {} does not exist ({} found)", cfg_.device, count));
  infra(rt_.init_device(cfg_.device), "creating the context");
  infra(rt_.device_info(info_), "reading the device properties");
  Bytes total = 0;
  infra(rt_.mem_get_info(free_after_context_, total), "cudaMemGetInfo");
  // Every stream a program can name (compute + up to kMaxOffloadStreams offload streams) and an
  // event each, created once: nothing of the kind happens inside a case.
  streams_.resize(1 + kMaxOffloadStreams);
  events_.resize(streams_.size());
  for (std::size_t i = 0; i < streams_.size(); ++i) {
    infra(rt_.stream_create(streams_[i]), "cudaStreamCreate");
    infra(rt_.event_create(events_[i], false), "cudaEventCreate");
  }
  warm_up();
  infra(rt_.mem_get_info(free_after_warmup_, total), "cudaMemGetInfo");
}

// Lazy module loading charges device memory the first time each kernel runs: run every variant
// once now so no case pays for it (and raw mode's free-memory deltas stay the allocator's own).
void CudaBackend::warm_up() {
  auto infra = [](const Status& s) {
    if (!s) throw InfraError(fmt::format("cuda backend: warm-up: {}", s.describe()));
  };
  infra(rt_.malloc(scratch_, kScratch));
  const DevPtr src = scratch_;
  const DevPtr dst = scratch_ + kScratch / 2;
  const Stream s = streams_[0];
  infra(rt_.memset_async(scratch_, 0, kScratch, s));
  for (Dtype from : kUpcastFrom) {
    for (Dtype to : kTargets) infra(rt_.upcast(src, from, dst, to, kWarmElems, 1.0f, s));
  }
  for (Dtype from : kDequantFrom) {
    for (Dtype to : kTargets) infra(rt_.dequant(src, from, dst, to, kWarmElems, s));
  }
  infra(rt_.touch(dst, kScratch / 2, kTouchValue, s));
  infra(rt_.device_synchronize());
  infra(rt_.last_error());
}

Status CudaBackend::ensure_pinned(Bytes bytes) {
  if (bytes <= pinned_bytes_) return ok_status();
  if (pinned_ != nullptr) {
    (void)rt_.host_free(pinned_);
    pinned_ = nullptr;
    pinned_bytes_ = 0;
  }
  const Bytes size = round_up(bytes, kPinnedStep);
  void* p = nullptr;
  if (Status s = rt_.host_alloc(p, size); !s) return s;
  pinned_ = p;
  pinned_bytes_ = size;
  ++pinned_allocations_;
  return ok_status();
}

void CudaBackend::release_all() noexcept {
  (void)rt_.device_synchronize();
  ballast_.release();
  if (pinned_ != nullptr) (void)rt_.host_free(pinned_);
  pinned_ = nullptr;
  if (scratch_ != 0) (void)rt_.free(scratch_);
  scratch_ = 0;
  for (Event e : events_) (void)rt_.event_destroy(e);
  for (Stream s : streams_) (void)rt_.stream_destroy(s);
  events_.clear();
  streams_.clear();
}

// ---- one case ---------------------------------------------------------------------------------

class CudaBackend::Case {
 public:
  Case(CudaBackend& b, const Scenario& s, const Program& p, const ExecOptions& opt, ExecResult& r)
      : b_(b), rt_(b.rt_), s_(s), p_(p), opt_(opt), r_(r), sampler_(b.rt_, b.cfg_.sample_interval_ms, b.cfg_.nvml_interval_ms) {}

  void run();

 private:
  enum class Outcome : std::uint8_t { ok, oom, stop };

  // Dynamic VRAM's torch side: PyTorch's synchronize / empty_cache and get_free_memory, on the device.
  class Torch final : public TorchView {
   public:
    explicit Torch(Case& c) : c_(c) {}
    void synchronize() override;
    void empty_cache() override;
    Bytes free_memory() const override;

   private:
    Case& c_;
  };

  bool prepare();
  bool prepare_dynamic();
  Outcome step(std::uint32_t i);
  Outcome dynamic_op(std::uint32_t i, const Op& op);
  // Dynamic VRAM: a driver allocation through aimdo's hook; `st` gets the driver's last status.
  bool hooked(bool async_hook, Bytes size, const std::function<Status()>& real, Status& st);
  void advance_time(const Op& op, Bytes moved);
  void apply_events(std::uint32_t i);
  Bytes held_now(Bytes free_now) const;  // what the process holds, other processes' stand-ins aside
  void account(std::uint32_t i, const Op& op, std::string what, Bytes request);
  Outcome alloc(std::uint32_t i, const Op& op);
  Status free_buffer(std::uint32_t b);
  Status convert(const Op& op);
  Status flush_if_cached();
  bool measure(std::uint32_t i);
  bool read_allocator(Bytes free_now, Bytes& reserved, Bytes& allocated);
  // The caching model's other-stream blocks, at a peak and after a failed malloc; the driver's
  // async pool does not say (0).
  Bytes held_for_others(std::uint32_t stream, Bytes request) const {
    return caching_ ? caching_->held_for_other_streams(stream, request) : 0;
  }
  Bytes held_at_oom(std::uint32_t stream, Bytes request) const { return caching_ ? caching_->held_at_oom(stream, request) : 0; }
  void cleanup();
  void fault(const Status& s, std::uint32_t op);  // ends the case with an error
  Stream stream(std::uint8_t i) const { return b_.streams_[i]; }
  Bytes bytes_of(std::uint32_t b) const { return p_.buffers[b].bytes; }

  CudaBackend& b_;
  Runtime& rt_;
  const Scenario& s_;
  const Program& p_;
  const ExecOptions& opt_;
  ExecResult& r_;
  DeviceReport rep_;
  MemSampler sampler_;
  sim::AllocOptions options_;
  std::vector<DevPtr> ptr_;           // per buffer
  std::vector<std::uint8_t> live_;    // per buffer
  Bytes live_bytes_ = 0;
  sim::AllocStats stats_;             // raw / async: tallied here (caching: the model's)
  std::optional<Bytes> limit_;        // async: per_process_memory_fraction x total, on requested bytes
  Pool pool_;
  bool pool_owned_ = false;
  // Dynamic VRAM: aimdo over real VMM pages (its own layer), destroyed after the allocator.
  std::unique_ptr<CudaDeviceLayer> vmm_;
  std::unique_ptr<sim::Aimdo> aimdo_;
  std::unique_ptr<Torch> torch_;
  std::unique_ptr<DynamicRuntime> dyn_;
  LiveTensors live_tensors_;
  std::uint64_t now_us_ = 0;     // modelled time on the fake runtime, wall-clock time on a GPU
  bool modelled_time_ = true;
  const OpClock clock_{s_};      // declared after s_: built from it
  std::chrono::steady_clock::time_point t0_{};
  std::size_t next_event_ = 0;
  std::vector<std::pair<DevPtr, Bytes>> others_;  // cudaMallocs standing in for other processes
  Bytes others_held_ = 0;
  Bytes others_at_poll_ = 0;
  std::uint64_t polls_seen_ = 0;
  std::unique_ptr<CudaDeviceLayer> layer_;          // declared before the model: destroyed after it
  std::unique_ptr<sim::DeviceLayer> hooked_;        // dynamic caching: layer_ through aimdo's hook
  std::unique_ptr<sim::CachingAllocator> caching_;
  Bytes min_free_ = ~Bytes{0};
};

void CudaBackend::Case::Torch::synchronize() {
  if (Status st = c_.rt_.device_synchronize(); !st) throw CudaFault(st);
  if (c_.caching_) c_.caching_->synchronize();
}

void CudaBackend::Case::Torch::empty_cache() {
  if (c_.caching_) {
    c_.caching_->empty_cache();
  } else if (c_.options_.mode == AllocatorMode::async) {
    if (Status st = c_.rt_.device_synchronize(); !st) throw CudaFault(st);
    if (Status st = c_.rt_.pool_trim(c_.pool_, 0); !st) throw CudaFault(st);
  }
}

Bytes CudaBackend::Case::Torch::free_memory() const {
  Bytes free_now = 0, total = 0;
  if (Status st = c_.rt_.mem_get_info(free_now, total); !st) throw CudaFault(st);
  Bytes reserved = 0, active = 0;
  if (c_.caching_) {
    reserved = c_.caching_->stats().reserved.current;
    active = c_.caching_->stats().active.current;
  } else if (c_.options_.mode == AllocatorMode::async) {
    std::uint64_t res = 0, used = 0;
    (void)c_.rt_.pool_get(c_.pool_, PoolAttr::reserved_current, res);
    (void)c_.rt_.pool_get(c_.pool_, PoolAttr::used_current, used);
    reserved = res;
    active = used;
  }
  return free_now + sat_sub(reserved, active);
}

Bytes CudaBackend::Case::held_now(Bytes free_now) const { return sat_sub(sat_sub(rep_.free_before, free_now), others_held_); }

bool CudaBackend::Case::prepare_dynamic() {
  // The clock of aimdo's 2 s poll and of other processes' events: the modelled durations on the
  // fake runtime (so a fake run is the sim run), the wall clock on a GPU (as aimdo's own).
  modelled_time_ = rt_.kind() == "fake";
  t0_ = std::chrono::steady_clock::now();
  vmm_ = std::make_unique<CudaDeviceLayer>(rt_, s_.device);
  // aimdo's capacity is cuDeviceTotalMem: the emulated card's total.
  aimdo_ = std::make_unique<sim::Aimdo>(s_.device.total, s_.policy.constants.dynamic, *vmm_, now_us_, [this] {
    if (Status st = rt_.device_synchronize(); !st) throw CudaFault(st);
  });
  torch_ = std::make_unique<Torch>(*this);
  dyn_ = std::make_unique<DynamicRuntime>(s_, p_, *aimdo_, *torch_);
  live_tensors_ = LiveTensors(s_.models.size());
  others_at_poll_ = s_.device.used_by_others;
  r_.dynamic.emplace();
  return true;
}

bool CudaBackend::Case::hooked(bool async_hook, Bytes size, const std::function<Status()>& real, Status& st) {
  auto attempt = [&] {
    st = real();
    if (st.err == Err::out_of_memory) (void)rt_.last_error();
    return st.ok();
  };
  return async_hook ? aimdo_->hook_malloc_async(size, attempt) : aimdo_->hook_cuda_malloc(size, attempt);
}

void CudaBackend::Case::advance_time(const Op& op, Bytes moved) {
  if (modelled_time_) {
    now_us_ += clock_.duration_us(p_, op, moved);
  } else {
    now_us_ = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0_).count());
  }
  if (aimdo_->stats().polls != polls_seen_) {
    polls_seen_ = aimdo_->stats().polls;
    others_at_poll_ = s_.device.used_by_others + others_held_;
  }
}

// Other processes' events: a cudaMalloc of ours stands in for each take (the device's free memory
// drops the same), freed for a `free`.
void CudaBackend::Case::apply_events(std::uint32_t i) {
  for (; next_event_ < s_.device.events.size() && s_.device.events[next_event_].at_us <= now_us_; ++next_event_) {
    const OthersEvent& ev = s_.device.events[next_event_];
    if (!ev.take) {
      Bytes left = ev.bytes;
      while (left > 0 && !others_.empty()) {
        auto [ptr, n] = others_.back();
        others_.pop_back();
        if (Status st = rt_.free(ptr); !st) throw CudaFault(st);
        others_held_ -= n;
        left = sat_sub(left, n);
      }
      continue;
    }
    Bytes free_now = 0, total = 0;
    if (Status st = rt_.mem_get_info(free_now, total); !st) throw CudaFault(st);
    DevPtr ptr = 0;
    Status st;
    st.err = Err::out_of_memory;
    if (free_now >= ev.bytes) st = rt_.malloc(ptr, ev.bytes);
    if (st) {
      others_.emplace_back(ptr, ev.bytes);
      others_held_ += ev.bytes;
    } else if (st.err == Err::out_of_memory) {
      (void)rt_.last_error();
      r_.dynamic->others_failures.push_back(
          others_failure(i, now_us_, ev.bytes, free_now, *aimdo_, s_.device.used_by_others + others_held_ != others_at_poll_));
    } else {
      throw CudaFault(st);
    }
  }
}

void CudaBackend::Case::account(std::uint32_t i, const Op& op, std::string what, Bytes request) {
  (void)i;
  Bytes free_now = 0, total = 0;
  (void)rt_.mem_get_info(free_now, total);
  Bytes reserved = 0, allocated = 0;
  if (!read_allocator(free_now, reserved, allocated)) return;
  sim::AllocStats torch = caching_ ? caching_->stats() : stats_;
  torch.reserved.current = reserved;
  torch.allocated.current = allocated;
  r_.dynamic->oom = account_oom(s_, op, live_tensors_, torch, free_now, held_now(free_now), *aimdo_, *dyn_, std::move(what), request);
}

CudaBackend::Case::Outcome CudaBackend::Case::dynamic_op(std::uint32_t i, const Op& op) {
  const DynamicRuntime::Result res = dyn_->execute(op);
  if (!res.ok) {
    Bytes free_now = 0, total = 0;
    (void)rt_.mem_get_info(free_now, total);
    Bytes reserved = 0, allocated = 0;
    if (!read_allocator(free_now, reserved, allocated)) return Outcome::stop;
    r_.oom = OomEvent{i, res.request, free_now, reserved, allocated, res.detail, held_at_oom(op.stream, res.request)};
    account(i, op, res.failure, res.request);
    return Outcome::oom;
  }
  // The copy of a fault that was not resident: into the VBAR slice or the cast buffer, from the
  // pinned buffer (or a memset with --transfer skip), on the offload stream ComfyUI picked.
  if (res.moved > 0 && res.dest != 0) {
    const Stream st = stream(static_cast<std::uint8_t>(res.stream < b_.streams_.size() ? res.stream : 0));
    Status s = b_.cfg_.transfer == Transfer::copy ? rt_.memcpy_h2d_async(res.dest, b_.pinned_, res.moved, st)
                                                  : rt_.memset_async(res.dest, 0, res.moved, st);
    if (!s) {
      fault(s, i);
      return Outcome::stop;
    }
    if (b_.cfg_.transfer == Transfer::copy) ++rep_.h2d_copies;
    else ++rep_.memsets;
  }
  advance_time(op, res.moved);
  return Outcome::ok;
}

void CudaBackend::Case::fault(const Status& s, std::uint32_t op) {
  if (r_.error) return;
  r_.error = fmt::format("op {} ({}): {}", op, op < p_.ops.size() ? op_kind_name(p_.ops[op].kind) : "setup", s.describe());
  if (s.err == Err::sticky) {
    r_.fatal = true;
    b_.poisoned_ = *r_.error;
  }
}

bool CudaBackend::Case::prepare() {
  try {
    options_ = sim::parse_alloc_options(s_.allocator, "allocator");
  } catch (const InputError& e) {
    r_.error = e.what();
    return false;
  }
  const std::uint32_t setup = static_cast<std::uint32_t>(p_.ops.size());
  if (p_.streams > b_.streams_.size()) {
    r_.error = fmt::format("the program uses {} streams; the backend has {}", p_.streams, b_.streams_.size());
    return false;
  }
  // The emulated card: free memory = total - others - context, exactly what the plan assumed.
  const Bytes target = s_.device.available();
  if (Status st = b_.ballast_.fit(target, rep_.free_at_start, rep_.free_before); !st) {
    fault(st, setup);
    return false;
  }
  rep_.ballast = b_.ballast_.bytes();
  if (b_.cfg_.transfer == Transfer::copy) {
    Bytes largest = 0;
    for (const Op& op : p_.ops) {
      if (op.kind == OpKind::h2d) largest = std::max(largest, bytes_of(op.buffer));
    }
    for (const VbarLayout& v : p_.vbars) {
      for (const Bytes slice : v.size) largest = std::max(largest, slice);
    }
    if (Status st = b_.ensure_pinned(largest); !st) {
      fault(st, setup);
      return false;
    }
  }
  ModelHints hints;
  hints.seed = s_.seed;
  hints.pool_granularity = options_.async.pool_granularity;
  hints.opportunistic_probability = options_.async.opportunistic_probability;
  rt_.begin_case(hints);
  if (p_.dynamic && !prepare_dynamic()) return false;

  switch (options_.mode) {
    case AllocatorMode::raw: break;
    case AllocatorMode::caching:
    case AllocatorMode::caching_expandable:
      layer_ = std::make_unique<CudaDeviceLayer>(rt_, s_.device);
      if (aimdo_) hooked_ = sim::make_hooked_segments(*layer_, *aimdo_);
      caching_ = std::make_unique<sim::CachingAllocator>(hooked_ ? *hooked_ : static_cast<sim::DeviceLayer&>(*layer_), options_.caching);
      break;
    case AllocatorMode::async: {
      const sim::AsyncOptions& a = options_.async;
      Status st = b_.cfg_.dedicated_pool ? rt_.pool_create(pool_) : rt_.default_pool(pool_);
      pool_owned_ = b_.cfg_.dedicated_pool && st.ok();
      if (st && !b_.cfg_.dedicated_pool) st = rt_.pool_trim(pool_, 0);
      // PyTorch's backend:cudaMallocAsync sets the threshold and all three reuse policies
      // explicitly; here they come from the scenario's options.
      if (st) st = rt_.pool_set(pool_, PoolAttr::release_threshold, a.release_threshold);
      if (st) st = rt_.pool_set(pool_, PoolAttr::reuse_follow_event_dependencies, a.reuse_follow_event_dependencies);
      if (st) st = rt_.pool_set(pool_, PoolAttr::reuse_allow_opportunistic, a.reuse_allow_opportunistic);
      if (st) st = rt_.pool_set(pool_, PoolAttr::reuse_allow_internal_dependencies, a.reuse_allow_internal_dependencies);
      if (st) st = rt_.pool_set(pool_, PoolAttr::reserved_high, 0);  // 0 = reset to current
      if (st) st = rt_.pool_set(pool_, PoolAttr::used_high, 0);
      if (!st) {
        fault(st, setup);
        return false;
      }
      if (a.memory_fraction < 1.0) limit_ = static_cast<Bytes>(a.memory_fraction * static_cast<double>(s_.device.total));
      break;
    }
  }
  Bytes total = 0;
  if (Status st = rt_.mem_get_info(rep_.free_before, total); !st) {
    fault(st, setup);
    return false;
  }
  rep_.total = total;
  min_free_ = rep_.free_before;
  return true;
}

void CudaBackend::Case::run() {
  r_.backend = "cuda";
  r_.stage_reserved_peak.assign(p_.stage_begin.size(), 0);
  r_.stage_reserved_peak_op.assign(p_.stage_begin.size(), 0);
  r_.stage_allocated_at_peak.assign(p_.stage_begin.size(), 0);
  r_.stage_held_at_peak.assign(p_.stage_begin.size(), 0);
  ptr_.assign(p_.buffers.size(), 0);
  live_.assign(p_.buffers.size(), 0);
  const bool ready = prepare();
  r_.environment = fmt::format("{}; emulating {} ({} free to the case, ballast {})", b_.info_.describe(),
                               format_size(s_.device.total), format_mib(rep_.free_before), format_mib(rep_.ballast));
  if (ready) {
    if (opt_.record_trace) r_.trace.reserve(p_.ops.size());
    sampler_.start(rep_.free_before);
    for (std::uint32_t i = 0; i < p_.ops.size(); ++i) {
      Outcome o = Outcome::stop;
      try {
        o = step(i);
      } catch (const CudaFault& e) {
        fault(e.status(), i);
      } catch (const std::exception& e) {
        if (!r_.error) r_.error = fmt::format("op {}: {}", i, e.what());
      }
      if (o == Outcome::stop) {
        r_.ops_executed = i;
        break;
      }
      if (!measure(i)) {
        r_.ops_executed = i;
        break;
      }
      r_.ops_executed = i + 1;
      if (o == Outcome::oom) break;
    }
    const SampleResult sr = sampler_.stop();
    min_free_ = std::min(min_free_, sr.min_free);
    rep_.samples = sr.samples;
    rep_.nvml_process_peak = sr.nvml_self_max;
    rep_.sampled_used_peak = sat_sub(rep_.free_before, sr.min_free);
    Bytes total = 0;
    if (!r_.fatal) (void)rt_.mem_get_info(rep_.free_after, total);
  }
  if (caching_) {
    r_.final_stats = caching_->stats();
    r_.allocated_peak = caching_->stats().allocated.peak;
  } else {
    r_.final_stats = stats_;
    r_.allocated_peak = stats_.allocated.peak;
  }
  if (pool_.h != 0 && !r_.fatal) {
    std::uint64_t v = 0;
    if (rt_.pool_get(pool_, PoolAttr::reserved_high, v)) rep_.pool_reserved_high = v;
    if (rt_.pool_get(pool_, PoolAttr::used_high, v)) rep_.pool_used_high = v;
    r_.allocated_peak = std::max(r_.allocated_peak, rep_.pool_used_high);
  }
  r_.device_peak = std::max(r_.device_peak, sat_sub(s_.device.total, min_free_));
  if (r_.dynamic) fill_dynamic_report(*r_.dynamic, *aimdo_, *dyn_, now_us_);
  cleanup();
  r_.device = rep_;
}

CudaBackend::Case::Outcome CudaBackend::Case::step(std::uint32_t i) {
  const Op& op = p_.ops[i];
  Status st;
  if (dyn_) {
    apply_events(i);
    if (!dyn_->runs(op)) return Outcome::ok;  // conditional on a fault that went the other way
    switch (op.kind) {
      case OpKind::vbar_prioritize:
      case OpKind::vbar_fault:
      case OpKind::vbar_unpin:
      case OpKind::vbar_free:
      case OpKind::node_end: return dynamic_op(i, op);
      case OpKind::alloc: {
        const Outcome o = alloc(i, op);
        advance_time(op, 0);
        return o;
      }
      default: break;
    }
  }
  switch (op.kind) {
    case OpKind::alloc: return alloc(i, op);
    case OpKind::free:
      st = free_buffer(op.buffer);
      break;
    case OpKind::h2d: {
      const Bytes n = bytes_of(op.buffer);
      if (n == 0 || ptr_[op.buffer] == 0) break;
      if (b_.cfg_.transfer == Transfer::copy) {
        st = rt_.memcpy_h2d_async(ptr_[op.buffer], b_.pinned_, n, stream(op.stream));
        ++rep_.h2d_copies;
      } else {
        st = rt_.memset_async(ptr_[op.buffer], 0, n, stream(op.stream));
        ++rep_.memsets;
      }
      break;
    }
    case OpKind::upcast:
    case OpKind::dequant: st = convert(op); break;
    case OpKind::compute: {
      // The module's kernels stand in as one kernel writing the whole output (the activation, or
      // the LoRA merge result).
      const Bytes n = bytes_of(op.buffer);
      if (n == 0 || ptr_[op.buffer] == 0) break;
      st = rt_.touch(ptr_[op.buffer], n, kTouchValue, stream(op.stream));
      ++rep_.launches;
      break;
    }
    case OpKind::wait:
      // `stream` waits for the work issued so far on `target`.
      st = rt_.event_record(b_.events_[op.target], stream(op.target));
      if (st) st = rt_.stream_wait_event(stream(op.stream), b_.events_[op.target]);
      if (caching_) caching_->stream_wait(op.stream, op.target);
      break;
    case OpKind::sync:
      st = rt_.device_synchronize();
      if (caching_) caching_->synchronize();
      break;
    case OpKind::empty_cache:
      if (caching_) {
        caching_->empty_cache();
      } else if (options_.mode == AllocatorMode::async) {
        st = rt_.device_synchronize();  // torch.cuda.empty_cache with cudaMallocAsync: sync + TrimTo(0)
        if (st) st = rt_.pool_trim(pool_, 0);
      }
      break;
    case OpKind::flush_if_cached: st = flush_if_cached(); break;
    case OpKind::vbar_prioritize:
    case OpKind::vbar_fault:
    case OpKind::vbar_unpin:
    case OpKind::vbar_free:
    case OpKind::node_end: break;  // handled above (a dynamic program)
  }
  if (!st) {
    fault(st, i);
    return Outcome::stop;
  }
  if (dyn_) advance_time(op, 0);
  return Outcome::ok;
}

CudaBackend::Case::Outcome CudaBackend::Case::alloc(std::uint32_t i, const Op& op) {
  const std::uint32_t b = op.buffer;
  const Bytes bytes = bytes_of(b);
  std::optional<std::string> oom_detail;
  Status st;
  switch (options_.mode) {
    case AllocatorMode::raw: {
      // PYTORCH_NO_CUDA_MEMORY_CACHING: one cudaMalloc per tensor (1 byte for an empty one, as
      // the sim charges it).
      if (aimdo_) {
        hooked(false, std::max<Bytes>(bytes, 1), [&] { return rt_.malloc(ptr_[b], std::max<Bytes>(bytes, 1)); }, st);
      } else {
        st = rt_.malloc(ptr_[b], std::max<Bytes>(bytes, 1));
      }
      if (st.err == Err::out_of_memory) {
        (void)rt_.last_error();
        oom_detail = fmt::format("cudaMalloc({}) failed: {}", format_mib(bytes), st.message);
      } else if (st) {
        stats_.requested.add(bytes);
        stats_.allocated.add(round_up(std::max<Bytes>(bytes, 1), sim::kCudaMallocAlign));
        stats_.active.add(round_up(std::max<Bytes>(bytes, 1), sim::kCudaMallocAlign));
        ++stats_.num_device_alloc;
      }
      break;
    }
    case AllocatorMode::async: {
      if (bytes == 0) break;  // PyTorch never calls cudaMallocAsync for an empty tensor
      if (limit_ && stats_.requested.current + bytes > *limit_) {
        oom_detail = fmt::format("async: per_process_memory_fraction: requested {} + {} > limit {}; PyTorch raises before "
                                 "calling CUDA",
                                 format_mib(stats_.requested.current), format_mib(bytes), format_mib(*limit_));
        break;
      }
      if (aimdo_) {
        hooked(true, bytes, [&] { return rt_.malloc_async(ptr_[b], bytes, pool_, stream(op.stream)); }, st);
      } else {
        st = rt_.malloc_async(ptr_[b], bytes, pool_, stream(op.stream));
      }
      if (st.err == Err::out_of_memory) {
        (void)rt_.last_error();
        oom_detail = fmt::format("async: cudaMallocAsync({}) on stream {} failed: {}; PyTorch raises at once (no sync, "
                                 "trim or retry)",
                                 format_mib(bytes), op.stream, st.message);
      } else if (st) {
        stats_.requested.add(bytes);
        stats_.allocated.add(round_up(bytes, sim::kAsyncAlign));
        stats_.active.add(round_up(bytes, sim::kAsyncAlign));
      }
      break;
    }
    case AllocatorMode::caching:
    case AllocatorMode::caching_expandable:
      if (!caching_->malloc(b, bytes, op.stream)) {
        oom_detail = caching_->last_oom() ? caching_->last_oom()->detail : std::string("caching allocator: OOM");
      } else {
        ptr_[b] = caching_->address(b).value_or(0);
      }
      break;
  }
  if (oom_detail) {
    ++stats_.num_ooms;
    Bytes free_now = 0;
    Bytes total = 0;
    (void)rt_.mem_get_info(free_now, total);
    Bytes reserved = 0;
    Bytes allocated = 0;
    if (!read_allocator(free_now, reserved, allocated)) return Outcome::stop;
    // A failed cudaMallocAsync keeps what it mapped of the growth (the pool grew, the call
    // failed): the event records what the request met, the measured pool after it says the rest.
    Bytes retained = 0;
    if (options_.mode == AllocatorMode::async && reserved > stats_.reserved.current) {
      retained = reserved - stats_.reserved.current;
      *oom_detail += fmt::format("; trying, the pool grew by {} it could not use, and keeps it until trimmed", format_mib(retained));
    }
    r_.oom = OomEvent{i, bytes, free_now + retained, reserved - retained, allocated, *oom_detail, held_at_oom(op.stream, bytes)};
    if (aimdo_) account(i, op, "torch allocation", bytes);
    return Outcome::oom;
  }
  if (!st) {
    fault(st, i);
    return Outcome::stop;
  }
  live_[b] = 1;
  live_bytes_ += bytes;
  if (aimdo_) live_tensors_.add(p_.buffers[b]);
  return Outcome::ok;
}

Status CudaBackend::Case::free_buffer(std::uint32_t b) {
  if (!live_[b]) return ok_status();
  Status st;
  if (aimdo_) live_tensors_.remove(p_.buffers[b]);
  switch (options_.mode) {
    case AllocatorMode::raw: {
      st = rt_.free(ptr_[b]);
      if (aimdo_ && st) aimdo_->hook_free(std::max<Bytes>(bytes_of(b), 1));
      const Bytes rounded = round_up(std::max<Bytes>(bytes_of(b), 1), sim::kCudaMallocAlign);
      stats_.requested.sub(bytes_of(b));
      stats_.allocated.sub(rounded);
      stats_.active.sub(rounded);
      ++stats_.num_device_free;
      break;
    }
    case AllocatorMode::async:
      if (ptr_[b] != 0) {
        // Ordered on the stream the program names: the buffer's own (allocation) stream.
        st = rt_.free_async(ptr_[b], stream(p_.buffers[b].stream));
        if (aimdo_ && st) aimdo_->hook_free(bytes_of(b));
        const Bytes rounded = round_up(bytes_of(b), sim::kAsyncAlign);
        stats_.requested.sub(bytes_of(b));
        stats_.allocated.sub(rounded);
        stats_.active.sub(rounded);
      }
      break;
    case AllocatorMode::caching:
    case AllocatorMode::caching_expandable: caching_->free(b); break;
  }
  live_[b] = 0;
  live_bytes_ -= bytes_of(b);
  ptr_[b] = 0;
  return st;
}

// upcast / dequant with the real kernels on the real buffers: the source dtype is the tensor's
// (or the compute dtype for the scale multiply of scaled fp8), the destination the compute (or
// LoRA patch) dtype. A pair no kernel covers (fp32 sources, int8, other GGUF types) writes the
// output with a touch instead, so the memory traffic of the output is still real.
Status CudaBackend::Case::convert(const Op& op) {
  const DevPtr dst = ptr_[op.buffer];
  const Bytes dst_bytes = bytes_of(op.buffer);
  if (dst == 0 || dst_bytes == 0) return ok_status();
  const Stream st = stream(op.stream);
  const DevPtr src = op.src != kNone ? ptr_[op.src] : 0;
  const Dtype to = buffer_dtype(s_, p_, op.buffer);
  std::uint64_t written = 0;  // output elements the kernel covers
  Status s;
  if (src != 0) {
    const Dtype from = buffer_dtype(s_, p_, op.src);
    const Bytes src_bytes = bytes_of(op.src);
    const bool target_ok = std::find(std::begin(kTargets), std::end(kTargets), to) != std::end(kTargets);
    const std::uint64_t out_elems = dst_bytes / compute_elem_bytes(target_ok ? to : Dtype::fp32);
    if (target_ok && kernels::is_upcast_source(from)) {
      const std::uint64_t n = std::min(elems_that_fit(src_bytes, from), out_elems);
      if (n > 0) s = rt_.upcast(src, from, dst, to, n, 1.0f, st);
      written = n;
    } else if (target_ok && kernels::is_dequant_source(from)) {
      const std::uint32_t block = dtype_info(from).block_elems;
      const std::uint64_t n = std::min(elems_that_fit(src_bytes, from), out_elems / block * block);
      if (n > 0) s = rt_.dequant(src, from, dst, to, n, st);
      written = n;
    }
    if (!s) return s;
    if (written > 0) ++rep_.launches;
    const Bytes done = written * compute_elem_bytes(target_ok ? to : Dtype::fp32);
    if (done >= dst_bytes) return ok_status();
    if (written == 0) ++rep_.fallback_touches;
    ++rep_.launches;
    return rt_.touch(dst + done, dst_bytes - done, kTouchValue, st);  // the rest of the output
  }
  ++rep_.fallback_touches;
  ++rep_.launches;
  return rt_.touch(dst, dst_bytes, kTouchValue, st);
}

// ComfyUI's soft_empty_cache rule on the real free memory.
Status CudaBackend::Case::flush_if_cached() {
  Bytes free_now = 0;
  Bytes total = 0;
  if (Status st = rt_.mem_get_info(free_now, total); !st) return st;
  Bytes reserved = 0;
  Bytes active = 0;
  if (caching_) {
    reserved = caching_->stats().reserved.current;
    active = caching_->stats().active.current;
  } else if (!read_allocator(free_now, reserved, active)) {
    return ok_status();  // read_allocator already ended the case
  }
  const Bytes cached = sat_sub(reserved, active);
  if (static_cast<double>(cached) <= kCacheFlushShare * static_cast<double>(free_now + cached)) return ok_status();
  if (caching_) {
    caching_->empty_cache();
  } else if (options_.mode == AllocatorMode::async) {
    if (Status st = rt_.device_synchronize(); !st) return st;
    return rt_.pool_trim(pool_, 0);
  }
  return ok_status();
}

// The allocator's reserved and allocated bytes now: raw = what cudaMalloc took from the device
// (the drop of free memory since the baseline); async = the pool's ReservedMemCurrent /
// UsedMemCurrent; caching = the model's statistics (its segments are real allocations).
bool CudaBackend::Case::read_allocator(Bytes free_now, Bytes& reserved, Bytes& allocated) {
  switch (options_.mode) {
    case AllocatorMode::raw:
      // What cudaMalloc took: the drop of free memory, less aimdo's VMM pages and the
      // allocations standing in for other processes.
      reserved = sat_sub(held_now(free_now), vmm_ ? vmm_->held() : 0);
      allocated = stats_.allocated.current;
      return true;
    case AllocatorMode::async: {
      std::uint64_t res = 0;
      std::uint64_t used = 0;
      Status st = rt_.pool_get(pool_, PoolAttr::reserved_current, res);
      if (st) st = rt_.pool_get(pool_, PoolAttr::used_current, used);
      if (!st) {
        fault(st, static_cast<std::uint32_t>(r_.ops_executed));
        return false;
      }
      reserved = res;
      allocated = used;
      return true;
    }
    case AllocatorMode::caching:
    case AllocatorMode::caching_expandable:
      reserved = caching_->stats().reserved.current;
      allocated = caching_->stats().allocated.current;
      return true;
  }
  return true;
}

// After each op, exactly as the sim backend measures: stage peaks over non-transition ops.
bool CudaBackend::Case::measure(std::uint32_t i) {
  const Op& op = p_.ops[i];
  Bytes free_now = 0;
  Bytes total = 0;
  if (Status st = rt_.mem_get_info(free_now, total); !st) {
    fault(st, i);
    return false;
  }
  min_free_ = std::min(min_free_, free_now);
  Bytes reserved = 0;
  Bytes allocated = 0;
  if (!read_allocator(free_now, reserved, allocated)) return false;
  if (!caching_) {
    // Keep the tallied stats' reserved in step with what was measured.
    if (reserved > stats_.reserved.current) stats_.reserved.add(reserved - stats_.reserved.current);
    else stats_.reserved.sub(stats_.reserved.current - reserved);
  }
  const std::uint16_t stage = op.stage;
  if (!is_transition(op) && (reserved > r_.stage_reserved_peak[stage] || r_.stage_reserved_peak[stage] == 0)) {
    r_.stage_reserved_peak[stage] = reserved;
    r_.stage_reserved_peak_op[stage] = i;
    r_.stage_allocated_at_peak[stage] = allocated;
    r_.stage_held_at_peak[stage] = held_for_others(op.stream, op_request(p_, op));
  }
  if (reserved > r_.reserved_peak) {
    r_.reserved_peak = reserved;
    r_.reserved_peak_op = i;
  }
  if (live_bytes_ > r_.live_peak) r_.live_peak = live_bytes_;
  const Bytes device_used = sat_sub(s_.device.total, free_now);  // the emulated card's used memory
  if (device_used > r_.device_peak) r_.device_peak = device_used;
  if (opt_.record_trace) {
    TraceRow row{i, live_bytes_, allocated, reserved, device_used};
    if (aimdo_) {
      row.vbar = aimdo_->vbar_resident();
      row.cast = aimdo_->cast_bytes();
      row.time_us = now_us_;
    }
    r_.trace.push_back(row);
  }
  return true;
}

// Gives back everything the case left and checks the device's free memory came back.
void CudaBackend::Case::cleanup() {
  if (r_.fatal) {
    // The context is gone: nothing can be freed or measured any more.
    caching_.reset();
    layer_.reset();
    return;
  }
  auto note = [&](const Status& st) {
    if (!st && !r_.fatal) {
      r_.warnings.push_back(fmt::format("cleanup: {}", st.describe()));
      if (st.err == Err::sticky) {
        r_.fatal = true;
        b_.poisoned_ = st.describe();
      }
    }
  };
  note(rt_.device_synchronize());
  try {
    for (std::uint32_t b = 0; b < p_.buffers.size() && !r_.fatal; ++b) note(free_buffer(b));
    if (caching_) caching_->empty_cache();
    if (aimdo_) aimdo_->release_all();
    for (const auto& [ptr, n] : others_) note(rt_.free(ptr));
    others_.clear();
    others_held_ = 0;
  } catch (const CudaFault& e) {
    note(e.status());
  }
  caching_.reset();
  hooked_.reset();
  if (vmm_) {
    std::string why;
    if (vmm_->release_all(&why) > 0) r_.warnings.push_back(why);
  }
  if (layer_) {
    std::string why;
    if (layer_->release_all(&why) > 0) r_.warnings.push_back(why);
    layer_.reset();
  }
  if (pool_.h != 0) {
    note(rt_.device_synchronize());
    note(rt_.pool_trim(pool_, 0));
    if (pool_owned_) note(rt_.pool_destroy(pool_));
  }
  note(rt_.device_synchronize());
  note(rt_.last_error());
  if (r_.fatal) return;
  Bytes total = 0;
  if (Status st = rt_.mem_get_info(rep_.free_after_cleanup, total); !st) {
    note(st);
    return;
  }
  const Bytes missing = sat_sub(rep_.free_before, rep_.free_after_cleanup);
  if (missing > b_.cfg_.leak_tolerance) {
    rep_.leaked = missing;
    r_.warnings.push_back(fmt::format(
        "device memory did not come back after the case: {} missing (free {} before the first op, {} after cleanup); the "
        "ballast is refitted for the next case",
        format_mib(missing), format_mib(rep_.free_before), format_mib(rep_.free_after_cleanup)));
  }
}

ExecResult CudaBackend::execute(const Scenario& s, const Program& p, const ExecOptions& opt) {
  ExecResult r;
  r.backend = "cuda";
  r.environment = info_.describe();
  if (poisoned_) {
    r.stage_reserved_peak.assign(p.stage_begin.size(), 0);
    r.stage_reserved_peak_op.assign(p.stage_begin.size(), 0);
    r.stage_allocated_at_peak.assign(p.stage_begin.size(), 0);
    r.stage_held_at_peak.assign(p.stage_begin.size(), 0);
    r.error = fmt::format("the CUDA context is unusable after an earlier sticky error ({}); restart the process", *poisoned_);
    r.fatal = true;
    return r;
  }
  Case c(*this, s, p, opt, r);
  c.run();
  return r;
}

}  // namespace vf::cuda
