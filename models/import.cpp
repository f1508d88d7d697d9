#include "models/import.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <set>
#include <span>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "models/catalog.h"
#include "models/file_read.h"
#include "models/gguf.h"
#include "models/safetensors.h"

namespace vf {
namespace {

namespace fs = std::filesystem;

// The inline scenario format's limits (harness/scenario.cpp): an imported model must load back.
constexpr std::size_t kMaxRank = 8;
constexpr std::size_t kMaxModules = std::size_t{1} << 20;
constexpr Bytes kMaxModelBytes = Bytes{1} << 48;

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) { return s.size() >= p.size() && s.substr(s.size() - p.size()) == p; }

// `name` is `prefix` itself or lies under it ("blocks.1" is under "blocks", "blocksx" is not).
bool under(std::string_view name, std::string_view prefix) {
  if (prefix.empty()) return name.empty();
  return name == prefix || (starts_with(name, prefix) && name.size() > prefix.size() && name[prefix.size()] == '.');
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::vector<std::string_view> components(std::string_view name) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = name.find('.', start);
    if (dot == std::string_view::npos) {
      out.push_back(name.substr(start));
      return out;
    }
    out.push_back(name.substr(start, dot - start));
    start = dot + 1;
  }
}

// "a.b.weight" -> module "a.b", suffix "weight"; a name without a dot belongs to the root module.
std::pair<std::string, std::string> split_name(const std::string& name) {
  const std::size_t dot = name.rfind('.');
  if (dot == std::string::npos) return {std::string(), name};
  return {name.substr(0, dot), name.substr(dot + 1)};
}

std::string last_component(std::string_view module) {
  const std::size_t dot = module.rfind('.');
  return std::string(dot == std::string_view::npos ? module : module.substr(dot + 1));
}

// ---- roles ------------------------------------------------------------------------------------

// Scaled-fp8 / int8 scales (both ComfyUI conventions, and the common NVIDIA / compressed-tensors
// names): read by the dequant, attached to the module of their weight.
constexpr std::array<std::string_view, 8> kScaleNames = {
    "scale_weight", "scale_input", "weight_scale", "weight_scale_2", "input_scale", "pre_quant_scale", "weight_scale_inv",
    "input_scale_inv",
};
// Buffers: moved with their module, never converted.
constexpr std::array<std::string_view, 7> kBufferNames = {
    "position_ids", "num_batches_tracked", "running_mean", "running_var", "pos_embed", "inv_freq", "freqs_cis",
};
// Modules that are lookup tables (only the gathered rows are converted).
constexpr std::array<std::string_view, 12> kEmbeddingModules = {
    "embed_tokens",       "shared",   "token_embedding", "tok_embeddings",  "token_embd",          "position_embedding",
    "relative_attention_bias", "wte", "wpe",             "word_embeddings", "position_embeddings", "attn_rel_b",
};
// Marker tensors a loader consumes; they are not part of the model it builds.
bool is_marker(std::string_view suffix) { return suffix == "scaled_fp8" || suffix == "comfy_quant"; }

template <std::size_t N>
bool in(const std::array<std::string_view, N>& list, std::string_view s) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

TensorRole role_of(const std::string& module, const std::string& suffix, std::size_t rank, bool norm_module) {
  if (in(kScaleNames, suffix)) return TensorRole::scale;
  if (in(kBufferNames, suffix)) return TensorRole::other;
  if (suffix == "weight" && rank == 2 && in(kEmbeddingModules, last_component(module))) return TensorRole::embedding;
  if (suffix == "modulation") return TensorRole::bias;  // Wan's learned per-block parameter, cast like a bias
  if (rank <= 1) return suffix == "bias" && !norm_module ? TensorRole::bias : TensorRole::norm;
  return TensorRole::weight;
}

// Within a module: weight, its scales, bias, then the rest by name (the catalog's order).
int tensor_rank(const Tensor& t) {
  if (t.name == "weight") return 0;
  if (t.role == TensorRole::scale) return 1;
  if (t.name == "bias") return 2;
  return 3;
}

// ---- forward order ----------------------------------------------------------------------------

// Top-level prefixes in forward order per family; "*" places everything not listed. A reversed
// prefix runs its numbered children from the highest index down (the BFL VAE decoder's levels).
struct OrderRule {
  std::string_view prefix;
  bool reversed = false;
};

constexpr OrderRule kFluxOrder[] = {
    {"img_in"}, {"x_embedder"}, {"time_in"}, {"guidance_in"}, {"vector_in"}, {"time_text_embed"}, {"time_guidance_embed"},
    {"txt_in"}, {"context_embedder"}, {"double_stream_modulation_img"}, {"double_stream_modulation_txt"},
    {"single_stream_modulation"}, {"*"}, {"double_blocks"}, {"transformer_blocks"}, {"single_blocks"},
    {"single_transformer_blocks"}, {"final_layer"}, {"norm_out"}, {"proj_out"},
};
constexpr OrderRule kSd3Order[] = {
    {"x_embedder"}, {""}, {"pos_embed"}, {"t_embedder"}, {"y_embedder"}, {"time_text_embed"}, {"context_embedder"}, {"*"},
    {"joint_blocks"}, {"transformer_blocks"}, {"final_layer"}, {"norm_out"}, {"proj_out"},
};
constexpr OrderRule kQwenOrder[] = {
    {"img_in"}, {"txt_norm"}, {"txt_in"}, {"time_text_embed"}, {"*"}, {"transformer_blocks"}, {"norm_out"}, {"proj_out"},
};
constexpr OrderRule kWanOrder[] = {
    {"patch_embedding"}, {"time_embedding"}, {"time_projection"}, {"text_embedding"}, {"img_emb"}, {"*"}, {"blocks"}, {"head"},
};
constexpr OrderRule kUnetOrder[] = {
    {"time_embedding"}, {"time_embed"}, {"add_embedding"}, {"label_emb"}, {"conv_in"}, {"*"}, {"down_blocks"},
    {"input_blocks"}, {"mid_block"}, {"middle_block"}, {"up_blocks"}, {"output_blocks"}, {"conv_norm_out"}, {"conv_out"},
    {"out"},
};
constexpr OrderRule kT5Order[] = {
    {"shared"}, {"token_embd"}, {"encoder.embed_tokens"}, {"*"}, {"encoder.block"}, {"enc.blk"}, {"encoder.final_layer_norm"},
    {"enc.output_norm"},
};
constexpr OrderRule kClipOrder[] = {
    {"text_model.embeddings"}, {"*"}, {"text_model.encoder"}, {"text_model.final_layer_norm"}, {"text_projection"},
};
constexpr OrderRule kMistralOrder[] = {
    {"model.embed_tokens"}, {"token_embd"}, {"*"}, {"model.layers"}, {"blk"}, {"model.norm"}, {"output_norm"}, {"lm_head"},
    {"output"},
};
constexpr OrderRule kVaeOrder[] = {
    {"encoder.conv_in"}, {"encoder.down"}, {"encoder.down_blocks"}, {"encoder.mid"}, {"encoder.mid_block"},
    {"encoder.norm_out"}, {"encoder.conv_norm_out"}, {"encoder.conv_out"}, {"encoder.quant_conv"}, {"quant_conv"}, {"bn"},
    {"*"}, {"decoder.post_quant_conv"}, {"post_quant_conv"}, {"decoder.conv_in"}, {"decoder.mid"}, {"decoder.mid_block"},
    {"decoder.up", true}, {"decoder.up_blocks"}, {"decoder.norm_out"}, {"decoder.conv_norm_out"}, {"decoder.conv_out"},
};
constexpr OrderRule kGenericOrder[] = {{"*"}};

std::span<const OrderRule> order_rules(Family f) {
  switch (f) {
    case Family::flux:
    case Family::flux2: return kFluxOrder;
    case Family::sd3: return kSd3Order;
    case Family::qwen_image: return kQwenOrder;
    case Family::wan21: return kWanOrder;
    case Family::sdxl:
    case Family::sd15: return kUnetOrder;
    case Family::t5: return kT5Order;
    case Family::clip: return kClipOrder;
    case Family::mistral: return kMistralOrder;
    case Family::vae_kl: return kVaeOrder;
    case Family::generic: return kGenericOrder;
  }
  return kGenericOrder;
}

struct OrderKey {
  std::size_t rank = 0;
  std::uint64_t index = 0;  // reversed rules: the child's index (sorted descending); else 0
};

OrderKey order_key(std::span<const OrderRule> rules, const std::string& module) {
  std::size_t wildcard = rules.size();
  for (std::size_t i = 0; i < rules.size(); ++i) {
    if (rules[i].prefix == "*") {
      wildcard = i;
      continue;
    }
    if (!under(module, rules[i].prefix)) continue;
    OrderKey k{i, 0};
    if (rules[i].reversed && module.size() > rules[i].prefix.size()) {
      const std::string_view rest = std::string_view(module).substr(rules[i].prefix.size() + 1);
      const std::string_view first = rest.substr(0, rest.find('.'));
      std::uint64_t n = 0;
      bool ok = all_digits(first) && first.size() <= 18;
      for (char c : first) n = n * 10 + static_cast<std::uint64_t>(c - '0');
      k.index = ok ? n : 0;
    }
    return k;
  }
  return {wildcard, 0};
}

// ---- family detection -------------------------------------------------------------------------

struct Names {
  std::unordered_map<std::string, const SourceTensor*> by_name;  // stripped name -> tensor
  std::vector<std::string> sorted;                               // stripped names, sorted

  bool has_prefix(std::string_view prefix) const {
    const auto it = std::lower_bound(sorted.begin(), sorted.end(), prefix, [](const std::string& a, std::string_view b) { return a < b; });
    return it != sorted.end() && starts_with(*it, prefix);
  }
  // Dimension `dim` of the tensor `name` (PyTorch order), 0 when absent.
  std::uint64_t dim(const std::string& name, std::size_t d) const {
    const auto it = by_name.find(name);
    if (it == by_name.end() || it->second->shape.size() <= d) return 0;
    return it->second->shape[d];
  }
  // The first tensor whose components match `pattern` ("#" = any number, "*" = anything).
  const std::string* find_pattern(std::initializer_list<std::string_view> pattern) const {
    for (const std::string& n : sorted) {
      const auto c = components(n);
      if (c.size() < pattern.size()) continue;
      bool ok = true;
      std::size_t i = 0;
      for (std::string_view p : pattern) {
        const std::string_view x = c[i++];
        if (p == "#" ? !all_digits(x) : (p != "*" && p != x)) {
          ok = false;
          break;
        }
      }
      if (ok) return &n;
    }
    return nullptr;
  }
};

struct Detection {
  std::optional<Family> family;
  std::string reason;  // why (or, without a family, what was seen)
};

Detection detect_from_names(const Names& n) {
  if (n.has_prefix("double_blocks.") && n.has_prefix("single_blocks.")) {
    std::uint64_t hidden = n.dim("img_in.weight", 0);
    if (hidden == 0) hidden = n.dim("double_blocks.0.img_attn.qkv.weight", 1);
    if (n.has_prefix("double_stream_modulation_img.")) return {Family::flux2, fmt::format("double_blocks + single_blocks with a shared double_stream_modulation, hidden {}", hidden)};
    if (hidden == 6144) return {Family::flux2, "double_blocks + single_blocks, hidden 6144"};
    if (hidden == 3072) return {Family::flux, "double_blocks + single_blocks, hidden 3072"};
    return {std::nullopt, fmt::format("a FLUX layout (double_blocks + single_blocks) with hidden {}, neither FLUX.1's 3072 nor FLUX.2's 6144", hidden)};
  }
  if (n.has_prefix("single_transformer_blocks.") && n.has_prefix("transformer_blocks.")) {
    const std::uint64_t hidden = n.dim("x_embedder.weight", 0);
    if (hidden == 6144) return {Family::flux2, "diffusers FLUX layout (transformer_blocks + single_transformer_blocks), hidden 6144"};
    if (hidden == 3072) return {Family::flux, "diffusers FLUX layout (transformer_blocks + single_transformer_blocks), hidden 3072"};
    return {std::nullopt, fmt::format("a diffusers FLUX layout with hidden {}", hidden)};
  }
  if (n.has_prefix("joint_blocks.")) return {Family::sd3, "joint_blocks (MMDiT)"};
  if (n.find_pattern({"transformer_blocks", "#", "img_mod"}) != nullptr) return {Family::qwen_image, "transformer_blocks.N.img_mod"};
  if (n.find_pattern({"blocks", "#", "ffn"}) != nullptr && n.has_prefix("time_projection.")) {
    return {Family::wan21, "blocks.N.ffn + time_projection"};
  }
  const bool ldm_unet = n.has_prefix("input_blocks.") && n.has_prefix("middle_block.");
  const bool diffusers_unet = n.has_prefix("down_blocks.") && n.has_prefix("mid_block.") && n.has_prefix("up_blocks.");
  if (ldm_unet || diffusers_unet) {
    if (n.has_prefix("add_embedding.") || n.has_prefix("label_emb.")) return {Family::sdxl, "UNet with an add/label embedding (SDXL)"};
    for (const std::string& name : n.sorted) {
      if (!ends_with(name, "attn2.to_k.weight")) continue;
      const std::uint64_t context = n.dim(name, 1);
      if (context == 768) return {Family::sd15, "UNet with cross-attention context 768 (SD1.5)"};
      if (context == 2048) return {Family::sdxl, "UNet with cross-attention context 2048 (SDXL)"};
      return {std::nullopt, fmt::format("a UNet with cross-attention context {}, neither SD1.5's 768 nor SDXL's 2048", context)};
    }
    return {std::nullopt, "a UNet without cross-attention"};
  }
  if (n.has_prefix("encoder.block.") || n.has_prefix("enc.blk.")) return {Family::t5, "encoder.block (T5 encoder)"};
  if (n.has_prefix("text_model.encoder.")) return {Family::clip, "text_model.encoder (CLIP text model)"};
  if (const std::string* gate = n.find_pattern({"model", "layers", "#", "mlp", "gate_proj", "weight"})) {
    const std::uint64_t hidden = n.dim(*gate, 1);
    if (hidden == 5120) return {Family::mistral, "model.layers.N.mlp.gate_proj, hidden 5120"};
    return {std::nullopt, fmt::format("a decoder LM (model.layers.N.mlp.gate_proj) with hidden {}, not Mistral-Small's 5120", hidden)};
  }
  if (const std::string* gate = n.find_pattern({"blk", "#", "ffn_gate", "weight"})) {
    const std::uint64_t hidden = n.dim(*gate, 1);
    if (hidden == 5120) return {Family::mistral, "blk.N.ffn_gate (llama.cpp names), hidden 5120"};
    return {std::nullopt, fmt::format("a decoder LM (blk.N.ffn_gate) with hidden {}, not Mistral-Small's 5120", hidden)};
  }
  if (n.has_prefix("encoder.") && n.has_prefix("decoder.") && (n.has_prefix("decoder.up.") || n.has_prefix("decoder.up_blocks."))) {
    return {Family::vae_kl, "encoder + decoder.up (AutoencoderKL)"};
  }
  return {std::nullopt, ""};
}

std::optional<Family> family_from_architecture(std::string_view arch) {
  std::string a(arch);
  for (char& c : a) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  struct Map {
    std::string_view name;
    Family family;
  };
  // GGUF general.architecture (city96 / llama.cpp names), then safetensors modelspec prefixes.
  static constexpr Map kExact[] = {
      {"flux", Family::flux}, {"flux2", Family::flux2}, {"sd3", Family::sd3}, {"sdxl", Family::sdxl}, {"sd1", Family::sd15},
      {"wan", Family::wan21}, {"qwen_image", Family::qwen_image}, {"t5", Family::t5}, {"t5encoder", Family::t5},
      {"clip", Family::clip},
  };
  for (const Map& m : kExact) {
    if (a == m.name) return m.family;
  }
  static constexpr Map kPrefix[] = {
      {"flux-1", Family::flux}, {"flux-2", Family::flux2}, {"stable-diffusion-xl", Family::sdxl},
      {"stable-diffusion-v1", Family::sd15}, {"stable-diffusion-v3", Family::sd3},
  };
  for (const Map& m : kPrefix) {
    if (starts_with(a, m.name)) return m.family;
  }
  return std::nullopt;
}

std::string family_list() {
  std::string out;
  for (int f = 0; f <= static_cast<int>(Family::generic); ++f) {
    if (!out.empty()) out += ", ";
    out += family_name(static_cast<Family>(f));
  }
  return out;
}

// ---- components -------------------------------------------------------------------------------

// Known checkpoint component prefixes. ComfyUI text encoder files nest the model under
// `text_encoders.NAME.` and often `transformer.`.
std::string component_of(const std::string& name) {
  static constexpr std::string_view kPrefixes[] = {
      "model.diffusion_model.", "diffusion_model.", "first_stage_model.", "cond_stage_model.", "conditioner.", "language_model.",
  };
  for (std::string_view p : kPrefixes) {
    if (starts_with(name, p)) return std::string(p);
  }
  if (starts_with(name, "text_encoders.")) {
    const std::size_t dot = name.find('.', 14);
    if (dot == std::string::npos) return "";
    std::string p = name.substr(0, dot + 1);
    if (starts_with(std::string_view(name).substr(p.size()), "transformer.")) p += "transformer.";
    return p;
  }
  return "";
}

[[noreturn]] void fail_tensor(const SourceTensor& t, const std::string& message) {
  throw InputError(t.file, at_byte(t.offset, fmt::format("tensor \"{}\": {}", t.name, message)));
}

std::string tensor_shape_text(const std::vector<std::uint64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// A tensor of a dtype vramfuzz lacks, kept as its raw bytes (int8 elements) so the module's
// size stays exact: the last dimension is scaled by the element size, or the tensor is flattened
// when a row does not end on a byte boundary.
std::vector<std::uint64_t> raw_byte_shape(const SourceTensor& t) {
  if (t.shape.empty()) return {t.bytes};
  std::vector<std::uint64_t> s = t.shape;
  std::uint64_t row_bits = 0;
  if (!__builtin_mul_overflow(s.back(), static_cast<std::uint64_t>(t.elem_bits), &row_bits) && row_bits % 8 == 0) {
    s.back() = row_bits / 8;
    return s;
  }
  return {t.bytes};
}

// ---- quantization conventions -----------------------------------------------------------------

struct QuantSummary {
  std::string text;
  std::vector<std::string> warnings;
};

std::string_view expected_weight_dtype(std::string_view format) {
  if (format == "float8_e4m3fn" || format == "float8_e4m3fn_blockwise") return "fp8_e4m3fn";
  if (format == "float8_e5m2") return "fp8_e5m2";
  if (starts_with(format, "int8")) return "int8";
  return "";
}

void check_quant_metadata(const SourceHints& h, const std::string& prefix, const std::map<std::string, Module*>& modules,
                          QuantSummary& q) {
  nlohmann::json doc;
  try {
    doc = parse_json_unique(h.quant_metadata);
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(h.quant_metadata_file, at_byte(h.quant_metadata_offset,
                                                    fmt::format("__metadata__._quantization_metadata is not valid JSON (at "
                                                                "character {} of the string)",
                                                                e.byte)));
  } catch (const nlohmann::json::exception& e) {
    // out_of_range: a number too large for a double (1e999).
    throw InputError(h.quant_metadata_file, at_byte(h.quant_metadata_offset,
                                                    fmt::format("__metadata__._quantization_metadata is not valid JSON ({})", e.what())));
  } catch (const JsonDuplicateKey& e) {
    throw InputError(h.quant_metadata_file, at_byte(h.quant_metadata_offset,
                                                    fmt::format("__metadata__._quantization_metadata: {}: key given twice in one object",
                                                                e.path())));
  } catch (const JsonTooDeep& e) {
    throw InputError(h.quant_metadata_file, at_byte(h.quant_metadata_offset,
                                                    fmt::format("__metadata__._quantization_metadata: {} of the string", e.what())));
  }
  auto bad = [&](const std::string& what) {
    throw InputError(h.quant_metadata_file, at_byte(h.quant_metadata_offset, "__metadata__._quantization_metadata: " + what));
  };
  if (!doc.is_object()) bad("expected a JSON object");
  std::map<std::string, std::size_t> formats;
  std::size_t missing = 0, mismatched = 0, layers = 0;
  if (doc.contains("layers")) {
    const nlohmann::json& lj = doc["layers"];
    if (!lj.is_object()) bad("\"layers\" must be an object of layer name: {\"format\": ...}");
    for (auto it = lj.begin(); it != lj.end(); ++it) {
      if (!it->is_object() || !it->contains("format") || !(*it)["format"].is_string()) {
        bad(fmt::format("layer \"{}\" needs a \"format\" string", it.key()));
      }
      const std::string format = (*it)["format"].get<std::string>();
      ++formats[format];
      ++layers;
      std::string layer = it.key();
      if (!prefix.empty() && starts_with(layer, prefix)) layer = layer.substr(prefix.size());
      const auto m = modules.find(layer);
      if (m == modules.end()) {
        ++missing;
        continue;
      }
      const std::string_view want = expected_weight_dtype(format);
      for (const Tensor& t : m->second->tensors) {
        if (t.name == "weight" && !want.empty() && dtype_name(t.dtype) != want) ++mismatched;
      }
    }
  }
  std::string fl;
  for (const auto& [f, c] : formats) fl += fmt::format("{}{} {}", fl.empty() ? "" : ", ", f, c);
  q.text = fmt::format("__metadata__._quantization_metadata: {} layer(s){}", layers, fl.empty() ? "" : " (" + fl + ")");
  if (missing > 0) q.warnings.push_back(fmt::format("_quantization_metadata names {} layer(s) the file has no module for", missing));
  if (mismatched > 0) {
    q.warnings.push_back(fmt::format("_quantization_metadata gives {} layer(s) a format their weight's dtype does not match", mismatched));
  }
}

// ---- model defaults ---------------------------------------------------------------------------

void apply_family(ModelSpec& m, const Names& names) {
  const auto d = family_defaults(m.family);
  if (!d) {
    m.kind = ModelKind::diffusion;
    return;
  }
  m.kind = d->kind;
  m.memory_usage_factor = d->memory_usage_factor;
  m.arch = d->arch;
  // What the file itself says where the catalog's model of the family may differ.
  if (m.family == Family::vae_kl) {
    std::uint64_t z = names.dim("decoder.conv_in.weight", 1);
    if (z == 0) z = names.dim("post_quant_conv.weight", 1);
    if (z > 0 && z <= 1024) m.arch.latent_channels = static_cast<std::uint32_t>(z);
  } else if (m.family == Family::clip) {
    const std::uint64_t hidden = names.dim("text_model.embeddings.token_embedding.weight", 1);
    const std::uint64_t ff = names.dim("text_model.encoder.layers.0.mlp.fc1.weight", 0);
    if (hidden > 0 && hidden < (1u << 24)) m.arch.hidden = static_cast<std::uint32_t>(hidden);
    if (ff > 0 && ff < (1u << 24)) m.arch.widest = static_cast<std::uint32_t>(ff);
  }
}

std::string model_name_from(const std::string& path) {
  std::string n = fs::path(path).filename().string();
  for (std::string_view ext : {".safetensors.index.json", ".index.json", ".safetensors", ".gguf", ".sft"}) {
    if (ends_with(n, ext) && n.size() > ext.size()) {
      n.resize(n.size() - ext.size());
      break;
    }
  }
  return n.empty() ? "model" : n;
}

}  // namespace

bool natural_less(std::string_view a, std::string_view b) {
  std::size_t i = 0, j = 0;
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      std::size_t i2 = i, j2 = j;
      while (i2 < a.size() && digit(a[i2])) ++i2;
      while (j2 < b.size() && digit(b[j2])) ++j2;
      std::string_view x = a.substr(i, i2 - i), y = b.substr(j, j2 - j);
      while (x.size() > 1 && x.front() == '0') x.remove_prefix(1);
      while (y.size() > 1 && y.front() == '0') y.remove_prefix(1);
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      i = i2;
      j = j2;
      continue;
    }
    if (a[i] != b[j]) return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[j]);
    ++i;
    ++j;
  }
  if ((a.size() - i) != (b.size() - j)) return (a.size() - i) < (b.size() - j);
  return a < b;  // equal up to leading zeros: a total order all the same
}

ImportedModel build_imported_model(std::vector<SourceTensor> tensors, const SourceHints& hints, const ImportOptions& options,
                                   const std::string& origin) {
  ImportedModel out;
  // 1. Markers (the legacy scaled_fp8 tensor, per-layer comfy_quant blobs) are read, not kept.
  std::vector<SourceTensor> kept;
  kept.reserve(tensors.size());
  std::optional<SourceTensor> scaled_fp8;
  std::size_t comfy_quant = 0;
  for (SourceTensor& t : tensors) {
    const std::string suffix = split_name(t.name).second;
    if (suffix == "scaled_fp8" && !scaled_fp8) scaled_fp8 = t;
    if (suffix == "comfy_quant") ++comfy_quant;
    if (!is_marker(suffix)) kept.push_back(std::move(t));
  }
  if (kept.empty()) throw InputError(origin, "the file holds no tensors");

  // 2. Components: one prefix for all tensors is stripped; several components import the largest.
  std::map<std::string, std::pair<std::size_t, Bytes>> groups;
  for (const SourceTensor& t : kept) {
    auto& g = groups[component_of(t.name)];
    ++g.first;
    g.second += t.bytes;  // bytes per tensor are < 2^64 and a file is < 2^64: the sum cannot wrap
  }
  std::string prefix = groups.begin()->first;
  if (groups.size() > 1) {
    for (const auto& [p, g] : groups) {
      if (g.second > groups.at(prefix).second) prefix = p;
    }
    std::string others;
    for (const auto& [p, g] : groups) {
      if (p == prefix) continue;
      others += fmt::format("{}{} ({} tensors, {})", others.empty() ? "" : ", ", p.empty() ? "(no prefix)" : p, g.first, format_mib(g.second));
    }
    out.warnings.push_back(fmt::format("the file holds several components; imported the largest, {} ({} tensors), and skipped {}",
                                       prefix.empty() ? "(no prefix)" : prefix, groups.at(prefix).first, others));
    std::erase_if(kept, [&](const SourceTensor& t) { return component_of(t.name) != prefix; });
  }
  out.stripped_prefix = prefix;

  // 3. Names without the prefix; zero-element tensors hold no bytes and are dropped.
  std::vector<std::pair<std::string, const SourceTensor*>> named;
  named.reserve(kept.size());
  std::size_t empty_tensors = 0;
  for (const SourceTensor& t : kept) {
    bool zero = false;
    for (std::uint64_t d : t.shape) zero = zero || d == 0;
    if (zero) {
      ++empty_tensors;
      continue;
    }
    if (t.shape.size() > kMaxRank) fail_tensor(t, fmt::format("rank {} is more than {} dimensions", t.shape.size(), kMaxRank));
    std::string stripped = t.name.substr(prefix.size());
    const auto parts = components(stripped);
    if (std::any_of(parts.begin(), parts.end(), [](std::string_view c) { return c.empty(); })) {
      fail_tensor(t, "the name has an empty component (a state-dict key is dot-separated names), so it belongs to no module");
    }
    named.emplace_back(std::move(stripped), &t);
  }
  if (empty_tensors > 0) out.warnings.push_back(fmt::format("{} tensor(s) with a zero dimension hold no bytes and were left out", empty_tensors));
  if (named.empty()) throw InputError(origin, "the file holds no tensor with any elements");

  Names names;
  for (const auto& [n, t] : named) {
    names.by_name.emplace(n, t);
    names.sorted.push_back(n);
  }
  std::sort(names.sorted.begin(), names.sorted.end());

  // 4. Family: the flag, else the names, else what the file's metadata says.
  const Detection by_names = detect_from_names(names);
  // (A Family plus a flag rather than an optional: GCC 12 warns a maybe-uninitialized optional.)
  const std::optional<Family> hinted = family_from_architecture(hints.architecture);
  const bool has_hint = hinted.has_value();
  const Family hint_family = hinted.value_or(Family::generic);
  Family family = Family::generic;
  if (options.family) {
    family = *options.family;
    out.family_reason = "given (--family / \"family\")";
    if (by_names.family && *by_names.family != family) {
      out.warnings.push_back(fmt::format("the tensor names look like {} ({}), but the family given is {}", family_name(*by_names.family),
                                         by_names.reason, family_name(family)));
    }
  } else if (by_names.family) {
    family = *by_names.family;
    out.family_reason = by_names.reason;
    if (has_hint && hint_family != family) {
      out.warnings.push_back(fmt::format("{} says \"{}\", but the tensor names are {} ({}); using {}", hints.arch_from, hints.architecture,
                                         family_name(family), by_names.reason, family_name(family)));
    }
  } else if (has_hint) {
    family = hint_family;
    out.family_reason = fmt::format("{} = \"{}\"", hints.arch_from, hints.architecture);
  } else {
    std::string seen = by_names.reason.empty() ? "" : fmt::format(" (it looks like {})", by_names.reason);
    if (!hints.architecture.empty()) seen += fmt::format(" ({} = \"{}\" is not one vramfuzz knows)", hints.arch_from, hints.architecture);
    throw InputError(origin, fmt::format("cannot tell the model family from the tensor names{}; pass --family NAME (or \"family\": "
                                         "NAME in the scenario), one of: {}",
                                         seen, family_list()));
  }

  // 5. Modules: the parent path of each tensor; roles need the whole module (a norm's bias).
  std::map<std::string, std::vector<std::pair<std::string, const SourceTensor*>>> by_module;
  for (const auto& [n, t] : named) {
    auto [module, suffix] = split_name(n);
    // An inline model names each tensor within its module, and refuses an empty name.
    if (suffix.empty()) {
      throw InputError(t->file, at_byte(t->offset, fmt::format("tensor \"{}\" has no name after its module path (empty, or ending in '.')",
                                                               t->name)));
    }
    by_module[module].emplace_back(std::move(suffix), t);
  }
  std::map<std::string, std::size_t> unmodelled;  // dtype name -> tensors kept as raw bytes
  struct Built {
    Module module;
    std::vector<const SourceTensor*> sources;  // parallel to module.tensors
  };
  std::vector<Built> modules;
  modules.reserve(by_module.size());
  for (const auto& [module, members] : by_module) {
    bool norm_module = false;
    for (const auto& [suffix, t] : members) {
      if ((suffix == "weight" || suffix == "scale") && t->shape.size() <= 1) norm_module = true;
    }
    Module m;
    m.name = module;
    m.cast_hook = false;
    std::vector<std::pair<Tensor, const SourceTensor*>> built;
    for (const auto& [suffix, t] : members) {
      Tensor x;
      x.name = suffix;
      x.role = role_of(module, suffix, t->shape.size(), norm_module);
      if (t->dtype) {
        x.dtype = *t->dtype;
        x.shape = t->shape;
      } else if (x.role == TensorRole::scale || x.role == TensorRole::other) {
        x.dtype = Dtype::int8;
        x.shape = raw_byte_shape(*t);
        ++unmodelled[t->dtype_name];
      } else {
        fail_tensor(*t, fmt::format("dtype {} cannot be modelled: as a {} it needs a conversion (upcast / dequantize) vramfuzz does "
                                    "not know; vramfuzz models F32, F16, BF16, F8_E4M3, F8_E5M2 and I8 tensors (GGUF: the block "
                                    "types of dtype.h)",
                                    t->dtype_name, role_name(x.role)));
      }
      if (suffix == "weight" || suffix == "bias" || suffix == "scale") m.cast_hook = true;
      built.emplace_back(std::move(x), t);
    }
    std::stable_sort(built.begin(), built.end(), [](const auto& a, const auto& b) {
      const int ra = tensor_rank(a.first), rb = tensor_rank(b.first);
      return ra != rb ? ra < rb : a.first.name < b.first.name;
    });
    Built b;
    for (auto& [x, t] : built) {
      m.tensors.push_back(std::move(x));
      b.sources.push_back(t);
    }
    b.module = std::move(m);
    modules.push_back(std::move(b));
  }
  if (modules.size() > kMaxModules) throw InputError(origin, fmt::format("{} modules is more than the {} a model may have", modules.size(), kMaxModules));
  for (const auto& [d, c] : unmodelled) {
    out.warnings.push_back(fmt::format("{} {} tensor(s) (a dtype vramfuzz does not model) are buffers or scales: kept as their raw "
                                       "bytes (int8 elements), never converted",
                                       c, d));
  }

  // 6. Forward order: the family's input layers, blocks in index order, output layers.
  const auto rules = order_rules(family);
  std::vector<std::pair<OrderKey, std::size_t>> keys;
  keys.reserve(modules.size());
  for (std::size_t i = 0; i < modules.size(); ++i) keys.emplace_back(order_key(rules, modules[i].module.name), i);
  std::stable_sort(keys.begin(), keys.end(), [&](const auto& a, const auto& b) {
    if (a.first.rank != b.first.rank) return a.first.rank < b.first.rank;
    if (a.first.index != b.first.index) return a.first.index > b.first.index;
    return natural_less(modules[a.second].module.name, modules[b.second].module.name);
  });
  ModelSpec& spec = out.model;
  spec.modules.reserve(modules.size());
  std::vector<std::vector<const SourceTensor*>> sources;
  sources.reserve(modules.size());
  for (const auto& k : keys) {
    spec.modules.push_back(std::move(modules[k.second].module));
    sources.push_back(std::move(modules[k.second].sources));
  }

  // 7. Scales: which convention the file uses.
  QuantSummary q;
  if (!hints.quant_metadata.empty()) {
    std::map<std::string, Module*> index;
    for (Module& m : spec.modules) index.emplace(m.name, &m);
    check_quant_metadata(hints, prefix, index, q);
  }
  std::size_t scaled_weights = 0, scales = 0;
  for (const Module& m : spec.modules) {
    bool has_scale = false;
    for (const Tensor& t : m.tensors) has_scale = has_scale || t.role == TensorRole::scale;
    for (const Tensor& t : m.tensors) scales += t.role == TensorRole::scale ? 1 : 0;
    if (has_scale) ++scaled_weights;
  }
  if (scaled_fp8) {
    const std::string flavour = scaled_fp8->dtype_name == "F32" ? "F8_E4M3 (an F32 marker means e4m3fn)" : scaled_fp8->dtype_name;
    std::uint64_t numel = 1;
    for (std::uint64_t d : scaled_fp8->shape) numel *= d;
    q.text = fmt::format("scaled_fp8 marker ({}{}), {} scaled module(s)", flavour, numel == 2 ? ", 2 elements: matmul in full precision" : "",
                         scaled_weights);
  } else if (q.text.empty() && comfy_quant > 0) {
    q.text = fmt::format("{} per-layer comfy_quant marker(s), {} scaled module(s)", comfy_quant, scaled_weights);
  } else if (q.text.empty() && scales > 0) {
    q.text = fmt::format("{} scale tensor(s) without a marker or _quantization_metadata", scales);
  }
  out.quantization = q.text;
  out.warnings.insert(out.warnings.end(), q.warnings.begin(), q.warnings.end());

  // 8. The model: name, family numbers from the catalog, sizes.
  spec.name = options.name.empty() ? "model" : options.name;
  spec.family = family;
  apply_family(spec, names);
  // The tensor layout says which modules are containers: a module with tensors of its own and
  // parameters below it (Wan's blocks.N.modulation beside blocks.N.self_attn.q, SD3.5's root
  // pos_embed). Castable ops are leaves, so a container's own tensors are raw, whatever their names.
  mark_containers(spec.modules);
  for (Module& m : spec.modules) {
    if (m.container) m.cast_hook = false;
  }
  finalize_model(spec, origin);
  if (spec.bytes > kMaxModelBytes) throw InputError(origin, fmt::format("the model is {} bytes, more than the 256 TiB limit", spec.bytes));
  // The stored bytes of every tensor must be what dtype.h computes for its shape: a mismatch is a
  // bug in a reader (the headers were validated), not bad input.
  for (std::size_t mi = 0; mi < spec.modules.size(); ++mi) {
    for (std::size_t ti = 0; ti < spec.modules[mi].tensors.size(); ++ti) {
      const Tensor& t = spec.modules[mi].tensors[ti];
      const SourceTensor* src = sources[mi][ti];
      if (t.bytes != src->bytes) {
        throw InfraError(fmt::format("importer bug: tensor \"{}\" of {} is {} bytes in the file but {} bytes as {} {}", src->name, src->file,
                                     src->bytes, t.bytes, dtype_name(t.dtype), tensor_shape_text(t.shape)));
      }
      ++out.tensors;
    }
  }
  return out;
}

// ---- files ------------------------------------------------------------------------------------

namespace {

struct Loaded {
  std::vector<SourceTensor> tensors;
  SourceHints hints;
  std::vector<std::string> warnings;
  std::string format;
};

void add_safetensors(const StHeader& h, const std::string& file, Loaded& out, const std::set<std::string>* only) {
  for (const StTensor& t : h.tensors) {
    if (only != nullptr && only->count(t.name) == 0) continue;
    SourceTensor s;
    s.name = t.name;
    s.shape = t.shape;
    s.dtype = st_dtype_to_vf(t.dtype);
    s.dtype_name = std::string(st_dtype_name(t.dtype));
    s.elem_bits = st_dtype_bits(t.dtype);
    s.bytes = t.bytes();
    s.file = file;
    s.offset = t.entry_offset;
    out.tensors.push_back(std::move(s));
  }
  if (out.hints.architecture.empty()) {
    if (const std::string* a = h.find_metadata("modelspec.architecture")) {
      out.hints.architecture = *a;
      out.hints.arch_from = "__metadata__ modelspec.architecture";
    }
  }
  for (std::size_t i = 0; i < h.metadata.size(); ++i) {
    if (h.metadata[i].first != "_quantization_metadata" || !out.hints.quant_metadata.empty()) continue;
    out.hints.quant_metadata = h.metadata[i].second;
    out.hints.quant_metadata_file = file;
    out.hints.quant_metadata_offset = h.metadata_value_offsets[i];
  }
}

// comfy.gguf.orig_shape.NAME: the PyTorch shape ComfyUI-GGUF restores for a tensor the converter
// stored reshaped (5-D tensors, K-quant rows that were not whole super-blocks).
std::vector<std::uint64_t> gguf_shape(const GgufHeader& h, const GgufTensorInfo& t, const std::string& file) {
  std::vector<std::uint64_t> shape = t.torch_shape();
  const GgufKv* kv = h.find("comfy.gguf.orig_shape." + t.name);
  if (kv == nullptr) return shape;
  const GgufValue& v = kv->value;
  const auto bad = [&](const std::string& why) {
    throw InputError(file, at_byte(kv->offset, fmt::format("{}: {}", kv->key, why)));
  };
  GgufValue elem;
  elem.type = v.elem_type;
  if (v.type != GgufType::array || !elem.is_integer()) bad("expected an array of integers (ComfyUI-GGUF writes INT32)");
  if (v.count > kMaxRank) bad(fmt::format("{} dimensions is more than {}", v.count, kMaxRank));
  std::vector<std::uint64_t> orig;
  std::uint64_t numel = 1, stored = 1;
  for (const GgufValue& e : v.elems) {
    const auto d = e.as_int();
    if (!d || *d < 0) bad("a dimension is negative");
    orig.push_back(static_cast<std::uint64_t>(*d));
    if (__builtin_mul_overflow(numel, orig.back(), &numel)) bad("the shape's element count overflows 64 bits");
  }
  for (std::uint64_t d : shape) stored *= d;  // bounded by the reader (int64)
  if (numel != stored) bad(fmt::format("{} elements, but tensor \"{}\" has {}", numel, t.name, stored));
  // The bytes are what is stored: keep the original shape only where it gives the same bytes
  // (a reshaped K-quant row of 256 would not).
  const Bytes as_orig = tensor_bytes(t.dtype, orig, kv->key);
  return as_orig == t.bytes ? orig : shape;
}

void add_gguf(const GgufHeader& h, const std::string& file, Loaded& out) {
  for (const GgufTensorInfo& t : h.tensors) {
    SourceTensor s;
    s.name = t.name;
    s.shape = gguf_shape(h, t, file);
    s.dtype = t.dtype;
    s.dtype_name = std::string(ggml_type_name(t.ggml_type));
    s.bytes = t.bytes;
    s.file = file;
    s.offset = t.info_offset;
    out.tensors.push_back(std::move(s));
  }
  if (out.hints.architecture.empty() && !h.architecture.empty()) {
    out.hints.architecture = h.architecture;
    out.hints.arch_from = "general.architecture";
  }
  out.warnings.insert(out.warnings.end(), h.warnings.begin(), h.warnings.end());
}

// A GGUF file by its magic, or by its name: a `.gguf` whose magic is wrong is a damaged GGUF
// (the GGUF reader says "bad magic"), not a safetensors file whose header length is absurd.
bool is_gguf(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".gguf") return true;
  const HeaderFile f(path);
  const auto magic = f.prefix(4);
  return magic.size() == 4 && std::equal(magic.begin(), magic.end(), "GGUF");
}

void load_index(const std::string& index_path, Loaded& out) {
  const std::string text = read_text_file(index_path);
  const StIndex idx = parse_safetensors_index(text, index_path);
  const fs::path dir = fs::path(index_path).parent_path();
  std::vector<std::string> shards;
  std::map<std::string, std::set<std::string>> wanted;  // shard -> tensors weight_map puts there
  std::map<std::string, std::uint64_t> entry_offset;    // tensor -> its weight_map entry in the index
  for (std::size_t i = 0; i < idx.weight_map.size(); ++i) {
    const auto& [tensor, shard] = idx.weight_map[i];
    if (wanted.find(shard) == wanted.end()) shards.push_back(shard);
    wanted[shard].insert(tensor);
    entry_offset[tensor] = idx.offsets[i];
  }
  if (shards.empty()) throw InputError(index_path, at_byte(0, "weight_map is empty"));
  std::size_t extra = 0;
  Bytes total = 0;
  for (const std::string& shard : shards) {
    const std::string path = (dir / shard).string();
    const StHeader h = read_safetensors_header(path);
    std::set<std::string> present;
    for (const StTensor& t : h.tensors) {
      present.insert(t.name);
      if (wanted[shard].count(t.name) == 0) ++extra;
      else total += t.bytes();
    }
    for (const std::string& t : wanted[shard]) {
      if (present.count(t) == 0) {
        throw InputError(index_path, at_byte(entry_offset.at(t), fmt::format("weight_map puts tensor \"{}\" in {}, which has no such tensor", t, shard)));
      }
    }
    add_safetensors(h, path, out, &wanted[shard]);
  }
  if (extra > 0) out.warnings.push_back(fmt::format("{} tensor(s) in the shards are not in weight_map and were ignored", extra));
  if (idx.total_size && *idx.total_size != total) {
    out.warnings.push_back(fmt::format("metadata.total_size says {} bytes; the tensors of weight_map hold {}", *idx.total_size, total));
  }
  out.format = fmt::format("safetensors, sharded: {} file(s) through {}", shards.size(), fs::path(index_path).filename().string());
}

}  // namespace

ImportedModel import_model_files(std::span<const std::string> paths, const ImportOptions& options) {
  if (paths.empty()) throw InputError("models import", "no model file given");
  Loaded loaded;
  const std::string& first = paths.front();
  if (ends_with(first, ".json")) {
    if (paths.size() > 1) throw InputError(first, "an index.json names its shards itself: give it alone");
    load_index(first, loaded);
  } else {
    std::size_t ggufs = 0;
    std::uint32_t version = 0;
    for (const std::string& p : paths) {
      if (ends_with(p, ".json")) throw InputError(p, "an index.json names its shards itself: give it alone");
      if (is_gguf(p)) {
        const GgufHeader h = read_gguf_header(p);
        version = h.version;
        add_gguf(h, p, loaded);
        ++ggufs;
      } else {
        add_safetensors(read_safetensors_header(p), p, loaded, nullptr);
      }
    }
    if (ggufs != 0 && ggufs != paths.size()) throw InputError(first, "the files mix GGUF and safetensors: give the shards of one model");
    loaded.format = ggufs != 0 ? fmt::format("gguf v{}", version) : std::string("safetensors");
    if (paths.size() > 1) loaded.format += fmt::format(", {} files", paths.size());
  }
  // The same tensor in two shards is ambiguous.
  std::unordered_map<std::string, const SourceTensor*> seen;
  for (const SourceTensor& t : loaded.tensors) {
    const auto [it, fresh] = seen.emplace(t.name, &t);
    if (!fresh) {
      throw InputError(t.file, at_byte(t.offset, fmt::format("tensor \"{}\" is also in {}", t.name, it->second->file)));
    }
  }
  loaded.hints.file = first;
  ImportOptions opts = options;
  if (opts.name.empty()) opts.name = model_name_from(first);
  ImportedModel m = build_imported_model(std::move(loaded.tensors), loaded.hints, opts, first);
  m.format = loaded.format;
  m.warnings.insert(m.warnings.begin(), loaded.warnings.begin(), loaded.warnings.end());
  std::error_code ec;
  const fs::path abs = fs::absolute(first, ec);
  m.model.source = "file:" + (ec ? first : abs.lexically_normal().string());
  return m;
}

ImportedModel import_safetensors_image(std::span<const std::uint8_t> bytes, std::uint64_t file_size, const std::string& origin,
                                       const ImportOptions& options) {
  Loaded loaded;
  add_safetensors(parse_safetensors_header(bytes, file_size, origin), origin, loaded, nullptr);
  ImportedModel m = build_imported_model(std::move(loaded.tensors), loaded.hints, options, origin);
  m.format = "safetensors";
  return m;
}

ImportedModel import_gguf_image(std::span<const std::uint8_t> bytes, std::uint64_t file_size, const std::string& origin,
                                const ImportOptions& options) {
  Loaded loaded;
  const GgufHeader h = parse_gguf_header(bytes, file_size, origin);
  add_gguf(h, origin, loaded);
  ImportedModel m = build_imported_model(std::move(loaded.tensors), loaded.hints, options, origin);
  m.format = fmt::format("gguf v{}", h.version);
  m.warnings.insert(m.warnings.begin(), loaded.warnings.begin(), loaded.warnings.end());
  return m;
}

std::string family_names() { return family_list(); }

ImportedModel import_model_file(const std::string& path, const ImportOptions& options) {
  const std::string paths[] = {path};
  return import_model_files(paths, options);
}

std::string model_fragment_json(const ModelSpec& m, const std::string& id) {
  // One module per line: a FLUX file has ~800 modules, and a diff of two imports stays readable.
  const nlohmann::ordered_json arch = {
      {"latent_channels", m.arch.latent_channels}, {"hidden", m.arch.hidden}, {"widest", m.arch.widest},
      {"text_tokens", m.arch.text_tokens},         {"patch", m.arch.patch},   {"temporal_down", m.arch.temporal_down},
      {"gated", m.arch.gated},                     {"kept_hidden_states", m.arch.kept_hidden_states}};
  std::string out = "{\n";
  out += fmt::format("  \"id\": {},\n", nlohmann::json(id).dump());
  out += fmt::format("  \"kind\": \"{}\",\n", kind_name(m.kind));
  out += fmt::format("  \"family\": \"{}\",\n", family_name(m.family));
  out += fmt::format("  \"memory_usage_factor\": {},\n", nlohmann::json(m.memory_usage_factor).dump());
  out += fmt::format("  \"arch\": {},\n", arch.dump());
  out += "  \"modules\": [";
  for (std::size_t i = 0; i < m.modules.size(); ++i) {
    const Module& mod = m.modules[i];
    nlohmann::ordered_json tj = nlohmann::ordered_json::array();
    for (const Tensor& t : mod.tensors) {
      tj.push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", dtype_name(t.dtype)}, {"role", role_name(t.role)}});
    }
    nlohmann::ordered_json mj = {{"name", mod.name}, {"tensors", std::move(tj)}};
    if (!mod.cast_hook) mj["cast_hook"] = false;
    out += (i == 0 ? "\n    " : ",\n    ") + mj.dump();
  }
  out += m.modules.empty() ? "]\n}\n" : "\n  ]\n}\n";
  return out;
}

}  // namespace vf
