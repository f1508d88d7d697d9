// Class C, over-reservation (harness/oracle.cpp judge_waste): the plan offloads modules a card
// had room for because its offload buffer was larger than the transients ever were.
#include <gtest/gtest.h>

#include <string>

#include <fmt/format.h>

#include "harness/campaign.h"
#include "harness/exec.h"
#include "harness/scenario.h"
#include "reports/summary.h"

namespace vf {
namespace {

// PR #11096's shape: one 512 MiB weight (16384 x 16384 bf16) and 64 of 16 MiB (2048 x 4096
// bf16), 1536 MiB in all, bf16 compute, on a 2880 MiB card with a 256 MiB context (2624 MiB
// available; 2624 - 819.20 floor - 400 reserve = 1404.80 MB usable).
std::string shape(const std::string& policy) {
  std::string mods = R"({"name": "giant", "tensors": [{"name": "weight", "shape": [16384, 16384], "dtype": "bf16"}]})";
  for (int b = 0; b < 64; ++b) {
    mods += fmt::format(R"(, {{"name": "blocks.{}.mlp", "tensors": [{{"name": "weight", "shape": [2048, 4096], "dtype": "bf16"}}]}})", b);
  }
  return R"({"schema": "vramfuzz.scenario/1", "device": {"total": "2880MiB", "context_overhead": "256MiB"},
    "allocator": {"mode": "raw"}, "policy": ")" + policy + R"(", "offload_streams": 2,
    "models": [{"id": "m", "source": "inline", "kind": "diffusion", "family": "generic", "memory_usage_factor": 0.1, "compute": "bf16",
                "arch": {"latent_channels": 16, "hidden": 4096, "widest": 4096, "text_tokens": 0, "patch": 2, "temporal_down": 1,
                         "gated": false, "kept_hidden_states": 0},
                "modules": [)" + mods + R"(]}],
    "workload": {"width": 256, "height": 256, "batch": 1, "cfg": 1.0}})";
}

CaseResult run(const std::string& policy) {
  Catalog catalog;
  SimBackend sim;
  return run_case(parse_scenario_json(shape(policy), catalog, "waste.json"), sim, false);
}

TEST(Waste, Nov2025sBufferKeepsTheWholeModelOffACardWithRoomForIt) {
  // comfy:nov2025 budgets cost + NS x the largest module: 512 + 2 x 512 = 1536 MiB, the whole
  // model, so nothing is resident. In flight at once: the 512 MiB weight's transfer copy and two
  // 16 MiB ones, 544 MiB: 992 MiB of the buffer unused (65% of the 1536 MiB offloaded). Measured
  // peak 552 MiB (544 + 8 MiB of activations); with the activations at the plan's 819.20 MiB
  // allowance instead, 1363.20 MiB, + 400 MiB reserve leaves 860.80 MiB of 2624: room for the
  // 512 MiB module.
  const CaseResult r = run("comfy:nov2025");
  ASSERT_EQ(r.verdict.kind, VerdictKind::waste) << r.verdict.message;
  EXPECT_EQ(r.verdict.signature, "waste:forward:offload-buffer:raw");
  EXPECT_EQ(r.verdict.overshoot, static_cast<std::int64_t>(992 * MiB));
  EXPECT_EQ(r.verdict.measured, 552 * MiB);
  EXPECT_TRUE(r.verdict.finding());
  EXPECT_FALSE(r.verdict.expected_oom);
  EXPECT_EQ(r.verdict.cause,
            "offload buffer 1536.00 MiB budgeted, transients peaked at 544.00 MiB: 992.00 MiB unused while 65 modules (1536.00 MiB, "
            "largest 512.00 MiB) were offloaded");
  EXPECT_NE(r.verdict.message.find("the measured peak with the activations at their budget (1363.20 MiB) + reserve 400.00 MiB left "
                                   "860.80 MiB of the 2624.00 MiB available, room for the largest offloaded module (giant, 512.00 MiB)"),
            std::string::npos)
      << r.verdict.message;
  EXPECT_NE(r.verdict.explanation.find("Over-reservation (class C)"), std::string::npos);
  EXPECT_EQ(r.verdict.rests_on.rfind("exact: the offload buffer is the plan's own term", 0), 0u) << r.verdict.rests_on;
}

TEST(Waste, Dec2025sLookaheadBufferLoadsItAndPasses) {
  // After PR #11096 the buffer is the next NS modules' cost: 48 MiB, 1344 MiB resident. No waste.
  const CaseResult r = run("comfy:dec2025");
  EXPECT_EQ(r.verdict.kind, VerdictKind::pass) << r.verdict.message;
  ASSERT_EQ(r.plan.loads.size(), 1u);
  EXPECT_EQ(r.plan.loads[0].loaded, 1344 * MiB);
  EXPECT_EQ(r.plan.loads[0].offload_buffer, 48 * MiB);
}

TEST(Waste, ACardWithoutRoomForTheLargestOffloadedModuleIsNoWaste) {
  // The same plan with 1200 MiB of the card taken by another process: 1424 MiB available, and
  // even the measured 552 MiB (activations below their allowance) + 400 MiB reserve leave only
  // 472 MiB, less than the 512 MiB module. 992 MiB of the buffer still went unused, but the card
  // had no room for what it kept off: a pass.
  Catalog catalog;
  SimBackend sim;
  Scenario s = parse_scenario_json(shape("comfy:nov2025"), catalog, "waste.json");
  s.device.used_by_others = 1200 * MiB;
  const CaseResult r = run_case(s, sim, false);
  EXPECT_EQ(r.verdict.kind, VerdictKind::pass) << r.verdict.message;
  EXPECT_EQ(r.exec.reserved_peak, 552 * MiB);
}

TEST(Waste, SeverityIsATenthOfTheUnusedBuffersShareOfTheDevice) {
  // 992 MiB unused on a 2880 MiB card: 34.4% of it, weighted a tenth (waste costs bandwidth, not
  // an OOM): 0.034444; a violation of the same bytes is 0.344444.
  EXPECT_DOUBLE_EQ(report::finding_severity(992 * static_cast<std::int64_t>(MiB), 2880 * MiB, "waste"), 0.034444);
  EXPECT_DOUBLE_EQ(report::finding_severity(992 * static_cast<std::int64_t>(MiB), 2880 * MiB, "violation"), 0.344444);
}

}  // namespace
}  // namespace vf
