// libFuzzer target: the GGUF header reader and the importer behind it, on bytes taken as a whole
// file image. Expected outcomes: a model, or InputError; anything else escaping is a bug.
#include <cstdint>
#include <span>

#include "harness/core/error.h"
#include "models/gguf.h"
#include "models/import.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  try {
    const vf::GgufHeader h = vf::parse_gguf_header(bytes, size, "fuzz.gguf");
    // The reader's promises: counts match what was read, offsets are aligned and inside the file.
    if (h.tensors.size() != h.tensor_count || h.kvs.size() != h.kv_count) __builtin_trap();
    if (h.alignment == 0 || h.alignment % 8 != 0 || h.data_start % h.alignment != 0) __builtin_trap();
    for (const vf::GgufTensorInfo& t : h.tensors) {
      if (t.ne.size() > vf::kGgufMaxDims || t.offset % h.alignment != 0) __builtin_trap();
      if (t.bytes > 0 && (h.data_start > size || t.offset + t.bytes > size - h.data_start)) __builtin_trap();
    }
  } catch (const vf::InputError&) {
    return 0;
  }
  for (const bool given : {false, true}) {
    try {
      vf::ImportOptions opts;
      if (given) opts.family = vf::Family::generic;
      const vf::ImportedModel r = vf::import_gguf_image(bytes, size, "fuzz.gguf", opts);
      vf::Bytes sum = 0;
      for (const vf::Module& m : r.model.modules) sum += m.bytes;
      if (sum != r.model.bytes) __builtin_trap();
    } catch (const vf::InputError&) {
    }
  }
  return 0;
}
