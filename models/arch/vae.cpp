// AutoencoderKL-style VAEs in the BFL `ae.safetensors` layout: a conv encoder and decoder with
// channels 128/256/512/512, two resnets per level on the way down and three on the way up, one
// self-attention in each mid block, x8 spatial down/up sampling.
//
// FLUX VAE: 16-channel latent, no quant convs. 83,819,683 parameters in 244 tensors.
// FLUX.2 VAE (derived): the same stack with a 32-channel latent, 1x1 quant / post-quant convs,
// and a BatchNorm (running stats only) over the 2x2-patchified 128-channel latent.
// 84,046,115 parameters plus 256 buffer values.
#include <array>

#include "models/arch/net.h"

namespace vf::arch {
namespace {

constexpr std::uint64_t kImageChannels = 3;
constexpr std::array<std::uint64_t, 4> kChannels = {128, 256, 512, 512};  // 128 x ch_mult (1, 2, 4, 4)
constexpr std::uint64_t kVaeResnetsDown = 2;
constexpr std::uint64_t kVaeResnetsUp = kVaeResnetsDown + 1;
constexpr std::uint64_t kVaeConvKernel = 3;
constexpr std::uint64_t kPatchArea = 2 * 2;  // FLUX.2 patchifies the latent 2x2 before its BatchNorm

struct VaeShape {
  std::uint64_t z_channels;  // latent channels
  bool quant_convs;
  bool latent_batchnorm;
};

constexpr VaeShape kFluxVae = {16, false, false};
constexpr VaeShape kFlux2Vae = {32, true, true};

void vae_resnet(Net& net, std::string_view path, std::uint64_t in, std::uint64_t out) {
  net.norm(sub(path, "norm1"), in, true);
  net.conv2d(sub(path, "conv1"), in, out, kVaeConvKernel);
  net.norm(sub(path, "norm2"), out, true);
  net.conv2d(sub(path, "conv2"), out, out, kVaeConvKernel);
  if (in != out) net.conv2d(sub(path, "nin_shortcut"), in, out, 1);
}

// Mid block: resnet, single-head self-attention made of 1x1 convs, resnet.
void mid(Net& net, std::string_view path, std::uint64_t c) {
  vae_resnet(net, sub(path, "block_1"), c, c);
  net.norm(sub(path, "attn_1.norm"), c, true);
  for (std::string_view p : {"q", "k", "v", "proj_out"}) net.conv2d(sub(path, fmt::format("attn_1.{}", p)), c, c, 1);
  vae_resnet(net, sub(path, "block_2"), c, c);
}

void encoder(Net& net, const VaeShape& s) {
  net.conv2d("encoder.conv_in", kImageChannels, kChannels[0], kVaeConvKernel);
  std::uint64_t c = kChannels[0];
  for (std::size_t level = 0; level < kChannels.size(); ++level) {
    for (std::uint64_t r = 0; r < kVaeResnetsDown; ++r) {
      vae_resnet(net, fmt::format("encoder.down.{}.block.{}", level, r), c, kChannels[level]);
      c = kChannels[level];
    }
    if (level + 1 < kChannels.size()) net.conv2d(fmt::format("encoder.down.{}.downsample.conv", level), c, c, kVaeConvKernel);
  }
  mid(net, "encoder.mid", c);
  net.norm("encoder.norm_out", c, true);
  // Mean and log-variance of the latent.
  net.conv2d("encoder.conv_out", c, 2 * s.z_channels, kVaeConvKernel);
  if (s.quant_convs) net.conv2d("encoder.quant_conv", 2 * s.z_channels, 2 * s.z_channels, 1);
}

void decoder(Net& net, const VaeShape& s) {
  if (s.quant_convs) net.conv2d("decoder.post_quant_conv", s.z_channels, s.z_channels, 1);
  std::uint64_t c = kChannels.back();
  net.conv2d("decoder.conv_in", s.z_channels, c, kVaeConvKernel);
  mid(net, "decoder.mid", c);
  // Levels run bottom-up; each keeps its index in the name (decoder.up.3 runs first).
  for (std::size_t level = kChannels.size(); level-- > 0;) {
    for (std::uint64_t r = 0; r < kVaeResnetsUp; ++r) {
      vae_resnet(net, fmt::format("decoder.up.{}.block.{}", level, r), c, kChannels[level]);
      c = kChannels[level];
    }
    if (level != 0) net.conv2d(fmt::format("decoder.up.{}.upsample.conv", level), c, c, kVaeConvKernel);
  }
  net.norm("decoder.norm_out", c, true);
  net.conv2d("decoder.conv_out", c, kImageChannels, kVaeConvKernel);
}

std::vector<Module> vae_modules(const VaeShape& s, Dtype native) {
  Net net(native);
  encoder(net, s);
  if (s.latent_batchnorm) {
    // Non-affine BatchNorm: buffers only (num_batches_tracked, an int64 counter, is left out).
    const std::uint64_t c = kPatchArea * s.z_channels;
    net.raw("bn", "running_mean", {c}, TensorRole::other);
    net.raw("bn", "running_var", {c}, TensorRole::other);
  }
  decoder(net, s);
  return std::move(net).take();
}

// Decoder activations at full pixel resolution: the 256-channel output of the last upsample and
// the 128-channel convs of level 0.
ArchShape vae_arch(const VaeShape& s) {
  ArchShape a;
  a.latent_channels = static_cast<std::uint32_t>(s.z_channels);
  a.hidden = static_cast<std::uint32_t>(kChannels[0]);
  a.widest = static_cast<std::uint32_t>(kChannels[1]);
  a.patch = 1;
  return a;
}

}  // namespace

Built flux_vae(Dtype native) {
  Built b;
  b.modules = vae_modules(kFluxVae, native);
  b.arch = vae_arch(kFluxVae);
  return b;
}

Built flux2_vae(Dtype native) {
  Built b;
  b.modules = vae_modules(kFlux2Vae, native);
  b.arch = vae_arch(kFlux2Vae);
  return b;
}

}  // namespace vf::arch
