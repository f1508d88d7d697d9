// What the loader sees of a model: modules in forward order, each a parent path with its own
// tensors (weight, bias, norms, scales), plus what the activation estimates need to know.
// Built-in catalog models are generated from architecture rules (catalog.h); file importers
// (safetensors / GGUF) produce the same structure.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "harness/core/flat_name_index.h"

#include "harness/core/bytes.h"
#include "harness/core/dtype.h"

namespace vf {

// What a tensor is for; it decides how the runtime treats it at forward time.
enum class TensorRole : std::uint8_t {
  weight,     // a matmul / conv weight: upcast or dequantized to the compute dtype when they differ
  bias,       // 1-D bias, cast with its weight
  norm,       // norm scale / shift (1-D), cast like a bias
  embedding,  // a lookup table: only the gathered rows are converted, never the whole table
  scale,      // a scaled-fp8 scale (fp32 scalar or small tensor), read by the dequant
  other,      // buffers, positional tables: moved with the module, not converted
};
std::string_view role_name(TensorRole r);

struct Tensor {
  std::string name;                  // suffix within the module ("weight", "bias", "scale_weight")
  std::vector<std::uint64_t> shape;  // PyTorch order, innermost last
  Dtype dtype = Dtype::bf16;
  TensorRole role = TensorRole::weight;
  std::uint64_t numel = 0;           // derived: product of shape (1 for a scalar)
  Bytes bytes = 0;                   // derived: exact storage bytes (dtype.h rules)
};

struct Module {
  std::string name;  // full parent path ("double_blocks.3.img_mlp.0")
  std::vector<Tensor> tensors;
  // ComfyUI's cast hook: true for the Linear / Conv / Norm / Embedding ops that can be cast
  // (and therefore offloaded and cast on the fly). Modules without it are never offloaded.
  bool cast_hook = true;
  // Derived from the names (finalize_model): some module below this one ("name." + more, or any
  // module at all below the root "") owns parameters, so this is a PyTorch container whose own
  // tensors sit beside its children's (Wan's `blocks.N.modulation`, SD3.5's root `pos_embed`).
  // ComfyUI's load walk skips such a module altogether. A container never has the cast hook.
  bool container = false;
  Bytes bytes = 0;  // derived: sum of tensor bytes (ComfyUI's module_mem)
  std::uint64_t weight_numel = 0;  // derived: elements of its weight tensors (its matmuls, for modelled time)
};

// Whether `m` owns a parameter (PyTorch's named_parameters): a tensor of any role but `other`,
// which holds buffers. A module of buffers only is not in ComfyUI's load walk unless it has the
// cast hook.
bool owns_parameters(const Module& m);

// Sets `container` on every module from the names: true where a module with parameters lies
// below it. Called by finalize_model; exposed for parsers that default `cast_hook` from it.
void mark_containers(std::vector<Module>& modules);

enum class ModelKind : std::uint8_t { diffusion, text_encoder, vae };
std::string_view kind_name(ModelKind k);

// Model families decide the latent rule and the activation working set.
enum class Family : std::uint8_t {
  flux,        // FLUX.1 DiT: 16-ch latent, 2x2 patches, T5 text tokens
  flux2,       // FLUX.2 DiT: 32-ch latent, 2x2 patches, Mistral text tokens
  sd3,         // SD3.5 MMDiT
  qwen_image,  // Qwen-Image MMDiT
  wan21,       // Wan 2.1 video DiT: 16-ch latent, x4 temporal, (1,2,2) patches
  sdxl,        // SDXL UNet: 4-ch latent
  sd15,        // SD1.5 UNet: 4-ch latent
  t5,          // T5-XXL encoder
  clip,        // CLIP-L text encoder
  mistral,     // Mistral-Small-3.x decoder layers (FLUX.2 text encoder)
  vae_kl,      // AutoencoderKL-style VAE (FLUX / SD)
  generic,     // inline or imported model whose family could not be told
};
std::string_view family_name(Family f);
std::optional<Family> parse_family(std::string_view name);

// The numbers an activation rule needs. For DiTs `hidden` is the model width and `widest` the
// widest intermediate a block materialises per token (FLUX.1 single block linear1: 21504);
// for text encoders `hidden` / `widest` are the residual and feed-forward widths and
// `gated` says the MLP keeps gate and up projections alive together; for VAEs `widest` is the
// widest channel count live at full pixel resolution of the decoder (the 256-channel upsample
// output) and `hidden` the channels of the full-resolution convs (128).
struct ArchShape {
  std::uint32_t latent_channels = 0;
  std::uint32_t hidden = 0;
  std::uint32_t widest = 0;
  std::uint32_t text_tokens = 0;    // tokens of the conditioning (or the encoder's own max tokens)
  std::uint32_t patch = 2;          // DiT spatial patch (2x2); 1 for UNets
  std::uint32_t temporal_down = 1;  // Wan: 4 (T frames -> 1 + (T-1)/4 latent frames)
  bool gated = false;
  std::uint32_t kept_hidden_states = 0;  // text encoders that return several layers' states
};

// What the per-case loops read of a tensor (ModelSpec::tensors_flat).
struct FlatTensor {
  Bytes bytes = 0;
  std::uint64_t numel = 0;
  Dtype dtype = Dtype::bf16;
  TensorRole role = TensorRole::weight;
};
// ModelSpec::module_flags bits.
inline constexpr std::uint8_t kModuleCastHook = 1;  // Module::cast_hook
inline constexpr std::uint8_t kModuleScaled = 2;    // a tensor of role `scale` (a scaled-fp8 layer)
inline constexpr std::uint8_t kModuleContainer = 4;       // Module::container
inline constexpr std::uint8_t kModuleOwnsParameters = 8;  // owns_parameters(module)

struct ModelSpec {
  std::string name;    // catalog name or user-given name
  std::string source;  // "catalog:flux1-dev", "inline", "file:PATH"
  Family family = Family::generic;
  ModelKind kind = ModelKind::diffusion;
  double memory_usage_factor = 1.0;  // ComfyUI's per-architecture activation factor
  ArchShape arch;
  std::vector<Module> modules;  // forward order
  std::uint64_t params = 0;     // derived
  Bytes bytes = 0;              // derived: total storage bytes
  // Derived too, for the loops that visit every module of a large model (the planner's walk and
  // transient window, the lowering's loads, casts and transfers): what they read of each module
  // and tensor, in flat arrays, where a Module is 96 bytes and a Tensor 80 (its shape and name on
  // the heap besides) read for a field or two each. Whoever edits `modules` finalizes again, as for
  // every derived field.
  std::vector<Bytes> module_sizes;          // modules[i].bytes
  std::vector<std::uint64_t> module_weight_numels;  // modules[i].weight_numel (the modelled compute time)
  std::vector<std::uint8_t> module_flags;   // modules[i]: the kModule* bits above
  std::vector<std::uint32_t> tensor_first;  // module i's tensors: tensors_flat[tensor_first[i], tensor_first[i + 1])
  std::vector<FlatTensor> tensors_flat;     // modules[i].tensors[t], module after module
  // Empty, or per module the place of its name in the byte order of the model's names (equal
  // names, equal places): what the load walks' sorts compare instead of the names. The catalog
  // fills it once per model it builds (set_name_ranks), where a model's walks are built for many
  // storages, dtypes and constants; finalize_model empties it, since an edit can reorder names.
  std::vector<std::uint32_t> name_rank;
};

// Fills m.name_rank (one sort of the names).
void set_name_ranks(ModelSpec& m);

// Modules by name in one flat table (harness/core/flat_name_index.h), the names read through the
// vector (which may grow while a reader adds to it).
struct ModuleNameOf {
  const std::vector<Module>* modules;
  std::string_view operator()(std::uint32_t i) const { return (*modules)[i].name; }
};
using ModuleNameIndex = FlatNameIndex<ModuleNameOf>;

// m.module_sizes, checked against the modules (the other flat arrays with them): a model
// edited after finalize_model is our bug, and an InfraError, never a plan from stale sizes.
const std::vector<Bytes>& module_sizes(const ModelSpec& m);

// Fills the derived fields (numel, bytes per tensor and module, containers, params and bytes of
// the model). `path` prefixes error messages ("models[0]"); throws InputError on overflow and on
// a container with the cast hook (`models[0].modules[3].cast_hook`).
void finalize_model(ModelSpec& m, std::string_view path);

}  // namespace vf
