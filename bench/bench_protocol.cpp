// The external-predictor protocol's overhead (issue #17): the same campaign (cases, verdicts,
// repros) with the built-in predictor, with it served over the protocol by `vramfuzz
// predict-serve`, and over a predictor that only replays those replies, side by side. Wall-clock time (the predictor is another process, so
// CPU time of this one would leave half the work out); compare the two rows' ratio. Each
// iteration is a 200- or 1000-case campaign, the predictor process started for it (so the first
// request of each catalog model, the largest ones, weighs more in the shorter campaign).
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "harness/campaign.h"
#include "harness/predictors/external.h"

#ifndef VF_CLI
#error "VF_CLI must name the vramfuzz executable (bench/CMakeLists.txt)"
#endif

namespace vf {
namespace {

namespace fs = std::filesystem;

// Arg 0: the predictor: 0 built in, 1 `vramfuzz predict-serve` over the protocol, 2 a canned
// predictor (bench/canned_predictor.py) replaying predict-serve's recorded replies: the protocol's
// own cost, with a predictor that does no work. Arg 1: shrinking off (0) or on (1; findings are
// written to a temporary directory, as shrinking needs). Arg 2: cases.
void BM_Campaign(benchmark::State& state) {
  const int predictor = static_cast<int>(state.range(0));
  const bool shrink = state.range(1) != 0;
  const auto cases = static_cast<std::uint64_t>(state.range(2));
  const std::string policy = "comfy:dec2025";
  const std::string serve = fmt::format("{} predict-serve --policy {}", VF_CLI, policy);
  const fs::path work = fs::temp_directory_path() / fmt::format("vf-bench-protocol-{}", ::getpid());
  const std::string replies = (work / fmt::format("replies-{}-{}.jsonl", cases, shrink ? 1 : 0)).string();
  const std::string canned = fmt::format("python3 {}/bench/canned_predictor.py", VF_SOURCE_DIR);
  CampaignConfig cfg;
  cfg.seed = 2;
  cfg.cases = cases;
  cfg.shrink = shrink;
  const auto run = [&](const std::string& policy_flag) {
    cfg.gen.policy = parse_policy_list(policy_flag, "--policy");
    std::error_code ec;
    fs::remove_all(work / "out", ec);
    if (shrink) cfg.out_dir = (work / "out").string();
    SimBackend backend;
    Catalog catalog;
    const CampaignResult r = run_campaign(cfg, catalog, backend);
    // Each run is a whole campaign: the predictor starts cold (and holds no specs), as it does
    // in a campaign of its own; the restart is timed with it.
    stop_external_predictors();
    return r;
  };
  fs::create_directories(work);
  if (predictor == 2) (void)run(fmt::format("exec:{} record {} -- {}", canned, replies, serve));  // untimed
  const std::string flag = predictor == 0 ? policy : predictor == 1 ? "exec:" + serve : fmt::format("exec:{} replay {}", canned, replies);
  std::uint64_t findings = 0;
  for (auto _ : state) {
    const CampaignResult r = run(flag);
    if (r.errors != 0) {
      state.SkipWithError("a case had an error verdict (a canned reply not for its request?)");
      break;
    }
    findings = r.findings;
    benchmark::DoNotOptimize(findings);
  }
  std::error_code ec;
  fs::remove_all(work, ec);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * cfg.cases));
  state.counters["findings"] = static_cast<double>(findings);
  state.SetLabel(predictor == 0 ? "built in" : predictor == 1 ? "exec:predict-serve" : "exec:canned (replayed replies)");
}

BENCHMARK(BM_Campaign)
    ->ArgsProduct({{0, 1, 2}, {0, 1}, {200}})
    ->ArgsProduct({{0, 1, 2}, {0, 1}, {1000}})
    ->ArgNames({"predictor", "shrink", "cases"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace vf

BENCHMARK_MAIN();
