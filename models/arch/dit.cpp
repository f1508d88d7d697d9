// The other DiTs: SD3.5 Large (MMDiT, SAI/ComfyUI layout), Qwen-Image (diffusers layout, as in
// ComfyUI's qwen_image files) and Wan 2.1 T2V 14B (original Wan layout).
#include "models/arch/net.h"

namespace vf::arch {
namespace {

constexpr std::uint64_t kDitTimestepDim = 256;  // sinusoidal timestep embedding width

// ---- SD3.5 Large ------------------------------------------------------------------------------
// 38 joint blocks at hidden 2432 (38 heads x 64), MLP 4x (9728), RMS q/k norms; the last block's
// context stream is "pre-only" (it emits no text tokens, so it has no out-projection or MLP).
// 8,056,627,520 parameters plus the 89.65 M pos_embed buffer the checkpoint also stores.
namespace sd35 {
constexpr std::uint64_t kHidden = 2432;
constexpr std::uint64_t kHeadDim = 64;
constexpr std::uint64_t kMlp = 4 * kHidden;
constexpr std::uint64_t kDepth = 38;
constexpr std::uint64_t kLatentChannels = 16;
constexpr std::uint64_t kPatch = 2;
constexpr std::uint64_t kPosEmbedMax = 192;      // pos_embed_max_size: a 192 x 192 patch grid
constexpr std::uint64_t kContextIn = 4096;       // T5-XXL width (CLIP-L+G are zero-padded to it)
constexpr std::uint64_t kPooledIn = 2048;        // pooled CLIP-L (768) + CLIP-G (1280)

void stream(Net& net, std::string_view path, bool pre_only, bool post) {
  if (!post) {
    // adaLN: 6 modulation sets, or 2 (shift, scale) for the pre-only context stream.
    net.linear(sub(path, "adaLN_modulation.1"), kHidden, (pre_only ? 2 : 6) * kHidden);
    net.linear(sub(path, "attn.qkv"), kHidden, 3 * kHidden);
    net.norm(sub(path, "attn.ln_q"), kHeadDim, false);
    net.norm(sub(path, "attn.ln_k"), kHeadDim, false);
    return;
  }
  if (pre_only) return;
  net.linear(sub(path, "attn.proj"), kHidden, kHidden);
  net.linear(sub(path, "mlp.fc1"), kHidden, kMlp);
  net.linear(sub(path, "mlp.fc2"), kMlp, kHidden);
}

std::vector<Module> modules(Dtype native) {
  Net net(native);
  net.conv2d("x_embedder.proj", kLatentChannels, kHidden, kPatch);
  // A fixed sin-cos table, stored in the file as a buffer of the root module.
  net.raw("", "pos_embed", {1, kPosEmbedMax * kPosEmbedMax, kHidden}, TensorRole::other);
  net.linear("t_embedder.mlp.0", kDitTimestepDim, kHidden);
  net.linear("t_embedder.mlp.2", kHidden, kHidden);
  net.linear("y_embedder.mlp.0", kPooledIn, kHidden);
  net.linear("y_embedder.mlp.2", kHidden, kHidden);
  net.linear("context_embedder", kContextIn, kHidden);
  for (std::uint64_t i = 0; i < kDepth; ++i) {
    const std::string block = sub("joint_blocks", i);
    const bool last = i + 1 == kDepth;
    // Both streams project q/k/v, then the joint attention, then each stream's post-attention.
    stream(net, sub(block, "context_block"), last, false);
    stream(net, sub(block, "x_block"), false, false);
    stream(net, sub(block, "context_block"), last, true);
    stream(net, sub(block, "x_block"), false, true);
  }
  net.linear("final_layer.adaLN_modulation.1", kHidden, 2 * kHidden);
  net.linear("final_layer.linear", kHidden, kPatch * kPatch * kLatentChannels);
  return std::move(net).take();
}
}  // namespace sd35

// ---- Qwen-Image -------------------------------------------------------------------------------
// 60 dual-stream blocks at hidden 3072 (24 heads x 128), MLP 4x, separate q/k/v projections per
// stream, RMS q/k norms; text comes from Qwen2.5-VL-7B (3584 wide). 20,430,401,088 parameters.
namespace qwen {
constexpr std::uint64_t kHidden = 3072;
constexpr std::uint64_t kHeadDim = 128;
constexpr std::uint64_t kMlp = 4 * kHidden;
constexpr std::uint64_t kDepth = 60;
constexpr std::uint64_t kLatentIn = 64;    // 16 channels x 2 x 2 patch
constexpr std::uint64_t kTextIn = 3584;    // Qwen2.5-VL-7B hidden size

void block(Net& net, std::string_view path) {
  net.linear(sub(path, "img_mod.1"), kHidden, 6 * kHidden);
  net.linear(sub(path, "txt_mod.1"), kHidden, 6 * kHidden);
  const std::string attn = sub(path, "attn");
  for (std::string_view p : {"to_q", "to_k", "to_v"}) net.linear(sub(attn, p), kHidden, kHidden);
  net.norm(sub(attn, "norm_q"), kHeadDim, false);
  net.norm(sub(attn, "norm_k"), kHeadDim, false);
  for (std::string_view p : {"add_q_proj", "add_k_proj", "add_v_proj"}) net.linear(sub(attn, p), kHidden, kHidden);
  net.norm(sub(attn, "norm_added_q"), kHeadDim, false);
  net.norm(sub(attn, "norm_added_k"), kHeadDim, false);
  net.linear(sub(attn, "to_out.0"), kHidden, kHidden);
  net.linear(sub(attn, "to_add_out"), kHidden, kHidden);
  for (std::string_view stream : {"img_mlp", "txt_mlp"}) {
    net.linear(sub(path, fmt::format("{}.net.0.proj", stream)), kHidden, kMlp);
    net.linear(sub(path, fmt::format("{}.net.2", stream)), kMlp, kHidden);
  }
}

std::vector<Module> modules(Dtype native) {
  Net net(native);
  net.linear("img_in", kLatentIn, kHidden);
  net.norm("txt_norm", kTextIn, false);
  net.linear("txt_in", kTextIn, kHidden);
  net.linear("time_text_embed.timestep_embedder.linear_1", kDitTimestepDim, kHidden);
  net.linear("time_text_embed.timestep_embedder.linear_2", kHidden, kHidden);
  for (std::uint64_t i = 0; i < kDepth; ++i) block(net, sub("transformer_blocks", i));
  net.linear("norm_out.linear", kHidden, 2 * kHidden);
  net.linear("proj_out", kHidden, kLatentIn);  // back to 2 x 2 patch x 16 channels
  return std::move(net).take();
}
}  // namespace qwen

// ---- Wan 2.1 T2V 14B --------------------------------------------------------------------------
// 40 blocks at dim 5120 (40 heads x 128), FFN 13824, self- and cross-attention with RMS q/k norms
// over the full width, an affine norm3 before cross-attention, and a learned per-block
// `modulation` parameter [1, 6, dim] added to the shared time projection. 14,288,491,584
// parameters.
namespace wan {
constexpr std::uint64_t kDim = 5120;
constexpr std::uint64_t kFfn = 13824;
constexpr std::uint64_t kDepth = 40;
constexpr std::uint64_t kLatentChannels = 16;
constexpr std::uint64_t kTextIn = 4096;  // umT5-XXL width
constexpr std::uint64_t kModSets = 6;    // shift/scale/gate for self-attention and FFN

void attention(Net& net, std::string_view path) {
  for (std::string_view p : {"q", "k", "v", "o"}) net.linear(sub(path, p), kDim, kDim);
  net.norm(sub(path, "norm_q"), kDim, false);
  net.norm(sub(path, "norm_k"), kDim, false);
}

void block(Net& net, std::string_view path) {
  net.raw(path, "modulation", {1, kModSets, kDim}, TensorRole::bias);
  attention(net, sub(path, "self_attn"));
  net.norm(sub(path, "norm3"), kDim, true);
  attention(net, sub(path, "cross_attn"));
  net.linear(sub(path, "ffn.0"), kDim, kFfn);
  net.linear(sub(path, "ffn.2"), kFfn, kDim);
}

std::vector<Module> modules(Dtype native) {
  Net net(native);
  net.conv3d("patch_embedding", kLatentChannels, kDim, 1, 2, 2);  // patch (1, 2, 2)
  net.linear("time_embedding.0", kDitTimestepDim, kDim);
  net.linear("time_embedding.2", kDim, kDim);
  net.linear("time_projection.1", kDim, kModSets * kDim);
  net.linear("text_embedding.0", kTextIn, kDim);
  net.linear("text_embedding.2", kDim, kDim);
  for (std::uint64_t i = 0; i < kDepth; ++i) block(net, sub("blocks", i));
  net.raw("head", "modulation", {1, 2, kDim}, TensorRole::bias);
  net.linear("head.head", kDim, 1 * 2 * 2 * kLatentChannels);
  return std::move(net).take();
}
}  // namespace wan

}  // namespace

Built sd35_large(Dtype native) {
  Built b;
  b.modules = sd35::modules(native);
  b.arch.latent_channels = sd35::kLatentChannels;
  b.arch.hidden = sd35::kHidden;
  // Widest per-token tensor: the MLP hidden (4 x 2432 = 9728), wider than q/k/v (7296).
  b.arch.widest = sd35::kMlp;
  // ComfyUI's SD3 conditioning: 77 CLIP-L/G tokens followed by 256 T5 tokens.
  b.arch.text_tokens = 77 + 256;
  b.arch.patch = sd35::kPatch;
  b.memory_usage_factor = 1.2;  // ComfyUI supported_models SD3
  return b;
}

Built qwen_image(Dtype native) {
  Built b;
  b.modules = qwen::modules(native);
  b.arch.latent_channels = 16;
  b.arch.hidden = qwen::kHidden;
  b.arch.widest = qwen::kMlp;  // the MLP hidden, 4 x 3072 = 12288
  // Qwen-Image is not padded: the text sequence is the prompt's own length after the chat
  // template is dropped. 256 tokens is a long, detailed prompt; short prompts are ~30-100.
  b.arch.text_tokens = 256;
  b.arch.patch = 2;
  b.memory_usage_factor = 1.8;  // ComfyUI supported_models QwenImage
  return b;
}

Built wan21_14b(Dtype native) {
  Built b;
  b.modules = wan::modules(native);
  b.arch.latent_channels = wan::kLatentChannels;
  b.arch.hidden = wan::kDim;
  b.arch.widest = wan::kFfn;  // the FFN hidden, 13824
  // Wan pads the umT5 context to text_len 512 (used through cross-attention).
  b.arch.text_tokens = 512;
  b.arch.patch = 2;
  b.arch.temporal_down = 4;
  b.memory_usage_factor = static_cast<double>(wan::kDim) / 2222.0;  // ComfyUI WAN21: dim / 2222
  return b;
}

}  // namespace vf::arch
