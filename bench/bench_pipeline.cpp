// Full scenarios on `sim`: predict -> lower -> execute -> judge, the per-case cost of a campaign.
// Target (issue "core pipeline"): >= 1,000 flux2-dev scenarios per second on one core.
#include <benchmark/benchmark.h>

#include "harness/campaign.h"
#include "harness/scenario.h"

namespace vf {
namespace {

Scenario flux2(Catalog& catalog, AllocatorMode mode, bool pipeline, std::uint32_t total_gib,
              std::string_view policy = "comfy:dec2025") {
  Scenario s;
  s.name = "bench";
  s.device.total = Bytes{total_gib} * GiB;
  s.allocator.mode = mode;
  s.policy = parse_policy(policy, "policy");
  auto add = [&](std::string_view name, Dtype storage, Dtype compute) {
    ModelRef m;
    m.id = std::string(name);
    m.source = "catalog:" + std::string(name);
    m.storage = StorageChoice{storage, true};
    m.storage_given = true;
    m.compute = compute;
    m.spec = catalog.get(name, m.storage, m.id);
    s.models.push_back(std::move(m));
  };
  if (pipeline) add("flux2-text-encoder", Dtype::fp8_e4m3fn, Dtype::bf16);
  add("flux2-dev", Dtype::fp8_e4m3fn, Dtype::bf16);
  if (pipeline) add("flux2-vae", Dtype::fp32, Dtype::bf16);
  s.workload.width = s.workload.height = 1024;
  s.workload.cfg = 1.0;
  s.stages = default_stages(s.models.size());
  validate_scenario(s);
  return s;
}

Scenario flux2_te(Catalog& catalog) {
  Scenario s;
  s.device.total = 12 * GiB;
  s.policy = parse_policy("comfy:dec2025", "policy");
  ModelRef m;
  m.id = "te";
  m.source = "catalog:flux2-text-encoder";
  m.storage = StorageChoice{Dtype::fp8_e4m3fn, true};
  m.compute = Dtype::fp32;
  m.spec = catalog.get("flux2-text-encoder", m.storage, m.id);
  s.models.push_back(std::move(m));
  s.offload_streams = 2;
  s.stages = default_stages(1);
  validate_scenario(s);
  return s;
}

void run_scenarios(benchmark::State& state, const Scenario& s) {
  SimBackend backend;
  std::size_t ops = 0;
  for (auto _ : state) {
    const CaseResult r = run_case(s, backend, false);
    ops = r.program.ops.size();
    benchmark::DoNotOptimize(r.verdict.overshoot);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["ops_per_case"] = static_cast<double>(ops);
  state.counters["scenarios_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void BM_Flux2Dev(benchmark::State& state) {
  Catalog catalog;
  run_scenarios(state, flux2(catalog, static_cast<AllocatorMode>(state.range(0)), false, 24));
}
void BM_Flux2Pipeline(benchmark::State& state) {
  Catalog catalog;
  run_scenarios(state, flux2(catalog, static_cast<AllocatorMode>(state.range(0)), true, 24));
}
void BM_Flux2TextEncoderLoadForward(benchmark::State& state) {
  Catalog catalog;
  run_scenarios(state, flux2_te(catalog));
}

// Dynamic VRAM (comfy:sep2026): staging, the aimdo layer's faults, evictions and cast buffers, on
// a 24 GiB card where the 32 GiB fp8 DiT does not fit (every step faults, evicts and casts).
// Target (issue "dynamic VRAM"): >= 1,000 flux2-dev scenarios per second on one core.
void BM_Flux2DevDynamic(benchmark::State& state) {
  Catalog catalog;
  run_scenarios(state, flux2(catalog, static_cast<AllocatorMode>(state.range(0)), false, 24, "comfy:sep2026"));
}
void BM_Flux2PipelineDynamic(benchmark::State& state) {
  Catalog catalog;
  run_scenarios(state, flux2(catalog, static_cast<AllocatorMode>(state.range(0)), true, 24, "comfy:sep2026"));
}

// Allocator mode as the argument: 0 raw, 1 caching, 2 caching-expandable, 3 async.
BENCHMARK(BM_Flux2Dev)->DenseRange(0, 3)->Unit(benchmark::kMicrosecond);
// Dynamic VRAM runs raw, caching and async (no expandable segments under ComfyUI).
BENCHMARK(BM_Flux2DevDynamic)->Arg(0)->Arg(1)->Arg(3)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Flux2PipelineDynamic)->Arg(0)->Arg(1)->Arg(3)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Flux2Pipeline)->DenseRange(0, 3)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Flux2TextEncoderLoadForward)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace vf

BENCHMARK_MAIN();
