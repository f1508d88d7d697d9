// Dynamic VRAM end to end: ModelPatcherDynamic's staging with the reference's numbers (the FLUX.2
// text encoder of reference/comfyui-dynamic-vram.md §5), the lowered ops, the sim run, and the
// oracle's property (an avoidable OOM is a finding, a workload too big is an expected OOM).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <regex>

#include <fmt/format.h>

#include "harness/campaign.h"
#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "harness/core/splitmix.h"
#include "harness/dynamic_runtime.h"
#include "harness/shrink.h"
#include "harness/exec.h"
#include "harness/lower.h"
#include "harness/oracle.h"
#include "harness/predict.h"
#include "harness/scenario.h"
#include "harness/sim/aimdo.h"

namespace vf {
namespace {

Scenario te_scenario(Bytes total, std::string_view policy = "comfy:sep2026") {
  Catalog catalog;
  const std::string json = fmt::format(R"({{"device": {{"total": {}}}, "allocator": "async", "policy": "{}",
    "models": [{{"id": "te", "source": "catalog:flux2-text-encoder", "storage": "fp8_e4m3fn", "scaled": false, "compute": "fp32"}}]}})",
                                       total, policy);
  return parse_scenario_json(json, catalog, "te.json");
}

const Module& module_named(const ModelSpec& m, std::string_view name) {
  const auto it = std::find_if(m.modules.begin(), m.modules.end(), [&](const Module& x) { return x.name == name; });
  EXPECT_NE(it, m.modules.end()) << name;
  return *it;
}

std::uint32_t index_of(const ModelSpec& m, std::string_view name) {
  return static_cast<std::uint32_t>(&module_named(m, name) - m.modules.data());
}

// Modelled durations round as llround does, inline (round_us).
TEST(DynamicTime, RoundUsIsLlroundForEveryPositiveDuration) {
  // The halves and their neighbours, where a rounding by adding 0.5 goes wrong.
  const double edges[] = {1e-300, 0.25, std::nextafter(0.5, 0.0), 0.5, std::nextafter(0.5, 1.0), 1.5, 2.5,
                          std::nextafter(2.5, 0.0), 123456.5, 0x1p52 - 0.5, std::nextafter(0x1p52, 0.0), 0x1p52,
                          0x1p52 + 1.0, 0x1p60};
  for (const double us : edges) EXPECT_EQ(round_us(us), static_cast<std::uint64_t>(std::llround(us))) << us;
  EXPECT_EQ(round_us(0.5), 1u);
  EXPECT_EQ(round_us(std::nextafter(0.5, 0.0)), 0u);
  EXPECT_EQ(round_us(2.5), 3u);
  // Durations as OpClock makes them: a byte count or a flop count over a rate.
  SplitMix64 rng{7};
  for (int k = 0; k < 200000; ++k) {
    const double num = static_cast<double>(rng.below(std::uint64_t{1} << (1 + k % 50)));
    const double rate = 1.0 + static_cast<double>(rng.below(1000000)) / 997.0;
    const double us = num / rate;
    if (us == 0) continue;
    ASSERT_EQ(round_us(us), static_cast<std::uint64_t>(std::llround(us))) << num << " / " << rate;
  }
}

// A dynamic load reports the free memory load_models_gpu started from, before free_memory
// unloaded the legacy CLIP to make room (as a classic load reports it, and as the real planner's
// state reads through the ComfyUI adapter): 24047.19 MiB available (24 GiB less the default
// context, 528.81 MiB) less CLIP-L's 234.72 MiB.
TEST(DynamicStaging, ALoadsFreeMemoryIsWhatItStartedFromBeforeItsEvictions) {
  Catalog catalog;
  const Scenario s = parse_scenario_json(
      R"({"device": {"total": "24GiB"}, "allocator": "async", "policy": "comfy:sep2026",
          "models": [{"id": "clip", "source": "catalog:clip-l", "compute": "bf16", "patcher": "legacy"},
                     {"id": "dit", "source": "catalog:flux1-dev", "compute": "bf16"}],
          "pipeline": [{"op": "load", "model": "clip"}, {"op": "forward", "model": "clip"},
                       {"op": "load", "model": "dit"}, {"op": "forward", "model": "dit"}]})",
      catalog, "legacy-then-dynamic.json");
  const Plan plan = predict(s);
  ASSERT_EQ(plan.loads.size(), 2u);
  const LoadPlan& dit = plan.loads[1];
  ASSERT_TRUE(dit.dynamic);
  ASSERT_EQ(dit.evictions.size(), 1u);
  EXPECT_EQ(dit.evictions[0].model, 0u);
  EXPECT_EQ(dit.evictions[0].modules.size(), 99u);  // all of CLIP-L
  EXPECT_EQ(dit.evictions[0].bytes, s.models[0].spec->bytes);
  EXPECT_EQ(dit.free_before, s.device.available() - s.models[0].spec->bytes);
  EXPECT_EQ(format_mib(dit.free_before), "23812.47 MiB");
}

// Containers' own parameters (Wan's per-block `modulation`, beside the block's layers) are moved
// to the device outside the walk: on the device and in neither of the log's figures, the load's
// `uncounted` as much as the staging's.
TEST(DynamicStaging, ContainersOwnParametersAreUncountedOnTheDevice) {
  Catalog catalog;
  const Scenario s = parse_scenario_json(
      R"({"device": {"total": "24GiB"}, "allocator": "async", "policy": "comfy:sep2026",
          "models": [{"id": "dit", "source": "catalog:wan21-14b", "compute": "bf16"}]})",
      catalog, "wan.json");
  const Plan plan = predict(s);
  ASSERT_EQ(plan.loads.size(), 1u);
  const LoadPlan& lp = plan.loads[0];
  Bytes own = 0;
  std::size_t containers = 0;
  for (const Module& m : s.models[0].spec->modules) {
    if (!m.container) continue;
    ++containers;
    for (const Tensor& t : m.tensors) own += t.role == TensorRole::other ? 0 : t.bytes;
  }
  ASSERT_GE(containers, 40u);  // one per block at least
  EXPECT_GT(own, 0u);
  EXPECT_EQ(lp.staging.uncounted, own);
  EXPECT_EQ(lp.uncounted, own);
}

TEST(DynamicStaging, Flux2TextEncoderStages17180MBWithTheEmbeddingFirstAndForceLoadsItsNorms) {
  const Scenario s = te_scenario(24 * GiB);
  const Plan plan = predict(s);
  ASSERT_TRUE(plan.dynamic);
  ASSERT_EQ(plan.loads.size(), 1u);
  const LoadPlan& lp = plan.loads[0];
  ASSERT_TRUE(lp.dynamic);
  const StagingPlan& st = lp.staging;
  const ModelSpec& m = *s.models[0].spec;
  // ComfyUI's own line, as the real run printed it.
  EXPECT_EQ(lp.log_line, "Model te prepared for dynamic VRAM loading. 17180MB Staged. 0 patches attached. "
                         "Force pre-loaded 61 weights: 610 KB.");
  EXPECT_EQ(st.staged, 17180 * MiB);  // 1280 + 90 x 160 + 60 x 20 + 60 x 5 MiB
  EXPECT_EQ(st.forced, 61u);
  EXPECT_EQ(st.forced_bytes, 61u * 5120 * 2);
  EXPECT_EQ(st.vbar_request, m.bytes * 10);
  EXPECT_EQ(format_mib(st.vbar_request), "171805.96 MiB");
  EXPECT_EQ(st.vbar_pages, 768u);  // capped at the 24 GiB card
  // Staging order: the 61 norms (offload cost under 64 KiB) first, then by descending cost: the
  // embedding (1280 MiB + its 2560 MiB fp32 copy), the 90 MLP projections (160 + 640 MiB), q and
  // o (20 + 80 MiB), k and v (5 + 20 MiB) last.
  ASSERT_EQ(st.order.size(), 272u);
  for (std::size_t k = 0; k < 61; ++k) EXPECT_TRUE(st.forced_module[st.order[k]]) << m.modules[st.order[k]].name;
  const std::uint32_t embed = index_of(m, "model.embed_tokens");
  EXPECT_EQ(st.order[61], embed);
  EXPECT_EQ(st.slice_offset[embed], 0u);
  EXPECT_EQ(st.slice_size[embed], 1280 * MiB);
  for (std::size_t k = 62; k < 62 + 90; ++k) {
    EXPECT_NE(m.modules[st.order[k]].name.find(".mlp."), std::string::npos) << k;
    EXPECT_EQ(st.slice_size[st.order[k]], 160 * MiB);
  }
  for (std::size_t k = 152; k < 152 + 60; ++k) EXPECT_EQ(st.slice_size[st.order[k]], 20 * MiB) << m.modules[st.order[k]].name;
  for (std::size_t k = 212; k < 272; ++k) EXPECT_EQ(st.slice_size[st.order[k]], 5 * MiB) << m.modules[st.order[k]].name;
  // Slices follow each other in that order, 512 B-aligned (all of these are page multiples).
  EXPECT_EQ(st.slice_offset[st.order[62]], 1280 * MiB);
  EXPECT_EQ(st.slice_offset[st.order[271]], 17175 * MiB);
  EXPECT_EQ(st.vbar_end, 17180 * MiB);
  // A 12 GiB card caps the VBAR at 384 pages: every slice past 12 GiB always goes through a
  // cast buffer.
  const Plan small = predict(te_scenario(12 * GiB));
  EXPECT_EQ(small.loads[0].staging.vbar_pages, 384u);
  EXPECT_EQ(small.loads[0].staging.slices_beyond_cap, 142u);
  // No predicted peak for a dynamic stage.
  for (const StagePlan& sp : plan.stages) {
    EXPECT_TRUE(sp.dynamic);
    EXPECT_FALSE(sp.checked);
  }
  EXPECT_TRUE(plan.fits);
}

TEST(DynamicStaging, SlicesAre1KiBAlignedPerTensorAndPlacedAt512ByteOffsets) {
  Catalog catalog;
  // A Linear of 10,241 bf16 elements (20,482 B -> 21,504 B aligned) with a 3-element bias (6 B ->
  // 1 KiB), one of 20,000 fp32 elements (80,000 B -> 80,896 B), and a tiny 8 KiB one.
  const std::string json = R"({"device": {"total": "8GiB"}, "allocator": "async", "policy": "comfy:sep2026",
    "models": [{"id": "m", "source": "inline", "modules": [
      {"name": "a", "tensors": [{"name": "weight", "shape": [10241, 1], "dtype": "bf16"}, {"name": "bias", "shape": [3], "dtype": "bf16"}]},
      {"name": "b", "tensors": [{"name": "weight", "shape": [20000, 1], "dtype": "fp32"}]},
      {"name": "tiny", "tensors": [{"name": "weight", "shape": [64, 64], "dtype": "bf16"}]}]}]})";
  const Scenario s = parse_scenario_json(json, catalog, "x.json");
  const Plan plan = predict(s);
  const StagingPlan& st = plan.loads[0].staging;
  // Offload costs (bf16 compute): a 20,488 B and tiny 8,192 B are under 64 KiB: the first class,
  // by descending cost; b's fp32 weight needs a bf16 copy: 80,000 + 40,000 = 120,000 B, the
  // second class. tiny (8 KiB <= 16 KiB) is force-loaded.
  EXPECT_EQ(st.offload_cost[0], 20488u);
  EXPECT_EQ(st.offload_cost[1], 120000u);
  EXPECT_EQ(st.order, (std::vector<std::uint32_t>{0, 2, 1}));
  EXPECT_EQ(st.slice_offset[0], 0u);
  EXPECT_EQ(st.slice_size[0], 21504u + 1024u);  // each tensor to a 1 KiB multiple
  EXPECT_EQ(st.slice_offset[1], 22528u);        // 512 B-aligned already
  EXPECT_EQ(st.slice_size[1], 80896u);
  EXPECT_EQ(st.slice_size[2], 0u);
  EXPECT_TRUE(st.forced_module[2]);
  EXPECT_EQ(st.forced, 1u);
  EXPECT_EQ(st.forced_bytes, 8192u);
  EXPECT_EQ(st.staged, 22528u + 80896u);
}

CaseResult run_sim(const Scenario& s) {
  SimBackend backend;
  return run_case(s, backend, false);
}

TEST(DynamicRun, OnACardThatHoldsItAllTheSecondNodeFindsEveryModuleResident) {
  Scenario s = te_scenario(48 * GiB);
  s.stages = {{StageOp::load, 0}, {StageOp::forward, 0}, {StageOp::forward, 0}};
  const CaseResult r = run_sim(s);
  ASSERT_FALSE(r.exec.error) << *r.exec.error;
  ASSERT_TRUE(r.exec.dynamic);
  const DynamicReport& d = *r.exec.dynamic;
  EXPECT_EQ(r.verdict.kind, VerdictKind::pass) << r.verdict.message;
  EXPECT_EQ(d.faults, 2u * 211);
  EXPECT_EQ(d.copies, 211u);         // the first node copies every staged module in
  EXPECT_EQ(d.resident_hits, 211u);  // the second finds every copy intact
  EXPECT_EQ(d.refused, 0u);
  EXPECT_EQ(d.pages_evicted, 0u);
  EXPECT_EQ(d.vbar_peak, round_up(17180 * MiB, sim::kVbarPage));  // 537 pages: slices share pages
  // 17180 MiB at 25 GB/s and the matmuls of 512 tokens at 100 TFLOP/s.
  EXPECT_GT(d.elapsed_us, 700'000u);
}

TEST(DynamicRun, AWorkloadThatCannotFitIsAnExpectedOomNotAFinding) {
  // One 4 GiB bf16 weight computed in fp32 on an 8 GiB card: its 8 GiB fp32 copy alone is the card.
  Catalog catalog;
  const std::string json = R"({"device": {"total": "8GiB"}, "allocator": "async", "policy": "comfy:sep2026",
    "models": [{"id": "big", "source": "inline", "compute": "fp32", "modules": [
      {"name": "proj", "tensors": [{"name": "weight", "shape": [65536, 32768], "dtype": "bf16"}]}]}]})";
  const CaseResult r = run_sim(parse_scenario_json(json, catalog, "x.json"));
  ASSERT_TRUE(r.exec.oom);
  EXPECT_TRUE(r.verdict.expected_oom) << r.verdict.message;
  EXPECT_FALSE(r.verdict.finding());
  EXPECT_NE(r.verdict.message.find("could not have"), std::string::npos) << r.verdict.message;
  ASSERT_TRUE(r.exec.dynamic && r.exec.dynamic->oom);
  EXPECT_FALSE(r.exec.dynamic->oom->avoidable());
  EXPECT_EQ(r.exec.dynamic->oom->request, 8 * GiB);
}

TEST(DynamicPresets, DatedPresetsDifferWhereAimdoDid) {
  const ComfyConstants feb = preset_constants(Preset::feb2026), sep = preset_constants(Preset::sep2026);
  EXPECT_EQ(feb.dynamic.poll_ms, 0u);
  EXPECT_EQ(sep.dynamic.poll_ms, 2000u);
  EXPECT_EQ(feb.dynamic.malloc_headroom, 0u);
  EXPECT_EQ(sep.dynamic.malloc_headroom, 128 * MiB);
  EXPECT_TRUE(feb.dynamic.ledger_pages);
  EXPECT_FALSE(sep.dynamic.ledger_pages);
  EXPECT_FALSE(feb.dynamic.aimdo_cast_buffers);
  EXPECT_TRUE(sep.dynamic.aimdo_cast_buffers);
  // The classic constants legacy models are planned with are dec2025's.
  EXPECT_EQ(sep.reserve, preset_constants(Preset::dec2025).reserve);
  EXPECT_EQ(parse_policy("comfy:dynamic", "p").label(), "comfy:sep2026");
  // --reserve-vram sets aimdo's simple headroom too (sep2026), not in feb2026.
  Policy p = parse_policy("comfy:sep2026", "p");
  apply_policy_override(p, "reserve", "1GiB", "--reserve");
  EXPECT_EQ(p.constants.dynamic.simple_headroom, 1 * GiB);
  Policy f = parse_policy("comfy:feb2026", "p");
  apply_policy_override(f, "reserve", "1GiB", "--reserve");
  EXPECT_EQ(f.constants.dynamic.simple_headroom, 256 * MiB);
  EXPECT_THROW(apply_policy_override(f, "vram_headroom", "1GiB", "--set"), InputError);
  Policy c = parse_policy("comfy:dec2025", "p");
  EXPECT_THROW(apply_policy_override(c, "vram_headroom", "1GiB", "--set"), InputError);
  EXPECT_THROW(parse_policy("exact:sep2026", "p"), InputError);
}

TEST(DynamicPresets, ScenariosComfyUICannotRunAreRefusedNamingTheField) {
  Catalog catalog;
  auto load = [&](std::string_view allocator, std::string_view policy) {
    const std::string json = fmt::format(R"({{"device": {{"total": "8GiB"}}, "allocator": "{}", "policy": "{}",
      "models": [{{"source": "catalog:clip-l"}}]}})", allocator, policy);
    return parse_scenario_json(json, catalog, "x.json");
  };
  try {
    load("caching-expandable", "comfy:sep2026");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("allocator.mode"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expandable_segments"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load("caching", "comfy:feb2026"), InputError);
  EXPECT_NO_THROW(load("async", "comfy:feb2026"));
  EXPECT_NO_THROW(load("caching-expandable", "comfy:dec2025"));
}

}  // namespace
}  // namespace vf

namespace vf {
namespace {

// ---- avoidable OOMs, found from a cold start and shrunk ------------------------------------------

std::string mechanism_of(const std::string& signature) {
  // "oom:forward:cast-buffer:async" -> "cast-buffer"
  const std::size_t a = signature.find(':', signature.find(':') + 1);
  return signature.substr(a + 1, signature.rfind(':') - a - 1);
}

TEST(DynamicCampaign, AColdStartFindsThreeAvoidableOomMechanismsEachShrunkToTwoModules) {
  // A campaign from nothing (seed 2, 3000 cases of comfy:sep2026, allocator, device and workload
  // drawn) finds avoidable OOMs of three mechanisms and shrinks each to a repro of two modules.
  // (1000 cases found all three while synthetic models could be under-tuned; tuned within the
  // catalog's range, seed 1 found them in 3000 until the context and the pool's growth step
  // became the H200's, and needs 6000 since; seed 2 finds all three in 3000.)
  const std::filesystem::path out = std::filesystem::temp_directory_path() / "vramfuzz-test-dynamic-campaign";
  std::filesystem::remove_all(out);
  Catalog catalog;
  SimBackend sim;
  CampaignConfig cfg;
  cfg.seed = 2;
  cfg.cases = 3000;
  cfg.gen.policy = "comfy:sep2026";
  cfg.out_dir = out.string();
  const CampaignResult r = run_campaign(cfg, catalog, sim);
  std::map<std::string, std::size_t> smallest;  // mechanism -> fewest repro modules
  for (const auto& [key, count] : r.signatures) {
    if (key.signature.rfind("oom:", 0) != 0) continue;
    ASSERT_FALSE(count.repro_file.empty()) << key.signature;
    const std::string mech = mechanism_of(key.signature);
    auto [it, fresh] = smallest.emplace(mech, count.repro_modules);
    if (!fresh) it->second = std::min(it->second, count.repro_modules);
    // Each repro says why, in its first paragraphs.
    const std::string md = read_text_file((std::filesystem::path(count.repro_file).parent_path() / "repro.md").string());
    EXPECT_NE(md.find("**Why:**"), std::string::npos) << count.repro_file;
    EXPECT_NE(md.find("**Rests on:** modelled"), std::string::npos) << count.repro_file;
    // Its stages have no predicted peak: the table says so in a row per stage (the forward's with
    // its measured peak) instead of being empty.
    EXPECT_TRUE(std::regex_search(md, std::regex(R"(\| [0-9]+ forward \S+ \| none \(dynamic VRAM: placed at run time\) \| \| [0-9]+\.[0-9]{2} MiB \| \|)")))
        << count.repro_file;
    // Its size while shrinking is the failed request's shortfall, named as such (no predicted peak).
    EXPECT_NE(md.find("Largest shortfall (the failed request beyond the free memory) seen while shrinking: +"), std::string::npos)
        << count.repro_file;
  }
  for (const char* mech : {"torch-cache", "cast-buffer", "stale-poll"}) {
    ASSERT_TRUE(smallest.count(mech)) << mech;
    EXPECT_LE(smallest[mech], 2u) << mech;
  }
  std::filesystem::remove_all(out);
}

CaseResult replay_corpus_repro(const std::string& name) {
  Catalog catalog;
  const std::string path = std::string(VF_SOURCE_DIR) + "/fuzz/corpus/regressions/" + name + "/repro.json";
  const Scenario s = load_case_file(path, catalog);
  SimBackend sim;
  CaseResult r = run_case(s, sim, false);
  EXPECT_LE(case_size(s).modules, 3u) << name;
  return r;
}

TEST(DynamicMechanisms, TheAsyncPoolsCachedBlocksAimdoCannotReach) {
  // sep2026-oom-forward-torch-cache-async: two 648 MiB FLUX.2 single-block linears, fp32 with a
  // LoRA, on 5.06 GiB: the conversions and LoRA deltas grow the cudaMallocAsync pool, whose freed
  // blocks it keeps (release threshold UINT64_MAX); a refused fault's cast buffer then finds no room.
  const CaseResult r = replay_corpus_repro("sep2026-oom-forward-torch-cache-async");
  EXPECT_EQ(r.verdict.signature, "oom:forward:torch-cache:async");
  ASSERT_TRUE(r.exec.dynamic && r.exec.dynamic->oom);
  const DynamicOom& o = *r.exec.dynamic->oom;
  EXPECT_TRUE(o.avoidable());
  EXPECT_EQ(o.what, "cast buffer grow");
  EXPECT_GT(o.torch_cache, o.request);  // the pool's cache alone would have held the request
  EXPECT_NE(r.verdict.explanation.find("UINT64_MAX"), std::string::npos) << r.verdict.explanation;
}

TEST(DynamicMechanisms, TheCachingAllocatorsCachedBlocksAimdoCannotReach) {
  const CaseResult r = replay_corpus_repro("sep2026-oom-forward-torch-cache-caching");
  EXPECT_EQ(r.verdict.signature, "oom:forward:torch-cache:caching");
  ASSERT_TRUE(r.exec.dynamic && r.exec.dynamic->oom);
  EXPECT_TRUE(r.exec.dynamic->oom->avoidable());
  EXPECT_GT(r.exec.dynamic->oom->torch_cache, r.exec.dynamic->oom->request);
  EXPECT_NE(r.verdict.explanation.find("cuMemAlloc hook"), std::string::npos) << r.verdict.explanation;
}

TEST(DynamicMechanisms, ACastBufferTheLargestRuleGrewOnTheSecondStream) {
  // sep2026-oom-forward-cast-buffer-async: a 2580 MiB embedding refused every step on a 3.12 GiB
  // card. Step 1 grows offload stream 1's cast buffer to 2592 MiB; in step 2 the
  // LARGEST_AIMDO_CASTED_WEIGHT rule moves the embedding to stream 2 (it compares the call's own,
  // empty, cast buffer with the size needed), whose buffer must grow to 2592 MiB too.
  const CaseResult r = replay_corpus_repro("sep2026-oom-forward-cast-buffer-async");
  EXPECT_EQ(r.verdict.signature, "oom:forward:cast-buffer:async");
  ASSERT_TRUE(r.exec.dynamic && r.exec.dynamic->oom);
  const DynamicOom& o = *r.exec.dynamic->oom;
  EXPECT_EQ(o.cast_slack, 2592 * MiB);
  EXPECT_EQ(o.request, 2336 * MiB);
  ASSERT_TRUE(r.exec.oom);
  EXPECT_NE(r.exec.oom->detail.find("LARGEST_AIMDO_CASTED_WEIGHT"), std::string::npos) << r.exec.oom->detail;
  EXPECT_EQ(r.exec.dynamic->refused, 3u);
}

TEST(DynamicMechanisms, AnotherProcessAllocatingBetweenTwoPolls) {
  // sep2026-oom-others-stale-poll-caching: another process takes 1088 MiB 8 ms in, after aimdo's
  // first poll; aimdo keeps filling the card as if it had not; its 64 MiB 3 ms later fails
  // within the headroom aimdo promises, while aimdo holds unpinned pages it would have evicted.
  const CaseResult r = replay_corpus_repro("sep2026-oom-others-stale-poll-caching");
  EXPECT_EQ(r.verdict.signature, "oom:others:stale-poll:caching");
  ASSERT_TRUE(r.exec.dynamic);
  ASSERT_EQ(r.exec.dynamic->others_failures.size(), 1u);
  const OthersFailure& f = r.exec.dynamic->others_failures[0];
  EXPECT_EQ(f.bytes, 64 * MiB);
  EXPECT_LT(f.free, f.bytes);
  EXPECT_GE(f.evictable + f.free, f.bytes);
  EXPECT_TRUE(f.others_changed);
  EXPECT_LT(f.since_poll_us, 2'000'000u);
}


TEST(DynamicFindingFile, CarriesTheDiagnosisAndAimdosColumnsAndReadsBack) {
  // A finding file written for a dynamic OOM says why (explanation) and what the verdict rests on,
  // and its trace rows carry aimdo's resident pages, its cast buffers and the modelled time; the
  // strict reader takes the file back and it replays to the same signature.
  Catalog catalog;
  const std::string path = std::string(VF_SOURCE_DIR) + "/fuzz/corpus/regressions/sep2026-oom-forward-cast-buffer-async/repro.json";
  const Scenario s = load_case_file(path, catalog);
  SimBackend sim;
  const CaseResult r = run_case(s, sim, true);
  const std::filesystem::path out = std::filesystem::temp_directory_path() / fmt::format("vf-dynfinding-{}.json", ::getpid());
  const nlohmann::json j = nlohmann::json::parse(case_json(s, r, 1, 2, 3, out.string()));
  EXPECT_EQ(j["schema"], "vramfuzz.finding/1");
  EXPECT_EQ(j["verdict"]["explanation"], r.verdict.explanation);
  EXPECT_NE(j["verdict"]["explanation"].get<std::string>().find("reset_cast_buffers"), std::string::npos);
  EXPECT_EQ(j["verdict"]["rests_on"].get<std::string>().rfind("modelled:", 0), 0u) << j["verdict"]["rests_on"];
  ASSERT_FALSE(j["trace_around_peak"].empty());
  bool cast_seen = false;
  std::uint64_t last_t = 0;
  for (const nlohmann::json& row : j["trace_around_peak"]) {
    ASSERT_TRUE(row.contains("vbar") && row.contains("cast") && row.contains("t_us")) << row.dump();
    cast_seen = cast_seen || row["cast"].get<std::uint64_t>() >= 2592 * MiB;
    EXPECT_GE(row["t_us"].get<std::uint64_t>(), last_t) << "modelled time runs forward";
    last_t = row["t_us"].get<std::uint64_t>();
  }
  EXPECT_TRUE(cast_seen) << "the 2592 MiB cast buffer is in the rows around the OOM";
  write_file_atomic(out.string(), j.dump(1));
  const Scenario again = load_case_file(out.string(), catalog);
  EXPECT_EQ(run_case(again, sim, false).verdict.signature, "oom:forward:cast-buffer:async");
  std::filesystem::remove(out);
}

}  // namespace
}  // namespace vf
