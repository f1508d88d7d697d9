// The predictors behind predict() (harness/predict.h), one file each: classic ComfyUI
// (comfy_classic.cpp), exact (exact.cpp). predict.cpp picks one by the scenario's policy.
#pragma once

#include "harness/predict.h"

namespace vf {

// ComfyUI's classic accounting for every stage of `s` (presets oct2025 .. dec2025).
Plan plan_comfy_classic(const Scenario& s);

// `exact`: replaces the predicted peaks of a classic plan with the lowered program's exact live
// peaks and sets the exact reserve; `limit_need` is what a memory-fraction check can see.
void refine_exact(const Scenario& s, Plan& plan, Bytes& limit_need);

}  // namespace vf
