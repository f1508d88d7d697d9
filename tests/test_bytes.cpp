// Byte arithmetic and size parsing (harness/core/bytes.h).
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "harness/core/bytes.h"
#include "harness/core/error.h"

namespace vf {
namespace {

std::string parse_error(std::string_view text) {
  try {
    (void)parse_size(text, "--vram");
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "--vram");
    return e.what();
  }
  return "<no error>";
}

TEST(Bytes, ParseSizeUnits) {
  EXPECT_EQ(parse_size("24GiB", "--vram"), 24 * GiB);
  EXPECT_EQ(parse_size("1.5GiB", "--vram"), 3 * GiB / 2);
  EXPECT_EQ(parse_size("100MB", "--vram"), 100 * MiB);  // ComfyUI's and PyTorch's "MB" are MiB
  EXPECT_EQ(parse_size("400MiB", "--vram"), 400 * MiB);
  EXPECT_EQ(parse_size("512KiB", "--vram"), 512 * KiB);
  EXPECT_EQ(parse_size("24G", "--vram"), 24 * GiB);
  EXPECT_EQ(parse_size("2048B", "--vram"), 2048u);
  EXPECT_EQ(parse_size("123", "--vram"), 123u);
  EXPECT_EQ(parse_size("0", "--vram"), 0u);
  EXPECT_EQ(parse_size(" 24 GiB ", "--vram"), 24 * GiB);
  EXPECT_EQ(parse_size("0.5KiB", "--vram"), 512u);
  EXPECT_EQ(parse_size("1TiB", "--vram"), 1024 * GiB);
  EXPECT_EQ(parse_size("18446744073709551615", "--vram"), ~Bytes{0});
}

TEST(Bytes, ParseSizeErrors) {
  EXPECT_NE(parse_error("-1GiB").find("negative"), std::string::npos);
  EXPECT_NE(parse_error("18446744073709551616").find("overflows"), std::string::npos);
  EXPECT_NE(parse_error("17179869184GiB").find("overflows"), std::string::npos);  // 2^34 GiB = 2^64 B
  EXPECT_NE(parse_error("99999999999999999999.5GiB").find("overflows"), std::string::npos);
  EXPECT_NE(parse_error("24GiBx").find("unknown unit"), std::string::npos);
  EXPECT_NE(parse_error("24gib").find("unknown unit"), std::string::npos);
  EXPECT_NE(parse_error("GiB").find("not a size"), std::string::npos);
  EXPECT_NE(parse_error("").find("empty"), std::string::npos);
  EXPECT_NE(parse_error("1.2.3GiB").find("not a size"), std::string::npos);
  EXPECT_NE(parse_error("1.5").find("needs a unit"), std::string::npos);
  EXPECT_NE(parse_error("1.1KiB").find("whole number of bytes"), std::string::npos);
  EXPECT_NE(parse_error("+5GiB").find("not a size"), std::string::npos);
}

TEST(Bytes, CheckedArithmetic) {
  const Bytes max = ~Bytes{0};
  EXPECT_EQ(checked_add(1, 2, "x"), 3u);
  EXPECT_THROW((void)checked_add(max, 1, "x"), InputError);
  EXPECT_EQ(checked_sub(5, 5, "x"), 0u);
  EXPECT_THROW((void)checked_sub(4, 5, "x"), InputError);
  EXPECT_EQ(checked_mul(GiB, 24, "x"), 24 * GiB);
  EXPECT_THROW((void)checked_mul(Bytes{1} << 32, Bytes{1} << 32, "x"), InputError);
  EXPECT_EQ(checked_round_up(1025, 512, "x"), 1536u);
  EXPECT_EQ(checked_round_up(1024, 512, "x"), 1024u);
  EXPECT_THROW((void)checked_round_up(max, 512, "x"), InputError);
  EXPECT_EQ(round_up(1, 2 * MiB), 2 * MiB);
  EXPECT_EQ(ceil_div(33, 32), 2u);
  EXPECT_EQ(ceil_div(32, 32), 1u);
  EXPECT_EQ(sat_sub(3, 5), 0u);
  try {
    (void)checked_mul(max, 2, "models[0].modules[3].bytes");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "models[0].modules[3].bytes");
  }
}

TEST(Bytes, ScaleBytesTruncatesLikeComfyUI) {
  EXPECT_EQ(scale_bytes(10, 1.1, "x"), 11u);
  EXPECT_EQ(scale_bytes(10, 1.15, "x"), 11u);  // int() truncates toward zero
  EXPECT_EQ(scale_bytes(GiB, 0.0, "x"), 0u);
  EXPECT_THROW((void)scale_bytes(1, -0.5, "x"), InputError);
  EXPECT_THROW((void)scale_bytes(1, std::numeric_limits<double>::quiet_NaN(), "x"), InputError);
  EXPECT_THROW((void)scale_bytes(~Bytes{0}, 2.0, "x"), InputError);
}

TEST(Bytes, Formatting) {
  EXPECT_EQ(format_mib(1280 * MiB), "1280.00 MiB");
  EXPECT_EQ(format_mib(MiB / 2), "0.50 MiB");
  EXPECT_EQ(format_signed_mib(32 * static_cast<std::int64_t>(MiB)), "+32.00 MiB");
  EXPECT_EQ(format_signed_mib(-static_cast<std::int64_t>(MiB)), "-1.00 MiB");
  EXPECT_EQ(format_size(24 * GiB), "24 GiB");
  EXPECT_EQ(format_size(24 * GiB + GiB / 2), "24.50 GiB");
  EXPECT_EQ(format_size(400 * MiB), "400 MiB");
  EXPECT_DOUBLE_EQ(to_mib(3 * MiB / 2), 1.5);
}

}  // namespace
}  // namespace vf
