#include "harness/core/dtype.h"

#include <array>
#include <cctype>
#include <string>

#include "harness/core/error.h"

namespace vf {
namespace {

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

std::string_view dtype_name(Dtype d) { return dtype_info(d).name; }

std::optional<Dtype> parse_dtype(std::string_view name) {
  const std::string n = lower(name);
  for (const DtypeInfo& i : kDtypeInfo) {
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

void throw_not_compute_dtype(Dtype d) {
  throw InputError("", std::string(dtype_info(d).name) + " is not a compute dtype (use fp32, fp16 or bf16)");
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
