// gpu-check sections that measure the device itself: calibration and kernels.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "harness/cuda/gpu_check_detail.h"
#include "harness/cuda/gpu_check_sequences.h"
#include "harness/sim/async_pool.h"
#include "harness/sim/device.h"
#include "kernels/convert.h"
#include "kernels/reference.h"

namespace vf::cuda::detail {

namespace {

constexpr Dtype kUpcastFrom[] = {Dtype::fp8_e4m3fn, Dtype::fp8_e5m2, Dtype::fp16, Dtype::bf16};
constexpr Dtype kDequantFrom[] = {Dtype::q8_0, Dtype::q4_0, Dtype::q4_k, Dtype::q6_k};
constexpr Dtype kTargets[] = {Dtype::fp32, Dtype::fp16, Dtype::bf16};
// The bandwidth target of kernels/README.md: every conversion >= 70% of a D2D copy.
constexpr double kBandwidthTarget = 0.70;
constexpr std::uint64_t kReleaseNever = ~std::uint64_t{0};

using Clock = std::chrono::steady_clock;
double micros_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }


// Median and max of a latency sample, microseconds.
Json latency(std::vector<double> us) {
  if (us.empty()) return nullptr;
  std::sort(us.begin(), us.end());
  return Json{{"calls", us.size()}, {"median_us", us[us.size() / 2]}, {"max_us", us.back()}};
}

// Runs every kernel variant once on a scratch buffer, and every other kind of device work the
// cuda backend does (memset, D2D and pinned H2D copies, events across streams): with lazy module
// loading the driver loads code and may allocate for each path the first time it is used.
void warm_up(Runtime& rt, DevPtr scratch, Bytes bytes, Stream s) {
  for (Dtype from : kUpcastFrom) {
    for (Dtype to : kTargets) need(rt.upcast(scratch, from, scratch + bytes / 2, to, 256, 1.0f, s));
  }
  for (Dtype from : kDequantFrom) {
    for (Dtype to : kTargets) need(rt.dequant(scratch, from, scratch + bytes / 2, to, 256, s));
  }
  need(rt.touch(scratch, bytes, 1, s));
  need(rt.copy_kernel(scratch + bytes / 2, scratch, bytes / 2, s));
  need(rt.memset_async(scratch, 0, bytes / 2, s));
  need(rt.copy_d2d(scratch + bytes / 2, scratch, bytes / 2, s));
  constexpr Bytes kHost = 64 * KiB;
  void* host = nullptr;
  need(rt.host_alloc(host, kHost));
  std::memset(host, 0, kHost);
  const Status h2d = rt.memcpy_h2d_async(scratch, host, std::min(kHost, bytes), s);
  Stream other;
  Event e;
  Status ev = rt.stream_create(other);
  if (ev) ev = rt.event_create(e, false);
  if (ev) ev = rt.event_record(e, s);
  if (ev) ev = rt.stream_wait_event(other, e);
  const Status sync = rt.device_synchronize();
  (void)rt.host_free(host);
  need(h2d);
  need(ev);
  need(sync);
  need(rt.event_destroy(e));
  need(rt.stream_destroy(other));
}

// What the simulator's device charges for these cudaMalloc sizes in a fresh process
// (harness/sim/device.cpp: 2 MiB pages, small buffers packed into a shared page).
Bytes model_charge(std::initializer_list<Bytes> sizes) {
  DeviceSpec spec;
  spec.total = 64 * GiB;
  spec.context_overhead = 0;
  sim::SimDevice dev(spec);
  for (Bytes b : sizes) (void)dev.cuda_malloc(b);
  return dev.charged();
}

// One async pool sweep: allocations kept live, the pool's reserved / used after each (and the
// device's free memory, read without a synchronize, which would trim a threshold-0 pool), then
// everything freed and synchronized, then trimmed.
Json pool_sweep(Runtime& rt, Pool pool, std::uint64_t threshold, const std::vector<Bytes>& sizes, Stream s,
                const Deadline& dl) {
  Json out;
  out["release_threshold"] = threshold == kReleaseNever ? Json("UINT64_MAX") : Json(threshold);
  need(rt.pool_trim(pool, 0));
  need(rt.pool_set(pool, PoolAttr::release_threshold, threshold));
  need(rt.pool_set(pool, PoolAttr::reserved_high, 0));
  need(rt.pool_set(pool, PoolAttr::used_high, 0));
  std::vector<DevPtr> live;
  Json steps = Json::array();
  std::uint64_t prev = 0;
  need(rt.pool_get(pool, PoolAttr::reserved_current, prev));
  out["reserved_at_start"] = prev;
  Bytes free0 = 0;
  Bytes total = 0;
  need(rt.mem_get_info(free0, total));
  Bytes smallest_growth = 0;
  for (Bytes size : sizes) {
    if (dl.passed()) break;
    DevPtr p = 0;
    const Status st = rt.malloc_async(p, size, pool, s);
    if (!st) {
      (void)rt.last_error();
      steps.push_back({{"size", size}, {"error", st.describe()}});
      break;
    }
    live.push_back(p);
    std::uint64_t reserved = 0;
    std::uint64_t used = 0;
    Bytes free = 0;
    need(rt.pool_get(pool, PoolAttr::reserved_current, reserved));
    need(rt.pool_get(pool, PoolAttr::used_current, used));
    need(rt.mem_get_info(free, total));
    steps.push_back({{"size", size}, {"reserved", reserved}, {"used", used}, {"device_free_drop", delta(free0, free)}});
    if (reserved > prev) smallest_growth = smallest_growth == 0 ? reserved - prev : std::min(smallest_growth, reserved - prev);
    prev = reserved;
  }
  out["steps"] = std::move(steps);
  for (DevPtr p : live) need(rt.free_async(p, s));
  need(rt.device_synchronize());
  std::uint64_t reserved = 0;
  std::uint64_t used = 0;
  std::uint64_t high = 0;
  need(rt.pool_get(pool, PoolAttr::reserved_current, reserved));
  need(rt.pool_get(pool, PoolAttr::used_current, used));
  need(rt.pool_get(pool, PoolAttr::reserved_high, high));
  out["after_free_and_sync"] = {{"reserved", reserved}, {"used", used}};
  out["reserved_high"] = high;
  need(rt.pool_trim(pool, 0));
  need(rt.pool_get(pool, PoolAttr::reserved_current, reserved));
  out["after_trim_to_0"] = {{"reserved", reserved}};
  out["smallest_growth"] = smallest_growth;
  out["fit"] = fit_pool_step(out);
  return out;
}

// Float value of output element i of a compute dtype.
double out_value(const std::byte* p, Dtype d, std::uint64_t i) {
  switch (d) {
    case Dtype::fp32: {
      float f = 0;
      std::memcpy(&f, p + i * 4, 4);
      return f;
    }
    case Dtype::fp16: {
      std::uint16_t h = 0;
      std::memcpy(&h, p + i * 2, 2);
      return kernels::fp16_bits_to_float(h);
    }
    default: {
      std::uint16_t h = 0;
      std::memcpy(&h, p + i * 2, 2);
      return kernels::bf16_bits_to_float(h);
    }
  }
}

struct Compare {
  std::uint64_t mismatches = 0;
  std::uint64_t unwritten = 0;
  double max_rel = 0;
};

// Device output vs the host reference, element by element: bit-equal, or both NaN (the device
// returns a canonical NaN, kernels/README.md). Relative error over the finite values.
void compare(const std::vector<std::byte>& dev, const std::vector<std::byte>& ref, Dtype to, std::uint64_t n,
             std::uint8_t sentinel, Compare& c) {
  const std::uint32_t eb = compute_elem_bytes(to);
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::byte* a = dev.data() + i * eb;
    const std::byte* b = ref.data() + i * eb;
    if (std::memcmp(a, b, eb) == 0) continue;
    const double x = out_value(dev.data(), to, i);
    const double y = out_value(ref.data(), to, i);
    if (std::isnan(x) && std::isnan(y)) continue;
    ++c.mismatches;
    bool all_sentinel = true;
    for (std::uint32_t k = 0; k < eb; ++k) all_sentinel = all_sentinel && a[k] == std::byte{sentinel};
    if (all_sentinel) ++c.unwritten;
    if (std::isfinite(x) && std::isfinite(y)) c.max_rel = std::max(c.max_rel, std::abs(x - y) / std::max(std::abs(y), 1e-30));
    else c.max_rel = INFINITY;
  }
}

}  // namespace

// ---- calibration ------------------------------------------------------------------------------

void section_calibration(CheckContext& c, const Deadline& dl, Json& out) {
  Runtime& rt = c.rt;
  const bool quick = c.cfg.quick;
  out["suggested"] = {{"context_overhead", nullptr}, {"pool_granularity", nullptr}};
  // Each measurement runs on its own: a failure is recorded under errors.<name>, the others still
  // run, and the results file is rewritten after each (a killed process keeps what was measured).
  std::vector<std::string> failed;
  auto step = [&](const char* name, auto&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      out["errors"][name] = e.what();
      failed.emplace_back(name);
    }
    c.checkpoint(out);
  };

  // 1. Context: other processes and NVML before the context exists, then cudaFree(0), a stream,
  //    a small tensor, the first kernel, and everything the cuda backend's warm-up does.
  Json ctx;
  Bytes total = 0;
  Stream s;
  bool have_stream = false;
  step("context", [&] {
    NvmlMemory nv{};
    const bool nvml_before = rt.nvml_available() && rt.nvml_memory(nv).ok();
    ctx["nvml_used_before_context"] = nvml_before ? Json(nv.used) : Json(nullptr);
    // Memory other processes hold is in every device-wide reading below; it must not end up in
    // the committed constant. Before our context exists, every listed process is another one.
    Json others = {{"checked", false}};
    if (rt.nvml_available()) {
      NvmlProcesses procs;
      if (rt.nvml_processes(procs).ok()) others = {{"checked", true}, {"processes", procs.count}, {"used", procs.all}};
    }
    ctx["other_processes_before_context"] = others;
    const auto t0 = Clock::now();
    need(rt.init_device(0));
    ctx["context_create_us"] = micros_since(t0);
    DeviceInfo info;
    need(rt.device_info(info));
    out["device"] = device_json(info);
    Bytes free_ctx = 0;
    need(rt.mem_get_info(free_ctx, total));
    ctx["total"] = total;
    ctx["free_after_context"] = free_ctx;
    if (rt.nvml_available() && rt.nvml_memory(nv).ok()) {
      ctx["nvml_used_after_context"] = nv.used;
      if (nvml_before) ctx["nvml_context_delta"] = delta(nv.used, ctx["nvml_used_before_context"].get<Bytes>());
    }
    // A stream is part of what a runtime creates before its first tensor (PyTorch's too): its
    // cost, if any, stays in the overhead.
    need(rt.stream_create(s));
    have_stream = true;
    const Bytes free_stream = free_now(rt);
    ctx["stream_bytes"] = delta(free_ctx, free_stream);
    DevPtr small = 0;
    need(rt.malloc(small, 512));
    const Bytes free_small = free_now(rt);
    need(rt.touch(small, 512, 1, s));
    const Bytes free_first = free_now(rt);
    constexpr Bytes kScratch = 2 * MiB;
    DevPtr scratch = 0;
    need(rt.malloc(scratch, kScratch));
    const Bytes free_scratch = free_now(rt);
    warm_up(rt, scratch, kScratch, s);
    const Bytes free_all = free_now(rt);
    ctx["free_after_stream"] = free_stream;
    ctx["free_after_small_tensor"] = free_small;
    ctx["small_tensor_charge"] = delta(free_stream, free_small);
    ctx["free_after_first_kernel"] = free_first;
    ctx["first_kernel_bytes"] = delta(free_small, free_first);
    ctx["scratch_charge"] = delta(free_first, free_scratch);
    ctx["free_after_warm_up"] = free_all;
    ctx["warm_up_bytes"] = delta(free_scratch, free_all);
    // Our two buffers are taken off at what the simulator charges for them (a 512 B buffer opens
    // a 2 MiB page, the scratch is one page): anything the driver takes beyond that on a first
    // cudaMalloc is overhead the simulator does not otherwise model, so it stays in.
    const Bytes own = model_charge({512, kScratch});
    const std::int64_t own_measured = delta(free_stream, free_small) + delta(free_first, free_scratch);
    ctx["own_buffers_model_charge"] = own;
    ctx["own_buffers_measured_charge"] = own_measured;
    if (own_measured != static_cast<std::int64_t>(own)) {
      ctx["own_buffers_note"] = "the driver charged our two buffers differently from the simulator's rule";
    }
    const Bytes used = total - free_all;
    ctx["context_overhead"] = used - std::min(own, used);
    ctx["definition"] = "total - free after cudaFree(0), a stream, one 512 B tensor, a 2 MiB scratch buffer and the warm-up "
                        "(every vramfuzz kernel, memset, D2D and pinned H2D copies, a cross-stream event), less the "
                        "simulator's charge for the two buffers";
    need(rt.free(scratch));
    need(rt.free(small));
    out["context"] = ctx;
    if (others["checked"].get<bool>() && others.value("used", Bytes{0}) > 0) {
      out["suggested"]["context_overhead_note"] =
          fmt::format("not suggested: {} other process(es) held {} B on the device when the check began",
                      others["processes"].get<std::uint32_t>(), others["used"].get<Bytes>());
    } else {
      out["suggested"]["context_overhead"] = ctx["context_overhead"];
      if (!others["checked"].get<bool>()) {
        out["suggested"]["context_overhead_note"] = "other processes not checked (no NVML): make sure the GPU was idle";
      }
    }
  });
  out["context"] = ctx;
  if (!have_stream) {
    // Without a context and a stream nothing else can be measured.
    throw SectionFailure(fmt::format("context: {}", out["errors"].value("context", std::string("failed"))));
  }

  // 2. cudaMalloc charging: the free-memory drop per size, and what comes back at cudaFree.
  step("cudamalloc", [&] {
    const std::vector<Bytes> sizes = {1,       512,         4 * KiB,     64 * KiB, 512 * KiB, 1 * MiB,  1 * MiB + 1,  2 * MiB - 1,
                                      2 * MiB, 2 * MiB + 1, 3 * MiB,     4 * MiB,  10 * MiB,  20 * MiB + 1, 32 * MiB, 64 * MiB};
    Json sweep = Json::array();
    for (Bytes size : sizes) {
      if (dl.passed()) break;
      const Bytes f0 = free_now(rt);
      DevPtr p = 0;
      need(rt.malloc(p, size));
      const Bytes f1 = free_now(rt);
      need(rt.free(p));
      const Bytes f2 = free_now(rt);
      sweep.push_back({{"size", size}, {"charged", delta(f0, f1)}, {"returned", delta(f2, f1)}, {"model", model_charge({size})}});
      out["cudamalloc"] = sweep;
    }
    out["cudamalloc"] = sweep;
  });
  // Packing of small buffers into shared pages.
  step("cudamalloc_packing", [&] {
    Json packing = Json::array();
    for (const auto& [count, size] : {std::pair<int, Bytes>{32, 64 * KiB}, {256, 512}, {8, 1 * MiB}}) {
      if (dl.passed()) break;
      const Bytes f0 = free_now(rt);
      std::vector<DevPtr> ps(static_cast<std::size_t>(count));
      for (DevPtr& p : ps) need(rt.malloc(p, size));
      const Bytes f1 = free_now(rt);
      for (DevPtr p : ps) need(rt.free(p));
      packing.push_back({{"count", count}, {"size", size}, {"charged", delta(f0, f1)}, {"requested", count * size}});
      out["cudamalloc_packing"] = packing;
    }
    out["cudamalloc_packing"] = packing;
  });

  // 3. The async pool's growth: a sweep of sizes kept live, with release threshold 0 and
  //    UINT64_MAX on a dedicated pool, and UINT64_MAX on the default pool (what PyTorch's
  //    backend:cudaMallocAsync uses, so the suggested step comes from it). The run of 1 MiB
  //    requests at the end shows growth from small requests several times over.
  std::vector<Bytes> pool_sizes = {512, 4 * KiB, 1 * MiB, 1 * MiB, 1 * MiB, 1 * MiB, 2 * MiB, 3 * MiB, 17 * MiB, 33 * MiB, 100 * MiB};
  if (!quick) pool_sizes.push_back(1 * GiB);
  pool_sizes.insert(pool_sizes.end(), 40, 1 * MiB);
  Json pools = Json::array();
  for (const auto& pool_kind : {std::pair<bool, std::uint64_t>{true, 0}, {true, kReleaseNever}, {false, kReleaseNever}}) {
    // Plain variables, not a structured binding: the lambda below captures them, which C++20
    // allows for bindings only from clang 16 (clang 14, Debian 12's, refuses it).
    const bool dedicated = pool_kind.first;
    const std::uint64_t threshold = pool_kind.second;
    if (dl.passed()) break;
    const std::string name = fmt::format("async_pool_{}_{}", dedicated ? "dedicated" : "default",
                                         threshold == kReleaseNever ? "UINT64_MAX" : "0");
    step(name.c_str(), [&] {
      Pool pool;
      need(dedicated ? rt.pool_create(pool) : rt.default_pool(pool));
      Json j;
      try {
        j = pool_sweep(rt, pool, threshold, pool_sizes, s, dl);
      } catch (...) {
        if (dedicated) (void)rt.pool_destroy(pool);
        throw;
      }
      j["pool"] = dedicated ? "dedicated" : "default";
      pools.push_back(std::move(j));
      out["async_pool"] = pools;
      if (dedicated) {
        need(rt.pool_destroy(pool));
      } else {
        need(rt.pool_set(pool, PoolAttr::release_threshold, 0));
      }
    });
  }
  out["async_pool"] = pools;
  {
    Json fit_default = nullptr;
    Json fit_dedicated = nullptr;
    for (const Json& p : pools) {
      if (p["release_threshold"] != "UINT64_MAX") continue;
      (p["pool"] == "default" ? fit_default : fit_dedicated) = p["fit"]["step"];
    }
    out["suggested"]["pool_granularity"] = fit_default;
    if (fit_default.is_null()) {
      out["suggested"]["pool_granularity_note"] =
          "no single growth step reproduces the default pool's sweep: keep the current default and read async_pool[].fit";
    } else if (fit_dedicated != fit_default) {
      out["suggested"]["pool_granularity_note"] = fmt::format("the dedicated pool's sweep fits {}, the default pool's {}",
                                                              fit_dedicated.dump(), fit_default.dump());
    }
  }
  c.checkpoint(out);

  // 4. VMM granularity.
  step("vmm_granularity", [&] {
    Bytes gmin = 0;
    Bytes grec = 0;
    need(rt.vmm_granularity(gmin, false));
    need(rt.vmm_granularity(grec, true));
    out["vmm_granularity"] = {{"minimum", gmin}, {"recommended", grec}};
  });

  // 5. NVML's per-process figure next to the device view while the process holds memory, and
  //    the latency of the queries (NVML's process query takes the driver's lock).
  step("nvml", [&] {
    Json nvml;
    nvml["available"] = rt.nvml_available();
    nvml["note"] = rt.nvml_note();
    const Bytes hold_bytes = quick ? 64 * MiB : 1 * GiB;
    DevPtr hold = 0;
    need(rt.malloc(hold, hold_bytes));
    const Bytes f_hold = free_now(rt);
    nvml["held"] = hold_bytes;
    nvml["total_minus_free"] = total - f_hold;
    if (ctx.contains("context_overhead")) nvml["context_plus_held"] = ctx["context_overhead"].get<Bytes>() + hold_bytes;
    if (rt.nvml_available()) {
      NvmlProcesses procs;
      if (Status st = rt.nvml_processes(procs); st) {
        nvml["process_used"] = procs.self ? Json(*procs.self) : Json(nullptr);
        nvml["all_processes_used"] = procs.all;
        nvml["processes"] = procs.count;
        if (!procs.self) nvml["process_note"] = "this pid is not listed (a container's pid namespace?)";
      } else {
        nvml["process_error"] = st.describe();
      }
      std::vector<double> mem_us;
      std::vector<double> proc_us;
      for (int i = 0; i < 20 && !dl.passed(); ++i) {
        NvmlMemory m{};
        auto t = Clock::now();
        (void)rt.nvml_memory(m);
        mem_us.push_back(micros_since(t));
        NvmlProcesses p;
        t = Clock::now();
        (void)rt.nvml_processes(p);
        proc_us.push_back(micros_since(t));
      }
      nvml["latency_memory_info"] = latency(mem_us);
      nvml["latency_running_processes"] = latency(proc_us);
    }
    std::vector<double> info_us;
    for (int i = 0; i < 100; ++i) {
      Bytes f = 0;
      Bytes t = 0;
      const auto t1 = Clock::now();
      (void)rt.mem_get_info(f, t);
      info_us.push_back(micros_since(t1));
    }
    nvml["latency_cudaMemGetInfo"] = latency(info_us);
    need(rt.free(hold));
    out["nvml"] = nvml;
  });

  // 6. Recorded sequences (gpu_check_sequences.cpp): seeded cudaMalloc / cudaFree and pool
  //    programs with the device's answer after every call, the OOM probe and the VMM page cost.
  calibration_sequences(c, dl, s, out, [&](const char* name, const std::function<void()>& fn) { step(name, fn); });
  (void)rt.stream_destroy(s);

  if (!failed.empty()) {
    std::string names;
    for (const std::string& n : failed) names += (names.empty() ? "" : ", ") + n;
    throw SectionFailure(fmt::format("{} measurement(s) failed: {} (sections.calibration.errors)", failed.size(), names));
  }
}

// ---- kernels ----------------------------------------------------------------------------------

void section_kernels(CheckContext& c, const Deadline& dl, Json& out) {
  Runtime& rt = c.rt;
  const bool quick = c.cfg.quick;
  need(rt.init_device(0));
  Stream s;
  need(rt.stream_create(s));
  std::mt19937_64 rng(c.cfg.seed);
  constexpr Bytes kGuard = 64;  // bytes after each output that must stay untouched

  // Correctness: random data (every bit pattern: NaN, inf, subnormals), two sentinels.
  Json results = Json::array();
  out["correctness"] = results;
  std::uint64_t total_mismatches = 0;
  std::uint64_t total_unwritten = 0;
  double worst_rel = 0;
  struct Kernel {
    Dtype from;
    Dtype to;
  };
  std::vector<Kernel> kernels;
  for (Dtype f : kUpcastFrom) {
    for (Dtype t : kTargets) kernels.push_back({f, t});
  }
  for (Dtype f : kDequantFrom) {
    for (Dtype t : kTargets) kernels.push_back({f, t});
  }
  void* staging = nullptr;
  Bytes staging_bytes = 0;
  for (const Kernel& k : kernels) {
    if (dl.passed()) break;
    const DtypeInfo& fi = dtype_info(k.from);
    const bool dequant = fi.gguf_quantized;
    const std::uint64_t n = dequant ? (quick ? 37 : 4099) * std::uint64_t{fi.block_elems} : (quick ? 12295 : (1u << 20) + 4093);
    const kernels::ConvertBytes cb = kernels::check_convert(k.from, k.to, n, 1.0f);
    std::vector<std::byte> src(cb.src);
    for (std::byte& b : src) b = static_cast<std::byte>(rng());
    std::vector<std::byte> ref(cb.dst);
    if (dequant) {
      kernels::dequant(src, k.from, n, ref, k.to);
    } else {
      kernels::upcast(src, k.from, n, 1.0f, ref, k.to);
    }
    if (staging_bytes < std::max(cb.src, cb.dst + kGuard)) {
      if (staging != nullptr) need(rt.host_free(staging));
      staging_bytes = std::max(cb.src, cb.dst + kGuard);
      need(rt.host_alloc(staging, staging_bytes));
    }
    DevPtr dsrc = 0;
    DevPtr ddst = 0;
    need(rt.malloc(dsrc, cb.src));
    need(rt.malloc(ddst, cb.dst + kGuard));
    std::memcpy(staging, src.data(), cb.src);
    need(rt.memcpy_h2d_async(dsrc, staging, cb.src, s));
    Compare cmp;
    bool guard_ok = true;
    std::vector<std::byte> dev(cb.dst + kGuard);
    for (const std::uint8_t sentinel : {std::uint8_t{0xa5}, std::uint8_t{0x5a}}) {
      need(rt.memset_async(ddst, sentinel, cb.dst + kGuard, s));
      need(dequant ? rt.dequant(dsrc, k.from, ddst, k.to, n, s) : rt.upcast(dsrc, k.from, ddst, k.to, n, 1.0f, s));
      need(rt.device_synchronize());
      need(rt.memcpy_d2h(dev.data(), ddst, cb.dst + kGuard));
      compare(dev, ref, k.to, n, sentinel, cmp);
      for (Bytes g = 0; g < kGuard; ++g) guard_ok = guard_ok && dev[cb.dst + g] == std::byte{sentinel};
    }
    need(rt.free(dsrc));
    need(rt.free(ddst));
    total_mismatches += cmp.mismatches;
    total_unwritten += cmp.unwritten;
    worst_rel = std::max(worst_rel, cmp.max_rel);
    results.push_back({{"kernel", fmt::format("{} {} -> {}", dequant ? "dequant" : "upcast", dtype_name(k.from), dtype_name(k.to))},
                       {"elements", n},
                       {"mismatches", cmp.mismatches},
                       {"unwritten", cmp.unwritten},
                       {"guard_intact", guard_ok},
                       {"max_rel_err", std::isfinite(cmp.max_rel) ? Json(cmp.max_rel) : Json("inf")},
                       {"ok", cmp.mismatches == 0 && guard_ok}});
    out["correctness"] = results;
    c.checkpoint(out);
  }
  if (staging != nullptr) need(rt.host_free(staging));
  out["correctness_summary"] = {{"kernels", results.size()},
                                {"mismatches", total_mismatches},
                                {"unwritten", total_unwritten},
                                {"max_rel_err", std::isfinite(worst_rel) ? Json(worst_rel) : Json("inf")},
                                {"ok", total_mismatches == 0}};

  // Bandwidth: (bytes read + written) / time from events around repeated launches, against a
  // cudaMemcpyAsync D2D copy measured the same way.
  // 2^28 elements: the smallest source (q4_0, 4.5 bits each) is 144 MiB, several times the L2
  // (50 MiB on an H100 / H200), so no repetition reads its input from cache.
  const std::uint64_t n = quick ? (1u << 16) : (1u << 28);
  const int reps = quick ? 2 : 10;
  Event e0;
  Event e1;
  need(rt.event_create(e0, true));
  need(rt.event_create(e1, true));
  auto time_it = [&](auto&& launch, double bytes_per_launch) {
    for (int i = 0; i < 2; ++i) need(launch());
    need(rt.event_record(e0, s));
    for (int i = 0; i < reps; ++i) need(launch());
    need(rt.event_record(e1, s));
    need(rt.event_synchronize(e1));
    float ms = 0;
    need(rt.event_elapsed_ms(ms, e0, e1));
    const double seconds = std::max(static_cast<double>(ms), 1e-6) / 1000.0;
    return bytes_per_launch * reps / seconds / 1e9;  // GB/s
  };
  const Bytes copy_bytes = n * 4;
  DevPtr a = 0;
  DevPtr b = 0;
  need(rt.malloc(a, copy_bytes));
  need(rt.malloc(b, copy_bytes));
  need(rt.memset_async(a, 0x3c, copy_bytes, s));
  const double copy_gbps = time_it([&] { return rt.copy_d2d(b, a, copy_bytes, s); }, 2.0 * static_cast<double>(copy_bytes));
  Json bw = Json::array();
  bw.push_back({{"kernel", "cudaMemcpyAsync D2D (baseline)"}, {"bytes", 2 * copy_bytes}, {"gbps", copy_gbps}, {"ratio", 1.0}});
  out["bandwidth"] = bw;
  const Kernel bench[] = {{Dtype::fp8_e4m3fn, Dtype::bf16}, {Dtype::fp8_e4m3fn, Dtype::fp32}, {Dtype::fp8_e5m2, Dtype::bf16},
                          {Dtype::fp16, Dtype::fp32},       {Dtype::bf16, Dtype::fp32},       {Dtype::q8_0, Dtype::bf16},
                          {Dtype::q4_0, Dtype::bf16},       {Dtype::q4_k, Dtype::bf16},       {Dtype::q6_k, Dtype::bf16},
                          {Dtype::q8_0, Dtype::fp32},       {Dtype::q4_k, Dtype::fp32},       {Dtype::q6_k, Dtype::fp32}};
  bool all_fast = true;
  for (const Kernel& k : bench) {
    if (dl.passed()) break;
    const kernels::ConvertBytes cb = kernels::check_convert(k.from, k.to, n, 1.0f);
    DevPtr src = 0;
    DevPtr dst = 0;
    need(rt.malloc(src, cb.src));
    need(rt.malloc(dst, cb.dst));
    need(rt.memset_async(src, 0x3c, cb.src, s));
    const bool dequant = dtype_info(k.from).gguf_quantized;
    const double gbps = time_it(
        [&] { return dequant ? rt.dequant(src, k.from, dst, k.to, n, s) : rt.upcast(src, k.from, dst, k.to, n, 1.0f, s); },
        static_cast<double>(cb.src + cb.dst));
    need(rt.free(src));
    need(rt.free(dst));
    const double ratio = copy_gbps > 0 ? gbps / copy_gbps : 0;
    all_fast = all_fast && ratio >= kBandwidthTarget;
    bw.push_back({{"kernel", fmt::format("{} {} -> {}", dequant ? "dequant" : "upcast", dtype_name(k.from), dtype_name(k.to))},
                  {"bytes", cb.src + cb.dst},
                  {"gbps", gbps},
                  {"ratio", ratio},
                  {"ok", ratio >= kBandwidthTarget}});
    out["bandwidth"] = bw;
    c.checkpoint(out);
  }
  if (!dl.passed()) {
    const double touch = time_it([&] { return rt.touch(b, copy_bytes, 7, s); }, static_cast<double>(copy_bytes));
    bw.push_back({{"kernel", "touch (write only)"}, {"bytes", copy_bytes}, {"gbps", touch}, {"ratio", touch / copy_gbps}});
    const double kcopy = time_it([&] { return rt.copy_kernel(b, a, copy_bytes, s); }, 2.0 * static_cast<double>(copy_bytes));
    bw.push_back({{"kernel", "copy kernel"}, {"bytes", 2 * copy_bytes}, {"gbps", kcopy}, {"ratio", kcopy / copy_gbps}});
  }
  out["bandwidth"] = bw;
  out["bandwidth_target"] = kBandwidthTarget;
  out["bandwidth_ok"] = all_fast;
  out["tensor_elements"] = n;
  need(rt.free(a));
  need(rt.free(b));
  need(rt.event_destroy(e0));
  need(rt.event_destroy(e1));
  need(rt.stream_destroy(s));
}

}  // namespace vf::cuda::detail

namespace vf::cuda {

nlohmann::ordered_json fit_pool_step(const nlohmann::ordered_json& sweep) {
  using detail::Json;
  const Json& th = sweep.value("release_threshold", Json());
  const std::uint64_t threshold = th.is_number_unsigned() ? th.get<std::uint64_t>() : sim::kReleaseNever;
  const Bytes start = sweep.value("reserved_at_start", Bytes{0});
  std::vector<std::pair<Bytes, Bytes>> reqs;  // (size, device reserved - reserved at start)
  for (const Json& st : sweep.value("steps", Json::array())) {
    if (!st.contains("reserved") || !st.contains("size")) break;  // the request failed: the sweep ends there
    const Bytes r = st["reserved"].get<Bytes>();
    reqs.emplace_back(st["size"].get<Bytes>(), r >= start ? r - start : 0);
  }
  if (reqs.empty()) {
    return Json{{"steps_compared", 0}, {"candidates", 0}, {"matches", Json::array()}, {"step", nullptr},
                {"note", "no request of the sweep succeeded"}};
  }
  std::vector<Bytes> candidates;
  for (Bytes g = sim::kPoolGranularityQuantum; g <= 128 * MiB; g += sim::kPoolGranularityQuantum) candidates.push_back(g);
  const Bytes smallest = sweep.value("smallest_growth", Bytes{0});
  if (smallest > 128 * MiB && smallest % sim::kPoolGranularityQuantum == 0 && smallest <= 64 * GiB) candidates.push_back(smallest);

  Json matches = Json::array();
  Json closest = nullptr;
  std::size_t best = 0;
  for (const Bytes g : candidates) {
    DeviceSpec spec;
    spec.total = 4 * 1024 * GiB;  // the requests never run out of device here
    spec.context_overhead = 0;
    sim::SimDevice dev(spec);
    sim::AsyncOptions o;
    o.release_threshold = threshold;
    o.pool_granularity = g;
    sim::AsyncPoolAllocator pool(dev, o, 1);
    std::size_t ok = 0;
    Json mismatch = nullptr;
    for (const auto& [size, device] : reqs) {
      const bool fit = pool.malloc(static_cast<sim::BlockKey>(ok), size, 0);
      const Bytes model = pool.stats().reserved.current;
      if (!fit || model != device) {
        mismatch = {{"request", ok}, {"size", size}, {"device_reserved", device}, {"model_reserved", fit ? Json(model) : Json("OOM")}};
        break;
      }
      ++ok;
    }
    if (mismatch.is_null()) {
      matches.push_back(g);
    } else if (closest.is_null() || ok > best) {
      best = ok;
      closest = {{"step", g}, {"matched_requests", ok}, {"first_mismatch", mismatch}};
    }
  }
  Json out = {{"steps_compared", reqs.size()}, {"candidates", candidates.size()}, {"matches", matches}};
  out["step"] = matches.size() == 1 ? matches[0] : Json(nullptr);
  if (matches.empty()) out["closest"] = closest;
  if (matches.size() > 1) out["note"] = "the sweep does not tell these steps apart";
  return out;
}

}  // namespace vf::cuda
