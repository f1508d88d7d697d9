// The shrinker and the repro files: identity, margin, budgets, the cache, flake awareness.
#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <regex>
#include <set>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "harness/repro.h"
#include "harness/shrink.h"

namespace vf {
namespace {

namespace fs = std::filesystem;

Scenario origin_oct2025(Catalog& catalog) {
  return load_scenario_file(std::string(VF_SOURCE_DIR) + "/docs/examples/flux2-te-fp8-fp32-12gib.json", catalog);
}

// Records every scenario it runs, to prove the shrinker never runs one twice.
class CountingBackend final : public Backend {
 public:
  std::string_view name() const override { return "sim"; }
  ExecResult execute(const Scenario& s, const Program& p, const ExecOptions& opt) override {
    if (!opt.record_trace) seen.push_back(scenario_to_json(s, -1));
    return sim.execute(s, p, opt);
  }
  std::vector<std::string> seen;
  SimBackend sim;
};

TEST(Shrink, OriginFindingShrinksToAFewModulesFrugally) {
  Catalog catalog;
  const Scenario s = origin_oct2025(catalog);
  SimBackend backend;
  const ShrinkResult r = shrink(s, backend, ShrinkOptions{});
  EXPECT_EQ(r.signature, "oom:forward:upcast:raw");
  EXPECT_EQ(r.result.verdict.signature, r.signature);
  EXPECT_EQ(r.original_size.modules, 272u);  // 30 layers x 9 modules + the embedding + the final norm
  EXPECT_LE(r.final_size.modules, 3u);
  EXPECT_LE(r.executions, 200u);
  EXPECT_FALSE(r.budget_exhausted);
  // The margin: never a knife-edge repro.
  EXPECT_EQ(r.margin, std::max<std::int64_t>(MiB, r.original_overshoot / 2));
  EXPECT_GE(r.result.verdict.overshoot, r.margin);
  EXPECT_GE(r.largest_overshoot, r.result.verdict.overshoot);
  EXPECT_EQ(r.reproduced, 1u);
  EXPECT_FALSE(r.flaky);
  // What it kept: an offloaded fp8 MLP projection converted to fp32 is the whole story.
  ASSERT_EQ(r.minimal.models.size(), 1u);
  const ModelSpec& m = *r.minimal.models[0].spec;
  EXPECT_EQ(r.minimal.models[0].compute, Dtype::fp32);
  bool fp8_weight = false;
  for (const Module& mod : m.modules) {
    for (const Tensor& t : mod.tensors) fp8_weight |= t.role == TensorRole::weight && t.dtype == Dtype::fp8_e4m3fn;
  }
  EXPECT_TRUE(fp8_weight);
}

TEST(Shrink, TheShrunkCaseIsNamedForWhatItIsAndWhereItCameFrom) {
  // The origin is "..., 12 GiB, 2 offload streams"; its repro is a smaller device with fewer
  // modules and no offload stream: the name must not claim the original's facts as its own.
  Catalog catalog;
  const Scenario s = origin_oct2025(catalog);
  ASSERT_EQ(s.name, "origin: FLUX.2 text encoder, fp8 stored, fp32 compute, 12 GiB, 2 offload streams");
  SimBackend backend;
  const ShrinkResult r = shrink(s, backend, ShrinkOptions{});
  const Scenario& m = r.minimal;
  ASSERT_NE(m.device.total, s.device.total);
  ASSERT_NE(m.streams(), 2u);
  const std::size_t modules = m.models[0].spec->modules.size();
  EXPECT_EQ(m.name, fmt::format("te ({} module{}), {} device, {} offload stream{}; shrunk from \"{}\"", modules, modules == 1 ? "" : "s",
                                format_size(m.device.total), m.streams(), m.streams() == 1 ? "" : "s", s.name));
  EXPECT_EQ(m.device.name, "shrunk from RTX 3060 12GB (sim)");
  // The repro's title and the issue body carry the facts of the shrunk case.
  EXPECT_NE(repro_title(r).find(format_size(m.device.total)), std::string::npos) << repro_title(r);
  // Shrunk again (a repro is a valid input): the original is named once, not nested.
  Scenario again = m;
  again.device.total += 512 * MiB;  // room for the shrinker to take away
  const ShrinkResult r2 = shrink(again, backend, ShrinkOptions{});
  EXPECT_EQ(r2.minimal.name.find("shrunk from"), r2.minimal.name.rfind("shrunk from")) << r2.minimal.name;
  EXPECT_NE(r2.minimal.name.find("shrunk from \"" + s.name + "\""), std::string::npos) << r2.minimal.name;
  EXPECT_EQ(r2.minimal.device.name, "shrunk from RTX 3060 12GB (sim)");
}

TEST(Shrink, NeverRunsACandidateTwice) {
  Catalog catalog;
  CountingBackend backend;
  const ShrinkResult r = shrink(origin_oct2025(catalog), backend, ShrinkOptions{});
  const std::set<std::string> unique(backend.seen.begin(), backend.seen.end());
  // Everything run during shrinking is distinct; the only repeat allowed is the confirmation
  // re-run of the final case at the end.
  EXPECT_GE(unique.size() + 1, backend.seen.size());
  EXPECT_EQ(r.executions, unique.size());
}

TEST(Shrink, ExecutionBudgetReturnsTheBestSoFar) {
  Catalog catalog;
  SimBackend backend;
  ShrinkOptions opt;
  opt.max_execs = 6;
  const ShrinkResult r = shrink(origin_oct2025(catalog), backend, opt);
  EXPECT_TRUE(r.budget_exhausted);
  EXPECT_LE(r.executions, 6u);
  EXPECT_EQ(r.result.verdict.signature, "oom:forward:upcast:raw");
  EXPECT_LT(r.final_size.modules, r.original_size.modules);  // the first halvings already landed
}

TEST(Shrink, RefusesACaseThatPasses) {
  Catalog catalog;
  Scenario s = origin_oct2025(catalog);
  s.policy = parse_policy("comfy:dec2025", "policy");
  SimBackend backend;
  EXPECT_THROW(shrink(s, backend, ShrinkOptions{}), InputError);
}

TEST(Shrink, ReproFilesAreCompleteAndReplay) {
  Catalog catalog;
  SimBackend backend;
  const ShrinkResult r = shrink(origin_oct2025(catalog), backend, ShrinkOptions{});
  const fs::path dir = fs::temp_directory_path() / fmt::format("vf-repro-{}", ::getpid());
  ReproOrigin origin;
  origin.campaign_seed = 7;
  origin.case_index = 3;
  origin.case_seed = 0xabcdef;
  origin.choices = {1, 2, 3};
  origin.found_by = "vramfuzz fuzz --seed 7 --cases 4 --policy comfy:oct2025 --allocator raw --backend sim";
  const std::string path = write_repro(dir.string(), r, origin);
  const nlohmann::json j = nlohmann::json::parse(read_text_file(path));
  EXPECT_EQ(j["schema"], "vramfuzz.repro/1");
  EXPECT_EQ(j["signature"], "oom:forward:upcast:raw");
  EXPECT_EQ(j["replay"], "vramfuzz replay repro.json") << "from the folder of the file: it holds wherever that is";
  EXPECT_EQ(j["bytes"]["overshoot"], r.result.verdict.overshoot);
  EXPECT_EQ(j["bytes"]["largest_overshoot_seen"], r.largest_overshoot);
  EXPECT_EQ(j["reliability"]["runs"], 1);
  EXPECT_EQ(j["reliability"]["flaky"], false);
  EXPECT_EQ(j["origin"]["case_seed"], 0xabcdef);
  EXPECT_EQ(j["origin"]["choices"].size(), 3u);
  EXPECT_EQ(j["environment"]["backend"], "sim");
  EXPECT_NE(j["tool"].get<std::string>().find("git"), std::string::npos);
  EXPECT_NE(j["trace_around_peak"].get<std::string>().find("<-- OOM"), std::string::npos);
  EXPECT_EQ(j["shrink"]["final"]["modules"], r.final_size.modules);
  // The embedded scenario replays to the same signature.
  const Scenario again = load_case_file(path, catalog);
  EXPECT_EQ(run_case(again, backend, false).verdict.signature, "oom:forward:upcast:raw");
  // The issue body has the title, the table, the ComfyUI log line, the trace and the command.
  const std::string md = read_text_file((dir / "repro.md").string());
  for (const std::string& needle : {std::string("# [vramfuzz] oom:forward:upcast:raw"), std::string("| allocator | raw |"),
                                    std::string("loaded partially;"), std::string("<-- OOM"),
                                    std::string("From the folder this file is in:\n\n```\nvramfuzz replay repro.json\n```"),
                                    std::string("Reliability:")}) {
    EXPECT_NE(md.find(needle), std::string::npos) << needle;
  }
  // Where it came from: the whole command whose last case it is, not just the seed.
  EXPECT_EQ(j["origin"]["found_by"], origin.found_by);
  EXPECT_NE(md.find("Found by `" + origin.found_by + "`: its last case, case 3 (case seed 0xabcdef)."), std::string::npos) << md;
  const ReproOrigin back = read_origin(path);
  EXPECT_EQ(back.found_by, origin.found_by);
  EXPECT_EQ(back.case_seed, 0xabcdefu);
  EXPECT_EQ(back.choices, (std::vector<std::uint64_t>{1, 2, 3}));
  fs::remove_all(dir);
}

// A flaky oracle: under `async`, whether the transfer buffer one offload stream freed is reused by
// the next transfer on the other stream is the driver's opportunistic choice (no event edge links
// the two streams), which the simulator draws from the scenario seed. Eight 16 MiB bf16 modules on
// a 100 MiB device with a 50 MiB reserve: 3 resident, 5 offloaded; the transfer window (3 x 16
// MiB) fits, but the 4th transfer fits only by reusing the 1st one's block across streams. With
// internal dependencies off, each such reuse is a coin: the verdict depends on the seed.
TEST(Shrink, FlakyOracleGetsAReliabilityFigureAndTheLabel) {
  std::string mods;
  for (int i = 0; i < 8; ++i) {
    mods += fmt::format(R"({}{{"name": "m{}", "tensors": [{{"name": "weight", "shape": [4096, 2048], "dtype": "bf16"}}]}})",
                        i ? ", " : "", i);
  }
  const std::string text = fmt::format(
      R"({{"device": {{"total": "100MiB", "context_overhead": 0}},
          "allocator": {{"mode": "async", "options": {{"opportunistic_probability": 0.5, "reuse_allow_internal_dependencies": false}}}},
          "policy": {{"name": "comfy:oct2025", "overrides": {{"reserve": "50MiB", "inference_floor": "0", "weight_floor": "0"}}}},
          "models": [{{"id": "m", "kind": "text_encoder", "compute": "bf16", "modules": [{}]}}],
          "offload_streams": 2, "seed": 0}})",
      mods);
  Catalog catalog;
  const Scenario s = parse_scenario_json(text, catalog, "flaky");
  SimBackend backend;
  const CaseResult first = run_case(s, backend, false);
  ASSERT_EQ(first.verdict.signature, "oom:forward:h2d:async") << first.verdict.message;
  const std::uint32_t over_seeds = count_reproductions(s, backend, first.verdict.signature, 20);
  EXPECT_GT(over_seeds, 0u);
  EXPECT_LT(over_seeds, 20u) << "the reuse coin flips the verdict with the seed";

  // No shrinking budget: the shrinker is free to find a deterministic variant of a flaky case (here
  // it does: moving every byte into one module makes a plain OOM); the point is the reliability
  // figure of the case as found.
  ShrinkOptions opt;
  opt.confirm_runs = 20;
  opt.max_execs = 1;
  const ShrinkResult r = shrink(s, backend, opt);
  EXPECT_EQ(r.confirm_runs, 20u);
  EXPECT_GE(r.reproduced, 1u);
  EXPECT_LT(r.reproduced, 20u);
  EXPECT_EQ(r.flaky, r.reproduced < 16u);  // the default threshold: 80%
  const std::string md = repro_markdown(r, {}, "repro.json");
  EXPECT_NE(md.find(fmt::format("reproduced {} of 20 runs", r.reproduced)), std::string::npos);
  if (r.flaky) {
    EXPECT_NE(md.find("**flaky**"), std::string::npos);
  }
  const nlohmann::json j = nlohmann::json::parse(repro_json(r, {}, "repro.json"));
  EXPECT_EQ(j["reliability"]["runs"], 20);
  EXPECT_EQ(j["reliability"]["reproduced"], r.reproduced);
  EXPECT_EQ(j["reliability"]["flaky"], r.flaky);
}

// The class B scenario (below) with the stages given as a JSON array's contents.
std::string class_b_scenario(const std::string& pipeline) {
  return R"({"schema": "vramfuzz.scenario/1", "name": "flux2-te", "seed": 3652734677,
    "device": {"total": "16GiB", "context_overhead": 287047680},
    "allocator": {"mode": "async", "options": {"pool_granularity": "2MiB"}},
    "policy": "comfy:oct2025", "offload_streams": 2,
    "workload": {"width": 576, "height": 576, "batch": 4, "cfg": 7.0},
    "models": [{"id": "te", "source": "catalog:flux2-text-encoder", "storage": "fp16", "compute": "fp16"}],
    "pipeline": [)" + pipeline + "]}";
}

// Class B keeps its mechanism while it shrinks: seed 1's case 358 of `fuzz --policy
// comfy:oct2025 --allocator async` (the FLUX.2 text encoder in fp16 on 16 GiB, 2 offload streams,
// 576x576 batch 4) OOMs at a transfer copy with three modules' copies in flight. Dropping modules
// alone ends in one module copied on the compute stream (the same signature, class A's finding);
// the shrinker instead writes the largest module in flight repeated, all offloaded. (Found when the
// pool's growth step defaulted to 2 MiB; the scenario keeps that step.)
TEST(Shrink, TheAsyncOffloadOverlapShrinksToOneModuleRepeatedAndKeepsItsCause) {
  const std::string json = class_b_scenario(R"({"op": "load", "model": "te"}, {"op": "forward", "model": "te"})");
  Catalog catalog;
  SimBackend backend;
  const Scenario s = parse_scenario_json(json, catalog, "b.json");
  const CaseResult first = run_case(s, backend, false);
  ASSERT_EQ(first.verdict.signature, "oom:forward:h2d:async") << first.verdict.message;
  ASSERT_EQ(first.verdict.cause.rfind("async-offload overlap: weight transients 960.00 MiB with the transfer copies of 3 offloaded "
                                      "modules in flight at once on 2 offload streams",
                                      0),
            0u)
      << first.verdict.cause;
  const ShrinkResult r = shrink(s, backend, ShrinkOptions{});
  EXPECT_EQ(r.result.verdict.signature, "oom:forward:h2d:async");
  EXPECT_EQ(r.result.verdict.cause.rfind("async-offload overlap: ", 0), 0u) << r.result.verdict.cause;
  ASSERT_EQ(r.minimal.models.size(), 1u);
  const std::vector<Module>& mods = r.minimal.models[0].spec->modules;
  ASSERT_GE(mods.size(), 3u);
  EXPECT_EQ(repeat_run(mods, 0), mods.size()) << "one module repeated";
  EXPECT_EQ(r.final_size.repeats, mods.size() - 1);  // what the summary's repro column says
  EXPECT_LT(r.executions, 100u);
  const std::string md = repro_markdown(r, {}, "repro.json");
  EXPECT_NE(md.find(fmt::format("| {} x `", mods.size())), std::string::npos) << md;
  EXPECT_NE(md.find("Copies of a real module (`NAME.K`) stand for the modules the finding needs at once"), std::string::npos);
}

}  // namespace
}  // namespace vf

namespace vf {
namespace {

// A campaign's case (its scenario as the finding file writes it, on qwen-image), checked to fail
// with `signature` for the reason `cause` begins with, then shrunk with the default options.
struct Shrunk {
  std::optional<ShrinkResult> r;
};
Shrunk shrink_qwen_case(const std::string& allocator, const std::string& storage, const std::string& compute, int streams,
                        const std::string& workload, std::uint64_t seed, const std::string& signature, const std::string& cause) {
  const std::string json = fmt::format(R"({{"schema": "vramfuzz.scenario/1", "name": "qwen", "seed": {},
    "device": {{"name": "sim", "total": "{}", "used_by_others": 0, "context_overhead": 554500096}},
    "allocator": {{"mode": "{}", "options": {{}}}}, "policy": "comfy:dec2025",
    "models": [{{"compute": "{}", "id": "qwen-image", "lora": false, "source": "catalog:qwen-image", "storage": "{}"}}],
    "workload": {}, "offload_streams": {},
    "pipeline": [{{"model": "qwen-image", "op": "load"}}, {{"model": "qwen-image", "op": "forward"}}]}})",
                                       seed, allocator == "raw" ? "12GiB" : "16GiB", allocator, compute, storage, workload, streams);
  Catalog catalog;
  SimBackend backend;
  const Scenario s = parse_scenario_json(json, catalog, "case.json");
  const CaseResult first = run_case(s, backend, false);
  Shrunk out;
  EXPECT_EQ(first.verdict.signature, signature) << first.verdict.message;
  EXPECT_EQ(first.verdict.cause.rfind(cause, 0), 0u) << first.verdict.cause;
  if (first.verdict.signature != signature) return out;
  out.r = shrink(s, backend, ShrinkOptions{});
  EXPECT_EQ(out.r->result.verdict.signature, signature);
  EXPECT_EQ(out.r->result.verdict.cause.rfind(cause, 0), 0u) << out.r->result.verdict.cause;
  return out;
}

// A rounding sum keeps its diagnosis: qwen-image in q4_0 on a 12 GiB card under raw, fully
// loaded, OOMs at a dequant copy because 1,000 tensors' page rounding (about 950 MiB) was never
// budgeted. The dequant copy of the one module the op works on is not budgeted either (108 MiB),
// and grown alone it fails by itself: a one-module repro whose cause reads "weight transients".
// That is another finding (class A), so the shrinker must keep the rounding: the repro is the
// module the op works on plus pads written as one "repeat" run, and still says rounding.
TEST(Shrink, ARoundingSumKeepsItsCauseAndShrinksToPads) {
  const Shrunk x = shrink_qwen_case("raw", "q4_0", "fp16", 0,
                                    R"({"batch": 1, "cfg": 7.0, "frames": 1, "height": 1664, "text_tokens": 0, "width": 768})", 699963429,
                                    "oom:forward:dequant:raw", "allocator rounding ");
  ASSERT_TRUE(x.r);
  const ShrinkResult& r = *x.r;
  ASSERT_EQ(r.minimal.models.size(), 1u);
  const std::vector<Module>& mods = r.minimal.models[0].spec->modules;
  ASSERT_GE(mods.size(), 100u);  // a sum of hundreds of tensors' rounding
  // Written as the op's module and one run of pads: two entries.
  std::size_t entries = 0;
  for (std::size_t i = 0; i < mods.size(); i += repeat_run(mods, i)) ++entries;
  EXPECT_LE(entries, 2u);
  EXPECT_EQ(r.final_size.repeats + entries, mods.size());
  EXPECT_FALSE(r.budget_exhausted);
  EXPECT_LT(r.executions, 150u);
}

// A slack sum over a whole catalog model that cannot lose its modules: qwen-image in q6_k on
// 16 GiB under caching with two offload streams OOMs at a transfer copy, 1.6 MiB tails of
// hundreds of 32 MiB segments summing to about 1 GiB of slack. The passes edit the model (its
// biases dropped, its fp32 tensors plainer), which makes it an inline listing of a thousand
// modules; the repro writes it as the catalog reference with the modules it drops instead, the
// card moved by the bytes the catalog's modules differ by so the pressure stays the same.
TEST(Shrink, AModelThatKeepsItsModulesIsWrittenAsTheCatalogReference) {
  const Shrunk x = shrink_qwen_case("caching", "q6_k", "bf16", 2,
                                    R"({"batch": 1, "cfg": 1.0, "frames": 1, "height": 896, "text_tokens": 0, "width": 896})", 2942079777,
                                    "oom:forward:h2d:caching", "allocator slack ");
  ASSERT_TRUE(x.r);
  ASSERT_EQ(x.r->minimal.models.size(), 1u);
  EXPECT_EQ(x.r->minimal.models[0].source, "catalog:qwen-image");
  const std::string md = repro_markdown(*x.r, {}, "repro.json");
  EXPECT_NE(md.find("qwen-image (catalog:qwen-image, stored q6_k, "), std::string::npos) << md.substr(0, 2000);
}

// repro.md's table has a row for every stage: one after the OOM says it was not reached rather
// than showing a measured peak of 0.00 MiB. (The class B case above, its forward run twice: the
// first OOMs, so the second never starts.)
TEST(Shrink, TheReproTableMarksAStageAfterTheOomNotReached) {
  const std::string json =
      class_b_scenario(R"({"op": "load", "model": "te"}, {"op": "forward", "model": "te"}, {"op": "forward", "model": "te"})");
  Catalog catalog;
  SimBackend backend;
  ShrinkResult r;
  r.minimal = parse_scenario_json(json, catalog, "b.json");
  r.result = run_case(r.minimal, backend, false);
  ASSERT_EQ(r.result.verdict.signature, "oom:forward:h2d:async") << r.result.verdict.message;
  ASSERT_EQ(r.result.verdict.stage, 1u);
  const std::string md = repro_markdown(r, {}, "repro.json");
  EXPECT_NE(md.find("| 2 forward te | "), std::string::npos) << md;
  EXPECT_TRUE(std::regex_search(md, std::regex(R"(\| 2 forward te \| [0-9.]+ MiB \| [0-9.]+ MiB \| not reached \|  \|)"))) << md;
  EXPECT_TRUE(std::regex_search(md, std::regex(R"(\| 1 forward te \| [0-9.]+ MiB \| [0-9.]+ MiB \| [0-9.]+ MiB \| [+-])"))) << md;
}

}  // namespace
}  // namespace vf
