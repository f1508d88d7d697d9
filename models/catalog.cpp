#include "models/catalog.h"

#include <array>
#include <string>

#include <fmt/format.h>

#include "harness/core/error.h"
#include "models/activation.h"
#include "models/arch/net.h"
#include "models/storage.h"

namespace vf {
namespace {

using BuildFn = arch::Built (*)(Dtype native);

struct Recipe {
  CatalogEntry entry;
  BuildFn build;
};

// Published counts as the references state them: exact where the count was computed and
// confirmed (FLUX.1, CLIP-L, T5-XXL, the UNets); rounded where the source gives 4 digits; for
// the FLUX.2 text encoder and VAE, our own derivation (see models/arch/text_encoders.cpp and
// vae.cpp), since no count is published for those exact files.
constexpr std::array<Recipe, 12> kRecipes = {{
    {{"flux1-dev", "FLUX.1-dev DiT (BFL layout): 19 double + 38 single blocks, hidden 3072", ModelKind::diffusion,
      Family::flux, 11'901'408'320, Dtype::bf16},
     arch::flux1_dev},
    {{"flux2-dev", "FLUX.2-dev DiT: 8 double + 48 single blocks, hidden 6144, SwiGLU, shared modulation",
      ModelKind::diffusion, Family::flux2, 32'223'000'000, Dtype::bf16},
     arch::flux2_dev},
    {{"flux2-text-encoder", "Mistral-Small-3.x for FLUX.2: embedding + first 30 decoder layers, hidden 5120",
      ModelKind::text_encoder, Family::mistral, 17'343'754'240, Dtype::bf16},
     arch::flux2_text_encoder},
    {{"t5xxl", "T5-XXL v1.1 encoder: 24 blocks, d_model 4096, gated-GELU FF 10240", ModelKind::text_encoder, Family::t5,
      4'762'310'656, Dtype::fp16},
     arch::t5xxl_encoder},
    {{"clip-l", "CLIP-L text model: 12 layers, hidden 768, 77 positions", ModelKind::text_encoder, Family::clip,
      123'060'480, Dtype::fp16},
     arch::clip_l},
    {{"sdxl-unet", "SDXL UNet (diffusers layout): 320/640/1280, transformer depth 0/2/10, context 2048",
      ModelKind::diffusion, Family::sdxl, 2'567'463'684, Dtype::fp16},
     arch::sdxl_unet},
    {{"sd15-unet", "SD1.5 UNet (diffusers layout): 320/640/1280/1280, transformer depth 1, context 768",
      ModelKind::diffusion, Family::sd15, 859'520'964, Dtype::fp16},
     arch::sd15_unet},
    {{"sd35-large", "SD3.5 Large MMDiT: 38 joint blocks, hidden 2432", ModelKind::diffusion, Family::sd3,
      8'057'000'000, Dtype::bf16},
     arch::sd35_large},
    {{"qwen-image", "Qwen-Image MMDiT: 60 dual-stream blocks, hidden 3072", ModelKind::diffusion, Family::qwen_image,
      20'430'000'000, Dtype::bf16},
     arch::qwen_image},
    {{"wan21-14b", "Wan 2.1 T2V 14B video DiT: 40 blocks, dim 5120, FFN 13824", ModelKind::diffusion, Family::wan21,
      14'288'000'000, Dtype::bf16},
     arch::wan21_14b},
    {{"flux-vae", "FLUX.1 VAE (ae): AutoencoderKL 128/256/512/512, 16-channel latent", ModelKind::vae, Family::vae_kl,
      83'820'000, Dtype::fp32},
     arch::flux_vae},
    {{"flux2-vae", "FLUX.2 VAE (derived): the FLUX VAE stack with a 32-channel latent and quant convs",
      ModelKind::vae, Family::vae_kl, 84'000'000, Dtype::fp32},
     arch::flux2_vae},
}};

constexpr std::array<CatalogEntry, kRecipes.size()> kEntries = [] {
  std::array<CatalogEntry, kRecipes.size()> out{};
  for (std::size_t i = 0; i < kRecipes.size(); ++i) out[i] = kRecipes[i].entry;
  return out;
}();

const Recipe* find_recipe(std::string_view name) {
  for (const Recipe& r : kRecipes) {
    if (r.entry.name == name) return &r;
  }
  return nullptr;
}

std::string catalog_list() {
  std::string out;
  for (const CatalogEntry& e : kEntries) {
    if (!out.empty()) out += ", ";
    out += e.name;
  }
  return out;
}

}  // namespace

std::span<const CatalogEntry> catalog_entries() { return kEntries; }

const CatalogEntry* find_catalog_entry(std::string_view name) {
  for (const CatalogEntry& e : kEntries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

ModelSpec build_catalog_model(std::string_view name, StorageChoice storage, std::string_view path) {
  const Recipe* r = find_recipe(name);
  if (r == nullptr) throw InputError(std::string(path), fmt::format("unknown model \"{}\" (catalog: {})", name, catalog_list()));
  arch::Built built = r->build(r->entry.native_dtype);
  apply_storage(built.modules, storage, r->entry.native_dtype);

  ModelSpec m;
  m.name = std::string(r->entry.name);
  m.source = fmt::format("catalog:{}", r->entry.name);
  m.family = r->entry.family;
  m.kind = r->entry.kind;
  m.memory_usage_factor = built.memory_usage_factor;
  m.arch = built.arch;
  m.modules = std::move(built.modules);
  finalize_model(m, path);
  set_name_ranks(m);  // the load walks of its many (storage, dtype, constants) keys compare these
  return m;
}

std::optional<FamilyDefaults> family_defaults(Family f) {
  for (const Recipe& r : kRecipes) {
    if (r.entry.family != f) continue;
    const arch::Built built = r.build(r.entry.native_dtype);
    return FamilyDefaults{r.entry.name, r.entry.kind, built.memory_usage_factor, built.arch};
  }
  return std::nullopt;
}

const ActivationMarginRange& catalog_activation_margin() {
  static const ActivationMarginRange range = [] {
    ActivationMarginRange out;
    bool first = true;
    for (const Recipe& r : kRecipes) {
      if (r.entry.kind != ModelKind::diffusion) continue;
      const arch::Built built = r.build(r.entry.native_dtype);
      ModelSpec m;
      m.name = std::string(r.entry.name);
      m.kind = r.entry.kind;
      m.family = r.entry.family;
      m.memory_usage_factor = built.memory_usage_factor;
      m.arch = built.arch;
      const Workload w;  // 1024 x 1024, batch 1, one frame, the family's text tokens
      const double est = static_cast<double>(comfy_memory_required(m, w, 1, Dtype::bf16, true, "catalog"));
      const double live = static_cast<double>(activation_working_set(m, w, 1, Dtype::bf16, "catalog"));
      const double ratio = est / live;
      if (first || ratio < out.lo) {
        out.lo = ratio;
        out.lo_model = r.entry.name;
      }
      if (first || ratio > out.hi) {
        out.hi = ratio;
        out.hi_model = r.entry.name;
      }
      first = false;
    }
    return out;
  }();
  return range;
}

std::shared_ptr<const ModelSpec> Catalog::get(std::string_view name, StorageChoice storage, std::string_view path) {
  std::tuple<std::string, StorageChoice> key{std::string(name), storage};
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  }
  // Built outside the lock: a big model takes a while and other workers may want other models.
  // If two workers race on the same key, the first insert wins and both get that one.
  auto built = std::make_shared<const ModelSpec>(build_catalog_model(name, storage, path));
  std::lock_guard<std::mutex> lock(mu_);
  return cache_.emplace(std::move(key), std::move(built)).first->second;
}

}  // namespace vf
