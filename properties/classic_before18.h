// The classic planner as it was before issue #18 (frozen; see classic_before18.cpp).
#pragma once

#include "harness/predict.h"

namespace vf::before18 {

Plan plan_comfy_classic(const Scenario& s);
Bytes frozen_offload_cost(const Module& m, Dtype compute, bool lora, const ComfyConstants& c);

}  // namespace vf::before18
