// Attribution: what a classic finding's peak is made of against the plan's budget
// (harness/attribution.h), and the one-line cause every report shows.
#include <gtest/gtest.h>

#include <string>

#include "harness/attribution.h"
#include "harness/campaign.h"
#include "harness/exec.h"
#include "harness/lower.h"
#include "harness/oracle.h"
#include "harness/predict.h"
#include "harness/scenario.h"

namespace vf {
namespace {

Scenario corpus(const std::string& name, Catalog& catalog) {
  return load_case_file(std::string(VF_SOURCE_DIR) + "/fuzz/corpus/regressions/" + name + "/repro.json", catalog);
}

Scenario origin_scenario(Catalog& catalog) {
  return load_scenario_file(std::string(VF_SOURCE_DIR) + "/docs/examples/flux2-te-fp8-fp32-12gib.json", catalog);
}

TEST(Attribution, TheOriginCaseNamesTheFp32CopiesOfTheOffloadedFp8MlpWeights) {
  // The FLUX.2 text encoder (fp8 stored, fp32 compute) on 12 GiB under comfy:oct2025 OOMs at the
  // fp32 copy of layer 0's gate_proj. Live there: the three offloaded MLP weights' transfer copies
  // (5120 x 32768 fp8 = 160 MiB each, 480 MiB, and their three scales) and the one conversion in
  // flight (160 MiB x 4 = 640 MiB): 1120 MiB of transients against an offload buffer of 0.
  Catalog catalog;
  SimBackend sim;
  const CaseResult r = run_case(origin_scenario(catalog), sim, false);
  EXPECT_EQ(r.verdict.signature, "oom:forward:upcast:raw");
  EXPECT_EQ(r.verdict.cause.rfind("weight transients 1120.00 MiB for 6 tensors (6 offloaded, their transfer copies 480.00 MiB), "
                                  "fp8_e4m3fn -> fp32 conversions 640.00 MiB (largest: model.layers.0.mlp.gate_proj.weight",
                                  0),
            0u)
      << r.verdict.cause;
  EXPECT_NE(r.verdict.cause.find("budgeted 0.00 MiB (offload buffer): +1120.00 MiB"), std::string::npos) << r.verdict.cause;
  EXPECT_NE(r.verdict.explanation.find("resident weights 10795.05 MiB in 136 tensors (budgeted 10795.05 MiB as loaded weights)"),
            std::string::npos)
      << r.verdict.explanation;
  EXPECT_NE(r.verdict.explanation.find("activations 252.00 MiB (budgeted 819.20 MiB as the activation allowance)"), std::string::npos)
      << r.verdict.explanation;
  // The parts include the failing request: the total is what the allocator would have held, and
  // the paragraph says so beside what it did hold (the verdict's 11532 MiB).
  EXPECT_EQ(r.verdict.explanation.rfind("At op 366 the allocator would have held 12172.00 MiB reserved with the failing 640.00 MiB "
                                        "request (11532.00 MiB without it) against the plan's 11614.25 MiB + reserve 400.00 MiB",
                                        0),
            0u)
      << r.verdict.explanation;
  EXPECT_EQ(r.verdict.rests_on.rfind("modelled: the raw allocator on the simulated device", 0), 0u) << r.verdict.rests_on;
}

TEST(Attribution, PartsAreTheLiveBuffersAndTheAllocatorsOwnBytes) {
  Catalog catalog;
  Scenario s = origin_scenario(catalog);
  const Plan plan = predict(s);
  const Program p = lower(s, plan);
  SimBackend sim;
  const ExecResult r = sim.execute(s, p, ExecOptions{});
  ASSERT_TRUE(r.oom);
  const std::uint32_t op = r.oom->op;
  const Bytes request = r.oom->request;
  ASSERT_EQ(request, 640 * MiB);
  // Given 100 MiB of reserved memory above what is allocated and 3 MiB of rounding, on caching:
  s.allocator.mode = AllocatorMode::caching;
  const Attribution before = attribute(s, plan, p, 1, op, 0, 0, request);
  const Bytes live = before.requested;  // with the request
  const Attribution a = attribute(s, plan, p, 1, op, live - request + 3 * MiB + 100 * MiB, live - request + 3 * MiB, request);
  EXPECT_EQ(a.parts[static_cast<std::size_t>(PeakPart::convert)].bytes, 640 * MiB);
  EXPECT_EQ(a.parts[static_cast<std::size_t>(PeakPart::convert)].tensors, 1u);
  EXPECT_EQ(a.parts[static_cast<std::size_t>(PeakPart::transfer)].tensors, 6u);
  EXPECT_GE(a.parts[static_cast<std::size_t>(PeakPart::transfer)].bytes, 480 * MiB);
  EXPECT_LT(a.parts[static_cast<std::size_t>(PeakPart::transfer)].bytes, 481 * MiB);
  EXPECT_EQ(a.parts[static_cast<std::size_t>(PeakPart::rounding)].bytes, 3 * MiB);
  EXPECT_EQ(a.parts[static_cast<std::size_t>(PeakPart::slack)].bytes, 100 * MiB);
  EXPECT_EQ(a.budget_weights + a.budget_offload + a.budget_activation, plan.stages[1].predicted_peak);
  // Every byte reserved is in exactly one part.
  Bytes sum = 0;
  for (const PeakShare& part : a.parts) sum += part.bytes;
  EXPECT_EQ(sum, a.reserved);
  // The excesses, largest first: the transients (1120 MiB over 0), then slack, then rounding.
  const auto over = a.excesses();
  ASSERT_EQ(over.size(), 3u);
  EXPECT_EQ(over[0].budget, Budget::offload_buffer);
  EXPECT_EQ(over[1].part, PeakPart::slack);
  EXPECT_EQ(over[1].bytes, static_cast<std::int64_t>(100 * MiB));
  EXPECT_EQ(over[2].part, PeakPart::rounding);
  // On raw every tensor is its own cudaMalloc: reserved - requested is all page rounding.
  s.allocator.mode = AllocatorMode::raw;
  const Attribution raw = attribute(s, plan, p, 1, op, live - request + 103 * MiB, live - request + 3 * MiB, request);
  EXPECT_EQ(raw.parts[static_cast<std::size_t>(PeakPart::rounding)].bytes, 103 * MiB);
  EXPECT_EQ(raw.parts[static_cast<std::size_t>(PeakPart::slack)].bytes, 0u);
  EXPECT_EQ(raw.parts[static_cast<std::size_t>(PeakPart::rounding)].tensors, 144u);
}

TEST(Attribution, ACachingFindingNamesTheCachedBytesAndTheRounding) {
  // dec2025-violation-forward-upcast-caching: 733 MiB of the caching allocator's segments held
  // no tensor at the peak; the paragraph counts the tensors the rounding is spread over.
  Catalog catalog;
  SimBackend sim;
  const CaseResult r = run_case(corpus("dec2025-violation-forward-upcast-caching", catalog), sim, false);
  EXPECT_EQ(r.verdict.cause, "allocator slack 733.00 MiB (reserved but not allocated), budgeted 0: +733.00 MiB");
  EXPECT_NE(r.verdict.explanation.find("allocator rounding 2.00 MiB over 11 tensors and slack 733.00 MiB"), std::string::npos)
      << r.verdict.explanation;
  EXPECT_NE(r.verdict.explanation.find("Over budget: slack +733.00 MiB, weight transients +504.00 MiB, rounding +2.00 MiB"),
            std::string::npos)
      << r.verdict.explanation;
}

TEST(Attribution, AnActivationFindingSaysTheActivationsAreModelled) {
  Catalog catalog;
  SimBackend sim;
  const CaseResult r = run_case(corpus("dec2025-violation-forward-compute-caching-expandable", catalog), sim, false);
  EXPECT_EQ(r.verdict.cause, "activations 2410.31 MiB, budgeted 1182.66 MiB (activation allowance): +1227.66 MiB");
  EXPECT_NE(r.verdict.rests_on.find("activations from vramfuzz's structural formula (models/activation.cpp), not a measurement"),
            std::string::npos)
      << r.verdict.rests_on;
}

// Class B, the async-offload overlap: six 320 MiB fp16 weights, all offloaded (the 1613 MiB
// card leaves no weight budget), copied on 4 offload streams, each issued ahead of the compute
// stream: the copies of modules k ... k+4 are on the device at once, 5 x 320 MiB = 1600 MiB,
// and comfy:oct2025 budgets no offload buffer for them. The fifth copy's allocation (op 10)
// is the one that fails: 1280 MiB of copies are in the pool and 59.25 MiB are free.
TEST(Attribution, TheAsyncOffloadOverlapNamesTheCopiesInFlightAndTheirStreams) {
  const std::string json = R"({"schema": "vramfuzz.scenario/1", "name": "overlap",
    "device": {"total": "1613MiB", "context_overhead": 287047680}, "allocator": {"mode": "async"},
    "policy": "comfy:oct2025", "offload_streams": 4,
    "workload": {"width": 256, "height": 256, "batch": 1, "cfg": 1.0},
    "models": [{"id": "te", "kind": "text_encoder", "family": "mistral", "compute": "fp16",
                "modules": [{"name": "down_proj", "repeat": 6,
                             "tensors": [{"name": "weight", "shape": [5120, 32768], "dtype": "fp16"}]}]}],
    "pipeline": [{"op": "load", "model": "te"}, {"op": "forward", "model": "te"}]})";
  Catalog catalog;
  SimBackend sim;
  const CaseResult r = run_case(parse_scenario_json(json, catalog, "overlap.json"), sim, false);
  EXPECT_EQ(r.verdict.signature, "oom:forward:h2d:async") << r.verdict.message;
  EXPECT_EQ(r.verdict.op, 10u);
  EXPECT_EQ(r.verdict.cause,
            "async-offload overlap: weight transients 1600.00 MiB with the transfer copies of 5 offloaded modules in flight at "
            "once on 4 offload streams (5 tensors, 1600.00 MiB), budgeted 0.00 MiB (offload buffer): +1600.00 MiB");
  // One module on the compute stream alone is not the overlap: with no offload streams the
  // same six weights are copied one at a time and the case passes.
  Scenario one = parse_scenario_json(json, catalog, "overlap.json");
  one.offload_streams = 0;
  EXPECT_EQ(run_case(one, sim, false).verdict.kind, VerdictKind::pass);
}

// Other streams' frees: of reserved - allocated at the judged op, what its stream could not
// reuse is its own part, charged nothing, and leads the cause when it is the largest.
TEST(Attribution, OtherStreamsFreesAreTheirOwnPartOfTheUnallocatedBytes) {
  Catalog catalog;
  Scenario s = origin_scenario(catalog);
  s.allocator.mode = AllocatorMode::caching;
  const Plan plan = predict(s);
  const Program p = lower(s, plan);
  SimBackend sim;
  const ExecResult r = sim.execute(s, p, ExecOptions{});
  ASSERT_TRUE(r.oom);
  const Bytes live = r.oom->allocated;
  // 900 MiB unallocated at the failure, 700 of it held for the offload streams.
  const Attribution a = attribute(s, plan, p, 1, r.oom->op, live + 900 * MiB, live, r.oom->request, 700 * MiB);
  EXPECT_EQ(a.parts[static_cast<std::size_t>(PeakPart::held)].bytes, 700 * MiB);
  EXPECT_EQ(a.parts[static_cast<std::size_t>(PeakPart::slack)].bytes, 200 * MiB);
  // The held bytes cannot exceed what is unallocated.
  const Attribution capped = attribute(s, plan, p, 1, r.oom->op, live + 100 * MiB, live, r.oom->request, 700 * MiB);
  EXPECT_EQ(capped.parts[static_cast<std::size_t>(PeakPart::held)].bytes, 100 * MiB);
  EXPECT_EQ(capped.parts[static_cast<std::size_t>(PeakPart::slack)].bytes, 0u);
  // Only the transients (1120 MiB over a budget of 0) outweigh them; with the transients
  // budgeted, the held bytes lead.
  Attribution b = a;
  b.budget_offload = 1120 * MiB;
  const std::string cause = attribution_cause(b);
  EXPECT_EQ(cause, "other streams' frees 700.00 MiB (blocks cached in the offload streams' pools or waiting for their events; "
                   "PyTorch's caching allocator keeps a free list per stream, so the compute stream's allocations cannot reuse "
                   "them until empty_cache), budgeted 0: +700.00 MiB");
  b.mode = AllocatorMode::async;
  EXPECT_EQ(attribution_cause(b),
            "other streams' frees 700.00 MiB (frees on the offload streams that the compute stream is not yet ordered after, "
            "so its allocations could not reuse them: async-offload lag), budgeted 0: +700.00 MiB");
}

}  // namespace
}  // namespace vf
