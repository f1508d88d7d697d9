// Activation sizes, two ways:
//  * comfy_memory_required: ComfyUI's own estimate (model.memory_required / the VAE lambdas),
//    hand-tuned factors and all; this is what the comfy predictor believes.
//  * activation_working_set: what the runtime really holds live during a forward, from the
//    architecture (positions x live width x compute bytes); this is what the lowered program
//    allocates. The gap between the two is one of the things vramfuzz measures.
// Rules and worked numbers: docs/models.md ("Activation rules").
#pragma once

#include <cstdint>

#include "harness/core/bytes.h"
#include "harness/core/dtype.h"
#include "harness/core/workload.h"
#include "models/model.h"

namespace vf {

// Latent positions per batch element (ComfyUI's "area" without the batch): (H/8)·(W/8)·latent
// frames for diffusion models; 0 for text encoders (they get no memory_required).
std::uint64_t latent_area(const ModelSpec& m, const Workload& w);

// Positions the working set is computed over, per batch element: DiT tokens (image tokens after
// patchify + text tokens), UNet latent positions, text tokens, or VAE output pixels.
std::uint64_t activation_positions(const ModelSpec& m, const Workload& w);

// ComfyUI's estimate for `batch` elements in `compute` dtype (flash/PyTorch attention when
// `flash`, else the 0.15 MiB-per-unit split-attention rule). Text encoders: 0 (ComfyUI passes no
// memory_required for them). VAEs: the AutoencoderKL decode lambda 2178·h·w·64·bytes.
Bytes comfy_memory_required(const ModelSpec& m, const Workload& w, std::uint32_t batch, Dtype compute, bool flash,
                            std::string_view what);

// The live activation bytes during one forward of `batch` elements in `compute` dtype:
// batch · positions · (widest·(gated ? 3 : 1) + 3·hidden) · bytes, plus kept hidden states.
Bytes activation_working_set(const ModelSpec& m, const Workload& w, std::uint32_t batch, Dtype compute,
                             std::string_view what);

}  // namespace vf
