// gpu-check calibration, part two: recorded allocation sequences. The sweeps of
// gpu_check_device.cpp ask the driver one question each (what does one cudaMalloc of this size
// cost); these record whole seeded programs of cudaMalloc / cudaFree and cudaMallocAsync /
// cudaFreeAsync with what the device reported after every call, so the simulator's raw and async
// models can be checked against (and fitted to) the driver op by op on a CPU afterwards, without
// another GPU run. Each sequence also carries the simulator's verdict on it (ops reproduced
// exactly), and the OOM probes record what a failed allocation leaves behind.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "harness/core/splitmix.h"
#include "harness/cuda/gpu_check_detail.h"
#include "harness/cuda/gpu_check_sequences.h"
#include "harness/sim/async_pool.h"
#include "harness/sim/device.h"

namespace vf::cuda::detail {

namespace {

// The size mixes two programs of each kind share (see raw_sequence_specs).
const std::vector<SizeBand> kTensorBands = {{4 * KiB, 40 * KiB, 5, 2}, {1 * MiB, 13 * MiB, 4, 2}, {13 * MiB, 100 * MiB, 1, 2}};
const std::vector<SizeBand> kMixedBands = {{1, 64 * KiB, 4, 1}, {64 * KiB, 2 * MiB, 3, 1}, {2 * MiB, 16 * MiB, 2, 1}, {16 * MiB, 160 * MiB, 1, 1}};

// A simulated device no recorded program can fill (no context: the recordings are drops).
DeviceSpec roomy_device() {
  DeviceSpec spec;
  spec.total = 1024 * GiB;
  spec.context_overhead = 0;
  return spec;
}

}  // namespace

// ---- the programs -------------------------------------------------------------------------------

std::vector<SeqOp> make_sequence(const SeqSpec& spec) {
  SplitMix64 rng{spec.seed};
  auto uniform = [&] { return static_cast<double>(rng.next() >> 11) * 0x1.0p-53; };
  unsigned total_weight = 0;
  for (const SizeBand& b : spec.bands) total_weight += b.weight;
  auto draw_size = [&]() -> Bytes {
    unsigned pick = static_cast<unsigned>(rng.below(total_weight));
    const SizeBand* band = &spec.bands.front();
    for (const SizeBand& b : spec.bands) {
      if (pick < b.weight) {
        band = &b;
        break;
      }
      pick -= b.weight;
    }
    // Log-uniform inside the band: as many 4 KiB biases as 40 MiB projections per band.
    const double lo = std::log(static_cast<double>(band->lo));
    const double hi = std::log(static_cast<double>(band->hi));
    Bytes s = static_cast<Bytes>(std::exp(lo + (hi - lo) * uniform()));
    s = std::clamp(s, band->lo, band->hi);
    if (band->align > 1) s = std::max(band->align, s / band->align * band->align);
    return s;
  };
  std::vector<SeqOp> ops;
  ops.reserve(spec.ops);
  std::vector<std::uint32_t> live;  // indexes of live allocations in ops
  Bytes live_bytes = 0;
  while (ops.size() < spec.ops) {
    const Bytes size = draw_size();
    const bool must_free = !live.empty() && live_bytes + size > spec.live_cap;
    const bool alloc = live.empty() || (!must_free && uniform() < spec.alloc_probability);
    if (alloc) {
      live.push_back(static_cast<std::uint32_t>(ops.size()));
      live_bytes += size;
      ops.push_back({true, size, 0});
    } else {
      const std::size_t k = rng.below(live.size());
      const std::uint32_t victim = live[k];
      live[k] = live.back();
      live.pop_back();
      live_bytes -= ops[victim].size;
      ops.push_back({false, ops[victim].size, victim});
    }
  }
  return ops;
}

// Size bands of the three programs. `tensors` follows a diffusion model's parameters (4-40 KiB
// biases and norms, 1-13 MiB convolution and attention weights, 13-100 MiB projections);
// `small` churns sub-page buffers only (how the driver packs and reuses them); `mixed` has every
// size class at once, the large ones not 2 MiB multiples (their tails).
std::vector<SeqSpec> raw_sequence_specs(bool quick) {
  const std::uint32_t n = quick ? 300 : 1500;
  return {
      {"tensors", 0x7e45035ull, n, 0.62, 6 * GiB, kTensorBands},
      {"small", 0x5a11ull, n, 0.60, 512 * MiB, {{512, 64 * KiB, 6, 1}, {64 * KiB, 2 * MiB, 4, 1}}},
      {"mixed", 0x31feedull, n, 0.60, 4 * GiB, kMixedBands},
  };
}

std::vector<SeqSpec> async_sequence_specs(bool quick) {
  const std::uint32_t n = quick ? 300 : 1500;
  return {
      {"tensors", 0xa57c0ull, n, 0.62, 6 * GiB, kTensorBands},
      {"mixed", 0xa5feedull, n, 0.60, 4 * GiB, kMixedBands},
  };
}

// ---- the simulator's answers --------------------------------------------------------------------

std::vector<Bytes> model_raw_charges(const std::vector<SeqOp>& ops) {
  sim::SimDevice dev(roomy_device());
  std::vector<sim::DeviceAlloc> allocs(ops.size());
  std::vector<Bytes> out;
  out.reserve(ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].alloc) {
      if (auto a = dev.cuda_malloc(ops[i].size)) allocs[i] = *a;
    } else {
      dev.cuda_free(allocs[ops[i].of]);
    }
    out.push_back(dev.charged());
  }
  return out;
}

std::vector<Bytes> model_async_reserved(const std::vector<SeqOp>& ops, Bytes granularity) {
  sim::SimDevice dev(roomy_device());
  sim::AsyncOptions o;
  o.pool_granularity = granularity;
  o.release_threshold = sim::kReleaseNever;
  sim::AsyncPoolAllocator pool(dev, o, 1);
  std::vector<Bytes> out;
  out.reserve(ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].alloc) {
      (void)pool.malloc(static_cast<sim::BlockKey>(i), ops[i].size, 0);
    } else {
      pool.free(static_cast<sim::BlockKey>(ops[i].of));
    }
    out.push_back(pool.stats().reserved.current);
  }
  return out;
}

Json compare_series(const std::vector<std::int64_t>& measured, const std::vector<Bytes>& model) {
  std::size_t exact = 0;
  Json first = nullptr;
  std::int64_t max_abs = 0;
  const std::size_t n = std::min(measured.size(), model.size());
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t d = measured[i] - static_cast<std::int64_t>(model[i]);
    if (d == 0) {
      ++exact;
    } else if (first.is_null()) {
      first = {{"op", i}, {"measured", measured[i]}, {"model", model[i]}};
    }
    max_abs = std::max(max_abs, d < 0 ? -d : d);
  }
  return {{"ops", n}, {"exact", exact}, {"max_abs_diff", max_abs}, {"first_mismatch", first}};
}

// ---- on the device ------------------------------------------------------------------------------

namespace {

// [alloc 1 | free 0, size (alloc) or the alloc's op index (free), pointer (alloc), free-memory
// drop since the start after the call and a synchronize]
Json run_raw(Runtime& rt, const SeqSpec& spec, const Deadline& dl) {
  const std::vector<SeqOp> ops = make_sequence(spec);
  std::vector<DevPtr> ptr(ops.size(), 0);
  const Bytes free0 = free_now(rt);
  Json rows = Json::array();
  std::vector<std::int64_t> drops;
  std::string stopped;
  std::size_t done = 0;
  try {
    for (; done < ops.size(); ++done) {
      if (dl.passed()) {
        stopped = "time box";
        break;
      }
      const SeqOp& op = ops[done];
      if (op.alloc) {
        need(rt.malloc(ptr[done], op.size));
      } else {
        need(rt.free(ptr[op.of]));
        ptr[op.of] = 0;
      }
      const std::int64_t d = delta(free0, free_now(rt));
      drops.push_back(d);
      rows.push_back(Json::array({op.alloc ? 1 : 0, op.alloc ? op.size : Bytes{op.of}, op.alloc ? ptr[done] : 0, d}));
    }
  } catch (const SectionFailure& e) {
    stopped = e.what();
  }
  for (DevPtr p : ptr) {
    if (p != 0) (void)rt.free(p);
  }
  const std::vector<SeqOp> ran(ops.begin(), ops.begin() + static_cast<std::ptrdiff_t>(drops.size()));
  Json out = {{"name", spec.name}, {"seed", spec.seed}, {"columns", {"alloc", "size_or_alloc_op", "ptr", "free_drop"}}};
  if (!stopped.empty()) out["stopped"] = stopped;
  out["model"] = compare_series(drops, model_raw_charges(ran));
  out["ops"] = std::move(rows);
  return out;
}

// [alloc 1 | free 0, size or alloc op, pointer, pool reserved, pool used] on one stream of the
// default pool with PyTorch's release threshold (UINT64_MAX), trimmed to 0 first.
Json run_async(Runtime& rt, Pool pool, Stream s, const SeqSpec& spec, const Deadline& dl) {
  const std::vector<SeqOp> ops = make_sequence(spec);
  std::vector<DevPtr> ptr(ops.size(), 0);
  need(rt.device_synchronize());
  need(rt.pool_set(pool, PoolAttr::release_threshold, sim::kReleaseNever));
  need(rt.pool_trim(pool, 0));
  std::uint64_t start = 0;
  need(rt.pool_get(pool, PoolAttr::reserved_current, start));
  Json rows = Json::array();
  std::vector<std::int64_t> reserved_series;
  std::string stopped;
  try {
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (dl.passed()) {
        stopped = "time box";
        break;
      }
      const SeqOp& op = ops[i];
      if (op.alloc) {
        need(rt.malloc_async(ptr[i], op.size, pool, s));
      } else {
        need(rt.free_async(ptr[op.of], s));
        ptr[op.of] = 0;
      }
      std::uint64_t reserved = 0;
      std::uint64_t used = 0;
      need(rt.pool_get(pool, PoolAttr::reserved_current, reserved));
      need(rt.pool_get(pool, PoolAttr::used_current, used));
      reserved_series.push_back(static_cast<std::int64_t>(reserved));
      rows.push_back(Json::array({op.alloc ? 1 : 0, op.alloc ? op.size : Bytes{op.of}, op.alloc ? ptr[i] : 0, reserved, used}));
    }
  } catch (const SectionFailure& e) {
    stopped = e.what();
  }
  for (DevPtr p : ptr) {
    if (p != 0) (void)rt.free_async(p, s);
  }
  need(rt.device_synchronize());
  need(rt.pool_trim(pool, 0));
  const std::vector<SeqOp> ran(ops.begin(), ops.begin() + static_cast<std::ptrdiff_t>(reserved_series.size()));
  Json out = {{"name", spec.name},
              {"seed", spec.seed},
              {"pool", "default"},
              {"release_threshold", "UINT64_MAX"},
              {"reserved_at_start", start},
              {"columns", {"alloc", "size_or_alloc_op", "ptr", "reserved", "used"}}};
  if (!stopped.empty()) out["stopped"] = stopped;
  // The simulator at every candidate growth step: which (if any) reproduces the sequence.
  Json fits = Json::object();
  for (Bytes g : {2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB, 32 * MiB, 64 * MiB}) {
    fits[fmt::format("{}MiB", g / MiB)] = compare_series(reserved_series, model_async_reserved(ran, g));
  }
  out["model"] = {{"granularity", sim::kDefaultPoolGranularity},
                  {"result", compare_series(reserved_series, model_async_reserved(ran, sim::kDefaultPoolGranularity))},
                  {"by_granularity", std::move(fits)}};
  out["ops"] = std::move(rows);
  return out;
}

// With a ballast leaving `room` free: a pool allocation that fits, one that cannot, what the pool
// and the device show after the failure, after a synchronize, and whether a later allocation
// reuses what the failed one left; then a failed cudaMalloc. Everything is released at the end.
Json run_oom_probe(Runtime& rt, Pool pool, Stream s, Bytes room) {
  Json out;
  need(rt.device_synchronize());
  need(rt.pool_set(pool, PoolAttr::release_threshold, sim::kReleaseNever));
  need(rt.pool_trim(pool, 0));
  const Bytes free0 = free_now(rt);
  if (free0 <= room + 64 * MiB) throw SectionFailure(fmt::format("oom probe: only {} free", format_mib(free0)));
  const Bytes ballast_bytes = (free0 - room) / (2 * MiB) * (2 * MiB);
  DevPtr ballast = 0;
  need(rt.malloc(ballast, ballast_bytes));
  DevPtr a = 0;
  DevPtr b = 0;
  DevPtr c = 0;
  auto pool_state = [&](const char* name) {
    std::uint64_t reserved = 0;
    std::uint64_t used = 0;
    Bytes free = 0;
    Bytes total = 0;
    need(rt.pool_get(pool, PoolAttr::reserved_current, reserved));
    need(rt.pool_get(pool, PoolAttr::used_current, used));
    need(rt.mem_get_info(free, total));
    out["steps"].push_back({{"after", name}, {"reserved", reserved}, {"used", used}, {"device_free", free}});
  };
  try {
    const Bytes free1 = free_now(rt);
    out["ballast"] = ballast_bytes;
    out["free_with_ballast"] = free1;
    const Bytes first = room / 4 / MiB * MiB;
    const Bytes too_big = 2 * room;
    out["first_request"] = first;
    out["failing_request"] = too_big;
    need(rt.malloc_async(a, first, pool, s));
    pool_state("first request");
    const Status fail = rt.malloc_async(b, too_big, pool, s);
    (void)rt.last_error();
    out["failing_request_status"] = fail ? "succeeded" : fail.describe();
    if (fail) need(rt.free_async(b, s));
    pool_state("failed request");
    need(rt.device_synchronize());
    pool_state("synchronize");
    const Bytes third = room / 2 / MiB * MiB;
    out["third_request"] = third;
    const Status st3 = rt.malloc_async(c, third, pool, s);
    (void)rt.last_error();
    out["third_request_status"] = st3 ? "succeeded" : st3.describe();
    pool_state("third request");
    if (st3) need(rt.free_async(c, s));
    c = 0;
    need(rt.free_async(a, s));
    a = 0;
    need(rt.device_synchronize());
    pool_state("free and synchronize");
    need(rt.pool_trim(pool, 0));
    pool_state("trim to 0");
    // cudaMalloc: a request larger than what is free.
    const Bytes f_raw = free_now(rt);
    DevPtr r = 0;
    const Status raw = rt.malloc(r, f_raw + 64 * MiB);
    (void)rt.last_error();
    if (raw) need(rt.free(r));
    out["raw_failing_request"] = f_raw + 64 * MiB;
    out["raw_failing_status"] = raw ? "succeeded" : raw.describe();
    out["raw_free_drop_after_failure"] = delta(f_raw, free_now(rt));
  } catch (...) {
    for (DevPtr p : {a, c}) {
      if (p != 0) (void)rt.free_async(p, s);
    }
    (void)rt.device_synchronize();
    (void)rt.pool_trim(pool, 0);
    (void)rt.free(ballast);
    throw;
  }
  need(rt.free(ballast));
  return out;
}

// What physical VMM memory costs: cuMemCreate of one aimdo page (32 MiB) and of one granule,
// mapped and given access, then unmapped and released.
Json run_vmm_probe(Runtime& rt) {
  Json out;
  Bytes gran = 0;
  need(rt.vmm_granularity(gran, false));
  const Bytes page = 32 * MiB;
  const Bytes free0 = free_now(rt);
  MemHandle h32;
  MemHandle hg;
  need(rt.vmm_create(h32, page));
  const Bytes f1 = free_now(rt);
  need(rt.vmm_create(hg, gran));
  const Bytes f2 = free_now(rt);
  DevPtr va = 0;
  need(rt.vmm_reserve(va, 2 * page, page));
  const Bytes f3 = free_now(rt);
  need(rt.vmm_map(va, page, h32));
  need(rt.vmm_set_access(va, page));
  need(rt.vmm_map(va + page, gran, hg));
  need(rt.vmm_set_access(va + page, gran));
  const Bytes f4 = free_now(rt);
  need(rt.vmm_unmap(va, page));
  need(rt.vmm_unmap(va + page, gran));
  const Bytes f5 = free_now(rt);
  need(rt.vmm_release(h32));
  need(rt.vmm_release(hg));
  need(rt.vmm_free_range(va, 2 * page));
  const Bytes f6 = free_now(rt);
  out = {{"granularity", gran},
         {"create_32MiB", delta(free0, f1)},
         {"create_granule", delta(f1, f2)},
         {"reserve_64MiB_va", delta(f2, f3)},
         {"map_and_access", delta(f3, f4)},
         {"unmap", delta(f4, f5)},
         {"release_all", delta(f5, f6)},
         {"left_after_release", delta(free0, f6)}};
  return out;
}

}  // namespace

void calibration_sequences(CheckContext& c, const Deadline& dl, Stream s, Json& out, const StepFn& step) {
  Runtime& rt = c.rt;
  const bool quick = c.cfg.quick;
  step("sequences_raw", [&] {
    Json seqs = Json::array();
    for (const SeqSpec& spec : raw_sequence_specs(quick)) {
      if (dl.passed()) break;
      seqs.push_back(run_raw(rt, spec, dl));
      out["sequences_raw"] = seqs;
      c.checkpoint(out);
    }
    out["sequences_raw"] = seqs;
  });
  step("sequences_async", [&] {
    Pool pool;
    need(rt.default_pool(pool));
    Json seqs = Json::array();
    for (const SeqSpec& spec : async_sequence_specs(quick)) {
      if (dl.passed()) break;
      seqs.push_back(run_async(rt, pool, s, spec, dl));
      out["sequences_async"] = seqs;
      c.checkpoint(out);
    }
    out["sequences_async"] = seqs;
    need(rt.pool_set(pool, PoolAttr::release_threshold, 0));
  });
  step("oom_probe", [&] {
    Pool pool;
    need(rt.default_pool(pool));
    out["oom_probe"] = run_oom_probe(rt, pool, s, quick ? 256 * MiB : 2 * GiB);
    need(rt.pool_set(pool, PoolAttr::release_threshold, 0));
  });
  step("vmm_probe", [&] { out["vmm_probe"] = run_vmm_probe(rt); });
}

}  // namespace vf::cuda::detail
