// The built-in model catalog, generated from architecture rules (blocks x per-block tensor
// shapes), not typed-in tensor lists. A storage dtype is applied the way real files mix them:
// fp8 / int8 files keep 1-D tensors, norms and embeddings wide and carry fp32 scales; GGUF
// files follow the diffusion-GGUF rules (1-D, conv and embedding-in tensors F32; K-quants fall
// back where a row is not a multiple of 256).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>

#include "models/model.h"

namespace vf {

struct CatalogEntry {
  std::string_view name;            // "flux1-dev"
  std::string_view description;     // one line for `models list`
  ModelKind kind;
  Family family;
  std::uint64_t published_params;   // the count the catalog must match within 0.5%
  Dtype native_dtype;               // the dtype of the official release (bf16 for most)
};

std::span<const CatalogEntry> catalog_entries();
const CatalogEntry* find_catalog_entry(std::string_view name);

// How a file stores the model. `scaled` applies to fp8 / int8: ComfyUI's "fp8_scaled" files carry
// an fp32 scale per quantized weight (and the dequant multiplies by it).
struct StorageChoice {
  Dtype dtype = Dtype::bf16;
  bool scaled = true;
  auto operator<=>(const StorageChoice&) const = default;
};

// Generates the model with the storage choice applied. Throws InputError(path) for an unknown
// name; the message lists the catalog.
ModelSpec build_catalog_model(std::string_view name, StorageChoice storage, std::string_view path);

// What an imported model of family `f` takes from the catalog (models/import.h): the kind,
// ComfyUI's memory_usage_factor and the ArchShape of the catalog's first model of that family
// (vae_kl: flux-vae). nullopt for Family::generic, which has no catalog model.
struct FamilyDefaults {
  std::string_view catalog_name;
  ModelKind kind;
  double memory_usage_factor;
  ArchShape arch;
};
std::optional<FamilyDefaults> family_defaults(Family f);

// How generously ComfyUI's hand-tuned activation estimates cover vramfuzz's formula across the
// catalog's diffusion models: memory_required / activation_working_set at 1024 x 1024, batch 1,
// bf16, flash attention, per model; the smallest and largest ratio, and the models they belong
// to. The generator draws its synthetic models' memory_usage_factor inside this range, so a
// campaign's models are tuned as well (and as badly) as real ones are (docs/activations.md).
struct ActivationMarginRange {
  double lo = 0;
  double hi = 0;
  std::string_view lo_model;
  std::string_view hi_model;
};
const ActivationMarginRange& catalog_activation_margin();

// A thread-safe cache of built models: catalog models are immutable once built, and one campaign
// shares one Catalog across its workers (no global state).
class Catalog {
 public:
  std::shared_ptr<const ModelSpec> get(std::string_view name, StorageChoice storage, std::string_view path);

 private:
  std::mutex mu_;
  std::map<std::tuple<std::string, StorageChoice>, std::shared_ptr<const ModelSpec>, std::less<>> cache_;
};

}  // namespace vf
