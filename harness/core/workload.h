// The job a model runs for: image size, batch, video frames, CFG. Shared by the activation
// rules (models/activation.h), the predictor and the generator.
#pragma once

#include <cstdint>

namespace vf {

struct Workload {
  std::uint32_t width = 1024;   // pixels
  std::uint32_t height = 1024;  // pixels
  std::uint32_t batch = 1;      // images per prompt
  std::uint32_t frames = 1;     // video frames (Wan); 1 for images
  double cfg = 1.0;             // CFG scale; > 1 runs cond and uncond (batched when the 1.5 rule admits it)
  std::uint32_t text_tokens = 0;  // 0 = the text encoder's / family's default
  // Sampling steps: forward passes of a diffusion model per node. Memory is the same every step
  // under the classic path; under dynamic VRAM the weights faulted in step 1 stay resident, so
  // later steps behave differently (and take modelled time).
  std::uint32_t steps = 1;
  bool operator==(const Workload&) const = default;
};

}  // namespace vf
