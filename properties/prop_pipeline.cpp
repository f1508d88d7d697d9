// Properties of the whole pipeline, driven by RapidCheck through the same choice-driven generator
// a campaign uses (every draw is a gen::inRange, so RapidCheck shrinks the choices).
//   P1  measured allocator peak <= predicted peak + reserve        (the oracle's violation)
//   P2  no OOM where the plan said it fits                          (the oracle's oom)
//   P3  comfy: the realistic transient window of offloaded modules <= the plan's offload buffer
//   P4  every allocator mode: reserved peak - exact live peak <= the mode's overhead bound
//   plus invariants of plan and program, and that the pipeline never errors.
// Each case is written to disk before it runs (VF_PROPERTY_CASE, default
// vramfuzz-property-case.json in the working directory), so a crash cannot lose it the way it
// loses RapidCheck's reproduce string.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include <fmt/format.h>

#include "harness/campaign.h"
#include "harness/core/json_in.h"
#include "harness/overhead.h"
#include "harness/predictors/predictors.h"
#include "harness/shrink.h"
#include "properties/classic_before18.h"
#include "tests/sanitizer.h"

namespace vf {
namespace {

class RapidCheckChoices final : public Choices {
 protected:
  std::uint64_t draw_impl(std::uint64_t lo, std::uint64_t hi) override { return *rc::gen::inRange<std::uint64_t>(lo, hi + 1); }
};

// Catalog models are immutable once built; sharing one cache across property runs only saves time.
Catalog& shared_catalog() {
  static Catalog catalog;
  return catalog;
}

// The classic presets, for the properties of the classic planner and of `exact`.
constexpr const char* kClassicPolicies = "comfy:oct2025,comfy:nov2025,comfy:dec2025";

std::string case_file() {
  const char* e = std::getenv("VF_PROPERTY_CASE");
  return e ? e : "vramfuzz-property-case.json";
}

Scenario generate(const GenConfig& cfg) {
  RapidCheckChoices choices;
  Scenario s = generate_scenario(choices, cfg, shared_catalog());
  write_file_atomic(case_file(), scenario_to_json(s));
  RC_CLASSIFY(s.models.size() > 1, "pipeline");
  RC_TAG(allocator_mode_name(s.allocator.mode));
  return s;
}

CaseResult run_guarded(const Scenario& s) {
  SimBackend backend;
  try {
    return run_case(s, backend, false);
  } catch (const std::exception& e) {
    RC_FAIL(fmt::format("the pipeline threw: {}", e.what()));
  }
}

RC_GTEST_PROP(PipelineProps, PlanAndProgramInvariants, ()) {
  Scenario s = generate(GenConfig{});
  // Unload everything at the end so "every allocation is freed" is checkable.
  for (std::uint32_t m = 0; m < s.models.size(); ++m) s.stages.push_back({StageOp::unload, m});
  const CaseResult r = run_guarded(s);
  RC_ASSERT(r.verdict.kind != VerdictKind::error);
  for (const LoadPlan& lp : r.plan.loads) {
    const ModelSpec& m = *s.models[lp.model].spec;
    RC_ASSERT(lp.resident.size() == m.modules.size());
    if (lp.dynamic) {
      // Staging: each module is staged (a VBAR slice holding its weight and bias, each tensor
      // rounded to 1 KiB) or force-loaded; slices are 512 B-aligned, in staging order, disjoint;
      // every byte of the model is in a slice, the counted force-loaded bytes or the uncounted.
      const StagingPlan& st = lp.staging;
      Bytes in_slices = 0, end = 0;
      for (const std::uint32_t i : st.order) {
        if (st.slice_size[i] == 0) continue;
        RC_ASSERT(st.slice_offset[i] % 512 == 0u);
        RC_ASSERT(st.slice_offset[i] >= end);
        end = st.slice_offset[i] + st.slice_size[i];
        Bytes staged = 0;
        for (const Tensor& t : m.modules[i].tensors) staged += staged_tensor(t) ? t.bytes : 0;
        RC_ASSERT(st.slice_size[i] >= staged);
        RC_ASSERT(st.slice_size[i] - staged < 1024u * m.modules[i].tensors.size());
        in_slices += staged;
      }
      RC_ASSERT(end == st.vbar_end);
      for (std::size_t i = 0; i < m.modules.size(); ++i) {
        RC_ASSERT(st.slice_size[i] != 0 || st.forced_module[i] != 0);
        RC_ASSERT(!(st.slice_size[i] != 0 && st.forced_module[i] != 0));
      }
      RC_ASSERT(in_slices + st.forced_bytes + st.uncounted == m.bytes);
      RC_ASSERT(st.vbar_request == m.bytes * 10);
      continue;
    }
    RC_ASSERT(lp.lowvram.size() == m.modules.size());
    // Each module is on the device, cast on the fly (cast-hook modules only), or in host memory;
    // the log's figures and the uncounted rest add up to the model.
    Bytes resident = 0, lowvram = 0;
    for (std::size_t i = 0; i < m.modules.size(); ++i) {
      RC_ASSERT(!(lp.resident[i] && lp.lowvram[i]));
      if (lp.lowvram[i]) RC_ASSERT(m.modules[i].cast_hook);
      resident += lp.resident[i] ? m.modules[i].bytes : 0;
      lowvram += lp.lowvram[i] ? m.modules[i].bytes : 0;
    }
    RC_ASSERT(lowvram == lp.offloaded);
    RC_ASSERT(lp.loaded <= resident);
    RC_ASSERT(lp.loaded + lp.offloaded + lp.uncounted == m.bytes);
    if (lp.full_load) {
      RC_ASSERT(lp.offload_buffer == 0u);
      RC_ASSERT(resident == m.bytes);
    }
  }
  for (const StagePlan& sp : r.plan.stages) {
    if (sp.checked) RC_ASSERT(sp.predicted_peak >= sp.resident_total);
  }
  RC_ASSERT(check_program(r.program) == std::string());
  // Only modules with the cast hook are transferred per forward; a raw one stays where it is.
  for (const Op& op : r.program.ops) {
    if (op.phase != Phase::forward || op.kind != OpKind::h2d) continue;
    const Buffer& b = r.program.buffers[op.buffer];
    RC_ASSERT(s.models[b.model].spec->modules[b.module].cast_hook);
  }
  if (!r.exec.oom) {
    // Every allocation was freed by the unloads, and the allocator handed everything back.
    RC_ASSERT(live_peaks(r.program).peak >= r.plan.stages.back().resident_total);
    Bytes live = 0;
    for (const Op& op : r.program.ops) {
      if (op.kind == OpKind::alloc) live += r.program.buffers[op.buffer].bytes;
      if (op.kind == OpKind::free) live -= r.program.buffers[op.buffer].bytes;
    }
    RC_ASSERT(live == 0u);
    RC_ASSERT(r.exec.final_stats.allocated.current == 0u);
    RC_ASSERT(r.exec.final_stats.reserved.current == 0u);
  }
}

// Dynamic VRAM: every run ends without an error, and the account of an OOM adds up to the card
// (context + other processes + torch's requested, cache and rounding + aimdo's pages and cast
// buffers + free = total), so the mechanism a finding names is the slack that was there.
RC_GTEST_PROP(PipelineProps, DynamicOomAccountAddsUpToTheCard, ()) {
  GenConfig cfg;
  cfg.policy = "comfy:feb2026,comfy:sep2026";
  const Scenario s = generate(cfg);
  const CaseResult r = run_guarded(s);
  RC_ASSERT(r.verdict.kind != VerdictKind::error);
  RC_ASSERT(r.exec.dynamic.has_value());
  RC_ASSERT(check_program(r.program) == std::string());
  const DynamicReport& d = *r.exec.dynamic;
  RC_ASSERT(d.resident_hits + d.copies + d.refused <= d.faults);
  if (!d.oom) return;
  const DynamicOom& o = *d.oom;
  RC_CLASSIFY(o.avoidable(), "avoidable");
  const Bytes sum = o.context + o.others + o.needed_tensors + o.other_weights + o.torch_cache + o.rounding + o.needed_pages +
                    o.prefetch_pins + o.resident_pages + o.needed_cast + o.cast_slack + o.free;
  RC_ASSERT(sum == o.total);
  if (r.verdict.kind == VerdictKind::oom && r.verdict.signature.rfind("oom:others:", 0) != 0) {
    RC_ASSERT(o.avoidable());
    RC_ASSERT(r.verdict.signature.find(std::string(o.mechanism())) != std::string::npos);
  }
}

RC_GTEST_PROP(PipelineProps, SameScenarioSameVerdict, ()) {
  const Scenario s = generate(GenConfig{});
  const CaseResult a = run_guarded(s);
  const CaseResult b = run_guarded(s);
  RC_ASSERT(a.verdict.signature == b.verdict.signature);
  RC_ASSERT(a.verdict.overshoot == b.verdict.overshoot);
  RC_ASSERT(a.exec.reserved_peak == b.exec.reserved_peak);
}

// P3 for comfy:dec2025 where its sorted look-ahead is sound: models whose offload cost is
// proportional to their bytes (one storage dtype for every weight: catalog fp8 / bf16 files).
// Mixed GGUF files break it (an F32 tail converts at 0.5x its bytes, a q4_k weight at 3.6x), and
// so does mixing converted and unconverted weights (tests/test_pipeline.cpp, the golden case).
RC_GTEST_PROP(PipelineProps, P3Dec2025CoversTheTransientWindow, ()) {
  GenConfig cfg;
  cfg.policy = "comfy:dec2025";
  const Dtype storage = *rc::gen::element(Dtype::bf16, Dtype::fp8_e4m3fn, Dtype::fp8_e5m2, Dtype::fp16);
  const Dtype compute = *rc::gen::element(Dtype::bf16, Dtype::fp16, Dtype::fp32);
  cfg.dtypes = std::make_pair(storage, compute);
  const Scenario s = generate(cfg);
  RC_PRE(s.name != "synthetic");  // synthetic models mix an fp32 norm per block on purpose
  const CaseResult r = run_guarded(s);
  for (const LoadPlan& lp : r.plan.loads) {
    if (lp.full_load || lp.offloaded == 0) continue;
    RC_CLASSIFY(true, "offloaded");
    RC_ASSERT(lp.realistic_transient <= lp.offload_buffer);
  }
}

// ---- models whose every module has the cast hook plan as before issue #18 -----------------------

// `s` with the modules that have no cast hook taken out of every model (containers go with them:
// a container never has the cast hook), so Wan, SD3.5 and the FLUX.2 VAE are still drawn.
Scenario only_cast_hook_modules(Scenario s) {
  for (ModelRef& ref : s.models) {
    const auto& mods = ref.spec->modules;
    if (std::all_of(mods.begin(), mods.end(), [](const Module& m) { return m.cast_hook; })) continue;
    auto copy = std::make_shared<ModelSpec>(*ref.spec);
    std::erase_if(copy->modules, [](const Module& m) { return !m.cast_hook; });
    finalize_model(*copy, ref.id);
    ref.source = "inline";
    ref.spec = std::move(copy);
  }
  return s;
}

// Every field of the plan, against the planner frozen before #18 told raw modules apart. The two
// fields it did not have follow from the old ones: with every module cast-hooked, a module not
// on the device is cast on the fly, and nothing is left out of the log's figures.
RC_GTEST_PROP(PipelineProps, CastHookModelsPlanAsBefore, ()) {
  GenConfig classic;
  classic.policy = kClassicPolicies;
  Scenario s = only_cast_hook_modules(generate(classic));
  // Re-load the first model after the others: evictions, and a walk over what is left.
  if (s.models.size() > 1 && *rc::gen::arbitrary<bool>()) {
    s.stages.push_back({StageOp::load, 0});
    s.stages.push_back({StageOp::forward, 0});
  }
  const Plan now = plan_comfy_classic(s);
  const Plan before = before18::plan_comfy_classic(s);
  RC_ASSERT(now.policy == before.policy);
  RC_ASSERT(now.reserve == before.reserve);
  RC_ASSERT(now.streams == before.streams);
  RC_ASSERT(now.available == before.available);
  RC_ASSERT(now.loads.size() == before.loads.size());
  for (std::size_t i = 0; i < now.loads.size(); ++i) {
    const LoadPlan& a = now.loads[i];
    const LoadPlan& b = before.loads[i];
    RC_ASSERT(a.stage == b.stage);
    RC_ASSERT(a.model == b.model);
    RC_ASSERT(a.free_before == b.free_before);
    RC_ASSERT(a.est_max == b.est_max);
    RC_ASSERT(a.est_min == b.est_min);
    RC_ASSERT(a.extra_mem == b.extra_mem);
    RC_ASSERT(a.min_req == b.min_req);
    RC_ASSERT(a.evictions.size() == b.evictions.size());
    for (std::size_t e = 0; e < a.evictions.size(); ++e) {
      RC_ASSERT(a.evictions[e].model == b.evictions[e].model);
      RC_ASSERT(a.evictions[e].modules == b.evictions[e].modules);
      RC_ASSERT(a.evictions[e].bytes == b.evictions[e].bytes);
    }
    RC_ASSERT(a.usable == b.usable);
    RC_ASSERT(a.full_load == b.full_load);
    RC_ASSERT(a.loaded == b.loaded);
    RC_ASSERT(a.offloaded == b.offloaded);
    RC_ASSERT(a.uncounted == 0u);
    RC_ASSERT(a.offload_buffer == b.offload_buffer);
    RC_ASSERT(a.lowvram_patches == b.lowvram_patches);
    RC_ASSERT(a.resident == b.resident);
    RC_ASSERT(a.lowvram.size() == b.resident.size());
    for (std::size_t m = 0; m < a.lowvram.size(); ++m) RC_ASSERT(a.lowvram[m] == (b.resident[m] ? 0 : 1));
    RC_ASSERT(a.sorted == b.sorted);
    RC_ASSERT(a.offload_cost == b.offload_cost);
    RC_ASSERT(a.realistic_transient == b.realistic_transient);
    RC_ASSERT(a.transient_module == b.transient_module);
    RC_ASSERT(a.log_line == b.log_line);
  }
  RC_CLASSIFY(std::any_of(now.loads.begin(), now.loads.end(), [](const LoadPlan& lp) { return !lp.full_load; }), "partial");
  RC_CLASSIFY(std::any_of(now.loads.begin(), now.loads.end(), [](const LoadPlan& lp) { return !lp.evictions.empty(); }), "evictions");
  RC_ASSERT(now.stages.size() == before.stages.size());
  for (std::size_t i = 0; i < now.stages.size(); ++i) {
    const StagePlan& a = now.stages[i];
    const StagePlan& b = before.stages[i];
    RC_ASSERT(a.stage == b.stage);
    RC_ASSERT(a.op == b.op);
    RC_ASSERT(a.model == b.model);
    RC_ASSERT(a.checked == b.checked);
    RC_ASSERT(a.resident_total == b.resident_total);
    RC_ASSERT(a.offload_buffer == b.offload_buffer);
    RC_ASSERT(a.activation_allowance == b.activation_allowance);
    RC_ASSERT(a.activation_bytes == b.activation_bytes);
    RC_ASSERT(a.run_batch == b.run_batch);
    RC_ASSERT(a.passes == b.passes);
    RC_ASSERT(a.predicted_peak == b.predicted_peak);
    RC_ASSERT(a.load_plan == b.load_plan);
  }
  RC_ASSERT(format_plan(s, now) == format_plan(s, before));
}

// ---- known-bad presets must be caught ----------------------------------------------------------

struct Counted {
  std::uint64_t calls = 0;
  std::uint64_t calls_at_first_failure = 0;
  std::optional<Scenario> first_failure;
  std::optional<Scenario> last_failure;  // RapidCheck's final counterexample is its last failure

  // Runs one case of the property, remembering the first and the last failing one.
  bool fails(const Scenario& s) {
    ++calls;
    SimBackend backend;
    const bool failed = run_case(s, backend, false).verdict.finding();
    if (failed) {
      if (!first_failure) {
        first_failure = s;
        calls_at_first_failure = calls;
      }
      last_failure = s;
    }
    return failed;
  }
};

// "P1 and P2 hold" for comfy:oct2025 on the fp8 -> fp32 offload class (the origin class).
rc::detail::TestResult check_oct2025_class(std::uint64_t seed, Counted& counted) {
  rc::detail::TestParams params;
  params.seed = seed;
  params.maxSuccess = 100;  // RapidCheck's default number of cases
  rc::detail::TestMetadata meta;
  meta.id = "oct2025-fp8-fp32";
  return rc::detail::checkTestable(
      [&counted] {
        GenConfig cfg;
        cfg.policy = "comfy:oct2025";
        cfg.dtypes = std::make_pair(Dtype::fp8_e4m3fn, Dtype::fp32);
        RapidCheckChoices choices;
        const Scenario s = generate_scenario(choices, cfg, shared_catalog());
        RC_ASSERT(!counted.fails(s));
      },
      meta, params);
}

TEST(PipelineKnownBad, Oct2025FailsOnTheFp8ToFp32OffloadClass) {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    Counted counted;
    const auto result = check_oct2025_class(seed, counted);
    rc::detail::FailureResult failure;
    ASSERT_TRUE(result.match(failure)) << "seed " << seed << ": comfy:oct2025 survived 100 cases of its own bug class";
    EXPECT_LT(failure.numSuccess, 100);
    ASSERT_TRUE(counted.first_failure.has_value());
    SimBackend backend;
    const Verdict v = run_case(*counted.first_failure, backend, false).verdict;
    EXPECT_NE(v.signature.find(":forward:"), std::string::npos) << v.signature;  // it fails where the origin did
  }
}

// ---- RapidCheck's shrinking vs ours on the same failing property --------------------------------
// The origin class written the way a RapidCheck user would: a list of fp8 linear layers (fp32
// compute, two offload streams, comfy:oct2025) on a device of 4-24 GiB. RapidCheck shrinks the
// list natively (removing chunks, then each layer's dimensions); vramfuzz shrinks the first
// failing case RapidCheck found.

Scenario layers_scenario(const std::vector<std::pair<std::uint32_t, std::uint32_t>>& layers, std::uint32_t device_gib) {
  auto spec = std::make_shared<ModelSpec>();
  spec->name = "layers";
  spec->source = "inline";
  spec->kind = ModelKind::text_encoder;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    Module mod;
    mod.name = fmt::format("layers.{}", i);
    mod.tensors.push_back(Tensor{"weight", {256ull * layers[i].first, 256ull * layers[i].second}, Dtype::fp8_e4m3fn,
                                 TensorRole::weight, 0, 0});
    spec->modules.push_back(std::move(mod));
  }
  finalize_model(*spec, "layers");
  Scenario s;
  s.device.total = Bytes{device_gib} * GiB;
  s.policy = parse_policy("comfy:oct2025", "policy");
  s.offload_streams = 2;
  ModelRef ref;
  ref.id = "layers";
  ref.source = "inline";
  ref.compute = Dtype::fp32;
  ref.spec = std::move(spec);
  s.models.push_back(std::move(ref));
  s.stages = default_stages(1);
  return s;
}

struct Comparison {
  std::uint64_t rc_execs = 0;
  CaseSize rc_size;
  std::uint64_t our_execs = 0;
  CaseSize our_size;
};

std::optional<Comparison> compare_on_seed(std::uint64_t seed) {
  Counted counted;
  rc::detail::TestParams params;
  params.seed = seed;
  rc::detail::TestMetadata meta;
  meta.id = "oct2025-fp8-layers";
  (void)rc::detail::checkTestable(
      [&counted] {
        const auto device_gib = *rc::gen::inRange<std::uint32_t>(4, 25);
        const auto layers = *rc::gen::container<std::vector<std::pair<std::uint32_t, std::uint32_t>>>(
            rc::gen::pair(rc::gen::inRange<std::uint32_t>(1, 129), rc::gen::inRange<std::uint32_t>(1, 129)));
        RC_PRE(!layers.empty());
        const Scenario s = layers_scenario(layers, device_gib);
        RC_ASSERT(!counted.fails(s));
      },
      meta, params);
  if (!counted.first_failure) return std::nullopt;
  if (const char* dump = std::getenv("VF_DUMP_FIRST_FAILURE")) {
    write_file_atomic(fmt::format("{}-{}.json", dump, seed), scenario_to_json(*counted.first_failure));
  }
  SimBackend backend;
  const ShrinkResult ours = shrink(*counted.first_failure, backend, ShrinkOptions{});
  return Comparison{counted.calls - counted.calls_at_first_failure, case_size(*counted.last_failure), ours.executions,
                    ours.final_size};
}

TEST(ShrinkComparison, OursIsNoLargerInAThirdOfTheExecutions) {
  std::string table =
      "| seed | RapidCheck executions | RapidCheck final (modules / bytes) | vramfuzz executions | vramfuzz final (modules / bytes) |\n"
      "|---:|---:|---:|---:|---:|\n";
  std::uint64_t rc_total = 0, our_total = 0;
  std::size_t no_larger = 0, rows = 0;
  for (std::uint64_t seed = 1; seed <= 9; ++seed) {
    const auto c = compare_on_seed(seed);
    if (!c) continue;
    ++rows;
    table += fmt::format("| {} | {} | {} / {} | {} | {} / {} |\n", seed, c->rc_execs, c->rc_size.modules,
                         format_mib(c->rc_size.bytes), c->our_execs, c->our_size.modules, format_mib(c->our_size.bytes));
    rc_total += c->rc_execs;
    our_total += c->our_execs;
    no_larger += c->our_size.modules <= c->rc_size.modules ? 1 : 0;
  }
  ASSERT_GE(rows, 7u) << "the property must fail for most seeds";
  const double ratio = static_cast<double>(our_total) / static_cast<double>(rc_total);
  table += fmt::format("| total | {} | | {} | |\n\nexecutions, vramfuzz / RapidCheck: {:.3f}; vramfuzz has no more modules in {}/{} seeds\n",
                       rc_total, our_total, ratio, no_larger, rows);
  std::ofstream("shrink-comparison.md") << table;
  std::printf("%s", table.c_str());
  // Over the whole run, at most a third of RapidCheck's executions.
  EXPECT_LE(ratio, 1.0 / 3.0);
  // Never more modules. Bytes may be larger: the margin (overshoot >= half the original) forbids
  // RapidCheck's knife-edge minimum, and redistribution moves dropped modules' bytes into the one
  // at the peak.
  EXPECT_EQ(no_larger, rows);
}

// The median shrink of a comfy:oct2025 finding from a campaign: <= 3 modules, <= 200 executions.
using test::kSanitized;

TEST(ShrinkComparison, MedianOct2025FindingShrinksToThreeModulesIn200Executions) {
  if (kSanitized) {
    GTEST_SKIP() << "a measurement: it runs in the optimized build (make test runs it there); under ASan it "
                    "repeats the same shrinker code paths as the other properties at ten times the cost";
  }
  GenConfig cfg;
  cfg.policy = "comfy:oct2025";
  std::vector<std::size_t> modules;
  std::vector<std::uint64_t> execs;
  SimBackend backend;
  for (std::uint64_t i = 0; modules.size() < 11 && i < 3000; ++i) {
    PrngChoices c(case_seed(11, i));
    const Scenario s = generate_scenario(c, cfg, shared_catalog());
    if (!run_case(s, backend, false).verdict.finding()) continue;
    const ShrinkResult r = shrink(s, backend, ShrinkOptions{});
    modules.push_back(r.final_size.modules);
    execs.push_back(r.executions);
  }
  ASSERT_EQ(modules.size(), 11u);
  std::sort(modules.begin(), modules.end());
  std::sort(execs.begin(), execs.end());
  std::printf("oct2025 findings shrunk: median %zu modules (max %zu), median %llu executions (max %llu)\n", modules[7],
              modules.back(), static_cast<unsigned long long>(execs[7]), static_cast<unsigned long long>(execs.back()));
  EXPECT_LE(modules[5], 3u);
  EXPECT_LE(execs[5], 200u);
}

}  // namespace
}  // namespace vf

namespace {
// RapidCheck prints "Some of your RapidCheck properties had failures" at exit whenever any check
// failed, including the known-bad checks above that must fail. Say so before it does.
class KnownBadNote final : public ::testing::Environment {
 public:
  void TearDown() override {
    std::printf("note: the known-bad checks (PipelineKnownBad, ShrinkComparison) fail RapidCheck properties on purpose;\n"
                "      a RapidCheck 'had failures' line below refers to them unless a gtest case above FAILED.\n");
  }
};
const auto* const kKnownBadNote = ::testing::AddGlobalTestEnvironment(new KnownBadNote);
}  // namespace

// ---- P4: each allocator mode's overhead bound (harness/overhead.h) -----------------------------
// Per allocator mode, the generator's scenario with one of the option sets the bound is tested on
// (bound_option_sets), predicted by `exact` (the drawn policy's placement) with the bound as the
// reserve. For every checked stage, reserved peak - live peak <= B, and so for the program's
// overall peaks; hence no violation and no OOM where the plan fits (the plan's fit includes a
// memory fraction's limit). More cases: RC_PARAMS="max_success=5000".
namespace vf {
namespace {

void check_p4(AllocatorMode mode) {
  RapidCheckChoices choices;
  GenConfig cfg;
  cfg.allocator = mode;
  cfg.policy = kClassicPolicies;  // `exact` takes its placement from a classic preset
  Scenario s = generate_scenario(choices, cfg, shared_catalog());
  const auto sets = bound_option_sets(mode);
  const std::size_t set = choices.draw(0, sets.size() - 1);
  s.allocator.options = sets[set];
  s.policy.predictor = PredictorKind::exact;
  apply_policy_override(s.policy, "exact_reserve", "bound", "policy");
  validate_scenario(s);
  write_file_atomic(case_file(), scenario_to_json(s));
  RC_TAG(set);

  const CaseResult r = run_guarded(s);
  RC_ASSERT(r.verdict.kind != VerdictKind::error);
  const OverheadBreakdown b = overhead_breakdown(s, r.program);
  RC_ASSERT(r.plan.reserve == b.bound);
  // An OOM is allowed only where the plan itself says the case does not fit.
  RC_ASSERT(!r.exec.oom || !r.plan.fits);
  if (r.exec.oom) return;
  const LivePeaks lp = live_peaks(r.program);
  for (const StagePlan& sp : r.plan.stages) {
    if (!sp.checked) continue;
    const Bytes measured = r.exec.stage_reserved_peak[sp.stage];
    if (measured > lp.stage_peak[sp.stage] + b.bound) {
      RC_FAIL(fmt::format("stage {}: reserved peak {} - live peak {} = {} > bound: {}", sp.stage, measured,
                          lp.stage_peak[sp.stage], measured - lp.stage_peak[sp.stage], b.summary()));
    }
  }
  RC_ASSERT(r.exec.reserved_peak <= lp.peak + b.bound);
  RC_ASSERT(!r.verdict.finding());
}

RC_GTEST_PROP(PipelineProps, P4RawWithinOverheadBound, ()) { check_p4(AllocatorMode::raw); }
RC_GTEST_PROP(PipelineProps, P4CachingWithinOverheadBound, ()) { check_p4(AllocatorMode::caching); }
RC_GTEST_PROP(PipelineProps, P4ExpandableWithinOverheadBound, ()) { check_p4(AllocatorMode::caching_expandable); }
RC_GTEST_PROP(PipelineProps, P4AsyncWithinOverheadBound, ()) { check_p4(AllocatorMode::async); }

}  // namespace
}  // namespace vf
