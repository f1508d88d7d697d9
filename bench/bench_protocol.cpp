// The external-predictor protocol's overhead (issue #17): the same campaign (cases, verdicts,
// repros) with the built-in predictor and with it served over the protocol by
// `vramfuzz predict-serve`, side by side. Wall-clock time (the predictor is another process, so
// CPU time of this one would leave half the work out); compare the two rows' ratio. Each
// iteration is a 200- or 1000-case campaign, the predictor process started for it (so the first
// request of each catalog model, the largest ones, weighs more in the shorter campaign).
#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include "harness/campaign.h"
#include "harness/predictors/external.h"

#ifndef VF_CLI
#error "VF_CLI must name the vramfuzz executable (bench/CMakeLists.txt)"
#endif

namespace vf {
namespace {

// Arg 0: built in; 1: over the protocol. Arg 1: shrinking off (0) or on (1). Arg 2: cases.
void BM_Campaign(benchmark::State& state) {
  const bool external = state.range(0) != 0;
  const std::string policy = "comfy:dec2025";
  CampaignConfig cfg;
  cfg.seed = 2;
  cfg.cases = static_cast<std::uint64_t>(state.range(2));
  cfg.shrink = state.range(1) != 0;
  cfg.gen.policy = external ? parse_policy_list(fmt::format("exec:{} predict-serve --policy {}", VF_CLI, policy), "--policy") : policy;
  SimBackend backend;
  std::uint64_t findings = 0;
  for (auto _ : state) {
    Catalog catalog;
    const CampaignResult r = run_campaign(cfg, catalog, backend);
    findings = r.findings;
    benchmark::DoNotOptimize(findings);
    // Each iteration is a whole campaign: the predictor starts cold (and holds no specs), as it
    // does in a campaign of its own; the restart is timed with it.
    if (external) stop_external_predictors();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * cfg.cases));
  state.counters["findings"] = static_cast<double>(findings);
  state.SetLabel(external ? "exec:predict-serve" : "built in");
}

BENCHMARK(BM_Campaign)
    ->ArgsProduct({{0, 1}, {0, 1}, {200}})
    ->ArgsProduct({{0, 1}, {0}, {1000}})
    ->ArgNames({"external", "shrink", "cases"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace vf

BENCHMARK_MAIN();
