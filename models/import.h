// Real model files in: safetensors (one file, or a sharded checkpoint through its
// `*.safetensors.index.json`) and GGUF headers become a ModelSpec the way the loader sees the
// model -- modules in forward order, each a parent path with its tensors and their roles, plus the
// family, kind, memory_usage_factor and ArchShape of the catalog model of that family.
// The rules (grouping, order, roles, families, dtypes): docs/importing.md.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "harness/core/bytes.h"
#include "harness/core/dtype.h"
#include "models/model.h"

namespace vf {

struct ImportOptions {
  std::string name;              // the model's name; empty: from the file name
  std::optional<Family> family;  // --family / "family": wins over detection
};

// One tensor as a header describes it, before grouping (the file readers' common output).
struct SourceTensor {
  std::string name;                   // as stored ("model.diffusion_model.img_in.weight")
  std::vector<std::uint64_t> shape;   // PyTorch order
  std::optional<Dtype> dtype;         // nullopt: a dtype vramfuzz does not model
  std::string dtype_name;             // as the file names it ("F8_E4M3", "Q4_K", "I64")
  std::uint32_t elem_bits = 0;        // bits per element of dtype_name (unmodelled dtypes)
  Bytes bytes = 0;                    // exact stored bytes
  std::string file;                   // the file it is in (for messages)
  std::uint64_t offset = 0;           // file byte of its header entry
};

// What a file says about the model beyond its tensors.
struct SourceHints {
  std::string architecture;     // GGUF general.architecture / safetensors modelspec.architecture
  std::string arch_from;        // where it came from, for messages
  std::string file;             // the (first) file, for messages
  // safetensors __metadata__._quantization_metadata, as text, and where it is.
  std::string quant_metadata;
  std::string quant_metadata_file;
  std::uint64_t quant_metadata_offset = 0;
};

struct ImportedModel {
  ModelSpec model;             // finalized; source "file:<absolute path>"
  std::string format;          // "safetensors", "safetensors (3 shards)", "gguf v3"
  std::string family_reason;   // why this family ("double_blocks + single_blocks, hidden 3072")
  std::string quantization;    // how quantized weights and scales were found ("" for none)
  std::string stripped_prefix; // the component prefix removed from every name ("model.diffusion_model.")
  std::size_t tensors = 0;     // tensors in the model
  std::vector<std::string> warnings;
};

// Imports one model from `paths`: a safetensors file, a `*.safetensors.index.json`, a GGUF file,
// or several shards of one model given one by one. Reads headers only. Throws InputError naming
// the file and byte offset of the problem, or asking for --family when the family cannot be told.
ImportedModel import_model_files(std::span<const std::string> paths, const ImportOptions& options);
ImportedModel import_model_file(const std::string& path, const ImportOptions& options);
// The names --family and "family" take, for messages: "flux, flux2, ..., generic".
std::string family_names();

// The same importer on a file image in memory (the fuzz targets' entry points): `bytes` is the
// file, or at least its header, and `file_size` the size of the whole file.
ImportedModel import_safetensors_image(std::span<const std::uint8_t> bytes, std::uint64_t file_size, const std::string& origin,
                                       const ImportOptions& options);
ImportedModel import_gguf_image(std::span<const std::uint8_t> bytes, std::uint64_t file_size, const std::string& origin,
                                const ImportOptions& options);

// The part after the headers: groups tensors into modules, detects the family, orders and types
// them, and finalizes the model. `origin` names the model in errors that concern no one tensor.
ImportedModel build_imported_model(std::vector<SourceTensor> tensors, const SourceHints& hints, const ImportOptions& options,
                                   const std::string& origin);

// The inline-model JSON fragment a scenario's "models" list takes:
// {"id", "kind", "family", "memory_usage_factor", "arch", "modules": [...]}, one module per line.
std::string model_fragment_json(const ModelSpec& m, const std::string& id);

// Natural order of module paths: digit runs compare as numbers ("blocks.9" < "blocks.10").
bool natural_less(std::string_view a, std::string_view b);

}  // namespace vf
