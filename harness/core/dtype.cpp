#include "harness/core/dtype.h"

#include <array>
#include <cctype>
#include <string>

#include "harness/core/error.h"

namespace vf {
namespace {

// Block sizes and bytes per block follow ggml's block structs:
//   q4_0: f16 d + 16 B nibbles = 18 B / 32      q4_1: f16 d, f16 m + 16 B = 20 B / 32
//   q5_0: f16 d + 4 B high bits + 16 B = 22 / 32  q5_1: f16 d, f16 m + 4 + 16 = 24 / 32
//   q8_0: f16 d + 32 int8 = 34 / 32
//   q2_k: 16 B scales + 64 B quants + 2 f16 = 84 / 256
//   q3_k: 32 B hmask + 64 B quants + 12 B scales + f16 = 110 / 256
//   q4_k: 2 f16 + 12 B scales + 128 B = 144 / 256   q5_k: 2 f16 + 12 + 32 + 128 = 176 / 256
//   q6_k: 128 B low + 64 B high + 16 int8 scales + f16 = 210 / 256
constexpr std::array<DtypeInfo, kDtypeCount> kInfo = {{
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

struct Alias {
  std::string_view alias;
  Dtype dtype;
};
constexpr Alias kAliases[] = {
    {"float32", Dtype::fp32},     {"f32", Dtype::fp32},           {"float", Dtype::fp32},
    {"float16", Dtype::fp16},     {"f16", Dtype::fp16},           {"half", Dtype::fp16},
    {"bfloat16", Dtype::bf16},    {"float8_e4m3fn", Dtype::fp8_e4m3fn}, {"f8_e4m3", Dtype::fp8_e4m3fn},
    {"fp8", Dtype::fp8_e4m3fn},   {"float8_e5m2", Dtype::fp8_e5m2}, {"f8_e5m2", Dtype::fp8_e5m2},
    {"i8", Dtype::int8},
};

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

}  // namespace

const DtypeInfo& dtype_info(Dtype d) { return kInfo[static_cast<size_t>(d)]; }
std::string_view dtype_name(Dtype d) { return dtype_info(d).name; }

std::optional<Dtype> parse_dtype(std::string_view name) {
  const std::string n = lower(name);
  for (const DtypeInfo& i : kInfo) {
    if (n == i.name) return i.dtype;
  }
  for (const Alias& a : kAliases) {
    if (n == a.alias) return a.dtype;
  }
  return std::nullopt;
}

std::string_view dtype_list() {
  return "fp32, fp16, bf16, fp8_e4m3fn, fp8_e5m2, int8, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k";
}

std::uint32_t compute_elem_bytes(Dtype d) {
  const DtypeInfo& i = dtype_info(d);
  if (!i.compute) throw InputError("", std::string(i.name) + " is not a compute dtype (use fp32, fp16 or bf16)");
  return i.block_bytes;
}

std::uint64_t tensor_numel(std::span<const std::uint64_t> shape, std::string_view what) {
  std::uint64_t n = 1;
  for (std::uint64_t dim : shape) n = checked_mul(n, dim, what);
  return n;
}

Bytes tensor_bytes(Dtype d, std::span<const std::uint64_t> shape, std::string_view what) {
  const DtypeInfo& i = dtype_info(d);
  if (i.block_elems == 1) return checked_mul(tensor_numel(shape, what), i.block_bytes, what);
  // Block types: rows of the innermost dimension, each rounded up to whole blocks.
  const std::uint64_t inner = shape.empty() ? 1 : shape.back();
  const std::uint64_t rows = shape.empty() ? 1 : tensor_numel(shape.first(shape.size() - 1), what);
  const std::uint64_t blocks_per_row = ceil_div(inner, i.block_elems);
  return checked_mul(checked_mul(rows, blocks_per_row, what), i.block_bytes, what);
}

}  // namespace vf
