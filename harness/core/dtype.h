// Storage and compute dtypes, with the exact byte rules of each: plain element types, the fp8
// formats, and the GGUF block-quantized types (block size and bytes per block as in ggml).
#pragma once

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

const DtypeInfo& dtype_info(Dtype d);
std::string_view dtype_name(Dtype d);
// Accepts our names plus the common aliases ("float32", "f16", "BF16", "F8_E4M3", "Q4_K" ...).
std::optional<Dtype> parse_dtype(std::string_view name);
// "fp32, fp16, bf16, ..." for error messages.
std::string_view dtype_list();

// Bytes of one element in a compute dtype (fp32 4, fp16/bf16 2). Requires dtype_info(d).compute.
std::uint32_t compute_elem_bytes(Dtype d);

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
