// The predictors behind predict() (harness/predict.h), one file each: classic ComfyUI
// (comfy_classic.cpp), exact (exact.cpp). predict.cpp picks one by the scenario's policy.
#pragma once

#include "harness/predict.h"

namespace vf {

// ComfyUI's classic accounting for every stage of `s` (presets oct2025 .. dec2025).
Plan plan_comfy_classic(const Scenario& s);

// Dynamic VRAM (comfy_dynamic.cpp): ModelPatcherDynamic.load of model `m` at `stage`, with
// `free_before` free memory (predictor's view). Fills `dynamic`, `staging`, `resident` (the
// force-loaded modules), `loaded` (their bytes: torch tensors) and the log line.
LoadPlan stage_dynamic(const Scenario& s, std::uint32_t stage, std::uint32_t m, Bytes free_before);
// The activation of a dynamic stage: the cond batch (1.5 rule) and the VAE decode batch from the
// patcher's free memory, which counts every VBAR-resident byte as free.
void fill_dynamic_activation(const Scenario& s, StagePlan& sp, Bytes patcher_free);

// Sizes the forward's activations from the scenario's source (harness/activation_source.h), once
// activation_allowance (the predictor's own activation budget for the stage's rows) is set.
// Sets activation_bytes, activation_formula and activation.
void size_stage_activation(const Scenario& s, StagePlan& sp);

// `exact`: replaces the predicted peaks of a classic plan with the lowered program's exact live
// peaks and sets the exact reserve; `limit_need` is what a memory-fraction check can see.
void refine_exact(const Scenario& s, Plan& plan, Bytes& limit_need);

}  // namespace vf
