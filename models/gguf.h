// The GGUF header reader (versions 2 and 3): magic, version, counts, every metadata key/value
// type, and the tensor infos, checked the way a loader must before it trusts a single offset.
// Only the header is read, never the tensor data. Layout and rules: docs/importing.md.
//
// Every error is InputError(file, "byte B: problem") with B the file offset of the field.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "harness/core/dtype.h"

namespace vf {

inline constexpr std::uint32_t kGgufDefaultAlignment = 32;
inline constexpr std::uint32_t kGgufMaxDims = 4;            // GGML_MAX_DIMS
inline constexpr std::uint64_t kGgufSpecMaxName = 64;       // tensor names, per the spec
inline constexpr std::uint64_t kGgufMaxKeyLength = 65535;   // metadata keys, per the spec
inline constexpr std::uint32_t kGgufTypeCount = 43;         // GGML_TYPE_COUNT (ids 0..42)
inline constexpr int kGgufMaxArrayDepth = 8;                // arrays of arrays of ... (ours)
inline constexpr std::uint64_t kGgufKeptArrayElements = 4096;  // longer arrays keep their count only

enum class GgufType : std::uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9,
  u64 = 10, i64 = 11, f64 = 12,
};
std::string_view gguf_type_name(GgufType t);

struct GgufValue {
  GgufType type = GgufType::u8;
  std::uint64_t u = 0;  // unsigned integers, and bool (0 / 1)
  std::int64_t i = 0;   // signed integers
  double f = 0;         // f32 / f64
  std::string s;        // string
  // Arrays: the element type and count; the elements themselves only when count is at most
  // kGgufKeptArrayElements (a 150k-token vocabulary is checked and skipped, not copied).
  GgufType elem_type = GgufType::u8;
  std::uint64_t count = 0;
  std::vector<GgufValue> elems;

  bool is_integer() const;
  // The value as a signed 64-bit integer when it is an integer type that fits.
  std::optional<std::int64_t> as_int() const;
};

struct GgufKv {
  std::string key;
  GgufValue value;
  std::uint64_t offset = 0;  // file byte of the key
};

struct GgufTensorInfo {
  std::string name;
  std::vector<std::uint64_t> ne;  // ggml order: ne[0] is the contiguous axis
  std::uint32_t ggml_type = 0;
  Dtype dtype = Dtype::fp32;      // the vramfuzz dtype of ggml_type (the reader rejects others)
  std::uint64_t offset = 0;       // relative to the data section
  std::uint64_t bytes = 0;        // exact stored bytes
  std::uint64_t info_offset = 0;  // file byte where this tensor info starts
  // PyTorch order (ne reversed): [out, in] for a weight whose ne is (in, out).
  std::vector<std::uint64_t> torch_shape() const { return {ne.rbegin(), ne.rend()}; }
};

struct GgufHeader {
  std::uint32_t version = 0;
  std::uint64_t tensor_count = 0;
  std::uint64_t kv_count = 0;
  std::vector<GgufKv> kvs;
  std::vector<GgufTensorInfo> tensors;
  std::uint32_t alignment = kGgufDefaultAlignment;
  std::string architecture;     // general.architecture ("" when absent)
  std::uint64_t data_start = 0;  // file byte of the data section (aligned)
  std::uint64_t file_size = 0;
  std::vector<std::string> warnings;
  const GgufKv* find(std::string_view key) const;
};

// The name of a ggml type id ("Q4_K"), "retired" / "unknown" for the ids without a type.
std::string_view ggml_type_name(std::uint32_t id);

// Parses a GGUF header from `bytes`, the first bytes of a file of `file_size` bytes (all of it,
// or at least the whole header). `origin` names the file in errors.
GgufHeader parse_gguf_header(std::span<const std::uint8_t> bytes, std::uint64_t file_size, std::string_view origin);

// Reads only the header of the file at `path`, growing the read until the header fits.
GgufHeader read_gguf_header(const std::string& path);

}  // namespace vf
