// The origin bug class (reference/origin-discussion.txt, ComfyUI #10891 / #11171): the FLUX.2
// text encoder stored fp8 (scaled) with fp32 compute on a 12 GiB card, partially offloaded with
// two offload streams. Each dated preset must behave the way that preset behaved in ComfyUI.
#include <gtest/gtest.h>

#include "harness/campaign.h"
#include "harness/scenario.h"

namespace vf {
namespace {

Scenario origin(std::string_view policy) {
  Catalog catalog;
  Scenario s = load_scenario_file(std::string(VF_SOURCE_DIR) + "/docs/examples/flux2-te-fp8-fp32-12gib.json", catalog);
  s.policy = parse_policy(policy, "policy");
  return s;
}

CaseResult run(const Scenario& s) {
  SimBackend backend;
  return run_case(s, backend, false);
}

TEST(Origin, ScenarioIsTheReportedCase) {
  const Scenario s = origin("comfy:oct2025");
  EXPECT_EQ(s.device.total, 12 * GiB);
  ASSERT_EQ(s.models.size(), 1u);
  EXPECT_EQ(s.models[0].spec->name, "flux2-text-encoder");
  EXPECT_EQ(s.models[0].storage.dtype, Dtype::fp8_e4m3fn);
  EXPECT_EQ(s.models[0].compute, Dtype::fp32);
  EXPECT_EQ(s.streams(), 2u);
  // fp8 scaled weights with the bf16 embedding (671 M params) kept wide: 17.34 B params in
  // about 18.0 GB.
  EXPECT_GT(s.models[0].spec->bytes, 17'900'000'000u);
  EXPECT_LT(s.models[0].spec->bytes, 18'100'000'000u);
}

TEST(Origin, October2025FailsInTheForwardUpcast) {
  // No offload accounting: the walk fills the budget, leaving only min_req = 0.8 GiB + 400 MiB
  // free; the forward then needs three 160 MiB fp8 transfers in flight plus two 640 MiB fp32
  // copies of an MLP weight (upcast, then the out-of-place scale) plus the activations.
  const CaseResult r = run(origin("comfy:oct2025"));
  EXPECT_EQ(r.plan.loads[0].offload_buffer, 0u);
  EXPECT_GT(r.plan.loads[0].offloaded, 0u);
  ASSERT_TRUE(r.verdict.finding()) << r.verdict.message;
  EXPECT_EQ(r.verdict.signature, "oom:forward:upcast:raw");
  EXPECT_TRUE(r.plan.fits);  // the predictor believed it fits: that is the bug
}

TEST(Origin, LookaheadWithoutDequantTermStillFails) {
  // ComfyUI between #11096 (2025-12-04) and #11171 (2025-12-07): the buffer covers NS + 1
  // storage-size transfers (3 x 160 MiB, plus each module's 4-byte fp32 scale) but not the fp32
  // copy: the #11171 reproducer's state.
  Scenario s = origin("comfy:dec2025");
  apply_policy_override(s.policy, "dequant_term", "false", "policy");
  const CaseResult r = run(s);
  EXPECT_EQ(r.plan.loads[0].offload_buffer, 3 * (160 * MiB + 4));
  EXPECT_GT(r.plan.loads[0].realistic_transient, r.plan.loads[0].offload_buffer);  // P3 fails
  ASSERT_TRUE(r.verdict.finding()) << r.verdict.message;
  EXPECT_EQ(r.verdict.signature, "oom:forward:upcast:raw");
}

TEST(Origin, December2025Passes) {
  const CaseResult r = run(origin("comfy:dec2025"));
  const LoadPlan& lp = r.plan.loads[0];
  // The buffer now holds the fp32 copy: 160 + 640 + 2 x 160 = 1120 MiB (+ three 4-byte scales),
  // exactly the realistic forward-order window of an MLP projection: P3 holds with equality.
  EXPECT_EQ(lp.offload_buffer, 1120 * MiB + 12);
  EXPECT_EQ(lp.realistic_transient, 1120 * MiB + 12);
  EXPECT_EQ(r.verdict.kind, VerdictKind::pass) << r.verdict.message;
  EXPECT_LT(r.verdict.overshoot, 0);
}

TEST(Origin, November2025OverReserves) {
  // #10733's buffer: cost + NS x the largest module (the 1280 MiB bf16 embedding), so far more
  // is offloaded than needed (issue class C): no OOM, and a `waste` finding (tests/test_waste.cpp
  // has the rule's hand-computed numbers).
  const CaseResult nov = run(origin("comfy:nov2025"));
  const CaseResult dec = run(origin("comfy:dec2025"));
  EXPECT_EQ(nov.verdict.kind, VerdictKind::waste) << nov.verdict.message;
  EXPECT_EQ(nov.verdict.signature, "waste:forward:offload-buffer:raw");
  EXPECT_GT(nov.plan.loads[0].offload_buffer, 2 * dec.plan.loads[0].offload_buffer);
  EXPECT_LT(nov.plan.loads[0].loaded, dec.plan.loads[0].loaded);
}

}  // namespace
}  // namespace vf
