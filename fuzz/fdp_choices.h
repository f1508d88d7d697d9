// The choice-driven generator fed by libFuzzer's FuzzedDataProvider, the case fuzz target 5
// (fuzz_pipeline) makes of its input bytes, and what it does with that case. Header-only so that `vramfuzz fuzz-import` replays
// an input through the very same code: the same bytes give the same draws, hence the same
// scenario, on any build.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "harness/campaign.h"
#include "harness/choices.h"
#include "harness/core/error.h"
#include "harness/generate.h"
#include "harness/overhead.h"
#include "harness/scenario.h"

namespace vf {

// draw(lo, hi) = ConsumeIntegralInRange(lo, hi), both bounds inclusive as in Choices. Bytes are
// taken from the end of the input; an exhausted input gives lo, the simplest choice.
class FdpChoices final : public Choices {
 public:
  explicit FdpChoices(FuzzedDataProvider& fdp) : fdp_(fdp) {}

 protected:
  std::uint64_t draw_impl(std::uint64_t lo, std::uint64_t hi) override {
    return fdp_.ConsumeIntegralInRange<std::uint64_t>(lo, hi);
  }

 private:
  FuzzedDataProvider& fdp_;
};

// Fuzz target 5's case: the shared generator draws a scenario, then one of the allocator option
// sets the overhead bound is tested on (bound_option_sets); the drawn policy keeps its placement
// preset and overrides but predicts with `exact`, and the reserve is the allocator mode's overhead
// bound for the lowered program (`exact_reserve=bound`, harness/overhead.h). So a violation or an
// OOM where the plan fits means a model, the lowering, the predictor, the oracle or the bound is
// wrong.
inline Scenario pipeline_case(FuzzedDataProvider& fdp, Catalog& catalog, std::vector<std::uint64_t>* choices = nullptr) {
  FdpChoices c(fdp);
  GenConfig cfg;
  cfg.policy = "comfy:oct2025,comfy:nov2025,comfy:dec2025";  // `exact` takes a classic placement
  Scenario s = generate_scenario(c, cfg, catalog);
  s.allocator.options = c.pick(bound_option_sets(s.allocator.mode));
  s.policy.predictor = PredictorKind::exact;
  apply_policy_override(s.policy, "exact_reserve", "bound", "policy");
  validate_scenario(s);
  if (choices) *choices = c.recorded();
  return s;
}

// Fuzz target 5's run of a case, step by step (predict, lower, check_program, sim, judge), shared
// with `vramfuzz fuzz-import` so that every way the target can fail replays the same way there.
struct PipelineRun {
  CaseResult result;       // as far as it got
  std::string rejected;    // an InputError's message: the target skips the input
  std::string broken;      // a program check_program refuses, or any other exception: the target traps
};

inline PipelineRun run_pipeline_case(const Scenario& s) {
  PipelineRun run;
  CaseResult& r = run.result;
  try {
    r.plan = predict(s);
    r.program = lower(s, r.plan);
    if (const std::string why = check_program(r.program); !why.empty()) {
      run.broken = "check_program: " + why;
      return run;
    }
    SimBackend backend;
    r.exec = backend.execute(s, r.program, ExecOptions{false});
    r.verdict = judge(s, r.plan, r.program, r.exec);
  } catch (const InputError& e) {
    run.rejected = e.what();
  } catch (const std::exception& e) {
    run.broken = std::string("the pipeline threw: ") + e.what();
  }
  return run;
}

}  // namespace vf
