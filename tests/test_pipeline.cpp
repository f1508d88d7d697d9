// The pipeline end to end on a scenario small enough to work out by hand: every number below is
// derived in the comments from the rules in comfyui-accounting.md §2 and docs/lowering.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>

#include "harness/campaign.h"
#include "harness/choices.h"
#include "harness/generate.h"
#include "harness/lower.h"
#include "harness/scenario.h"
#include "bench/scale_fixture.h"

namespace vf {
namespace {

// Four modules in forward order (bf16 compute, NS = 1 offload stream):
//   a: [2048, 4096] fp8   =  8 MiB, offload cost  8 + 16 (bf16 copy) = 24 MiB
//   b: [4096, 4096] bf16  = 32 MiB, offload cost 32 (no conversion)
//   c: [1024, 4096] fp8   =  4 MiB, offload cost  4 + 8 = 12 MiB
//   d: [1024, 4096] fp8   =  4 MiB, offload cost 12 MiB
// reserve R = 64 MiB and inference floor 32 MiB, so I = 96 MiB. At 256x256 the latent area is
// 32 x 32 = 1024, memory_required(batch 1) = 1024 x 2 B x 0.01 x 1.0 MiB = 20.48 MiB, so
// min_req = max(I, 20.48 + 64) = 96 MiB. The device (142 MiB, nothing else on it) leaves
// usable = 142 - 96 = 46 MiB for weights.
constexpr const char* kTiny = R"({
  "schema": "vramfuzz.scenario/1",
  "device": {"total": "142MiB", "used_by_others": 0, "context_overhead": 0},
  "allocator": "raw",
  "policy": {"name": "comfy:dec2025", "overrides": {"reserve": "64MiB", "inference_floor": "32MiB"}},
  "models": [{
    "id": "m", "kind": "diffusion", "family": "generic", "memory_usage_factor": 1.0, "compute": "bf16",
    "arch": {"latent_channels": 16, "hidden": 64, "widest": 192, "text_tokens": 0, "patch": 2},
    "modules": [
      {"name": "a", "tensors": [{"name": "weight", "shape": [2048, 4096], "dtype": "fp8_e4m3fn"}]},
      {"name": "b", "tensors": [{"name": "weight", "shape": [4096, 4096], "dtype": "bf16"}]},
      {"name": "c", "tensors": [{"name": "weight", "shape": [1024, 4096], "dtype": "fp8_e4m3fn"}]},
      {"name": "d", "tensors": [{"name": "weight", "shape": [1024, 4096], "dtype": "fp8_e4m3fn"}]}
    ]}],
  "workload": {"width": 256, "height": 256, "batch": 1, "cfg": 1.0},
  "offload_streams": 1
})";

Scenario tiny(std::string_view policy_override = "") {
  Catalog catalog;
  Scenario s = parse_scenario_json(kTiny, catalog, "tiny");
  if (!policy_override.empty()) {
    s.policy = parse_policy(policy_override, "policy");
    apply_policy_override(s.policy, "reserve", "64MiB", "policy");
    apply_policy_override(s.policy, "inference_floor", "32MiB", "policy");
  }
  return s;
}

TEST(Pipeline, GoldenPlanByHand) {
  const Scenario s = tiny();
  const Plan p = predict(s);
  ASSERT_EQ(p.loads.size(), 1u);
  const LoadPlan& lp = p.loads[0];
  EXPECT_EQ(lp.min_req, 96 * MiB);
  EXPECT_EQ(lp.est_min, 21474836u);       // 20.48 MiB, truncated to bytes
  EXPECT_EQ(lp.est_max, 42949672u);       // batch x 2 for CFG: 40.96 MiB
  EXPECT_EQ(lp.extra_mem, 42949672u + 64 * MiB);
  EXPECT_EQ(lp.usable, static_cast<std::int64_t>(46 * MiB));
  EXPECT_EQ(lp.offload_cost, (std::vector<Bytes>{24 * MiB, 32 * MiB, 12 * MiB, 12 * MiB}));
  // Sorted by (cost, module_mem, name) descending: b, a, then d before c on the name tie-break.
  EXPECT_EQ(lp.sorted, (std::vector<std::uint32_t>{1, 0, 3, 2}));
  // Walk with NS = 1 look-ahead:
  //   b: potential 32 + mem(a) 8 = 40; 0 + 32 + 40 = 72 >= 46 -> offloaded, buffer 40
  //   a: max(40, 24 + mem(d) 4) = 40;    0 + 8 + 40 = 48 >= 46 -> offloaded
  //   d: max(40, 12 + mem(c) 4) = 40;    0 + 4 + 40 = 44 <  46 -> resident
  //   c: 40;                             4 + 4 + 40 = 48 >= 46 -> offloaded
  EXPECT_EQ(lp.resident, (std::vector<std::uint8_t>{0, 0, 0, 1}));
  EXPECT_EQ(lp.loaded, 4 * MiB);
  EXPECT_EQ(lp.offloaded, 44 * MiB);
  EXPECT_EQ(lp.offload_buffer, 40 * MiB);
  EXPECT_EQ(lp.log_line,
            "loaded partially; 46.00 MB usable, 4.00 MB loaded, 44.00 MB offloaded, 40.00 MB buffer reserved, lowvram patches: 0");
  // Forward prediction: resident 4 + buffer 40 + allowance max(floor 32, 20.48) = 76 MiB.
  ASSERT_EQ(p.stages.size(), 2u);
  EXPECT_EQ(p.stages[1].activation_allowance, 32 * MiB);
  EXPECT_EQ(p.stages[1].predicted_peak, 76 * MiB);
  EXPECT_EQ(p.predicted_peak, 76 * MiB);
  EXPECT_EQ(p.reserve, 64 * MiB);
  EXPECT_TRUE(p.fits);  // 76 + 64 = 140 <= 142
  // The true working set: (256/16)^2 = 256 tokens x (192 + 3 x 64) x 2 B = 192 KiB.
  EXPECT_EQ(p.stages[1].activation_bytes, 196608u);
}

TEST(Pipeline, GoldenTransientWindowExposesSortedLookahead) {
  // P3 walks offloaded modules in *forward* order (a, b, c) with windows of NS + 1 = 2:
  //   a: storage a 8 + b 32 + bf16 copy of a 16 = 56 MiB   <- worst
  //   b: 32 + 4 + 0 (already bf16)             = 36 MiB
  //   c: 4 + bf16 copy of c 8                   = 12 MiB
  // The sorted look-ahead budgeted 40 MiB: the forward order puts b's 32 MiB transfer next to
  // a's conversion, which the sorted order (b, a, d, c) never pairs.
  const Plan p = predict(tiny());
  EXPECT_EQ(p.loads[0].realistic_transient, 56 * MiB);
  EXPECT_EQ(p.loads[0].transient_module, 0u);
}

TEST(Pipeline, GoldenMeasuredPeakByHand) {
  const Scenario s = tiny();
  SimBackend backend;
  const CaseResult r = run_case(s, backend, true);
  EXPECT_EQ(check_program(r.program), "");
  // Peak while module a runs: resident d 4 MiB + activation 192 KiB + transfers of a (8) and of
  // the next offloaded module b (32, issued one ahead on the single offload stream) + a's bf16
  // copy (16) = 60 MiB + 192 KiB live.
  const LivePeaks live = live_peaks(r.program);
  EXPECT_EQ(live.peak, 60 * MiB + 196608);
  EXPECT_EQ(r.exec.live_peak, 60 * MiB + 196608);
  // raw charges whole 2 MiB pages: every weight buffer is a page multiple already, the 192 KiB
  // activation takes a 2 MiB page: 62 MiB reserved.
  EXPECT_EQ(r.exec.reserved_peak, 62 * MiB);
  EXPECT_EQ(r.exec.stage_reserved_peak[0], 4 * MiB);
  EXPECT_EQ(r.exec.stage_reserved_peak[1], 62 * MiB);
  EXPECT_FALSE(r.exec.oom.has_value());
  EXPECT_EQ(r.verdict.kind, VerdictKind::pass);
  EXPECT_EQ(r.verdict.overshoot, -static_cast<std::int64_t>(78 * MiB));  // 62 - (76 + 64)
}

// How runs, plans and repros show an inline model's storage: the dtype of most weight bytes
// (b: 32 MiB bf16 against a, c, d: 16 MiB fp8), with the other dtypes, never the unused default.
TEST(Pipeline, InlineModelStorageIsWhatItsTensorsHold) {
  const Scenario s = tiny();
  EXPECT_EQ(dominant_storage(s.models[0]), Dtype::bf16);
  EXPECT_EQ(storage_label(s.models[0]), "bf16 67% + fp8_e4m3fn");
  EXPECT_NE(format_plan(s, predict(s)).find("bf16 67% + fp8_e4m3fn -> bf16, 48.00 MiB"), std::string::npos)
      << format_plan(s, predict(s));
}

// A plan that does not fit and a run without an OOM: nothing failed, but the verdict says the
// plan was pessimistic instead of quoting a "headroom" against a reserve larger than the card.
TEST(Pipeline, PassWhereThePlanDoesNotFitSaysSo) {
  Scenario s = tiny();
  apply_policy_override(s.policy, "reserve", "1TiB", "--reserve");
  SimBackend backend;
  const CaseResult r = run_case(s, backend, false);
  ASSERT_FALSE(r.plan.fits);
  EXPECT_FALSE(r.exec.oom.has_value());
  EXPECT_EQ(r.verdict.kind, VerdictKind::pass);
  EXPECT_FALSE(r.verdict.expected_oom);
  EXPECT_NE(r.verdict.message.find("no OOM although the plan does not fit"), std::string::npos) << r.verdict.message;
  EXPECT_NE(r.verdict.message.find("reserve 1048576.00 MiB"), std::string::npos) << r.verdict.message;
  EXPECT_EQ(r.verdict.message.find("headroom"), std::string::npos) << r.verdict.message;
}

TEST(Pipeline, GoldenExactPredictorIsTheLivePeak) {
  const Scenario s = tiny("exact:dec2025");
  const Plan p = predict(s);
  EXPECT_EQ(p.reserve, 64 * MiB);  // the reserve override applies to exact too
  EXPECT_EQ(p.stages[0].predicted_peak, 4 * MiB);
  EXPECT_EQ(p.stages[1].predicted_peak, 60 * MiB + 196608);
  SimBackend backend;
  Scenario no_reserve = s;
  apply_policy_override(no_reserve.policy, "reserve", "0", "policy");
  const CaseResult r = run_case(no_reserve, backend, false);
  // With no reserve, the activation's page rounding (2 MiB - 192 KiB) is the whole overshoot; the
  // stage peak is first reached at a's bf16 copy, so that op names the signature.
  EXPECT_EQ(r.verdict.kind, VerdictKind::violation);
  EXPECT_EQ(r.verdict.overshoot, static_cast<std::int64_t>(2 * MiB - 196608));
  EXPECT_EQ(r.verdict.signature, "violation:forward:upcast:raw");
}

TEST(Pipeline, OctoberPresetLoadsEverythingOnTheWeightFloor) {
  // comfy:oct2025 keeps a 128 MiB weight floor: usable = max(128, 46) MiB > 48 MiB model.
  const Plan p = predict(tiny("comfy:oct2025"));
  EXPECT_TRUE(p.loads[0].full_load);
  EXPECT_EQ(p.loads[0].usable, static_cast<std::int64_t>(128 * MiB));
  EXPECT_EQ(p.loads[0].loaded, 48 * MiB);
  EXPECT_EQ(p.loads[0].offload_buffer, 0u);
}

TEST(Pipeline, ProgramInvariants) {
  const Scenario s = tiny();
  const Plan p = predict(s);
  const Program prog = lower(s, p);
  EXPECT_EQ(check_program(prog), "");
  EXPECT_EQ(prog.streams, 2u);
  // Every transfer lives on the offload stream and is freed there after a wait on compute.
  for (const Op& op : prog.ops) {
    if ((op.kind == OpKind::alloc || op.kind == OpKind::free) && prog.buffers[op.buffer].kind == BufferKind::transfer) {
      EXPECT_EQ(op.stream, 1);
    }
  }
}

TEST(Pipeline, SameScenarioSameTrace) {
  const Scenario s = tiny();
  SimBackend backend;
  const CaseResult a = run_case(s, backend, true);
  const CaseResult b = run_case(s, backend, true);
  ASSERT_EQ(a.exec.trace.size(), b.exec.trace.size());
  for (std::size_t i = 0; i < a.exec.trace.size(); ++i) {
    EXPECT_EQ(a.exec.trace[i].reserved, b.exec.trace[i].reserved);
    EXPECT_EQ(a.exec.trace[i].live, b.exec.trace[i].live);
  }
}

// The two programs are the same op for op and buffer for buffer.
::testing::AssertionResult same_program(const Program& a, const Program& b) {
  if (a.ops.size() != b.ops.size()) return ::testing::AssertionFailure() << a.ops.size() << " ops against " << b.ops.size();
  if (a.buffers.size() != b.buffers.size()) {
    return ::testing::AssertionFailure() << a.buffers.size() << " buffers against " << b.buffers.size();
  }
  for (std::size_t i = 0; i < a.ops.size(); ++i) {
    if (!(a.ops[i] == b.ops[i])) return ::testing::AssertionFailure() << "op " << i << " differs";
  }
  for (std::size_t i = 0; i < a.buffers.size(); ++i) {
    if (!(a.buffers[i] == b.buffers[i])) return ::testing::AssertionFailure() << "buffer " << i << " differs";
  }
  if (a.stage_begin != b.stage_begin) return ::testing::AssertionFailure() << "stage_begin differs";
  return ::testing::AssertionSuccess();
}

LowerOptions gather_walk(std::size_t min) {
  LowerOptions o;
  o.gather_walk_min = min;
  return o;
}

// Every preset kind: classic, dynamic with aimdo's cast buffers (sep2026) and without (feb2026),
// and a drawn mix ("").
constexpr const char* kEveryPresetKind[] = {"comfy:dec2025", "comfy:sep2026", "comfy:feb2026", ""};

// The generator's case for `seed` under `policy` ("" draws one); `salt` keeps one test's cases
// apart from another's.
Scenario generated(Catalog& catalog, const char* policy, std::uint64_t seed, std::uint64_t salt) {
  PrngChoices c(splitmix64(seed) ^ salt);
  GenConfig cfg;
  if (*policy) cfg.policy = policy;
  return generate_scenario(c, cfg, catalog);
}

// LowerOptions::repeat_passes: a forward's first pass lowered and copied for the others is the
// program every pass lowered on its own gives, op for op and buffer for buffer, over generated
// cases of every preset kind: classic, dynamic with aimdo's cast buffers (sep2026) and without
// (feb2026, whose torch cast buffers rotate over the offload streams and may not repeat), and a
// drawn mix. The copies' buffers are renumbered; the resident weights they read are not.
TEST(Lowering, RepeatedPassesAreThePassesLoweredOneByOne) {
  Catalog catalog;
  std::size_t repeated = 0, dynamic_repeated = 0, ops = 0;
  for (const char* policy : kEveryPresetKind) {
    for (std::uint64_t seed = 1; seed <= 150; ++seed) {
      const Scenario s = generated(catalog, policy, seed, 0x7265706561747321ull);
      const Plan plan = predict(s);
      const Program once = lower(s, plan);
      LowerOptions each;
      each.repeat_passes = false;
      ASSERT_TRUE(same_program(once, lower(s, plan, each))) << policy << " seed " << seed;
      ops += once.ops.size();
      for (std::size_t i = 0; i < s.stages.size(); ++i) {
        const bool diffusion = s.models[s.stages[i].model].spec->kind == ModelKind::diffusion;
        if (s.stages[i].op != StageOp::forward || plan.stages[i].passes * (diffusion ? s.workload.steps : 1) < 2) continue;
        ++repeated;
        if (plan.dynamic) ++dynamic_repeated;
      }
    }
  }
  // The cases exercise repetition, dynamic forwards included, on programs of real size.
  EXPECT_GT(repeated, 200u);
  EXPECT_GT(dynamic_repeated, 100u);
  EXPECT_GT(ops, 500000u);
}

// LowerOptions::gather_walk_min: a classic load walk that reads its modules' tensors from the copy
// gathered in walk order (here at any size: 0) lowers the program the walk reading the model's
// tables gives, over generated cases of every preset kind (dynamic presets load their legacy
// models classically), LoRA loads included.
TEST(Lowering, AGatheredLoadWalkIsTheWalkReadFromTheModel) {
  Catalog catalog;
  std::size_t moved = 0, lora_moved = 0;
  for (const char* policy : kEveryPresetKind) {
    for (std::uint64_t seed = 1; seed <= 120; ++seed) {
      const Scenario s = generated(catalog, policy, seed, 0x6761746865722121ull);
      const Plan plan = predict(s);
      // The first lowering notes the walk, the second gathers it.
      const Program noted = lower(s, plan, gather_walk(0));
      const Program gathered = lower(s, plan, gather_walk(0));
      const Program reference = lower(s, plan, gather_walk(std::numeric_limits<std::size_t>::max()));
      ASSERT_TRUE(same_program(noted, reference)) << (*policy ? policy : "drawn") << " seed " << seed;
      ASSERT_TRUE(same_program(gathered, reference)) << (*policy ? policy : "drawn") << " seed " << seed;
      for (const Op& op : reference.ops) {
        if (op.kind != OpKind::h2d || op.phase != Phase::load) continue;
        ++moved;
        if (s.models[op.model].lora) ++lora_moved;
      }
    }
  }
  // The walks moved real models' weights, some of them patched.
  EXPECT_GT(moved, 20000u);
  EXPECT_GT(lora_moved, 1000u);
}

// A thread keeps the last gather and uses it again only for the same model and the same walk: a
// walk in another order (as an external predictor may give), and another model of the same shape
// in the scenario's place, each lower as the model's tables say, the first time (noted) and the
// second (gathered).
TEST(Lowering, AGatheredLoadWalkIsMadeAgainForAnotherWalkOrModel) {
  Catalog catalog;
  std::size_t checked = 0;
  for (std::uint64_t seed = 1; seed <= 40 && checked < 10; ++seed) {
    Scenario s = generated(catalog, "comfy:dec2025", seed, 0x7265676174686572ull);
    Plan plan = predict(s);
    // A load whose walk moves at least two modules.
    const auto load = std::find_if(plan.loads.begin(), plan.loads.end(), [&](const LoadPlan& lp) {
      return std::count_if(lp.sorted.begin(), lp.sorted.end(), [&](std::uint32_t i) { return lp.resident[i] != 0; }) >= 2;
    });
    if (load == plan.loads.end()) continue;
    ++checked;
    const LowerOptions gather = gather_walk(0), never = gather_walk(std::numeric_limits<std::size_t>::max());
    // Lowered twice with the gather, the first noting the walk and the second gathering it: the
    // same program both times (the last one's is returned).
    const auto twice = [&] {
      const Program noted = lower(s, plan, gather);
      Program gathered = lower(s, plan, gather);
      EXPECT_TRUE(same_program(noted, gathered)) << "seed " << seed;
      return gathered;
    };
    const Program first = twice();
    ASSERT_TRUE(same_program(first, lower(s, plan, never))) << "seed " << seed;

    // Another model in its place: a copy whose tensors are the same but for one of the first
    // module the walk moves, longer by one row (the walk is the same list of modules).
    auto edited = std::make_shared<ModelSpec>(*s.models[load->model].spec);
    const std::uint32_t i = *std::find_if(load->sorted.begin(), load->sorted.end(), [&](std::uint32_t m) { return load->resident[m] != 0; });
    const auto t = std::find_if(edited->modules[i].tensors.begin(), edited->modules[i].tensors.end(),
                                [](const Tensor& x) { return !x.shape.empty(); });
    ASSERT_NE(t, edited->modules[i].tensors.end()) << "seed " << seed;
    ++t->shape.front();
    finalize_model(*edited, "models[0]");
    s.models[load->model].spec = edited;
    const Program other = twice();
    ASSERT_TRUE(same_program(other, lower(s, plan, never))) << "seed " << seed;
    EXPECT_FALSE(same_program(other, first)) << "seed " << seed;  // the edit did reach the program

    // The same model, walked in reverse.
    std::reverse(load->sorted.begin(), load->sorted.end());
    const Program reversed = twice();
    ASSERT_TRUE(same_program(reversed, lower(s, plan, never))) << "seed " << seed;
    EXPECT_FALSE(same_program(reversed, other)) << "seed " << seed;  // the order did reach the program
  }
  EXPECT_EQ(checked, 10u);
}

// At the default threshold: the scale bench's text encoder of 70,000 modules (above 65,536, its
// walk scattered as a real encoder's), lowered three times on one thread (noted, gathered, the
// gather reused), gives the program read from the model's tables each time.
TEST(Lowering, ALargeModelsWalkIsGatheredAtTheDefaultThreshold) {
  const Scenario s = scale_scenario(70'000, AllocatorMode::raw);
  const Plan plan = predict(s);
  ASSERT_GE(plan.loads.front().sorted.size(), LowerOptions{}.gather_walk_min);
  const Program reference = lower(s, plan, gather_walk(std::numeric_limits<std::size_t>::max()));
  std::size_t moved = 0;
  for (const Op& op : reference.ops) moved += op.kind == OpKind::h2d && op.phase == Phase::load;
  EXPECT_GT(moved, 40'000u);  // 60 % of the weights fit, the largest modules first: 24,378 of two tensors
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(same_program(lower(s, plan), reference)) << "lowering " << i + 1;
}

}  // namespace
}  // namespace vf
