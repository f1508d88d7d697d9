// The scale fixture of BM_ScaleModules (bench_pipeline.cpp), shared with vf_scale_case
// (scale_case.cpp), which times and counts the same case phase by phase.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include "harness/scenario.h"

namespace vf {

// Scale: a text encoder of N modules (an fp8 weight of 256..1279 x 512 and a bf16 bias each, as
// tests/scale scenarios have), 60% of it fitting the card, so the planner offloads and the
// forward pass casts every offloaded module on two offload streams: the cost per module must not
// grow with the model (issue #15: 10,000 -> 1,000,000 modules within 1.3x of linear; 100,000 in
// <= 1 s in every allocator mode). Built in code: the JSON read is measured by `vramfuzz run`
// on the same model (README, "Performance").
inline Scenario scale_scenario(std::size_t modules, AllocatorMode mode) {
  auto spec = std::make_shared<ModelSpec>();
  spec->name = "scale";
  spec->source = "inline";
  spec->family = Family::t5;
  spec->kind = ModelKind::text_encoder;
  Bytes weights = 0;
  for (std::size_t i = 0; i < modules; ++i) {
    Module m;
    m.name = fmt::format("blocks.{}.lin", i);
    const std::uint64_t rows = 256 + (i * 37) % 1024;
    m.tensors.push_back(Tensor{"weight", {rows, 512}, Dtype::fp8_e4m3fn, TensorRole::weight});
    m.tensors.push_back(Tensor{"bias", {rows}, Dtype::bf16, TensorRole::bias});
    weights += rows * 512;
    spec->modules.push_back(std::move(m));
  }
  finalize_model(*spec, "models[0]");
  Scenario s;
  s.name = "scale";
  s.device.total = weights * 6 / 10 + 2 * GiB;
  s.allocator.mode = mode;
  s.policy = parse_policy("comfy:dec2025", "policy");
  // A reserve of an eighth of the weights: the allocators' rounding of 100,000s of small weights
  // (a tenth of them under raw) outgrew the default 400 MiB, and raw and caching ran out of memory
  // a sixth of the way through the load from 100,000 modules up, so their rows measured a
  // fraction of the program (run_scenarios now refuses that).
  apply_policy_override(s.policy, "reserve", fmt::format("{}MiB", weights / 8 / MiB), "policy");
  ModelRef m;
  m.id = "te";
  m.source = "inline";
  m.compute = Dtype::bf16;
  m.spec = std::move(spec);
  s.models.push_back(std::move(m));
  s.workload.width = s.workload.height = 512;
  s.workload.cfg = 1.0;
  s.offload_streams = 2;
  s.stages = default_stages(1);
  validate_scenario(s);
  return s;
}

}  // namespace vf
