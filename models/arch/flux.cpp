// FLUX.1 and FLUX.2 DiTs in the BFL checkpoint layout (what ComfyUI loads): fused q/k/v in the
// double blocks, one fused `linear1` (q, k, v and the MLP input) per single block.
//
// FLUX.1-dev: 19 double + 38 single blocks, hidden 3072 (24 heads x 128), MLP 4x (12288), biases
// everywhere, per-block adaLN modulation. 11,901,408,320 parameters (exact).
// FLUX.2-dev: 8 double + 48 single blocks, hidden 6144 (48 heads x 128), SwiGLU MLP 3x (18432;
// the first MLP layer emits gate and up together), no biases, and one modulation per stream type
// shared by all blocks. 32,223,285,248 parameters.
#include "models/arch/net.h"

namespace vf::arch {
namespace {

// Width of the sinusoidal timestep / guidance embedding fed to time_in / guidance_in.
constexpr std::uint64_t kTimestepDim = 256;
constexpr std::uint64_t kHeadDim = 128;

struct FluxShape {
  std::uint64_t latent_in;        // patchified latent width: 16 ch x 2 x 2 (FLUX.1), 32 x 2 x 2 (FLUX.2)
  std::uint64_t hidden;
  std::uint64_t mlp_hidden;       // MLP inner width
  bool swiglu;                    // the MLP input layer emits gate and up (2 x mlp_hidden)
  bool bias;                      // FLUX.2 has no biases at all
  std::uint64_t context_in;       // T5-XXL 4096 (FLUX.1); 3 Mistral layers x 5120 = 15360 (FLUX.2)
  std::uint64_t pooled_in;        // pooled CLIP-L vector (FLUX.1: 768); 0 = no vector_in
  bool shared_modulation;         // FLUX.2: modulation once per stream type, outside the blocks
  std::uint64_t double_blocks;
  std::uint64_t single_blocks;
};

constexpr FluxShape kFlux1 = {64, 3072, 12288, false, true, 4096, 768, false, 19, 38};
constexpr FluxShape kFlux2 = {128, 6144, 18432, true, false, 15360, 0, true, 8, 48};

// adaLN modulation outputs: shift, scale, gate for attention and for the MLP (double blocks),
// or one set (single blocks); the final layer emits shift and scale.
constexpr std::uint64_t kDoubleModSets = 6;
constexpr std::uint64_t kSingleModSets = 3;
constexpr std::uint64_t kFinalModSets = 2;

std::uint64_t mlp_in_width(const FluxShape& s) { return s.swiglu ? 2 * s.mlp_hidden : s.mlp_hidden; }

// MLPEmbedder: in_layer -> SiLU -> out_layer.
void mlp_embedder(Net& net, std::string_view path, std::uint64_t in, const FluxShape& s) {
  net.linear(sub(path, "in_layer"), in, s.hidden, s.bias);
  net.linear(sub(path, "out_layer"), s.hidden, s.hidden, s.bias);
}

// QKNorm: RMSNorms over one head's q and k, stored as "scale".
void qk_norm(Net& net, std::string_view path) {
  net.norm(sub(path, "query_norm"), kHeadDim, false, "scale");
  net.norm(sub(path, "key_norm"), kHeadDim, false, "scale");
}

void double_block(Net& net, std::string_view path, const FluxShape& s) {
  if (!s.shared_modulation) {
    net.linear(sub(path, "img_mod.lin"), s.hidden, kDoubleModSets * s.hidden, s.bias);
    net.linear(sub(path, "txt_mod.lin"), s.hidden, kDoubleModSets * s.hidden, s.bias);
  }
  // Both streams project q/k/v before the joint attention, then each runs its own out-projection
  // and MLP.
  for (std::string_view stream : {"img", "txt"}) {
    const std::string attn = sub(path, fmt::format("{}_attn", stream));
    net.linear(sub(attn, "qkv"), s.hidden, 3 * s.hidden, s.bias);
    qk_norm(net, sub(attn, "norm"));
  }
  for (std::string_view stream : {"img", "txt"}) {
    net.linear(sub(path, fmt::format("{}_attn.proj", stream)), s.hidden, s.hidden, s.bias);
    const std::string mlp = sub(path, fmt::format("{}_mlp", stream));
    net.linear(sub(mlp, "0"), s.hidden, mlp_in_width(s), s.bias);
    net.linear(sub(mlp, "2"), s.mlp_hidden, s.hidden, s.bias);
  }
}

// linear1 emits q, k, v and the MLP input in one matmul (FLUX.1: 3x3072 + 12288 = 21504;
// FLUX.2: 3x6144 + 2x18432 = 55296); linear2 takes the attention output and the MLP hidden.
void single_block(Net& net, std::string_view path, const FluxShape& s) {
  if (!s.shared_modulation) net.linear(sub(path, "modulation.lin"), s.hidden, kSingleModSets * s.hidden, s.bias);
  net.linear(sub(path, "linear1"), s.hidden, 3 * s.hidden + mlp_in_width(s), s.bias);
  qk_norm(net, sub(path, "norm"));
  net.linear(sub(path, "linear2"), s.hidden + s.mlp_hidden, s.hidden, s.bias);
}

std::vector<Module> flux_modules(const FluxShape& s, Dtype native) {
  Net net(native);
  net.linear("img_in", s.latent_in, s.hidden, s.bias);
  mlp_embedder(net, "time_in", kTimestepDim, s);
  mlp_embedder(net, "guidance_in", kTimestepDim, s);  // both dev models are guidance-distilled
  if (s.pooled_in != 0) mlp_embedder(net, "vector_in", s.pooled_in, s);
  net.linear("txt_in", s.context_in, s.hidden, s.bias);
  if (s.shared_modulation) {
    net.linear("double_stream_modulation_img.lin", s.hidden, kDoubleModSets * s.hidden, s.bias);
    net.linear("double_stream_modulation_txt.lin", s.hidden, kDoubleModSets * s.hidden, s.bias);
    net.linear("single_stream_modulation.lin", s.hidden, kSingleModSets * s.hidden, s.bias);
  }
  for (std::uint64_t i = 0; i < s.double_blocks; ++i) double_block(net, sub("double_blocks", i), s);
  for (std::uint64_t i = 0; i < s.single_blocks; ++i) single_block(net, sub("single_blocks", i), s);
  net.linear("final_layer.adaLN_modulation.1", s.hidden, kFinalModSets * s.hidden, s.bias);
  net.linear("final_layer.linear", s.hidden, s.latent_in, s.bias);
  return std::move(net).take();
}

// The conditioning sequence both models are run with: FLUX.1-dev pads T5 to 512 tokens, FLUX.2
// pads its Mistral prompt to 512.
constexpr std::uint32_t kFluxTextTokens = 512;

}  // namespace

Built flux1_dev(Dtype native) {
  Built b;
  b.modules = flux_modules(kFlux1, native);
  b.arch.latent_channels = 16;
  b.arch.hidden = 3072;
  // Widest per-token tensor a block materialises: the single block's linear1 output
  // (3 x 3072 q/k/v + 12288 MLP = 21504), wider than the double block's 12288 MLP.
  b.arch.widest = 21504;
  b.arch.text_tokens = kFluxTextTokens;
  b.arch.patch = 2;
  b.memory_usage_factor = 3.1;  // ComfyUI supported_models Flux
  return b;
}

Built flux2_dev(Dtype native) {
  Built b;
  b.modules = flux_modules(kFlux2, native);
  b.arch.latent_channels = 32;
  b.arch.hidden = 6144;
  // The single block's linear1 (diffusers: to_qkv_mlp_proj) output: 3 x 6144 + 2 x 18432 = 55296.
  b.arch.widest = 55296;
  b.arch.text_tokens = kFluxTextTokens;
  b.arch.patch = 2;
  // ComfyUI: 3.1 x 4 x hidden_size / 2604 (29.257 at hidden 6144).
  b.memory_usage_factor = 3.1 * 4.0 * 6144.0 / 2604.0;
  return b;
}

}  // namespace vf::arch
