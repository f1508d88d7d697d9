// Activation sizes: ComfyUI's estimate (the worked example of comfyui-accounting.md §2.2) and the
// architecture working set, checked by hand.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "harness/core/error.h"
#include "models/activation.h"
#include "models/catalog.h"

namespace vf {
namespace {

const ModelSpec& model(std::string_view name) {
  static Catalog catalog;
  static std::map<std::string, std::shared_ptr<const ModelSpec>, std::less<>> held;
  auto it = held.find(name);
  if (it == held.end()) {
    const CatalogEntry* e = find_catalog_entry(name);
    it = held.emplace(std::string(name), catalog.get(name, {e->native_dtype, true}, "models[0]")).first;
  }
  return *it->second;
}

Workload image(std::uint32_t width, std::uint32_t height) {
  Workload w;
  w.width = width;
  w.height = height;
  return w;
}

double mib(Bytes b) { return static_cast<double>(b) / static_cast<double>(MiB); }

template <typename F>
std::string error_path(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.path();
  }
  return "<no error>";
}

// ---- latent area and positions ----------------------------------------------------------------

TEST(Activation, LatentAreaIsTheEighthScaleGrid) {
  EXPECT_EQ(latent_area(model("flux1-dev"), image(1024, 1024)), 128u * 128u);
  EXPECT_EQ(latent_area(model("sdxl-unet"), image(1216, 832)), 152u * 104u);
  // Floor, as ComfyUI's empty-latent nodes do: 1000 / 8 = 125, 1020 / 8 = 127.
  EXPECT_EQ(latent_area(model("flux1-dev"), image(1020, 1000)), 125u * 127u);
  EXPECT_EQ(latent_area(model("flux-vae"), image(1024, 1024)), 128u * 128u);
  EXPECT_EQ(latent_area(model("t5xxl"), image(1024, 1024)), 0u);
}

TEST(Activation, WanCountsLatentFrames) {
  Workload w = image(832, 480);
  w.frames = 81;  // 1 + 80 / 4 = 21 latent frames
  EXPECT_EQ(latent_area(model("wan21-14b"), w), 60u * 104u * 21u);
  // 30 x 52 patches x 21 frames = 32760 tokens (models-and-formats.md B.3), plus 512 text tokens.
  EXPECT_EQ(activation_positions(model("wan21-14b"), w), 32760u + 512u);
  w = image(1280, 720);
  w.frames = 81;
  EXPECT_EQ(activation_positions(model("wan21-14b"), w), 75600u + 512u);
  w.frames = 4;  // 1 + 3 / 4 = 1 (integer division)
  EXPECT_EQ(latent_area(model("wan21-14b"), w), 90u * 160u);
  // Frames mean nothing to an image model.
  w = image(1024, 1024);
  w.frames = 81;
  EXPECT_EQ(latent_area(model("flux1-dev"), w), 128u * 128u);
}

TEST(Activation, PositionsPerKind) {
  EXPECT_EQ(activation_positions(model("flux1-dev"), image(1024, 1024)), 4096u + 512u);
  EXPECT_EQ(activation_positions(model("flux2-dev"), image(1024, 1024)), 4096u + 512u);
  EXPECT_EQ(activation_positions(model("qwen-image"), image(1328, 1328)), 6889u + 256u);
  EXPECT_EQ(activation_positions(model("sd35-large"), image(1024, 1024)), 4096u + 333u);
  // An odd latent side is padded to whole patches: 125 -> 63 patches.
  EXPECT_EQ(activation_positions(model("flux1-dev"), image(1000, 1000)), 63u * 63u + 512u);
  EXPECT_EQ(activation_positions(model("sdxl-unet"), image(1024, 1024)), 128u * 128u);
  EXPECT_EQ(activation_positions(model("t5xxl"), image(1024, 1024)), 512u);
  EXPECT_EQ(activation_positions(model("clip-l"), image(1024, 1024)), 77u);
  EXPECT_EQ(activation_positions(model("flux-vae"), image(1024, 768)), 1024u * 768u);

  Workload w = image(1024, 1024);
  w.text_tokens = 256;  // a schnell-style T5 length overrides the family default
  EXPECT_EQ(activation_positions(model("flux1-dev"), w), 4096u + 256u);
  EXPECT_EQ(activation_positions(model("t5xxl"), w), 256u);
}

// ---- ComfyUI's estimate -----------------------------------------------------------------------

TEST(Activation, ComfyFluxWorkedExample) {
  const Workload w = image(1024, 1024);
  // 16384 x 2 bytes x 0.01 x 3.1 MiB = 1015.808 MiB; CFG doubles the batch.
  EXPECT_NEAR(mib(comfy_memory_required(model("flux1-dev"), w, 1, Dtype::bf16, true, "m")), 1015.8, 0.1);
  EXPECT_NEAR(mib(comfy_memory_required(model("flux1-dev"), w, 2, Dtype::bf16, true, "m")), 2031.6, 0.1);
  EXPECT_EQ(comfy_memory_required(model("flux1-dev"), w, 1, Dtype::bf16, true, "m"), 1'065'151'889u);
  // Split attention: 0.15 x 3.1 MiB per area unit, no dtype term: 7618.56 MiB.
  EXPECT_NEAR(mib(comfy_memory_required(model("flux1-dev"), w, 1, Dtype::bf16, false, "m")), 7618.56, 0.01);
  EXPECT_NEAR(mib(comfy_memory_required(model("flux1-dev"), w, 1, Dtype::fp32, false, "m")), 7618.56, 0.01);
  // fp32 compute doubles the flash estimate.
  EXPECT_NEAR(mib(comfy_memory_required(model("flux1-dev"), w, 1, Dtype::fp32, true, "m")), 2031.6, 0.1);
}

TEST(Activation, ComfyOtherFamilies) {
  const Workload w = image(1024, 1024);
  // SDXL: 16384 x 2 x 0.01 x 0.8 = 262.144 MiB.
  EXPECT_NEAR(mib(comfy_memory_required(model("sdxl-unet"), w, 1, Dtype::fp16, true, "m")), 262.144, 0.001);
  // FLUX.2: 16384 x 2 x 0.01 x 29.257 = 9587.0 MiB.
  EXPECT_NEAR(mib(comfy_memory_required(model("flux2-dev"), w, 1, Dtype::bf16, true, "m")),
              16384 * 2 * 0.01 * 3.1 * 4 * 6144 / 2604.0, 0.01);
  // Wan at 832x480x81: 131040 x 2 x 0.01 x 5120 / 2222 = 6038.9 MiB.
  Workload v = image(832, 480);
  v.frames = 81;
  EXPECT_NEAR(mib(comfy_memory_required(model("wan21-14b"), v, 1, Dtype::bf16, true, "m")),
              131040 * 2 * 0.01 * 5120 / 2222.0, 0.01);
  EXPECT_EQ(comfy_memory_required(model("flux2-text-encoder"), w, 1, Dtype::bf16, true, "m"), 0u);
}

TEST(Activation, ComfyVaeDecodeByHand) {
  // 2178 x 128 x 128 x 64 x 2 bytes = 4,567,597,056 B = 4356 MiB (128 x 128 x 64 is exactly 2^20).
  const Workload w = image(1024, 1024);
  EXPECT_EQ(comfy_memory_required(model("flux-vae"), w, 1, Dtype::bf16, true, "m"), 4'567'597'056u);
  EXPECT_EQ(comfy_memory_required(model("flux-vae"), w, 1, Dtype::bf16, false, "m"), 4356u * MiB);
  EXPECT_EQ(comfy_memory_required(model("flux-vae"), w, 3, Dtype::fp32, true, "m"), 3u * 2u * 4356u * MiB);
}

// ---- the working set --------------------------------------------------------------------------

TEST(Activation, WorkingSetFlux1ByHand) {
  // (4096 image + 512 text tokens) x (21504 linear1 + 3 x 3072 hidden) x 2 bytes.
  const Bytes expected = (4096u + 512u) * (21504u + 3u * 3072u) * 2u;
  EXPECT_EQ(expected, 283'115'520u);
  EXPECT_EQ(activation_working_set(model("flux1-dev"), image(1024, 1024), 1, Dtype::bf16, "m"), expected);
  EXPECT_EQ(activation_working_set(model("flux1-dev"), image(1024, 1024), 2, Dtype::bf16, "m"), 2 * expected);
  EXPECT_EQ(activation_working_set(model("flux1-dev"), image(1024, 1024), 1, Dtype::fp32, "m"), 2 * expected);
}

TEST(Activation, WorkingSetTextEncodersAndVae) {
  const Workload w = image(1024, 1024);
  // T5: gated, 512 x (3 x 10240 + 3 x 4096) x 2.
  EXPECT_EQ(activation_working_set(model("t5xxl"), w, 1, Dtype::bf16, "m"), 512u * (3u * 10240u + 3u * 4096u) * 2u);
  // CLIP: not gated, 77 x (3072 + 3 x 768) x 2.
  EXPECT_EQ(activation_working_set(model("clip-l"), w, 1, Dtype::fp16, "m"), 77u * (3072u + 3u * 768u) * 2u);
  // Mistral for FLUX.2: the gated FF plus the three kept 5120-wide hidden states.
  const Bytes ff = 512u * (3u * 32768u + 3u * 5120u) * 2u;
  const Bytes kept = 3u * 512u * 5120u * 2u;
  EXPECT_EQ(activation_working_set(model("flux2-text-encoder"), w, 1, Dtype::bf16, "m"), ff + kept);
  EXPECT_EQ(ff + kept, 132'120'576u);
  // VAE decode at full resolution: 1024^2 x (256 + 3 x 128) x 2 = 1280 MiB.
  EXPECT_EQ(activation_working_set(model("flux-vae"), w, 1, Dtype::bf16, "m"), 1280u * MiB);
  // SDXL: 16384 latent positions x (5120 + 3 x 320) x 2.
  EXPECT_EQ(activation_working_set(model("sdxl-unet"), w, 1, Dtype::fp16, "m"), 16384u * (5120u + 960u) * 2u);
}

// ---- bad input --------------------------------------------------------------------------------

TEST(Activation, ZeroFieldsAreInputErrors) {
  const ModelSpec& flux = model("flux1-dev");
  EXPECT_EQ(error_path([&] { (void)latent_area(flux, image(0, 1024)); }), "workload.width");
  EXPECT_EQ(error_path([&] { (void)activation_positions(flux, image(1024, 0)); }), "workload.height");
  EXPECT_EQ(error_path([&] { (void)activation_positions(model("flux-vae"), image(0, 8)); }), "workload.width");
  EXPECT_EQ(error_path([&] { (void)comfy_memory_required(flux, image(64, 64), 0, Dtype::bf16, true, "m"); }),
            "workload.batch");
  EXPECT_EQ(error_path([&] { (void)activation_working_set(flux, image(64, 64), 0, Dtype::bf16, "m"); }),
            "workload.batch");
  EXPECT_EQ(error_path([&] { (void)latent_area(flux, image(4, 1024)); }), "workload.width");  // < 1 latent pixel
  Workload video = image(832, 480);
  video.frames = 0;
  EXPECT_EQ(error_path([&] { (void)latent_area(model("wan21-14b"), video); }), "workload.frames");
}

TEST(Activation, NonComputeDtypeAndOverflowNameTheQuantity) {
  const ModelSpec& flux = model("flux1-dev");
  EXPECT_EQ(error_path([&] { (void)comfy_memory_required(flux, image(64, 64), 1, Dtype::q4_k, true, "models[0].act"); }),
            "models[0].act");
  Workload huge = image(4'000'000'000u, 4'000'000'000u);
  huge.frames = 4'000'000'000u;
  EXPECT_THROW((void)latent_area(model("wan21-14b"), huge), InputError);
  // About 6e16 positions x 30720 x 2 bytes overflows 64 bits.
  EXPECT_EQ(error_path([&] { (void)activation_working_set(flux, image(4'000'000'000u, 4'000'000'000u), 1,
                                                          Dtype::bf16, "models[0].act"); }),
            "models[0].act");
}

}  // namespace
}  // namespace vf
