// Dtype byte rules (harness/core/dtype.h) against the table in models-and-formats.md B.7.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/core/dtype.h"
#include "harness/core/error.h"

namespace vf {
namespace {

struct Row {
  Dtype dtype;
  std::uint32_t block_elems;
  std::uint32_t block_bytes;
  int ggml_type;
};

// Block elements, bytes per block and GGML type id, as ggml defines them.
constexpr Row kTable[] = {
    {Dtype::fp32, 1, 4, 0},       {Dtype::fp16, 1, 2, 1},      {Dtype::bf16, 1, 2, 30},
    {Dtype::fp8_e4m3fn, 1, 1, -1}, {Dtype::fp8_e5m2, 1, 1, -1}, {Dtype::int8, 1, 1, 24},
    {Dtype::q4_0, 32, 18, 2},     {Dtype::q4_1, 32, 20, 3},    {Dtype::q5_0, 32, 22, 6},
    {Dtype::q5_1, 32, 24, 7},     {Dtype::q8_0, 32, 34, 8},    {Dtype::q2_k, 256, 84, 10},
    {Dtype::q3_k, 256, 110, 11},  {Dtype::q4_k, 256, 144, 12}, {Dtype::q5_k, 256, 176, 13},
    {Dtype::q6_k, 256, 210, 14},
};

TEST(Dtype, BlockTableMatchesGgml) {
  static_assert(std::size(kTable) == kDtypeCount);
  for (const Row& r : kTable) {
    const DtypeInfo& i = dtype_info(r.dtype);
    EXPECT_EQ(i.dtype, r.dtype);
    EXPECT_EQ(i.block_elems, r.block_elems) << i.name;
    EXPECT_EQ(i.block_bytes, r.block_bytes) << i.name;
    EXPECT_EQ(i.ggml_type, r.ggml_type) << i.name;
    EXPECT_EQ(i.gguf_quantized, r.block_elems > 1) << i.name;
  }
}

TEST(Dtype, BitsPerWeight) {
  // B.4: Q8_0 8.5, Q6_K 6.5625, Q5_K 5.5, Q4_K and Q4_0 4.5, Q3_K 3.4375, Q2_K 2.625.
  auto bpw = [](Dtype d) { return 8.0 * dtype_info(d).block_bytes / dtype_info(d).block_elems; };
  EXPECT_DOUBLE_EQ(bpw(Dtype::q8_0), 8.5);
  EXPECT_DOUBLE_EQ(bpw(Dtype::q6_k), 6.5625);
  EXPECT_DOUBLE_EQ(bpw(Dtype::q5_k), 5.5);
  EXPECT_DOUBLE_EQ(bpw(Dtype::q4_k), 4.5);
  EXPECT_DOUBLE_EQ(bpw(Dtype::q4_0), 4.5);
  EXPECT_DOUBLE_EQ(bpw(Dtype::q3_k), 3.4375);
  EXPECT_DOUBLE_EQ(bpw(Dtype::q2_k), 2.625);
  EXPECT_DOUBLE_EQ(bpw(Dtype::q5_1), 6.0);
}

TEST(Dtype, TensorBytes) {
  const std::vector<std::uint64_t> square = {3072, 3072};
  EXPECT_EQ(tensor_bytes(Dtype::q4_k, square, "t"), 3072u * 12u * 144u);  // 12 super-blocks per row
  EXPECT_EQ(tensor_bytes(Dtype::bf16, square, "t"), 3072u * 3072u * 2u);
  EXPECT_EQ(tensor_bytes(Dtype::fp8_e4m3fn, square, "t"), 3072u * 3072u);
  // A row of 33 elements needs two q8_0 blocks.
  const std::vector<std::uint64_t> row33 = {33};
  EXPECT_EQ(tensor_bytes(Dtype::q8_0, row33, "t"), 2u * 34u);
  const std::vector<std::uint64_t> rows33 = {10, 33};
  EXPECT_EQ(tensor_bytes(Dtype::q8_0, rows33, "t"), 10u * 2u * 34u);
  // FLUX.1 single linear1 in ggml order ne = (3072, 21504): 21504 rows of 12 q6_k blocks.
  EXPECT_EQ(tensor_bytes(Dtype::q6_k, std::vector<std::uint64_t>{21504, 3072}, "t"), 21504u * 12u * 210u);
  // A scalar is one element.
  EXPECT_EQ(tensor_bytes(Dtype::fp32, std::vector<std::uint64_t>{}, "t"), 4u);
  EXPECT_EQ(tensor_numel(std::vector<std::uint64_t>{}, "t"), 1u);
  EXPECT_EQ(tensor_numel(std::vector<std::uint64_t>{4, 0, 7}, "t"), 0u);
}

TEST(Dtype, TensorBytesOverflowNamesTheTensor) {
  const std::vector<std::uint64_t> huge = {1ull << 40, 1ull << 40};
  try {
    (void)tensor_numel(huge, "models[0].modules[1].tensors[0]");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "models[0].modules[1].tensors[0]");
  }
  EXPECT_THROW((void)tensor_bytes(Dtype::fp32, std::vector<std::uint64_t>{1ull << 62}, "t"), InputError);
  EXPECT_THROW((void)tensor_bytes(Dtype::q4_0, std::vector<std::uint64_t>{1ull << 40, 1ull << 40}, "t"), InputError);
}

TEST(Dtype, NamesAndAliases) {
  for (const Row& r : kTable) EXPECT_EQ(parse_dtype(dtype_name(r.dtype)), r.dtype);
  EXPECT_EQ(parse_dtype("BF16"), Dtype::bf16);
  EXPECT_EQ(parse_dtype("float16"), Dtype::fp16);
  EXPECT_EQ(parse_dtype("F8_E4M3"), Dtype::fp8_e4m3fn);
  EXPECT_EQ(parse_dtype("float8_e5m2"), Dtype::fp8_e5m2);
  EXPECT_EQ(parse_dtype("Q4_K"), Dtype::q4_k);
  EXPECT_EQ(parse_dtype("f32"), Dtype::fp32);
  EXPECT_EQ(parse_dtype("q4_k_m"), std::nullopt);
  EXPECT_EQ(parse_dtype(""), std::nullopt);
  EXPECT_NE(dtype_list().find("q6_k"), std::string_view::npos);
  EXPECT_EQ(dtype_info(Dtype::fp8_e4m3fn).safetensors, "F8_E4M3");
}

TEST(Dtype, ComputeDtypes) {
  EXPECT_EQ(compute_elem_bytes(Dtype::fp32), 4u);
  EXPECT_EQ(compute_elem_bytes(Dtype::fp16), 2u);
  EXPECT_EQ(compute_elem_bytes(Dtype::bf16), 2u);
  EXPECT_THROW((void)compute_elem_bytes(Dtype::q8_0), InputError);
  EXPECT_THROW((void)compute_elem_bytes(Dtype::fp8_e4m3fn), InputError);
  EXPECT_TRUE(needs_conversion(Dtype::fp8_e4m3fn, Dtype::bf16));
  EXPECT_FALSE(needs_conversion(Dtype::bf16, Dtype::bf16));
}

}  // namespace
}  // namespace vf
