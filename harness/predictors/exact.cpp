// `exact`: the classic placement, with the prediction replaced by the exact live (requested)
// bytes peak of the lowered program, per stage: the lower bound any predictor must cover. Its
// reserve is 0, a given size, or the allocator mode's overhead bound for the program
// (harness/overhead.h).
#include "harness/lower.h"
#include "harness/overhead.h"
#include "harness/predictors/predictors.h"

namespace vf {

void refine_exact(const Scenario& s, Plan& plan, Bytes& limit_need) {
  plan.reserve = s.policy.exact_reserve.value_or(0);
  const Program prog = lower(s, plan);
  const LivePeaks lp = live_peaks(prog);
  for (StagePlan& sp : plan.stages) sp.predicted_peak = lp.stage_peak[sp.stage];
  if (s.policy.exact_reserve_bound) {
    const OverheadBreakdown b = overhead_breakdown(s, prog);
    plan.reserve = b.bound;
    limit_need = b.limit_need;
  } else if (s.policy.exact_reserve_only) {
    plan.reserve = *s.policy.exact_reserve_only;
  }
}

}  // namespace vf
