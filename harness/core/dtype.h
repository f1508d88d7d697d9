// Storage and compute dtypes, with the exact byte rules of each: plain element types, the fp8
// formats, and the GGUF block-quantized types (block size and bytes per block as in ggml).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "harness/core/bytes.h"

namespace vf {

enum class Dtype : std::uint8_t {
  fp32,
  fp16,
  bf16,
  fp8_e4m3fn,
  fp8_e5m2,
  int8,
  q4_0,
  q4_1,
  q5_0,
  q5_1,
  q8_0,
  q2_k,
  q3_k,
  q4_k,
  q5_k,
  q6_k,
};
inline constexpr int kDtypeCount = 16;

struct DtypeInfo {
  Dtype dtype;
  std::string_view name;       // our name, used in scenario JSON ("fp8_e4m3fn", "q4_k")
  std::uint32_t block_elems;   // 1 for element types; 32 or 256 for GGUF blocks
  std::uint32_t block_bytes;   // bytes per block (per element for element types)
  bool gguf_quantized;         // a GGUF block type that must be dequantized before compute
  bool fp8;                    // an 8-bit float that is upcast before compute
  bool compute;                // usable as a compute dtype (fp32 / fp16 / bf16)
  int ggml_type;               // GGML_TYPE_* id; -1 where GGUF has none (fp8)
  std::string_view safetensors;  // safetensors dtype string; empty where none (GGUF blocks)
};

// Block sizes and bytes per block follow ggml's block structs:
//   q4_0: f16 d + 16 B nibbles = 18 B / 32      q4_1: f16 d, f16 m + 16 B = 20 B / 32
//   q5_0: f16 d + 4 B high bits + 16 B = 22 / 32  q5_1: f16 d, f16 m + 4 + 16 = 24 / 32
//   q8_0: f16 d + 32 int8 = 34 / 32
//   q2_k: 16 B scales + 64 B quants + 2 f16 = 84 / 256
//   q3_k: 32 B hmask + 64 B quants + 12 B scales + f16 = 110 / 256
//   q4_k: 2 f16 + 12 B scales + 128 B = 144 / 256   q5_k: 2 f16 + 12 + 32 + 128 = 176 / 256
//   q6_k: 128 B low + 64 B high + 16 int8 scales + f16 = 210 / 256
inline constexpr std::array<DtypeInfo, kDtypeCount> kDtypeInfo = {{
    {Dtype::fp32, "fp32", 1, 4, false, false, true, 0, "F32"},
    {Dtype::fp16, "fp16", 1, 2, false, false, true, 1, "F16"},
    {Dtype::bf16, "bf16", 1, 2, false, false, true, 30, "BF16"},
    {Dtype::fp8_e4m3fn, "fp8_e4m3fn", 1, 1, false, true, false, -1, "F8_E4M3"},
    {Dtype::fp8_e5m2, "fp8_e5m2", 1, 1, false, true, false, -1, "F8_E5M2"},
    {Dtype::int8, "int8", 1, 1, false, false, false, 24, "I8"},
    {Dtype::q4_0, "q4_0", 32, 18, true, false, false, 2, ""},
    {Dtype::q4_1, "q4_1", 32, 20, true, false, false, 3, ""},
    {Dtype::q5_0, "q5_0", 32, 22, true, false, false, 6, ""},
    {Dtype::q5_1, "q5_1", 32, 24, true, false, false, 7, ""},
    {Dtype::q8_0, "q8_0", 32, 34, true, false, false, 8, ""},
    {Dtype::q2_k, "q2_k", 256, 84, true, false, false, 10, ""},
    {Dtype::q3_k, "q3_k", 256, 110, true, false, false, 11, ""},
    {Dtype::q4_k, "q4_k", 256, 144, true, false, false, 12, ""},
    {Dtype::q5_k, "q5_k", 256, 176, true, false, false, 13, ""},
    {Dtype::q6_k, "q6_k", 256, 210, true, false, false, 14, ""},
}};

// Inline: the lowering and the planners ask per tensor.
inline const DtypeInfo& dtype_info(Dtype d) { return kDtypeInfo[static_cast<std::size_t>(d)]; }
std::string_view dtype_name(Dtype d);
// Accepts our names plus the common aliases ("float32", "f16", "BF16", "F8_E4M3", "Q4_K" ...).
std::optional<Dtype> parse_dtype(std::string_view name);
// "fp32, fp16, bf16, ..." for error messages.
std::string_view dtype_list();

// Bytes of one element in a compute dtype (fp32 4, fp16/bf16 2). Requires dtype_info(d).compute.
[[noreturn]] void throw_not_compute_dtype(Dtype d);
inline std::uint32_t compute_elem_bytes(Dtype d) {
  const DtypeInfo& i = dtype_info(d);
  if (!i.compute) [[unlikely]] throw_not_compute_dtype(d);
  return i.block_bytes;
}

// Does this stored tensor need a conversion (upcast / dequant) before a kernel in `compute` can
// use it? True for any storage dtype other than the compute dtype itself.
inline bool needs_conversion(Dtype storage, Dtype compute) { return storage != compute; }

// Exact storage bytes of a tensor with PyTorch-order `shape` ([out, in], innermost last). GGUF
// block types quantize along the innermost axis: each row is rounded up to whole blocks
// (ggml itself requires the row to be a multiple of the block; importers enforce that, inline
// scenarios are allowed a partial last block). A scalar (empty shape) has one element.
// Throws InputError(`what`) on overflow.
Bytes tensor_bytes(Dtype d, std::span<const std::uint64_t> shape, std::string_view what);
std::uint64_t tensor_numel(std::span<const std::uint64_t> shape, std::string_view what);

}  // namespace vf
