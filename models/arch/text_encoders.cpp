// Text encoders in the HuggingFace transformers layout: T5-XXL v1.1 (encoder only), CLIP-L (text
// model), and the Mistral-Small-3.x decoder stack as FLUX.2 uses it.
#include "models/arch/net.h"

namespace vf::arch {
namespace {

// ---- T5-XXL v1.1 encoder ----------------------------------------------------------------------
// 24 blocks, d_model 4096, 64 heads x 64, gated-GELU FF 10240, RMS layer norms, no biases; block 0
// owns the relative position bias table (32 buckets x 64 heads). 4,762,310,656 parameters.
namespace t5 {
constexpr std::uint64_t kVocab = 32128;
constexpr std::uint64_t kModel = 4096;
constexpr std::uint64_t kInner = 64 * 64;  // heads x d_kv
constexpr std::uint64_t kFf = 10240;
constexpr std::uint64_t kBlocks = 24;
constexpr std::uint64_t kBuckets = 32;
constexpr std::uint64_t kHeads = 64;

std::vector<Module> modules(Dtype native) {
  Net net(native);
  net.embedding("shared", kVocab, kModel);
  for (std::uint64_t i = 0; i < kBlocks; ++i) {
    const std::string block = sub("encoder.block", i);
    const std::string attn = sub(block, "layer.0.SelfAttention");
    net.norm(sub(block, "layer.0.layer_norm"), kModel, false);
    for (std::string_view p : {"q", "k", "v"}) net.linear(sub(attn, p), kModel, kInner, false);
    // A lookup table indexed by relative-position bucket: an Embedding, read row-wise.
    if (i == 0) net.embedding(sub(attn, "relative_attention_bias"), kBuckets, kHeads);
    net.linear(sub(attn, "o"), kInner, kModel, false);
    const std::string ff = sub(block, "layer.1");
    net.norm(sub(ff, "layer_norm"), kModel, false);
    net.linear(sub(ff, "DenseReluDense.wi_0"), kModel, kFf, false);
    net.linear(sub(ff, "DenseReluDense.wi_1"), kModel, kFf, false);
    net.linear(sub(ff, "DenseReluDense.wo"), kFf, kModel, false);
  }
  net.norm("encoder.final_layer_norm", kModel, false);
  return std::move(net).take();
}
}  // namespace t5

// ---- CLIP-L text model ------------------------------------------------------------------------
// 12 layers, hidden 768 (12 heads), MLP 3072 (quick-GELU, not gated), LayerNorms with bias, 77
// learned positions. 123,060,480 parameters.
namespace clip {
constexpr std::uint64_t kVocab = 49408;
constexpr std::uint64_t kHidden = 768;
constexpr std::uint64_t kMlp = 3072;
constexpr std::uint64_t kLayers = 12;
constexpr std::uint64_t kPositions = 77;

std::vector<Module> modules(Dtype native) {
  Net net(native);
  net.embedding("text_model.embeddings.token_embedding", kVocab, kHidden);
  // The learned position table: an Embedding, indexed by position.
  net.embedding("text_model.embeddings.position_embedding", kPositions, kHidden);
  for (std::uint64_t i = 0; i < kLayers; ++i) {
    const std::string layer = sub("text_model.encoder.layers", i);
    net.norm(sub(layer, "layer_norm1"), kHidden, true);
    for (std::string_view p : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      net.linear(sub(layer, fmt::format("self_attn.{}", p)), kHidden, kHidden);
    }
    net.norm(sub(layer, "layer_norm2"), kHidden, true);
    net.linear(sub(layer, "mlp.fc1"), kHidden, kMlp);
    net.linear(sub(layer, "mlp.fc2"), kMlp, kHidden);
  }
  net.norm("text_model.final_layer_norm", kHidden, true);
  return std::move(net).take();
}
}  // namespace clip

// ---- Mistral-Small-3.x as FLUX.2's text encoder -----------------------------------------------
// FLUX.2 reads the hidden states after decoder layers 10, 20 and 30 and concatenates them
// (3 x 5120 = 15360, its txt_in width), so the encoder shipped for it keeps the token embedding
// and the first 30 of the 40 layers; the final norm and lm_head are never reached. Per layer:
// q 4096x5120 (32 heads x 128), k and v 1024x5120 (8 KV heads x 128), o 5120x4096, SwiGLU gate
// and up 32768x5120, down 5120x32768, two RMSNorms: 555,755,520. Total: 131072 x 5120 embedding
// (671,088,640) + 30 x 555,755,520 + 5120 = 17,343,759,360 parameters (34.69 GB in bf16).
namespace mistral {
constexpr std::uint64_t kVocab = 131072;
constexpr std::uint64_t kHidden = 5120;
constexpr std::uint64_t kHeadDim = 128;
constexpr std::uint64_t kQHeads = 32;
constexpr std::uint64_t kKvHeads = 8;
constexpr std::uint64_t kFf = 32768;
constexpr std::uint64_t kLayersKept = 30;  // the deepest layer FLUX.2 reads
constexpr std::uint32_t kStatesKept = 3;   // layers 10, 20, 30

std::vector<Module> modules(Dtype native) {
  Net net(native);
  net.embedding("model.embed_tokens", kVocab, kHidden);
  for (std::uint64_t i = 0; i < kLayersKept; ++i) {
    const std::string layer = sub("model.layers", i);
    net.norm(sub(layer, "input_layernorm"), kHidden, false);
    net.linear(sub(layer, "self_attn.q_proj"), kHidden, kQHeads * kHeadDim, false);
    net.linear(sub(layer, "self_attn.k_proj"), kHidden, kKvHeads * kHeadDim, false);
    net.linear(sub(layer, "self_attn.v_proj"), kHidden, kKvHeads * kHeadDim, false);
    net.linear(sub(layer, "self_attn.o_proj"), kQHeads * kHeadDim, kHidden, false);
    net.norm(sub(layer, "post_attention_layernorm"), kHidden, false);
    net.linear(sub(layer, "mlp.gate_proj"), kHidden, kFf, false);
    net.linear(sub(layer, "mlp.up_proj"), kHidden, kFf, false);
    net.linear(sub(layer, "mlp.down_proj"), kFf, kHidden, false);
  }
  net.norm("model.norm", kHidden, false);
  return std::move(net).take();
}
}  // namespace mistral

}  // namespace

Built t5xxl_encoder(Dtype native) {
  Built b;
  b.modules = t5::modules(native);
  b.arch.hidden = t5::kModel;
  b.arch.widest = t5::kFf;
  b.arch.gated = true;       // wi_0 (gate) and wi_1 (up) are live together
  b.arch.text_tokens = 512;  // FLUX.1-dev pads its T5 prompt to 512 tokens
  b.arch.patch = 1;
  return b;
}

Built clip_l(Dtype native) {
  Built b;
  b.modules = clip::modules(native);
  b.arch.hidden = clip::kHidden;
  b.arch.widest = clip::kMlp;
  b.arch.text_tokens = clip::kPositions;
  b.arch.patch = 1;
  return b;
}

Built flux2_text_encoder(Dtype native) {
  Built b;
  b.modules = mistral::modules(native);
  b.arch.hidden = mistral::kHidden;
  b.arch.widest = mistral::kFf;
  b.arch.gated = true;       // SwiGLU: gate and up are live together
  b.arch.text_tokens = 512;  // FLUX.2 pads the prompt to 512 tokens
  b.arch.patch = 1;
  b.arch.kept_hidden_states = mistral::kStatesKept;
  return b;
}

}  // namespace vf::arch
