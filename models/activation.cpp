#include "models/activation.h"

#include <string>

#include <fmt/format.h>

#include "harness/core/error.h"

namespace vf {
namespace {

// Every VAE in the catalog (and every ComfyUI latent image) is x8 down-sampled.
constexpr std::uint64_t kVaeDownscale = 8;

// Names the workload in an overflow error of a position count (only a video of absurd length
// and size can get there: width and height are 32-bit, so one latent frame never overflows).
constexpr std::string_view kWorkloadWhat = "workload";

// ComfyUI's per-area activation constants (BaseModel.memory_required), in MiB per latent
// position: 0.01 x dtype bytes x factor with flash / PyTorch / xformers attention, 0.15 x
// factor (no dtype term) with split or sub-quadratic attention.
constexpr double kFlashMiBPerArea = 0.01;
constexpr double kSplitMiBPerArea = 0.15;

// ComfyUI's AutoencoderKL decode estimate: 2178 x h x w x 64 x dtype bytes for an h x w latent.
constexpr std::uint64_t kVaeDecodeFactor = 2178;
constexpr std::uint64_t kVaeDecodeChannels = 64;

// The residual stream, plus the normalised copy and the attention output that live beside it
// while a block runs: 3 x hidden per position next to the widest intermediate.
constexpr std::uint64_t kHiddenCopies = 3;
// Gated MLPs hold gate, up and their product at the feed-forward width.
constexpr std::uint64_t kGatedCopies = 3;

void require_positive(std::uint64_t v, std::string_view field) {
  if (v == 0) throw InputError(std::string(field), "must be at least 1");
}

struct LatentDims {
  std::uint64_t h;
  std::uint64_t w;
};

// The latent grid ComfyUI creates for a W x H image: H // 8 by W // 8 (floor, as the empty-latent
// nodes do). An image smaller than one latent pixel is refused rather than given a zero area.
LatentDims latent_dims(const Workload& w) {
  require_positive(w.width, "workload.width");
  require_positive(w.height, "workload.height");
  const LatentDims d{w.height / kVaeDownscale, w.width / kVaeDownscale};
  if (d.h == 0) throw InputError("workload.height", fmt::format("{} px is less than one latent pixel (8 px)", w.height));
  if (d.w == 0) throw InputError("workload.width", fmt::format("{} px is less than one latent pixel (8 px)", w.width));
  return d;
}

// Video models compress time: T frames become 1 + (T - 1) // temporal_down latent frames (Wan:
// 81 frames -> 21). Image models always have one.
std::uint64_t latent_frames(const ModelSpec& m, const Workload& w) {
  if (m.arch.temporal_down <= 1) return 1;
  require_positive(w.frames, "workload.frames");
  return 1 + (w.frames - 1) / m.arch.temporal_down;
}

bool is_unet(const ModelSpec& m) { return m.family == Family::sdxl || m.family == Family::sd15; }

std::uint64_t text_tokens(const ModelSpec& m, const Workload& w) {
  return w.text_tokens != 0 ? w.text_tokens : m.arch.text_tokens;
}

std::uint32_t compute_bytes(Dtype compute, std::string_view what) {
  if (!dtype_info(compute).compute) {
    throw InputError(std::string(what),
                     fmt::format("{} is not a compute dtype (use fp32, fp16 or bf16)", dtype_name(compute)));
  }
  return compute_elem_bytes(compute);
}

// DiT tokens: the latent grid cut into patch x patch tiles. ComfyUI pads the latent up to whole
// patches, so a partial tile still makes a token (ceil).
std::uint64_t dit_image_tokens(const ModelSpec& m, const LatentDims& d) {
  const std::uint64_t patch = m.arch.patch == 0 ? 1 : m.arch.patch;
  return ceil_div(d.h, patch) * ceil_div(d.w, patch);
}

}  // namespace

std::uint64_t latent_area(const ModelSpec& m, const Workload& w) {
  const LatentDims d = latent_dims(w);
  switch (m.kind) {
    case ModelKind::text_encoder: return 0;
    case ModelKind::vae: return d.h * d.w;
    case ModelKind::diffusion: break;
  }
  return checked_mul(d.h * d.w, latent_frames(m, w), kWorkloadWhat);
}

std::uint64_t activation_positions(const ModelSpec& m, const Workload& w) {
  switch (m.kind) {
    case ModelKind::text_encoder: return text_tokens(m, w);
    case ModelKind::vae: {
      require_positive(w.width, "workload.width");
      require_positive(w.height, "workload.height");
      return static_cast<std::uint64_t>(w.width) * w.height;  // the decoder's last convs run at full size
    }
    case ModelKind::diffusion: break;
  }
  const LatentDims d = latent_dims(w);
  if (is_unet(m)) return d.h * d.w;  // the top level runs at latent resolution; text enters via cross-attention
  const std::uint64_t image = checked_mul(dit_image_tokens(m, d), latent_frames(m, w), kWorkloadWhat);
  return checked_add(image, text_tokens(m, w), kWorkloadWhat);
}

Bytes comfy_memory_required(const ModelSpec& m, const Workload& w, std::uint32_t batch, Dtype compute, bool flash,
                            std::string_view what) {
  require_positive(batch, "workload.batch");
  const std::uint64_t elem = compute_bytes(compute, what);
  switch (m.kind) {
    case ModelKind::text_encoder: return 0;  // ComfyUI loads text encoders with no memory_required
    case ModelKind::vae: {
      const LatentDims d = latent_dims(w);
      Bytes b = checked_mul(kVaeDecodeFactor, d.h, what);
      b = checked_mul(b, d.w, what);
      b = checked_mul(b, kVaeDecodeChannels, what);
      b = checked_mul(b, elem, what);
      return checked_mul(b, batch, what);
    }
    case ModelKind::diffusion: break;
  }
  const std::uint64_t area = checked_mul(latent_area(m, w), batch, what);
  if (flash) return scale_bytes(checked_mul(area, elem, what), kFlashMiBPerArea * m.memory_usage_factor * MiB, what);
  return scale_bytes(area, kSplitMiBPerArea * m.memory_usage_factor * MiB, what);
}

Bytes activation_working_set(const ModelSpec& m, const Workload& w, std::uint32_t batch, Dtype compute,
                             std::string_view what) {
  require_positive(batch, "workload.batch");
  const std::uint64_t elem = compute_bytes(compute, what);
  const std::uint64_t positions = activation_positions(m, w);
  const std::uint64_t widest = checked_mul(m.arch.widest, m.arch.gated ? kGatedCopies : 1, what);
  const std::uint64_t width = checked_add(widest, checked_mul(kHiddenCopies, m.arch.hidden, what), what);
  Bytes live = checked_mul(checked_mul(checked_mul(positions, width, what), elem, what), batch, what);
  if (m.kind == ModelKind::text_encoder && m.arch.kept_hidden_states != 0) {
    // Encoders that return several layers' states (FLUX.2's Mistral: layers 10, 20, 30) keep
    // each one alive until the last is produced.
    Bytes kept = checked_mul(m.arch.kept_hidden_states, positions, what);
    kept = checked_mul(checked_mul(checked_mul(kept, m.arch.hidden, what), elem, what), batch, what);
    live = checked_add(live, kept, what);
  }
  return live;
}

}  // namespace vf
