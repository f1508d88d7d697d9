// The built-in catalog: parameter totals against the published counts, the structure the rules
// generate (block counts, names, largest tensors, forward order), and the storage rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "harness/core/error.h"
#include "models/catalog.h"
#include "models/storage.h"

namespace vf {
namespace {

ModelSpec build(std::string_view name, Dtype d = Dtype::bf16, bool scaled = true) {
  return build_catalog_model(name, StorageChoice{d, scaled}, "models[0]");
}

std::string key_of(const Module& m, const Tensor& t) { return m.name.empty() ? t.name : m.name + "." + t.name; }

// The tensor stored under `key` ("double_blocks.0.img_attn.qkv.weight"); fails the test if absent.
const Tensor& tensor(const ModelSpec& m, std::string_view key) {
  for (const Module& mod : m.modules) {
    for (const Tensor& t : mod.tensors) {
      if (key_of(mod, t) == key) return t;
    }
  }
  ADD_FAILURE() << m.name << " has no tensor " << key;
  static const Tensor kNone;
  return kNone;
}

const Module& module(const ModelSpec& m, std::string_view name) {
  for (const Module& mod : m.modules) {
    if (mod.name == name) return mod;
  }
  ADD_FAILURE() << m.name << " has no module " << name;
  static const Module kNone;
  return kNone;
}

// Number of distinct N in "<prefix>N." over all module names.
std::size_t count_indexed(const ModelSpec& m, const std::string& prefix) {
  std::set<std::string> seen;
  for (const Module& mod : m.modules) {
    if (mod.name.rfind(prefix, 0) != 0) continue;
    const std::string rest = mod.name.substr(prefix.size());
    seen.insert(rest.substr(0, rest.find('.')));
  }
  return seen.size();
}

std::size_t count_suffix(const ModelSpec& m, std::string_view suffix) {
  return static_cast<std::size_t>(std::count_if(m.modules.begin(), m.modules.end(), [&](const Module& mod) {
    return mod.name.size() >= suffix.size() && mod.name.compare(mod.name.size() - suffix.size(), suffix.size(), suffix) == 0;
  }));
}

const Tensor& largest_tensor(const ModelSpec& m, std::string* key = nullptr) {
  const Tensor* best = nullptr;
  for (const Module& mod : m.modules) {
    for (const Tensor& t : mod.tensors) {
      if (best == nullptr || t.numel > best->numel) {
        best = &t;
        if (key) *key = key_of(mod, t);
      }
    }
  }
  return *best;
}

using Shape = std::vector<std::uint64_t>;

// ---- the catalog as a whole -------------------------------------------------------------------

TEST(Catalog, ListsTheTwelveModels) {
  std::vector<std::string> names;
  for (const CatalogEntry& e : catalog_entries()) names.emplace_back(e.name);
  const std::vector<std::string> expected = {"flux1-dev", "flux2-dev",  "flux2-text-encoder", "t5xxl",
                                             "clip-l",    "sdxl-unet",  "sd15-unet",          "sd35-large",
                                             "qwen-image", "wan21-14b", "flux-vae",           "flux2-vae"};
  EXPECT_EQ(names, expected);
  EXPECT_NE(find_catalog_entry("flux1-dev"), nullptr);
  EXPECT_EQ(find_catalog_entry("flux1-schnell"), nullptr);
}

TEST(Catalog, EveryEntryWithinHalfAPercentOfItsPublishedCount) {
  for (const CatalogEntry& e : catalog_entries()) {
    const ModelSpec m = build(e.name);
    const double published = static_cast<double>(e.published_params);
    const double off = std::abs(static_cast<double>(m.params) - published) / published;
    EXPECT_LE(off, 0.005) << e.name << ": " << m.params << " vs published " << e.published_params;
    EXPECT_EQ(m.name, e.name);
    EXPECT_EQ(m.source, "catalog:" + std::string(e.name));
    EXPECT_EQ(m.kind, e.kind) << e.name;
    EXPECT_EQ(m.family, e.family) << e.name;
  }
}

TEST(Catalog, ExactCountsWhereTheReferenceComputedThem) {
  EXPECT_EQ(build("flux1-dev").params, 11'901'408'320u);
  EXPECT_EQ(build("clip-l").params, 123'060'480u);
  EXPECT_EQ(build("t5xxl").params, 4'762'310'656u);
  EXPECT_EQ(build("sdxl-unet").params, 2'567'463'684u);
  EXPECT_EQ(build("sd15-unet").params, 859'520'964u);
  // Our own derivations (per-block sums in models/arch/*.cpp).
  EXPECT_EQ(build("flux2-dev").params, 32'223'281'152u);
  EXPECT_EQ(build("flux2-text-encoder").params, 17'343'759'360u);  // with model.norm
  EXPECT_EQ(build("sd35-large").params, 8'056'627'520u);
  EXPECT_EQ(build("qwen-image").params, 20'430'401'088u);
  EXPECT_EQ(build("wan21-14b").params, 14'288'491'584u);
  EXPECT_EQ(build("flux-vae").params, 83'819'683u);
  EXPECT_EQ(build("flux2-vae").params, 84'046'115u);
}

TEST(Catalog, Bf16BytesAreTwoPerStoredValue) {
  for (const CatalogEntry& e : catalog_entries()) {
    const ModelSpec m = build(e.name, Dtype::bf16);
    std::uint64_t buffers = 0;  // stored but not parameters (SD3.5 pos_embed, FLUX.2 VAE BatchNorm stats)
    for (const Module& mod : m.modules) {
      for (const Tensor& t : mod.tensors) {
        EXPECT_EQ(t.dtype, Dtype::bf16) << e.name << " " << key_of(mod, t);
        EXPECT_EQ(t.bytes, 2 * t.numel);
        if (t.role == TensorRole::other) buffers += t.numel;
      }
    }
    EXPECT_EQ(m.bytes, 2 * (m.params + buffers)) << e.name;
    if (e.name != "sd35-large" && e.name != "flux2-vae") {
      EXPECT_EQ(m.bytes, 2 * m.params) << e.name;
    }
  }
}

TEST(Catalog, TensorKeysAreUniqueAndModulesOwnTensors) {
  for (const CatalogEntry& e : catalog_entries()) {
    const ModelSpec m = build(e.name);
    std::set<std::string> keys;
    for (const Module& mod : m.modules) {
      EXPECT_FALSE(mod.tensors.empty()) << e.name << " " << mod.name;
      Bytes sum = 0;
      for (const Tensor& t : mod.tensors) {
        EXPECT_TRUE(keys.insert(key_of(mod, t)).second) << e.name << " duplicate " << key_of(mod, t);
        sum += t.bytes;
      }
      EXPECT_EQ(mod.bytes, sum);
    }
  }
}

// The classic planner's partial unload walks a model's modules in the reverse of its load walk
// (comfy_classic.cpp free_memory), which is the order ComfyUI sorts by only where (offload cost,
// bytes, name) orders the modules totally: their names must be unique.
TEST(Catalog, ModuleNamesAreUniqueInEveryModelAndStorage) {
  for (const CatalogEntry& e : catalog_entries()) {
    for (const StorageChoice storage : {StorageChoice{Dtype::bf16, true}, StorageChoice{Dtype::fp8_e4m3fn, true},
                                        StorageChoice{Dtype::fp8_e4m3fn, false}, StorageChoice{Dtype::q4_k, true}}) {
      const ModelSpec m = build_catalog_model(e.name, storage, "model");
      std::set<std::string> names;
      for (const Module& mod : m.modules) EXPECT_TRUE(names.insert(mod.name).second) << e.name << " duplicate " << mod.name;
    }
  }
}

TEST(Catalog, ForwardOrderStartsWithTheInputEmbeddingOrProjection) {
  EXPECT_EQ(build("flux1-dev").modules.front().name, "img_in");
  EXPECT_EQ(build("flux2-dev").modules.front().name, "img_in");
  EXPECT_EQ(build("sd35-large").modules.front().name, "x_embedder.proj");
  EXPECT_EQ(build("qwen-image").modules.front().name, "img_in");
  EXPECT_EQ(build("wan21-14b").modules.front().name, "patch_embedding");
  EXPECT_EQ(build("flux-vae").modules.front().name, "encoder.conv_in");
  for (std::string_view te : {"t5xxl", "clip-l", "flux2-text-encoder"}) {
    const ModelSpec m = build(te);
    ASSERT_FALSE(m.modules.front().tensors.empty());
    EXPECT_EQ(m.modules.front().tensors.front().role, TensorRole::embedding) << te;
  }
  // UNets compute the timestep embedding before conv_in touches the latent.
  const ModelSpec sdxl = build("sdxl-unet");
  EXPECT_EQ(sdxl.modules.front().name, "time_embedding.linear_1");
  EXPECT_EQ(sdxl.modules.back().name, "conv_out");
  EXPECT_EQ(build("flux1-dev").modules.back().name, "final_layer.linear");
}

TEST(Catalog, MemoryUsageFactorsFromComfyUI) {
  EXPECT_DOUBLE_EQ(build("flux1-dev").memory_usage_factor, 3.1);
  EXPECT_NEAR(build("flux2-dev").memory_usage_factor, 3.1 * 4 * 6144 / 2604.0, 1e-12);
  EXPECT_NEAR(build("flux2-dev").memory_usage_factor, 29.257, 0.001);
  EXPECT_DOUBLE_EQ(build("sdxl-unet").memory_usage_factor, 0.8);
  EXPECT_DOUBLE_EQ(build("sd15-unet").memory_usage_factor, 1.0);
  EXPECT_DOUBLE_EQ(build("sd35-large").memory_usage_factor, 1.2);
  EXPECT_DOUBLE_EQ(build("qwen-image").memory_usage_factor, 1.8);
  EXPECT_DOUBLE_EQ(build("wan21-14b").memory_usage_factor, 5120.0 / 2222.0);
  for (std::string_view n : {"t5xxl", "clip-l", "flux2-text-encoder", "flux-vae", "flux2-vae"}) {
    EXPECT_DOUBLE_EQ(build(n).memory_usage_factor, 1.0) << n;
  }
}

TEST(Catalog, UnknownNameListsTheCatalog) {
  try {
    (void)build_catalog_model("flux3", {}, "models[2].source");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "models[2].source");
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unknown model \"flux3\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("(catalog: flux1-dev, flux2-dev, flux2-text-encoder,"), std::string::npos) << msg;
    EXPECT_NE(msg.find("flux2-vae)"), std::string::npos) << msg;
  }
  Catalog c;
  EXPECT_THROW((void)c.get("nope", {}, "models[0]"), InputError);
}

// ---- FLUX.1 / FLUX.2 --------------------------------------------------------------------------

TEST(CatalogFlux1, BflLayout) {
  const ModelSpec m = build("flux1-dev");
  EXPECT_EQ(count_indexed(m, "double_blocks."), 19u);
  EXPECT_EQ(count_indexed(m, "single_blocks."), 38u);
  EXPECT_EQ(tensor(m, "single_blocks.0.linear1.weight").shape, (Shape{21504, 3072}));
  EXPECT_EQ(tensor(m, "single_blocks.37.linear2.weight").shape, (Shape{3072, 15360}));
  EXPECT_EQ(tensor(m, "double_blocks.0.img_attn.qkv.weight").shape, (Shape{9216, 3072}));
  EXPECT_EQ(tensor(m, "double_blocks.18.txt_mod.lin.weight").shape, (Shape{18432, 3072}));
  EXPECT_EQ(tensor(m, "double_blocks.0.img_attn.norm.query_norm.scale").role, TensorRole::norm);
  EXPECT_EQ(tensor(m, "img_in.weight").shape, (Shape{3072, 64}));
  EXPECT_EQ(tensor(m, "vector_in.in_layer.weight").shape, (Shape{3072, 768}));
  std::string key;
  EXPECT_EQ(largest_tensor(m, &key).numel, 66'060'288u);
  EXPECT_EQ(key, "single_blocks.0.linear1.weight");
  for (const Module& mod : m.modules) EXPECT_TRUE(mod.cast_hook) << mod.name;

  const ArchShape& a = m.arch;
  EXPECT_EQ(a.latent_channels, 16u);
  EXPECT_EQ(a.hidden, 3072u);
  EXPECT_EQ(a.widest, 21504u);
  EXPECT_EQ(a.text_tokens, 512u);
  EXPECT_EQ(a.patch, 2u);
  EXPECT_FALSE(a.gated);
}

TEST(CatalogFlux2, SharedModulationNoBiases) {
  const ModelSpec m = build("flux2-dev");
  EXPECT_EQ(count_indexed(m, "double_blocks."), 8u);
  EXPECT_EQ(count_indexed(m, "single_blocks."), 48u);
  EXPECT_EQ(tensor(m, "double_stream_modulation_img.lin.weight").shape, (Shape{36864, 6144}));
  EXPECT_EQ(tensor(m, "double_stream_modulation_txt.lin.weight").shape, (Shape{36864, 6144}));
  EXPECT_EQ(tensor(m, "single_stream_modulation.lin.weight").shape, (Shape{18432, 6144}));
  EXPECT_EQ(tensor(m, "single_blocks.0.linear1.weight").shape, (Shape{55296, 6144}));
  EXPECT_EQ(tensor(m, "double_blocks.0.img_mlp.0.weight").shape, (Shape{36864, 6144}));  // SwiGLU gate + up
  EXPECT_EQ(tensor(m, "double_blocks.0.img_mlp.2.weight").shape, (Shape{6144, 18432}));
  EXPECT_EQ(tensor(m, "txt_in.weight").shape, (Shape{6144, 15360}));
  for (const Module& mod : m.modules) {
    for (const Tensor& t : mod.tensors) EXPECT_NE(t.role, TensorRole::bias) << key_of(mod, t);
    EXPECT_EQ(mod.name.find("img_mod"), std::string::npos) << "per-block modulation in " << mod.name;
  }
  EXPECT_EQ(largest_tensor(m).numel, 339'738'624u);
  EXPECT_EQ(m.arch.latent_channels, 32u);
  EXPECT_EQ(m.arch.widest, 55296u);
  EXPECT_EQ(m.arch.hidden, 6144u);
}

// ---- the other diffusion models ---------------------------------------------------------------

TEST(CatalogSd35, JointBlocksAndPosEmbedBuffer) {
  const ModelSpec m = build("sd35-large");
  EXPECT_EQ(count_indexed(m, "joint_blocks."), 38u);
  EXPECT_EQ(tensor(m, "joint_blocks.0.x_block.adaLN_modulation.1.weight").shape, (Shape{14592, 2432}));
  // The last context block is pre-only: shift/scale modulation and q/k/v, no out-projection or MLP.
  EXPECT_EQ(tensor(m, "joint_blocks.37.context_block.adaLN_modulation.1.weight").shape, (Shape{4864, 2432}));
  EXPECT_EQ(count_suffix(m, "context_block.mlp.fc1"), 37u);
  EXPECT_EQ(count_suffix(m, "x_block.mlp.fc1"), 38u);
  const Tensor& pos = tensor(m, "pos_embed");
  EXPECT_EQ(pos.shape, (Shape{1, 36864, 2432}));
  EXPECT_EQ(pos.role, TensorRole::other);
  EXPECT_FALSE(module(m, "").cast_hook);
  EXPECT_EQ(m.arch.text_tokens, 77u + 256u);
}

TEST(CatalogQwenImage, SixtyDualStreamBlocks) {
  const ModelSpec m = build("qwen-image");
  EXPECT_EQ(count_indexed(m, "transformer_blocks."), 60u);
  EXPECT_EQ(tensor(m, "transformer_blocks.0.img_mod.1.weight").shape, (Shape{18432, 3072}));
  EXPECT_EQ(tensor(m, "txt_in.weight").shape, (Shape{3072, 3584}));
  EXPECT_EQ(largest_tensor(m).numel, 56'623'104u);
  EXPECT_EQ(m.arch.widest, 12288u);
}

TEST(CatalogWan, FortyBlocksAndRawModulation) {
  const ModelSpec m = build("wan21-14b");
  EXPECT_EQ(count_indexed(m, "blocks."), 40u);
  EXPECT_EQ(tensor(m, "time_projection.1.weight").shape, (Shape{30720, 5120}));
  EXPECT_EQ(tensor(m, "blocks.39.ffn.0.weight").shape, (Shape{13824, 5120}));
  EXPECT_EQ(tensor(m, "patch_embedding.weight").shape, (Shape{5120, 16, 1, 2, 2}));
  const Module& mod = module(m, "blocks.0");
  EXPECT_FALSE(mod.cast_hook);
  EXPECT_EQ(tensor(m, "blocks.0.modulation").shape, (Shape{1, 6, 5120}));
  std::string key;
  EXPECT_EQ(largest_tensor(m, &key).numel, 157'286'400u);
  EXPECT_EQ(key, "time_projection.1.weight");
  EXPECT_EQ(m.arch.temporal_down, 4u);
  EXPECT_EQ(m.arch.patch, 2u);
}

TEST(CatalogUNet, SdxlBlockStructure) {
  const ModelSpec m = build("sdxl-unet");
  EXPECT_EQ(count_suffix(m, "attn1.to_q"), 70u);  // 2x2 + 3x2 at 640 ... 10 per attention at 1280
  EXPECT_EQ(count_suffix(m, "attn2.to_k"), 70u);
  EXPECT_EQ(tensor(m, "down_blocks.2.attentions.0.transformer_blocks.0.attn2.to_k.weight").shape,
            (Shape{1280, 2048}));
  EXPECT_EQ(tensor(m, "mid_block.attentions.0.transformer_blocks.9.ff.net.0.proj.weight").shape,
            (Shape{10240, 1280}));
  EXPECT_EQ(tensor(m, "add_embedding.linear_1.weight").shape, (Shape{1280, 2816}));
  std::string key;
  EXPECT_EQ(largest_tensor(m, &key).shape, (Shape{1280, 2560, 3, 3}));
  EXPECT_EQ(key, "up_blocks.0.resnets.0.conv1.weight");
  EXPECT_EQ(m.arch.latent_channels, 4u);
  EXPECT_EQ(m.arch.patch, 1u);
  EXPECT_EQ(m.arch.hidden, 320u);
  EXPECT_EQ(m.arch.widest, 5120u);  // GEGLU at 640, the top level with attention
}

TEST(CatalogUNet, Sd15BlockStructure) {
  const ModelSpec m = build("sd15-unet");
  EXPECT_EQ(count_suffix(m, "attn1.to_q"), 16u);
  EXPECT_EQ(tensor(m, "down_blocks.0.attentions.0.proj_in.weight").shape, (Shape{320, 320, 1, 1}));
  EXPECT_EQ(tensor(m, "up_blocks.3.attentions.2.transformer_blocks.0.attn2.to_v.weight").shape, (Shape{320, 768}));
  EXPECT_EQ(count_indexed(m, "up_blocks."), 4u);
  EXPECT_EQ(m.arch.widest, 2560u);
}

// ---- text encoders ----------------------------------------------------------------------------

TEST(CatalogTextEncoders, Flux2MistralKeepsThirtyLayers) {
  const ModelSpec m = build("flux2-text-encoder");
  EXPECT_EQ(count_indexed(m, "model.layers."), 30u);
  EXPECT_EQ(count_suffix(m, "mlp.down_proj"), 30u);
  const Module* largest = &m.modules.front();
  for (const Module& mod : m.modules) {
    if (mod.bytes > largest->bytes) largest = &mod;
  }
  EXPECT_EQ(largest->name, "model.embed_tokens");
  EXPECT_EQ(largest->tensors.front().shape, (Shape{131072, 5120}));
  EXPECT_EQ(tensor(m, "model.layers.29.self_attn.k_proj.weight").shape, (Shape{1024, 5120}));
  EXPECT_EQ(tensor(m, "model.layers.0.mlp.gate_proj.weight").shape, (Shape{32768, 5120}));
  EXPECT_EQ(m.arch.kept_hidden_states, 3u);
  EXPECT_TRUE(m.arch.gated);
  EXPECT_EQ(m.arch.widest, 32768u);
  EXPECT_EQ(m.arch.text_tokens, 512u);
  // About 34.7 GB in bf16, the size of the file ComfyUI ships.
  EXPECT_EQ(m.bytes, 34'687'518'720u);  // with the final norm (10 KiB in bf16)
  EXPECT_EQ(m.modules.back().name, "model.norm");
}

TEST(CatalogTextEncoders, T5AndClip) {
  const ModelSpec t5 = build("t5xxl");
  EXPECT_EQ(count_indexed(t5, "encoder.block."), 24u);
  EXPECT_EQ(tensor(t5, "shared.weight").shape, (Shape{32128, 4096}));
  EXPECT_EQ(tensor(t5, "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight").shape,
            (Shape{32, 64}));
  EXPECT_TRUE(t5.arch.gated);
  EXPECT_EQ(t5.arch.widest, 10240u);
  const ModelSpec clip = build("clip-l");
  EXPECT_EQ(count_indexed(clip, "text_model.encoder.layers."), 12u);
  EXPECT_FALSE(clip.arch.gated);
  EXPECT_EQ(clip.arch.text_tokens, 77u);
}

// ---- VAEs -------------------------------------------------------------------------------------

TEST(CatalogVae, FluxVaeHas244Tensors) {
  const ModelSpec m = build("flux-vae", Dtype::fp32);
  std::size_t tensors = 0;
  for (const Module& mod : m.modules) tensors += mod.tensors.size();
  EXPECT_EQ(tensors, 244u);
  EXPECT_EQ(m.bytes, 4 * m.params);  // the release file is fp32: about 335 MB
  EXPECT_EQ(tensor(m, "encoder.conv_out.weight").shape, (Shape{32, 512, 3, 3}));
  EXPECT_EQ(tensor(m, "decoder.conv_in.weight").shape, (Shape{512, 16, 3, 3}));
  EXPECT_EQ(m.arch.widest, 256u);
  EXPECT_EQ(m.arch.hidden, 128u);
  EXPECT_EQ(m.arch.latent_channels, 16u);
}

TEST(CatalogVae, Flux2VaeHasA32ChannelLatent) {
  const ModelSpec m = build("flux2-vae");
  EXPECT_EQ(tensor(m, "decoder.conv_in.weight").shape, (Shape{512, 32, 3, 3}));
  EXPECT_EQ(tensor(m, "encoder.quant_conv.weight").shape, (Shape{64, 64, 1, 1}));
  EXPECT_EQ(tensor(m, "bn.running_var").role, TensorRole::other);
  EXPECT_EQ(m.arch.latent_channels, 32u);
}

// ---- modules without a cast hook --------------------------------------------------------------

// The modules without a cast hook in every catalog model, against the published PyTorch modules
// (ComfyUI's comfy/ldm code): Wan's WanAttentionBlock and Head own a `modulation` nn.Parameter
// beside their child layers; SD3.5's MMDiT registers `pos_embed` as a buffer of the root; the
// FLUX.2 VAE's `bn` is a torch.nn.BatchNorm2d(affine=False): running statistics only, no
// parameters, no children. Nothing else in the catalog sits outside a castable op.
TEST(Catalog, CastHookLessModulesAreWhereThePublishedModelsHaveThem) {
  for (const CatalogEntry& e : catalog_entries()) {
    SCOPED_TRACE(std::string(e.name));
    const ModelSpec m = build(e.name, e.native_dtype);
    std::vector<std::string> raw, containers;
    for (const Module& mod : m.modules) {
      if (!mod.cast_hook) raw.push_back(mod.name);
      if (mod.container) {
        containers.push_back(mod.name);
        EXPECT_FALSE(mod.cast_hook) << mod.name;
      }
    }
    if (e.name == "wan21-14b") {
      std::vector<std::string> want;
      for (int i = 0; i < 40; ++i) want.push_back(fmt::format("blocks.{}", i));
      want.push_back("head");
      EXPECT_EQ(raw, want);
      EXPECT_EQ(containers, want);
      for (int i = 0; i < 40; ++i) {
        const Module& block = module(m, fmt::format("blocks.{}", i));
        ASSERT_EQ(block.tensors.size(), 1u);
        EXPECT_EQ(block.tensors[0].name, "modulation");
        EXPECT_EQ(block.tensors[0].shape, (Shape{1, 6, 5120}));
        EXPECT_TRUE(owns_parameters(block));  // an nn.Parameter, not a buffer
        EXPECT_TRUE(module(m, fmt::format("blocks.{}.ffn.0", i)).cast_hook);
      }
      EXPECT_EQ(tensor(m, "head.modulation").shape, (Shape{1, 2, 5120}));
      EXPECT_TRUE(module(m, "head.head").cast_hook);
    } else if (e.name == "sd35-large") {
      EXPECT_EQ(raw, (std::vector<std::string>{""}));
      EXPECT_EQ(containers, (std::vector<std::string>{""}));
      const Module& root = module(m, "");
      ASSERT_EQ(root.tensors.size(), 1u);
      EXPECT_EQ(root.tensors[0].name, "pos_embed");
      EXPECT_FALSE(owns_parameters(root));  // a buffer
    } else if (e.name == "flux2-vae") {
      EXPECT_EQ(raw, (std::vector<std::string>{"bn"}));
      EXPECT_TRUE(containers.empty());
      const Module& bn = module(m, "bn");
      ASSERT_EQ(bn.tensors.size(), 2u);
      EXPECT_EQ(bn.tensors[0].shape, (Shape{128}));  // 2 x 2 patches x 32 latent channels
      EXPECT_FALSE(owns_parameters(bn));
    } else {
      EXPECT_TRUE(raw.empty()) << raw.front();
      EXPECT_TRUE(containers.empty()) << containers.front();
    }
  }
}

// ---- storage rules ----------------------------------------------------------------------------

TEST(CatalogStorage, Flux1Fp8ScaledQuantizesEveryMatrix) {
  const ModelSpec m = build("flux1-dev", Dtype::fp8_e4m3fn, true);
  std::size_t weights = 0;
  std::size_t scales = 0;
  for (const Module& mod : m.modules) {
    for (std::size_t i = 0; i < mod.tensors.size(); ++i) {
      const Tensor& t = mod.tensors[i];
      if (t.role == TensorRole::weight && t.shape.size() >= 2) {
        ++weights;
        EXPECT_EQ(t.dtype, Dtype::fp8_e4m3fn) << key_of(mod, t);
        ASSERT_LT(i + 1, mod.tensors.size()) << key_of(mod, t) << " has no scale";
        const Tensor& s = mod.tensors[i + 1];
        EXPECT_EQ(s.name, "scale_weight");
        EXPECT_EQ(s.role, TensorRole::scale);
        EXPECT_EQ(s.dtype, Dtype::fp32);
        EXPECT_TRUE(s.shape.empty());
        EXPECT_EQ(s.bytes, 4u);
      } else if (t.role == TensorRole::scale) {
        ++scales;
      } else {
        EXPECT_EQ(t.dtype, Dtype::bf16) << key_of(mod, t);  // biases and q/k norm scales stay wide
      }
    }
  }
  EXPECT_EQ(weights, scales);
  EXPECT_EQ(weights, 314u);
  EXPECT_EQ(m.params, 11'901'408'320u);  // scales are not parameters
  // 1 byte per matrix element + 2 per bias/norm element + 4 per scale: 11.904 GB.
  EXPECT_EQ(m.bytes, 11'904'494'952u);
}

TEST(CatalogStorage, UnscaledFp8CarriesNoScales) {
  const ModelSpec m = build("flux1-dev", Dtype::fp8_e5m2, false);
  for (const Module& mod : m.modules) {
    for (const Tensor& t : mod.tensors) EXPECT_NE(t.role, TensorRole::scale) << key_of(mod, t);
  }
  EXPECT_EQ(tensor(m, "img_in.weight").dtype, Dtype::fp8_e5m2);
  EXPECT_EQ(tensor(m, "img_in.bias").dtype, Dtype::bf16);
}

TEST(CatalogStorage, Int8UsesBlockwiseScales) {
  const ModelSpec m = build("flux1-dev", Dtype::int8, true);
  EXPECT_EQ(tensor(m, "single_blocks.0.linear1.weight").dtype, Dtype::int8);
  const Tensor& s = tensor(m, "single_blocks.0.linear1.weight_scale");
  EXPECT_EQ(s.shape, (Shape{168, 24}));  // 21504 / 128, 3072 / 128
  EXPECT_EQ(s.dtype, Dtype::fp32);
  EXPECT_EQ(tensor(m, "img_in.weight_scale").shape, (Shape{24, 1}));  // [3072, 64]: 64 rounds up to one block
}

TEST(CatalogStorage, Fp8KeepsEmbeddingsAndNormsInTheReleaseDtype) {
  const ModelSpec m = build("t5xxl", Dtype::fp8_e4m3fn, true);
  EXPECT_EQ(tensor(m, "shared.weight").dtype, Dtype::fp16);
  EXPECT_EQ(tensor(m, "encoder.final_layer_norm.weight").dtype, Dtype::fp16);
  EXPECT_EQ(tensor(m, "encoder.block.3.layer.1.DenseReluDense.wo.weight").dtype, Dtype::fp8_e4m3fn);
  const ModelSpec vae = build("flux-vae", Dtype::fp8_e4m3fn, true);
  EXPECT_EQ(tensor(vae, "decoder.conv_in.bias").dtype, Dtype::fp32);
  EXPECT_EQ(tensor(vae, "decoder.conv_in.weight").dtype, Dtype::fp8_e4m3fn);
}

TEST(CatalogStorage, Flux1Q4KFollowsTheDiffusionGgufRules) {
  const ModelSpec m = build("flux1-dev", Dtype::q4_k);
  EXPECT_EQ(tensor(m, "img_in.weight").dtype, Dtype::fp32);
  EXPECT_EQ(tensor(m, "time_in.in_layer.weight").dtype, Dtype::fp32);
  EXPECT_EQ(tensor(m, "txt_in.weight").dtype, Dtype::fp32);
  EXPECT_EQ(tensor(m, "final_layer.adaLN_modulation.1.weight").dtype, Dtype::fp32);
  const Tensor& proj = tensor(m, "double_blocks.0.img_attn.proj.weight");
  EXPECT_EQ(proj.shape, (Shape{3072, 3072}));
  EXPECT_EQ(proj.dtype, Dtype::q4_k);
  EXPECT_EQ(proj.bytes, 3072u * 12u * 144u);
  EXPECT_EQ(tensor(m, "single_blocks.5.linear1.weight").dtype, Dtype::q4_k);
  for (const Module& mod : m.modules) {
    for (const Tensor& t : mod.tensors) {
      if (t.shape.size() == 1) {
        EXPECT_EQ(t.dtype, Dtype::fp32) << key_of(mod, t);
      }
    }
  }
  // Measured 6,925,472,000 bytes (6.93 GB): the all-Q4_K figure of 6.69 GB plus about 0.23 GB of
  // F32 embedders, final layer and 1-D tensors.
  EXPECT_GT(m.bytes, 6'690'000'000u);
  EXPECT_LT(m.bytes, 7'100'000'000u);
  EXPECT_EQ(m.bytes, 6'925'472'000u);
}

TEST(CatalogStorage, Sd35KQuantFallsBackOnRowsOf2432) {
  const ModelSpec m = build("sd35-large", Dtype::q4_k);
  const Tensor& qkv = tensor(m, "joint_blocks.0.x_block.attn.qkv.weight");
  EXPECT_EQ(qkv.shape, (Shape{7296, 2432}));
  EXPECT_EQ(qkv.dtype, Dtype::q5_0);                 // 2432 = 9.5 x 256
  EXPECT_EQ(qkv.bytes, 7296u * (2432u / 32u) * 22u);
  EXPECT_EQ(tensor(m, "joint_blocks.0.x_block.mlp.fc2.weight").dtype, Dtype::q4_k);  // row 9728 = 38 x 256
  EXPECT_EQ(tensor(m, "x_embedder.proj.weight").dtype, Dtype::fp32);                 // a conv kernel
}

TEST(CatalogStorage, GgufRowFallbacks) {
  EXPECT_EQ(gguf_row_fallback(Dtype::q4_k, 3072), Dtype::q4_k);
  EXPECT_EQ(gguf_row_fallback(Dtype::q2_k, 2432), Dtype::q4_0);
  EXPECT_EQ(gguf_row_fallback(Dtype::q3_k, 2432), Dtype::q4_0);
  EXPECT_EQ(gguf_row_fallback(Dtype::q4_k, 2432), Dtype::q5_0);
  EXPECT_EQ(gguf_row_fallback(Dtype::q5_k, 320), Dtype::q5_1);
  EXPECT_EQ(gguf_row_fallback(Dtype::q6_k, 640), Dtype::q8_0);
  EXPECT_EQ(gguf_row_fallback(Dtype::q8_0, 33), Dtype::fp16);
  EXPECT_EQ(gguf_row_fallback(Dtype::q6_k, 100), Dtype::fp16);  // q8_0 still does not fit
  EXPECT_EQ(gguf_row_fallback(Dtype::q4_0, 64), Dtype::q4_0);
}

TEST(CatalogStorage, GgufKeepsWanModulationAndTextEmbeddingsQuantized) {
  const ModelSpec wan = build("wan21-14b", Dtype::q8_0);
  EXPECT_EQ(tensor(wan, "blocks.7.modulation").dtype, Dtype::fp32);
  EXPECT_EQ(tensor(wan, "patch_embedding.weight").dtype, Dtype::fp32);
  EXPECT_EQ(tensor(wan, "blocks.7.ffn.0.weight").dtype, Dtype::q8_0);
  const ModelSpec te = build("flux2-text-encoder", Dtype::q4_k);
  EXPECT_EQ(tensor(te, "model.embed_tokens.weight").dtype, Dtype::q4_k);  // llama.cpp quantizes it too
  EXPECT_EQ(tensor(te, "model.layers.0.input_layernorm.weight").dtype, Dtype::fp32);
}

TEST(CatalogStorage, FloatChoicesRetypeEverything) {
  for (Dtype d : {Dtype::fp32, Dtype::fp16}) {
    const ModelSpec m = build("sd35-large", d);
    for (const Module& mod : m.modules) {
      for (const Tensor& t : mod.tensors) EXPECT_EQ(t.dtype, d) << key_of(mod, t);
    }
  }
}

// ---- the memo ---------------------------------------------------------------------------------

TEST(CatalogCache, ReturnsTheSameFinalizedModel) {
  Catalog c;
  const auto a = c.get("clip-l", {Dtype::fp16, true}, "models[0]");
  const auto b = c.get("clip-l", {Dtype::fp16, true}, "models[1]");
  const auto other = c.get("clip-l", {Dtype::fp8_e4m3fn, true}, "models[2]");
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(a.get(), other.get());
  EXPECT_EQ(a->params, 123'060'480u);
  EXPECT_GT(other->bytes, 0u);
  EXPECT_LT(other->bytes, a->bytes);
}

TEST(CatalogCache, ConcurrentGetsShareOneModel) {
  Catalog c;
  std::vector<std::shared_ptr<const ModelSpec>> got(4);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = c.get("t5xxl", {Dtype::q4_k, true}, "models[0]"); });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& p : got) EXPECT_EQ(p.get(), got.front().get());
}

// ---- model.h helpers --------------------------------------------------------------------------

TEST(CatalogModelSpec, NamesRoundTrip) {
  for (Family f : {Family::flux, Family::flux2, Family::sd3, Family::qwen_image, Family::wan21, Family::sdxl,
                   Family::sd15, Family::t5, Family::clip, Family::mistral, Family::vae_kl, Family::generic}) {
    EXPECT_EQ(parse_family(family_name(f)), f);
  }
  EXPECT_EQ(family_name(Family::qwen_image), "qwen_image");
  EXPECT_EQ(parse_family("FLUX2"), Family::flux2);
  EXPECT_EQ(parse_family("flux3"), std::nullopt);
  EXPECT_EQ(kind_name(ModelKind::text_encoder), "text_encoder");
  EXPECT_EQ(role_name(TensorRole::embedding), "embedding");
  EXPECT_EQ(role_name(TensorRole::other), "other");
}

// Deep names make many more parents than modules: the set of parents grows past the room it
// was made with (twice the modules), and every ancestor is still found.
TEST(CatalogModelSpec, DeepNamesMarkEveryAncestorAsAContainer) {
  std::vector<Module> modules;
  for (int i = 0; i < 200; ++i) {
    Module m;
    m.name = fmt::format("x{}.a.b.c.d.e.f.g.h.lin", i);
    m.tensors.push_back(Tensor{"weight", {4, 4}, Dtype::bf16, TensorRole::weight, 0, 0});
    modules.push_back(std::move(m));
  }
  for (const char* name : {"x7.a.b.c", "x199.a", "x3.a.b.c.d.e.f.g.h", "x3.a.b.c.d.e.f.g.h.lin.more", "y", "x20"}) {
    Module m;
    m.name = name;
    m.tensors.push_back(Tensor{"bias", {4}, Dtype::bf16, TensorRole::other, 0, 0});
    modules.push_back(std::move(m));
  }
  mark_containers(modules);
  std::vector<bool> tail;
  for (std::size_t i = 200; i < modules.size(); ++i) tail.push_back(modules[i].container);
  EXPECT_EQ(tail, (std::vector<bool>{true, true, true, false, false, true}));
  EXPECT_FALSE(modules[0].container);
}

TEST(CatalogModelSpec, ContainersAreTheModulesWithParametersBelowThem) {
  auto mod = [](std::string name, TensorRole role, bool cast_hook) {
    Module m;
    m.name = std::move(name);
    m.cast_hook = cast_hook;
    m.tensors.push_back(Tensor{"t", {4, 4}, Dtype::bf16, role, 0, 0});
    return m;
  };
  ModelSpec m;
  m.modules = {mod("blk", TensorRole::bias, false),  mod("blk.lin", TensorRole::weight, true),
               mod("blk2", TensorRole::weight, true), mod("stats", TensorRole::other, false),
               mod("stats.buf", TensorRole::other, false), mod("a.b", TensorRole::weight, false),
               mod("a.b.c.d", TensorRole::weight, true)};
  finalize_model(m, "models[0]");
  std::vector<bool> containers;
  for (const Module& x : m.modules) containers.push_back(x.container);
  // blk holds blk.lin's parameters; "blk2" is not below "blk"; a child of buffers only does not
  // make `stats` a container; a.b has a parameter two levels down.
  EXPECT_EQ(containers, (std::vector<bool>{true, false, false, false, false, true, false}));
  EXPECT_FALSE(owns_parameters(m.modules[3]));
  // Below the root is every other module: a root that owns tensors is a container when any
  // other module owns parameters, and a leaf when it is alone.
  m.modules.push_back(mod("", TensorRole::other, false));
  finalize_model(m, "models[0]");
  EXPECT_TRUE(m.modules.back().container);
  ModelSpec alone;
  alone.modules = {mod("", TensorRole::weight, false)};
  finalize_model(alone, "models[0]");
  EXPECT_FALSE(alone.modules[0].container);
  // A container never has the cast hook: the path names the flag.
  m.modules[0].cast_hook = true;
  try {
    finalize_model(m, "models[0]");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "models[0].modules[0].cast_hook");
    EXPECT_NE(std::string(e.what()).find("module \"blk\" has parameters below it (\"blk.lin\")"), std::string::npos) << e.what();
  }
}

TEST(CatalogModelSpec, FinalizeSumsAndNamesTheOverflowingTensor) {
  ModelSpec m;
  Module a;
  a.name = "a";
  a.tensors.push_back(Tensor{"weight", {3072, 3072}, Dtype::q4_k, TensorRole::weight, 0, 0});
  a.tensors.push_back(Tensor{"bias", {3072}, Dtype::fp32, TensorRole::bias, 0, 0});
  a.tensors.push_back(Tensor{"scale_weight", {}, Dtype::fp32, TensorRole::scale, 0, 0});
  m.modules.push_back(a);
  finalize_model(m, "models[0]");
  EXPECT_EQ(m.modules[0].tensors[0].numel, 3072u * 3072u);
  EXPECT_EQ(m.modules[0].tensors[2].numel, 1u);  // a scalar
  EXPECT_EQ(m.modules[0].bytes, 3072u * 12u * 144u + 3072u * 4u + 4u);
  EXPECT_EQ(m.params, 3072u * 3072u + 3072u);  // the scale is not a parameter
  EXPECT_EQ(m.bytes, m.modules[0].bytes);

  Module b;
  b.name = "b";
  b.tensors.push_back(Tensor{"weight", {2}, Dtype::fp32, TensorRole::weight, 0, 0});
  b.tensors.push_back(Tensor{"weight2", {1ull << 40, 1ull << 40}, Dtype::fp32, TensorRole::weight, 0, 0});
  m.modules.push_back(b);
  try {
    finalize_model(m, "models[0]");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "models[0].modules[1].tensors[1]");
  }
  // Bytes can overflow where the element count does not.
  m.modules[1].tensors[1].shape = {1ull << 62};
  try {
    finalize_model(m, "");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "modules[1].tensors[1]");
  }
}

}  // namespace
}  // namespace vf
