// SD1.5 and SDXL UNets, generated from the diffusers UNet2DConditionModel block structure (and
// its tensor names): conv_in, down blocks of resnets (+ spatial transformers where the level has
// attention, + a stride-2 downsampler except at the bottom), a mid block, up blocks that eat the
// skip connections in reverse (one more resnet per level than on the way down), conv_out.
//
// SD1.5: channels 320/640/1280/1280, transformer depth 1 on the three upper levels and in the
//        mid block, context 768 (CLIP-L), 1x1-conv projections. 859,520,964 parameters.
// SDXL:  channels 320/640/1280, transformer depth 0/2/10 and 10 in the mid block, context 2048
//        (CLIP-L + CLIP-G), linear projections, and the size/crop "add" embedding.
//        2,567,463,684 parameters.
#include <span>

#include "models/arch/net.h"

namespace vf::arch {
namespace {

constexpr std::uint64_t kLatentChannels = 4;
constexpr std::uint64_t kResnetsDown = 2;            // layers_per_block
constexpr std::uint64_t kResnetsUp = kResnetsDown + 1;
constexpr std::uint64_t kFfMult = 4;                 // GEGLU inner width = 4 x channels
constexpr std::uint64_t kConvKernel = 3;

struct UNetShape {
  std::span<const std::uint64_t> channels;  // block_out_channels per level
  std::span<const std::uint64_t> depth;     // transformer blocks per attention, per level (0 = none)
  std::uint64_t mid_depth;
  std::uint64_t context;                    // cross-attention width (text encoder hidden)
  bool linear_projection;                   // proj_in / proj_out as Linear (SDXL) or 1x1 conv (SD1.5)
  std::uint64_t add_embed_in;               // SDXL text_time embedding input; 0 = none
};

constexpr std::uint64_t kSd15Channels[] = {320, 640, 1280, 1280};
constexpr std::uint64_t kSd15Depth[] = {1, 1, 1, 0};
constexpr std::uint64_t kSdxlChannels[] = {320, 640, 1280};
constexpr std::uint64_t kSdxlDepth[] = {0, 2, 10};
// SDXL's add embedding input: pooled CLIP-G (1280) + 6 size/crop conditions x 256 sinusoid = 2816.
constexpr std::uint64_t kSdxlAddEmbedIn = 1280 + 6 * 256;

const UNetShape kSd15 = {kSd15Channels, kSd15Depth, 1, 768, false, 0};
const UNetShape kSdxl = {kSdxlChannels, kSdxlDepth, 10, 2048, true, kSdxlAddEmbedIn};

std::uint64_t time_embed_dim(const UNetShape& s) { return 4 * s.channels[0]; }

void resnet(Net& net, std::string_view path, std::uint64_t in, std::uint64_t out, const UNetShape& s) {
  net.norm(sub(path, "norm1"), in, true);
  net.conv2d(sub(path, "conv1"), in, out, kConvKernel);
  net.linear(sub(path, "time_emb_proj"), time_embed_dim(s), out);
  net.norm(sub(path, "norm2"), out, true);
  net.conv2d(sub(path, "conv2"), out, out, kConvKernel);
  if (in != out) net.conv2d(sub(path, "conv_shortcut"), in, out, 1);
}

void projection(Net& net, std::string_view path, std::uint64_t c, const UNetShape& s) {
  if (s.linear_projection) net.linear(path, c, c);
  else net.conv2d(path, c, c, 1);
}

// BasicTransformerBlock: self-attention, cross-attention on the text, GEGLU feed-forward.
void transformer_block(Net& net, std::string_view path, std::uint64_t c, const UNetShape& s) {
  net.norm(sub(path, "norm1"), c, true);
  for (std::string_view p : {"to_q", "to_k", "to_v"}) net.linear(sub(path, fmt::format("attn1.{}", p)), c, c, false);
  net.linear(sub(path, "attn1.to_out.0"), c, c);
  net.norm(sub(path, "norm2"), c, true);
  net.linear(sub(path, "attn2.to_q"), c, c, false);
  net.linear(sub(path, "attn2.to_k"), s.context, c, false);
  net.linear(sub(path, "attn2.to_v"), s.context, c, false);
  net.linear(sub(path, "attn2.to_out.0"), c, c);
  net.norm(sub(path, "norm3"), c, true);
  net.linear(sub(path, "ff.net.0.proj"), c, 2 * kFfMult * c);  // GEGLU: value and gate halves
  net.linear(sub(path, "ff.net.2"), kFfMult * c, c);
}

// Transformer2DModel: GroupNorm, project in, `depth` blocks, project out.
void spatial_transformer(Net& net, std::string_view path, std::uint64_t c, std::uint64_t depth, const UNetShape& s) {
  net.norm(sub(path, "norm"), c, true);
  projection(net, sub(path, "proj_in"), c, s);
  for (std::uint64_t d = 0; d < depth; ++d) transformer_block(net, sub(path, fmt::format("transformer_blocks.{}", d)), c, s);
  projection(net, sub(path, "proj_out"), c, s);
}

std::vector<Module> unet_modules(const UNetShape& s, Dtype native) {
  Net net(native);
  const std::uint64_t temb = time_embed_dim(s);
  net.linear("time_embedding.linear_1", s.channels[0], temb);
  net.linear("time_embedding.linear_2", temb, temb);
  if (s.add_embed_in != 0) {
    net.linear("add_embedding.linear_1", s.add_embed_in, temb);
    net.linear("add_embedding.linear_2", temb, temb);
  }
  net.conv2d("conv_in", kLatentChannels, s.channels[0], kConvKernel);

  // Channels of every activation the down path hands to the up path, in push order.
  std::vector<std::uint64_t> skips = {s.channels[0]};
  std::uint64_t c = s.channels[0];
  const std::size_t levels = s.channels.size();
  for (std::size_t level = 0; level < levels; ++level) {
    const std::string block = sub("down_blocks", level);
    for (std::uint64_t r = 0; r < kResnetsDown; ++r) {
      resnet(net, sub(block, fmt::format("resnets.{}", r)), c, s.channels[level], s);
      c = s.channels[level];
      if (s.depth[level] != 0) spatial_transformer(net, sub(block, fmt::format("attentions.{}", r)), c, s.depth[level], s);
      skips.push_back(c);
    }
    if (level + 1 < levels) {
      net.conv2d(sub(block, "downsamplers.0.conv"), c, c, kConvKernel);
      skips.push_back(c);
    }
  }

  resnet(net, "mid_block.resnets.0", c, c, s);
  spatial_transformer(net, "mid_block.attentions.0", c, s.mid_depth, s);
  resnet(net, "mid_block.resnets.1", c, c, s);

  for (std::size_t up = 0; up < levels; ++up) {
    const std::size_t level = levels - 1 - up;
    const std::string block = sub("up_blocks", up);
    for (std::uint64_t r = 0; r < kResnetsUp; ++r) {
      const std::uint64_t skip = skips.back();
      skips.pop_back();
      resnet(net, sub(block, fmt::format("resnets.{}", r)), c + skip, s.channels[level], s);
      c = s.channels[level];
      if (s.depth[level] != 0) spatial_transformer(net, sub(block, fmt::format("attentions.{}", r)), c, s.depth[level], s);
    }
    if (level != 0) net.conv2d(sub(block, "upsamplers.0.conv"), c, c, kConvKernel);
  }

  net.norm("conv_norm_out", c, true);
  net.conv2d("conv_out", c, kLatentChannels, kConvKernel);
  return std::move(net).take();
}

// UNets work at latent resolution: no patchify, 4 latent channels; `hidden` is the top level's
// width. `widest` is the GEGLU projection (ff.net.0.proj, value and gate together) at the highest-
// resolution level that has attention; `gated` stays false because that width already counts
// both halves.
ArchShape unet_arch(const UNetShape& s) {
  ArchShape a;
  a.latent_channels = kLatentChannels;
  a.hidden = static_cast<std::uint32_t>(s.channels[0]);
  for (std::size_t level = 0; level < s.channels.size(); ++level) {
    if (s.depth[level] == 0) continue;
    a.widest = static_cast<std::uint32_t>(2 * kFfMult * s.channels[level]);
    break;
  }
  a.text_tokens = 77;  // one CLIP chunk
  a.patch = 1;
  return a;
}

}  // namespace

Built sd15_unet(Dtype native) {
  Built b;
  b.modules = unet_modules(kSd15, native);
  b.arch = unet_arch(kSd15);  // widest: 8 x 320 = 2560 (level 0 has attention)
  b.memory_usage_factor = 1.0;  // ComfyUI supported_models SD15
  return b;
}

Built sdxl_unet(Dtype native) {
  Built b;
  b.modules = unet_modules(kSdxl, native);
  b.arch = unet_arch(kSdxl);  // widest: 8 x 640 = 5120 (level 0 has no attention)
  b.memory_usage_factor = 0.8;  // ComfyUI supported_models SDXL
  return b;
}

}  // namespace vf::arch
