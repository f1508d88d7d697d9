// Full scenarios on `sim`: predict -> lower -> execute -> judge, the per-case cost of a campaign.
// Target (issue "core pipeline"): >= 1,000 flux2-dev scenarios per second on one core.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <filesystem>

#include "bench/scale_fixture.h"
#include "harness/campaign.h"
#include "harness/exec.h"
#include "harness/scenario.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

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

// Items per case: 1 (items_per_second is scenarios per second) or, for the scale bench, modules.
// `whole`: the case must run its whole program (a case that stops at an OOM does a fraction of
// the work, and its rate would not compare with the other sizes' and modes').
void run_scenarios(benchmark::State& state, const Scenario& s, std::size_t items_per_case = 1, bool whole = false) {
  SimBackend backend;
  std::size_t ops = 0, ran = 0;
  // One case before the clock starts: every row measures the steady state a campaign or a shrink
  // runs in (the model's load-walk order memoized, the heap grown). Without it a 1,000,000-module
  // row, one iteration long, timed its first case alone (sorting the walk) against 10,000-module
  // rows of hundreds of warm ones.
  benchmark::DoNotOptimize(run_case(s, backend, false).verdict.overshoot);
  for (auto _ : state) {
    const CaseResult r = run_case(s, backend, false);
    ops = r.program.ops.size();
    ran = r.exec.ops_executed;
    benchmark::DoNotOptimize(r.verdict.overshoot);
  }
  if (whole && ran != ops) {
    state.SkipWithError(fmt::format("the case stopped at op {} of {}: the fixture must run the whole program", ran, ops).c_str());
    return;
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * items_per_case));
  state.counters["ops_per_case"] = static_cast<double>(ops);
  state.counters["ops_run"] = static_cast<double>(ran);
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

// Arguments: modules, allocator mode. Items are modules: items_per_second is modules per second,
// which stays flat when the cost is linear.
void BM_ScaleModules(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  run_scenarios(state, scale_scenario(n, static_cast<AllocatorMode>(state.range(1))), n, true);
}

// Reading: the same model as JSON text (what `vramfuzz run` reads), parsed, checked and
// finalized. Items are modules: flat items_per_second is a linear read (issue #15: nlohmann's
// callback parser made it quadratic, 67% of a 100,000-module read).
std::string scale_json(std::size_t modules) {
  std::string text = R"({"schema": "vramfuzz.scenario/1", "device": {"total": "64GiB"}, "policy": "comfy:dec2025", )"
                     R"("models": [{"id": "te", "kind": "text_encoder", "family": "t5", "modules": [)";
  for (std::size_t i = 0; i < modules; ++i) {
    const std::uint64_t rows = 256 + (i * 37) % 1024;
    text += fmt::format(R"({}{{"name": "blocks.{}.lin", "tensors": [{{"name": "weight", "shape": [{}, 512], "dtype": "fp8_e4m3fn"}}, )"
                        R"({{"name": "bias", "shape": [{}], "dtype": "bf16"}}]}})",
                        i == 0 ? "" : ", ", i, rows, rows);
  }
  text += R"(]}], "pipeline": [{"op": "load", "model": "te"}, {"op": "forward", "model": "te"}]})";
  return text;
}

void BM_ReadScenario(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::string text = scale_json(n);
  Catalog catalog;
  for (auto _ : state) {
    const Scenario s = parse_scenario_json(text, catalog, "bench.json");
    benchmark::DoNotOptimize(s.models.size());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * n));
  state.counters["MiB_of_text"] = static_cast<double>(text.size()) / (1024.0 * 1024.0);
}

// The campaign of issue #15's target, `vramfuzz fuzz --backend sim --seed 1 --cases N --no-shrink
// --out DIR`: policy and allocator drawn (argument -1) or the allocator fixed (0 raw, 1 caching,
// 2 caching-expandable, 3 async: the rows side by side are the modes' relative costs), a knee
// pair for every fourth passing case, and the finding files written (each first few of a
// signature re-run with its trace, as the CLI does). Each iteration is the whole campaign from a
// fresh catalog, as a run of the CLI is; only the output directory's removal is outside the clock.
// Items are cases and rates divide by CPU time: items_per_second is cases per CPU-second.
void BM_Campaign(benchmark::State& state) {
  const auto cases = static_cast<std::uint64_t>(state.range(0));
  const std::int64_t mode = state.range(1);
  const auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::warn);  // each new finding's info line is the CLI's, not the bench's
  const std::filesystem::path out = std::filesystem::temp_directory_path() / fmt::format("vf-bench-campaign-{}", ::getpid());
  SimBackend backend;
  CampaignResult last;
  for (auto _ : state) {
    CampaignConfig cfg;
    cfg.seed = 1;
    cfg.cases = cases;
    cfg.shrink = false;
    cfg.out_dir = out.string();
    if (mode >= 0) cfg.gen.allocator = static_cast<AllocatorMode>(mode);
    Catalog catalog;
    last = run_campaign(cfg, catalog, backend);
    state.PauseTiming();
    std::filesystem::remove_all(out);
    state.ResumeTiming();
  }
  spdlog::set_level(level);
  if (last.cases != cases || last.errors != 0) {
    state.SkipWithError(fmt::format("the campaign ran {} of {} cases with {} errors", last.cases, cases, last.errors).c_str());
    return;
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * cases));
  state.counters["findings"] = static_cast<double>(last.findings);
  state.counters["signatures"] = static_cast<double>(last.signatures.size());
  state.counters["knee_pairs"] = static_cast<double>(last.knee_pairs);
}

// Allocator mode as the argument: 0 raw, 1 caching, 2 caching-expandable, 3 async.
BENCHMARK(BM_Flux2Dev)->DenseRange(0, 3)->Unit(benchmark::kMicrosecond);
// Dynamic VRAM runs raw, caching and async (no expandable segments under ComfyUI).
BENCHMARK(BM_Flux2DevDynamic)->Arg(0)->Arg(1)->Arg(3)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Flux2PipelineDynamic)->Arg(0)->Arg(1)->Arg(3)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Flux2Pipeline)->DenseRange(0, 3)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Flux2TextEncoderLoadForward)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ScaleModules)
    ->ArgsProduct({{10'000, 100'000, 1'000'000}, {0, 1, 2, 3}})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);
// Cases per iteration, then the allocator (-1: drawn, the target's row).
BENCHMARK(BM_Campaign)
    ->ArgsProduct({{10'000}, {-1, 0, 1, 2, 3}})
    ->ArgNames({"cases", "allocator"})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);
BENCHMARK(BM_ReadScenario)->Arg(10'000)->Arg(100'000)->Arg(1'000'000)->Unit(benchmark::kMillisecond)->MinTime(1.0);

}  // namespace
}  // namespace vf

BENCHMARK_MAIN();
