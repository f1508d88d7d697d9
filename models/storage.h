// How a file stores a generated model: the per-tensor dtype rules behind StorageChoice
// (catalog.h). Internal to models/; exposed for the catalog and its tests.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "models/catalog.h"
#include "models/model.h"

namespace vf {

// Re-types every tensor of freshly generated modules (all in `native`, the release dtype) the way
// a real file of that storage dtype holds them, adding scale tensors for scaled fp8 / int8.
void apply_storage(std::vector<Module>& modules, StorageChoice storage, Dtype native);

// The GGUF type a diffusion-GGUF converter gives one tensor of module `module` when asked for
// block type `requested` (rules in storage.cpp).
Dtype gguf_tensor_type(std::string_view module, const Tensor& t, Dtype requested);

// The type a block-quantized row of `row` elements really gets: K-quants need whole 256-element
// blocks and fall back to a 32-block type the way llama.cpp does; 32-block types that still do
// not fit fall back to F16.
Dtype gguf_row_fallback(Dtype requested, std::uint64_t row);

}  // namespace vf
