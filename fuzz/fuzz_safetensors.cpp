// libFuzzer target: the safetensors header reader and the importer behind it, on bytes taken as a
// whole file image (the reader parses from memory plus a file size, so no file is written).
// Expected outcomes: a model, or InputError (bad input, exit 2 in the CLI). Anything else that
// escapes -- another exception, a sanitizer report, a broken invariant -- is a bug.
#include <cstdint>
#include <span>

#include "harness/core/error.h"
#include "models/import.h"
#include "models/safetensors.h"

namespace {

// What every imported model must satisfy, whatever the input.
void check(const vf::ImportedModel& r) {
  vf::Bytes sum = 0;
  for (const vf::Module& m : r.model.modules) {
    vf::Bytes mb = 0;
    for (const vf::Tensor& t : m.tensors) mb += t.bytes;
    if (mb != m.bytes || m.tensors.empty()) __builtin_trap();
    sum += m.bytes;
  }
  if (sum != r.model.bytes) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  try {
    const vf::StHeader h = vf::parse_safetensors_header(bytes, size, "fuzz.safetensors");
    // The reader's promise: the tensors tile the data section exactly.
    vf::Bytes covered = 0;
    for (const vf::StTensor& t : h.tensors) covered += t.bytes();
    if (covered != size - h.data_start) __builtin_trap();
  } catch (const vf::InputError&) {
    return 0;
  }
  // The importer: family detection as the CLI does it, then with the family given (so grouping,
  // roles and ordering run even when the names fit no family).
  try {
    check(vf::import_safetensors_image(bytes, size, "fuzz.safetensors", {}));
  } catch (const vf::InputError&) {
  }
  try {
    check(vf::import_safetensors_image(bytes, size, "fuzz.safetensors", {.name = "fuzz", .family = vf::Family::generic}));
  } catch (const vf::InputError&) {
  }
  return 0;
}
