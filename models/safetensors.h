// The safetensors header reader: the 8-byte length, the JSON header, and the same validation the
// reference reader applies, without ever reading the tensor data (a 24 GB file costs one header
// read). Layout and rules: docs/importing.md.
//
// Every error is InputError(file, "byte B: problem"), B being the file offset of the offending
// byte or JSON value, so the CLI exits 2 and the user can find the spot with a hex viewer.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "harness/core/dtype.h"

namespace vf {

// The reference reader refuses headers longer than this (HeaderTooLarge).
inline constexpr std::uint64_t kSafetensorsMaxHeader = 100'000'000;

// Every dtype the safetensors format defines, including the ones vramfuzz cannot model.
enum class StDtype : std::uint8_t {
  BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64, C64,
  F8_E4M3, F8_E5M2, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, F4, F6_E2M3, F6_E3M2,
};
std::string_view st_dtype_name(StDtype d);
std::uint32_t st_dtype_bits(StDtype d);  // 1 .. 64; F4 is 4, F6_* are 6
std::optional<StDtype> parse_st_dtype(std::string_view name);  // exact, case-sensitive
// The vramfuzz dtype of a safetensors dtype, for the six vramfuzz models (F32 F16 BF16 F8_E4M3
// F8_E5M2 I8); nullopt for the rest (the importer decides what to do with those).
std::optional<Dtype> st_dtype_to_vf(StDtype d);

struct StTensor {
  std::string name;
  StDtype dtype = StDtype::F32;
  std::vector<std::uint64_t> shape;  // PyTorch order; [] is a scalar; zero dims allowed
  std::uint64_t begin = 0;           // data_offsets, relative to the data section
  std::uint64_t end = 0;
  std::uint64_t entry_offset = 0;    // file byte of the tensor's name in the header
  std::uint64_t bytes() const { return end - begin; }
};

struct StHeader {
  std::uint64_t header_len = 0;  // N
  std::uint64_t data_start = 0;  // 8 + N: where data offset 0 is in the file
  std::uint64_t file_size = 0;
  std::vector<StTensor> tensors;  // in header order
  std::vector<std::pair<std::string, std::string>> metadata;  // __metadata__, in header order
  std::uint64_t metadata_offset = 0;  // file byte of the __metadata__ object (0: none)
  // The file byte of each metadata value, parallel to `metadata`.
  std::vector<std::uint64_t> metadata_value_offsets;
  const std::string* find_metadata(std::string_view key) const;
};

// Parses and validates a safetensors header. `prefix` holds the first bytes of the file: the
// whole file, or at least its first min(size, 8 + N) bytes; `file_size` is the size of the whole
// file (the data section is file_size - 8 - N bytes and the tensors must cover it exactly).
// `origin` names the file in errors.
StHeader parse_safetensors_header(std::span<const std::uint8_t> prefix, std::uint64_t file_size, std::string_view origin);

// Reads only the header of the file at `path` (8 bytes, then N), never the data.
StHeader read_safetensors_header(const std::string& path);

// A sharded checkpoint's `model.safetensors.index.json`: {"metadata": {"total_size": N, ...},
// "weight_map": {tensor: shard file}}. Shard names are relative to the index file's directory.
struct StIndex {
  std::vector<std::pair<std::string, std::string>> weight_map;  // in file order
  std::vector<std::uint64_t> offsets;  // file byte of each weight_map entry, parallel to it
  std::optional<std::uint64_t> total_size;
};
StIndex parse_safetensors_index(std::string_view text, std::string_view origin);

}  // namespace vf
