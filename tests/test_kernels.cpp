// Host reference of the conversion kernels (kernels/convert.h, kernels/reference.h), checked
// against decoders and rounders written differently here: exponent/mantissa arithmetic with
// ldexp in double, nearest-value rounding by comparing candidates, and GGUF blocks decoded with
// ggml's loop structure (whole block at a time, in the order the format describes) rather than
// the library's runs of 8.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ios>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "harness/core/error.h"
#include "kernels/convert.h"
#include "kernels/reference.h"

namespace {

using vf::Dtype;
namespace k = vf::kernels;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

// Equal as bit patterns (so +0 != -0), or both NaN.
::testing::AssertionResult same_float(float got, double want) {
  if (std::isnan(want)) {
    if (std::isnan(got)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "got " << got << ", want NaN";
  }
  const auto w = static_cast<float>(want);
  if (static_cast<double>(w) != want) return ::testing::AssertionFailure() << want << " is not a float";
  if (bits(got) == bits(w)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << std::hexfloat << "got " << got << " (0x" << std::hex << bits(got)
                                       << "), want " << w << " (0x" << bits(w) << ")";
}

// --- independent decoders -----------------------------------------------------------------

double ind_e4m3(std::uint8_t c) {
  const int s = c >> 7;
  const int e = (c >> 3) & 15;
  const int m = c & 7;
  if (e == 15 && m == 7) return kNaN;
  const double mag = e == 0 ? std::ldexp(m, -6 - 3) : std::ldexp(8 + m, e - 7 - 3);
  return s != 0 ? -mag : mag;
}

double ind_e5m2(std::uint8_t c) {
  const int s = c >> 7;
  const int e = (c >> 2) & 31;
  const int m = c & 3;
  double mag = 0;
  if (e == 31) {
    if (m != 0) return kNaN;
    mag = std::numeric_limits<double>::infinity();
  } else {
    mag = e == 0 ? std::ldexp(m, -14 - 2) : std::ldexp(4 + m, e - 15 - 2);
  }
  return s != 0 ? -mag : mag;
}

double ind_fp16(std::uint16_t c) {
  const int s = c >> 15;
  const int e = (c >> 10) & 31;
  const int m = c & 1023;
  double mag = 0;
  if (e == 31) {
    if (m != 0) return kNaN;
    mag = std::numeric_limits<double>::infinity();
  } else {
    mag = e == 0 ? std::ldexp(m, -14 - 10) : std::ldexp(1024 + m, e - 15 - 10);
  }
  return s != 0 ? -mag : mag;
}

double ind_bf16(std::uint16_t c) {
  const int s = c >> 15;
  const int e = (c >> 7) & 255;
  const int m = c & 127;
  double mag = 0;
  if (e == 255) {
    if (m != 0) return kNaN;
    mag = std::numeric_limits<double>::infinity();
  } else {
    mag = e == 0 ? std::ldexp(m, -126 - 7) : std::ldexp(128 + m, e - 127 - 7);
  }
  return s != 0 ? -mag : mag;
}

// --- independent rounders (round to nearest, ties to even), NaN excluded ------------------

// binary16 by scaling to units of the ulp and rounding with nearbyint (ties to even in the
// default rounding mode), then looking the value up among all binary16 values.
std::uint16_t ind_to_fp16(float f) {
  static const std::map<double, std::uint16_t> by_value = [] {
    std::map<double, std::uint16_t> m;
    for (std::uint32_t c = 0; c < 0x7c00; ++c) m.emplace(ind_fp16(static_cast<std::uint16_t>(c)), c);
    return m;
  }();
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;  // past the tie between 65504 and 2^16
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, 0.5 <= m < 1
  const int ulp_exp = a < std::ldexp(1.0, -14) ? -24 : e - 1 - 10;
  const double r = std::nearbyint(std::ldexp(a, -ulp_exp)) * std::ldexp(1.0, ulp_exp);
  return static_cast<std::uint16_t>(sign | by_value.at(r));
}

// bfloat16 by comparing the two candidates around f (truncated and one ulp away from zero).
std::uint16_t ind_to_bf16(float f) {
  const std::uint32_t x = bits(f);
  const auto lo = static_cast<std::uint16_t>(x >> 16);
  const auto hi = static_cast<std::uint16_t>(lo + 1);
  const double a = std::fabs(static_cast<double>(f));
  const double vlo = std::fabs(ind_bf16(lo));
  // Above the largest bf16 the next step is 2^128 (which rounds to inf).
  const double vhi = (hi & 0x7fff) == 0x7f80 ? std::ldexp(1.0, 128) : std::fabs(ind_bf16(hi));
  const double dlo = a - vlo;
  const double dhi = vhi - a;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) == 0 ? lo : hi;
}

// --- independent GGUF block decoders (ggml's loop structure) -------------------------------

float half_at(const std::uint8_t* p) {
  return static_cast<float>(ind_fp16(static_cast<std::uint16_t>(p[0] | (p[1] << 8))));
}

std::vector<float> ind_q8_0(const std::uint8_t* b) {
  std::vector<float> y(32);
  const float d = half_at(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<std::int8_t>(b[2 + j])) * d;
  return y;
}

std::vector<float> ind_q4_0(const std::uint8_t* b) {
  std::vector<float> y(32);
  const float d = half_at(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((b[2 + j] & 0x0f) - 8) * d;
    y[j + 16] = static_cast<float>((b[2 + j] >> 4) - 8) * d;
  }
  return y;
}

std::vector<float> ind_q4_k(const std::uint8_t* b) {
  // Unpack the 8 six-bit scales and mins first, as a table.
  const std::uint8_t* s = b + 4;
  std::array<int, 8> sc{};
  std::array<int, 8> mn{};
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] % 64;
    mn[j] = s[j + 4] % 64;
    sc[j + 4] = (s[j + 8] % 16) + 16 * (s[j] / 64);
    mn[j + 4] = (s[j + 8] / 16) + 16 * (s[j + 4] / 64);
  }
  std::vector<float> y;
  const float d = half_at(b);
  const float dmin = half_at(b + 2);
  const std::uint8_t* q = b + 16;
  for (int chunk = 0; chunk < 4; ++chunk, q += 32) {  // 64 outputs from 32 bytes
    const float d1 = d * static_cast<float>(sc[2 * chunk]);
    const float m1 = dmin * static_cast<float>(mn[2 * chunk]);
    const float d2 = d * static_cast<float>(sc[2 * chunk + 1]);
    const float m2 = dmin * static_cast<float>(mn[2 * chunk + 1]);
    for (int l = 0; l < 32; ++l) y.push_back(d1 * static_cast<float>(q[l] & 0xf) - m1);
    for (int l = 0; l < 32; ++l) y.push_back(d2 * static_cast<float>(q[l] >> 4) - m2);
  }
  return y;
}

std::vector<float> ind_q6_k(const std::uint8_t* b) {
  std::vector<float> y(256);
  const float d = half_at(b + 208);
  const std::uint8_t* ql = b;
  const std::uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
  for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8) {
    float* out = y.data() + 128 * half;
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      out[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      out[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      out[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      out[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
  return y;
}

// --- helpers around the reference API -----------------------------------------------------

std::span<const std::byte> as_bytes(const std::vector<std::uint8_t>& v) {
  return std::as_bytes(std::span<const std::uint8_t>(v));
}

std::vector<float> dequant_f32(const std::vector<std::uint8_t>& src, Dtype type, std::uint64_t n) {
  std::vector<float> out(n);
  k::dequant(as_bytes(src), type, n, std::as_writable_bytes(std::span<float>(out)), Dtype::fp32);
  return out;
}

std::vector<std::uint16_t> dequant_u16(const std::vector<std::uint8_t>& src, Dtype type, std::uint64_t n,
                                       Dtype to) {
  std::vector<std::uint16_t> out(n);
  k::dequant(as_bytes(src), type, n, std::as_writable_bytes(std::span<std::uint16_t>(out)), to);
  return out;
}

void put_u16(std::vector<std::uint8_t>& b, std::size_t at, std::uint16_t v) {
  b[at] = static_cast<std::uint8_t>(v & 0xff);
  b[at + 1] = static_cast<std::uint8_t>(v >> 8);
}

// ===========================================================================================
// fp8

TEST(KernelFp8, E4m3fnAll256CodesMatchIndependentDecoder) {
  int nans = 0;
  int subnormals = 0;
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const float got = k::fp8_e4m3fn_to_float(code);
    EXPECT_TRUE(same_float(got, ind_e4m3(code))) << "code 0x" << std::hex << c;
    EXPECT_FALSE(std::isinf(got)) << "e4m3fn has no infinities: code 0x" << std::hex << c;
    nans += std::isnan(got) ? 1 : 0;
    subnormals += std::fpclassify(ind_e4m3(code)) != FP_ZERO && (c & 0x78) == 0 ? 1 : 0;
  }
  EXPECT_EQ(nans, 2);         // 0x7f and 0xff only
  EXPECT_EQ(subnormals, 14);  // mantissa 1..7, both signs
  EXPECT_TRUE(std::isnan(k::fp8_e4m3fn_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(k::fp8_e4m3fn_to_float(0xff)));
  EXPECT_TRUE(same_float(k::fp8_e4m3fn_to_float(0x7e), 448.0));   // 1.75 * 2^8, the max
  EXPECT_TRUE(same_float(k::fp8_e4m3fn_to_float(0xfe), -448.0));
  EXPECT_TRUE(same_float(k::fp8_e4m3fn_to_float(0x00), 0.0));
  EXPECT_TRUE(same_float(k::fp8_e4m3fn_to_float(0x80), -0.0));    // sign bit kept on zero
  EXPECT_TRUE(same_float(k::fp8_e4m3fn_to_float(0x01), 0x1p-9));  // smallest subnormal
  EXPECT_TRUE(same_float(k::fp8_e4m3fn_to_float(0x07), 7 * 0x1p-9));  // largest subnormal
  EXPECT_TRUE(same_float(k::fp8_e4m3fn_to_float(0x08), 0x1p-6));  // smallest normal
  EXPECT_TRUE(same_float(k::fp8_e4m3fn_to_float(0x38), 1.0));
  EXPECT_TRUE(same_float(k::fp8_e4m3fn_to_float(0x78), 256.0));   // exponent 15 is finite in "fn"
}

TEST(KernelFp8, E5m2All256CodesMatchIndependentDecoder) {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const float got = k::fp8_e5m2_to_float(code);
    EXPECT_TRUE(same_float(got, ind_e5m2(code))) << "code 0x" << std::hex << c;
    nans += std::isnan(got) ? 1 : 0;
  }
  EXPECT_EQ(nans, 6);  // 0x7d-0x7f, 0xfd-0xff
  EXPECT_TRUE(same_float(k::fp8_e5m2_to_float(0x7b), 57344.0));  // 1.75 * 2^15, the max
  EXPECT_TRUE(same_float(k::fp8_e5m2_to_float(0xfb), -57344.0));
  EXPECT_TRUE(same_float(k::fp8_e5m2_to_float(0x7c), std::numeric_limits<double>::infinity()));
  EXPECT_TRUE(same_float(k::fp8_e5m2_to_float(0xfc), -std::numeric_limits<double>::infinity()));
  EXPECT_TRUE(same_float(k::fp8_e5m2_to_float(0x80), -0.0));
  EXPECT_TRUE(same_float(k::fp8_e5m2_to_float(0x01), 0x1p-16));  // smallest subnormal
  EXPECT_TRUE(same_float(k::fp8_e5m2_to_float(0x03), 3 * 0x1p-16));
  EXPECT_TRUE(same_float(k::fp8_e5m2_to_float(0x04), 0x1p-14));  // smallest normal
  EXPECT_TRUE(same_float(k::fp8_e5m2_to_float(0x3c), 1.0));
}

// ===========================================================================================
// fp16 / bf16

TEST(KernelHalf, Fp16AllCodesDecodeExactly) {
  for (std::uint32_t c = 0; c < 0x10000; ++c) {
    const auto h = static_cast<std::uint16_t>(c);
    ASSERT_TRUE(same_float(k::fp16_bits_to_float(h), ind_fp16(h))) << "code 0x" << std::hex << c;
  }
  EXPECT_TRUE(same_float(k::fp16_bits_to_float(0x0000), 0.0));
  EXPECT_TRUE(same_float(k::fp16_bits_to_float(0x8000), -0.0));
  EXPECT_TRUE(same_float(k::fp16_bits_to_float(0x7c00), std::numeric_limits<double>::infinity()));
  EXPECT_TRUE(same_float(k::fp16_bits_to_float(0xfc00), -std::numeric_limits<double>::infinity()));
  EXPECT_TRUE(std::isnan(k::fp16_bits_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(k::fp16_bits_to_float(0x7c01)));  // signalling pattern is still NaN
  EXPECT_TRUE(same_float(k::fp16_bits_to_float(0x0001), 0x1p-24));          // smallest subnormal
  EXPECT_TRUE(same_float(k::fp16_bits_to_float(0x03ff), 1023 * 0x1p-24));   // largest subnormal
  EXPECT_TRUE(same_float(k::fp16_bits_to_float(0x0400), 0x1p-14));          // smallest normal
  EXPECT_TRUE(same_float(k::fp16_bits_to_float(0x7bff), 65504.0));          // max
  EXPECT_TRUE(same_float(k::fp16_bits_to_float(0x3c00), 1.0));
  // NaN payload and sign survive the widening (bits 13.. of the float mantissa).
  EXPECT_EQ(bits(k::fp16_bits_to_float(0xfe01)), 0xffc02000u);
}

TEST(KernelHalf, Bf16AllCodesDecodeExactly) {
  for (std::uint32_t c = 0; c < 0x10000; ++c) {
    const auto h = static_cast<std::uint16_t>(c);
    ASSERT_TRUE(same_float(k::bf16_bits_to_float(h), ind_bf16(h))) << "code 0x" << std::hex << c;
    ASSERT_EQ(bits(k::bf16_bits_to_float(h)), c << 16);  // NaN payloads too
  }
  EXPECT_TRUE(same_float(k::bf16_bits_to_float(0x8000), -0.0));
  EXPECT_TRUE(same_float(k::bf16_bits_to_float(0x7f80), std::numeric_limits<double>::infinity()));
  EXPECT_TRUE(same_float(k::bf16_bits_to_float(0xff80), -std::numeric_limits<double>::infinity()));
  EXPECT_TRUE(std::isnan(k::bf16_bits_to_float(0x7fc0)));
  EXPECT_TRUE(same_float(k::bf16_bits_to_float(0x0001), 0x1p-133));          // smallest subnormal
  EXPECT_TRUE(same_float(k::bf16_bits_to_float(0x7f7f), 0x1.fep127));        // max
  EXPECT_TRUE(same_float(k::bf16_bits_to_float(0x3f80), 1.0));
}

TEST(KernelHalf, FloatToFp16RoundsToNearestEven) {
  const auto h = [](double v) { return k::float_to_fp16_bits_soft(static_cast<float>(v)); };
  EXPECT_EQ(h(0.0), 0x0000);
  EXPECT_EQ(h(-0.0), 0x8000);
  EXPECT_EQ(h(1.0), 0x3c00);
  // Ties: 1 + 2^-11 is halfway between 1 (even) and 1 + 2^-10 (odd): down to 1.
  EXPECT_EQ(h(1.0 + 0x1p-11), 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even): up.
  EXPECT_EQ(h(1.0 + 3 * 0x1p-11), 0x3c02);
  EXPECT_EQ(h(1.0 + 0x1p-11 + 0x1p-20), 0x3c01);  // just above the tie: up
  EXPECT_EQ(h(1.0 + 0x1p-11 - 0x1p-20), 0x3c00);  // just below: down
  // Largest finite and overflow: 65520 is the tie between 65504 (odd) and 2^16: to inf.
  EXPECT_EQ(h(65504.0), 0x7bff);
  EXPECT_EQ(h(65519.99609375), 0x7bff);
  EXPECT_EQ(h(65520.0), 0x7c00);
  EXPECT_EQ(h(-65520.0), 0xfc00);
  EXPECT_EQ(h(1e10), 0x7c00);
  EXPECT_EQ(k::float_to_fp16_bits_soft(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(k::float_to_fp16_bits_soft(-std::numeric_limits<float>::infinity()), 0xfc00);
  // Subnormals: 2^-24 is the smallest; 2^-25 ties to 0 (even); just above it rounds up to 2^-24.
  EXPECT_EQ(h(0x1p-24), 0x0001);
  EXPECT_EQ(h(0x1p-25), 0x0000);
  EXPECT_EQ(h(-0x1p-25), 0x8000);
  EXPECT_EQ(k::float_to_fp16_bits_soft(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(h(3 * 0x1p-25), 0x0002);               // tie between 1 and 2 units: even
  EXPECT_EQ(h(5 * 0x1p-25), 0x0002);               // tie between 2 and 3 units: even
  EXPECT_EQ(h(1023 * 0x1p-24 + 0x1p-25), 0x0400);  // tie into the smallest normal (0x3ff is odd)
  EXPECT_EQ(h(0x1p-14), 0x0400);
  EXPECT_EQ(k::float_to_fp16_bits_soft(std::numeric_limits<float>::denorm_min()), 0x0000);
  // NaN stays NaN, sign kept.
  const std::uint16_t nan = k::float_to_fp16_bits_soft(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  EXPECT_EQ(k::float_to_fp16_bits_soft(std::bit_cast<float>(0xffc00000u)), 0xfe00);
  EXPECT_NE(k::float_to_fp16_bits_soft(std::bit_cast<float>(0x7f800001u)) & 0x03ff, 0);  // not inf
}

TEST(KernelHalf, FloatToFp16MatchesIndependentRounder) {
  // Every binary16 value round-trips.
  for (std::uint32_t c = 0; c < 0x10000; ++c) {
    const auto code = static_cast<std::uint16_t>(c);
    if ((code & 0x7c00) == 0x7c00 && (code & 0x3ff) != 0) continue;  // NaN
    ASSERT_EQ(k::float_to_fp16_bits_soft(k::fp16_bits_to_float(code)), code) << std::hex << c;
  }
  // Random floats concentrated on the binary16 range (exponents 2^-27 .. 2^17), and midpoints.
  std::mt19937 rng(20240611);
  std::uniform_int_distribution<std::uint32_t> man(0, 0x7fffff);
  std::uniform_int_distribution<std::uint32_t> exp(127 - 27, 127 + 17);
  for (int i = 0; i < 400000; ++i) {
    const std::uint32_t x = ((rng() & 1u) << 31) | (exp(rng) << 23) | man(rng);
    const float f = std::bit_cast<float>(x);
    ASSERT_EQ(k::float_to_fp16_bits_soft(f), ind_to_fp16(f)) << std::hexfloat << f;
    // The exact midpoint above f's truncation (13 dropped bits = 0x1000): ties.
    const float tie = std::bit_cast<float>((x & ~0x1fffu) | 0x1000u);
    ASSERT_EQ(k::float_to_fp16_bits_soft(tie), ind_to_fp16(tie)) << std::hexfloat << tie;
  }
}

TEST(KernelHalf, FloatToBf16RoundsToNearestEven) {
  const auto b = [](double v) { return k::float_to_bf16_bits_soft(static_cast<float>(v)); };
  EXPECT_EQ(b(1.0), 0x3f80);
  EXPECT_EQ(b(-0.0), 0x8000);
  EXPECT_EQ(b(1.0 + 0x1p-8), 0x3f80);             // tie, 1.0 is even: down
  EXPECT_EQ(b(1.0 + 3 * 0x1p-8), 0x3f82);         // tie, 1 + 2^-7 is odd: up
  EXPECT_EQ(b(1.0 + 0x1p-8 + 0x1p-23), 0x3f81);   // above the tie: up
  EXPECT_EQ(b(0x1.fep127), 0x7f7f);               // max
  EXPECT_EQ(k::float_to_bf16_bits_soft(std::numeric_limits<float>::max()), 0x7f80);  // overflow
  EXPECT_EQ(k::float_to_bf16_bits_soft(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(k::float_to_bf16_bits_soft(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(b(0x1p-133), 0x0001);                 // smallest bf16 subnormal
  EXPECT_EQ(k::float_to_bf16_bits_soft(std::numeric_limits<float>::denorm_min()), 0x0000);
  // NaN stays NaN: a payload only in the low 16 bits must not round into inf.
  for (const std::uint32_t x : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
    const std::uint16_t r = k::float_to_bf16_bits_soft(std::bit_cast<float>(x));
    EXPECT_TRUE(std::isnan(k::bf16_bits_to_float(r))) << std::hex << x << " -> " << r;
    EXPECT_EQ(r & 0x8000u, (x >> 16) & 0x8000u);
  }
}

TEST(KernelHalf, FloatToBf16MatchesIndependentRounder) {
  std::mt19937 rng(7);
  for (int i = 0; i < 400000; ++i) {
    const std::uint32_t x = rng();
    const float f = std::bit_cast<float>(x);
    if (std::isnan(f)) continue;
    ASSERT_EQ(k::float_to_bf16_bits_soft(f), ind_to_bf16(f)) << std::hex << x;
    const float tie = std::bit_cast<float>((x & 0xffff0000u) | 0x8000u);
    if (!std::isnan(tie)) {
      ASSERT_EQ(k::float_to_bf16_bits_soft(tie), ind_to_bf16(tie)) << std::hex << x;
    }
  }
}

// ===========================================================================================
// GGUF blocks, built byte by byte

TEST(KernelGguf, Q8_0HandBuiltBlock) {
  // d = 0x3800 = 0.5; q[j] = j - 16, except q[0] = -128 and q[31] = 127.
  std::vector<std::uint8_t> blk(34);
  put_u16(blk, 0, 0x3800);
  for (int j = 0; j < 32; ++j) blk[2 + j] = static_cast<std::uint8_t>(j - 16);
  blk[2] = 0x80;   // -128
  blk[33] = 0x7f;  // 127
  // y = q * 0.5
  const std::array<float, 32> want = {
      -64.0f, -7.5f, -7.0f, -6.5f, -6.0f, -5.5f, -5.0f, -4.5f, -4.0f, -3.5f, -3.0f,
      -2.5f,  -2.0f, -1.5f, -1.0f, -0.5f, 0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  2.5f,
      3.0f,   3.5f,  4.0f,  4.5f,  5.0f,  5.5f,  6.0f,  6.5f,  7.0f,  63.5f};
  const std::vector<float> got = dequant_f32(blk, Dtype::q8_0, 32);
  for (int j = 0; j < 32; ++j) EXPECT_TRUE(same_float(got[j], want[j])) << "element " << j;
}

TEST(KernelGguf, Q4_0HandBuiltBlock) {
  // d = 0x4000 = 2.0; byte j = (15 - j) << 4 | j: element j has nibble j, element j + 16 has
  // nibble 15 - j. y = (nibble - 8) * 2.
  std::vector<std::uint8_t> blk(18);
  put_u16(blk, 0, 0x4000);
  for (int j = 0; j < 16; ++j) blk[2 + j] = static_cast<std::uint8_t>(((15 - j) << 4) | j);
  const std::array<float, 32> want = {
      -16, -14, -12, -10, -8, -6, -4, -2, 0,  2,  4,  6,  8,   10,  12,  14,   // (j - 8) * 2
      14,  12,  10,  8,   6,  4,  2,  0,  -2, -4, -6, -8, -10, -12, -14, -16};  // (7 - j) * 2
  const std::vector<float> got = dequant_f32(blk, Dtype::q4_0, 32);
  for (int j = 0; j < 32; ++j) EXPECT_TRUE(same_float(got[j], want[j])) << "element " << j;
}

TEST(KernelGguf, Q4_KHandBuiltBlock) {
  // d = 0x3c00 = 1.0, dmin = 0x3800 = 0.5. Chosen 6-bit scales / mins per sub-block (the top two
  // bits of mins 4-7 differ from those of scales 4-7, so mixing up where they live shows):
  //   scale = {1, 2, 3, 63, 17, 33, 48, 5}, min = {0, 4, 10, 63, 40, 20, 1, 50}
  // Packed (bytes 0-3: scale j | top2(scale j+4) << 6; 4-7: min j | top2(min j+4) << 6;
  // 8-11: low4(scale j+4) | low4(min j+4) << 4):
  //   [0] 1 | 1<<6 = 0x41   [1] 2 | 2<<6 = 0x82   [2] 3 | 3<<6 = 0xc3   [3] 63 | 0<<6 = 0x3f
  //   [4] 0 | 2<<6 = 0x80   [5] 4 | 1<<6 = 0x44   [6] 10 | 0<<6 = 0x0a  [7] 63 | 3<<6 = 0xff
  //   [8] 1 | 8<<4 = 0x81   [9] 1 | 4<<4 = 0x41   [10] 0 | 1<<4 = 0x10  [11] 5 | 2<<4 = 0x25
  // Quants: byte 32c + l (c = 0..3, l = 0..31) = (15 - l % 16) << 4 | l % 16, so element
  // 64c + l has q = l % 16 (sub-block 2c) and element 64c + 32 + l has q = 15 - l % 16
  // (sub-block 2c + 1). y = (1.0 * scale) * q - 0.5 * min.
  std::vector<std::uint8_t> blk(144);
  put_u16(blk, 0, 0x3c00);
  put_u16(blk, 2, 0x3800);
  const std::array<std::uint8_t, 12> packed = {0x41, 0x82, 0xc3, 0x3f, 0x80, 0x44,
                                               0x0a, 0xff, 0x81, 0x41, 0x10, 0x25};
  std::memcpy(blk.data() + 4, packed.data(), 12);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) blk[16 + 32 * c + l] = static_cast<std::uint8_t>(((15 - l % 16) << 4) | (l % 16));
  }
  const std::array<float, 8> d1 = {1, 2, 3, 63, 17, 33, 48, 5};         // 1.0 * scale
  const std::array<float, 8> m1 = {0, 2, 5, 31.5f, 20, 10, 0.5f, 25};  // 0.5 * min
  const std::vector<float> got = dequant_f32(blk, Dtype::q4_k, 256);
  for (int i = 0; i < 256; ++i) {
    const int sub = i / 32;
    const int l = i % 32;
    const int q = sub % 2 == 0 ? l % 16 : 15 - l % 16;
    EXPECT_TRUE(same_float(got[i], d1[sub] * static_cast<float>(q) - m1[sub])) << "element " << i;
  }
  // Spot values worked out by hand, one per sub-block:
  EXPECT_TRUE(same_float(got[0], 0.0));           // sub 0: 1 * 0 - 0
  EXPECT_TRUE(same_float(got[32], 28.0));         // sub 1: 2 * 15 - 2
  EXPECT_TRUE(same_float(got[64 + 7], 16.0));     // sub 2: 3 * 7 - 5
  EXPECT_TRUE(same_float(got[96 + 1], 850.5));    // sub 3: 63 * 14 - 31.5
  EXPECT_TRUE(same_float(got[128 + 15], 235.0));  // sub 4: 17 * 15 - 20
  EXPECT_TRUE(same_float(got[160 + 0], 485.0));   // sub 5: 33 * 15 - 10
  EXPECT_TRUE(same_float(got[192 + 2], 95.5));    // sub 6: 48 * 2 - 0.5
  EXPECT_TRUE(same_float(got[224 + 5], 25.0));    // sub 7: 5 * 10 - 25
  EXPECT_TRUE(same_float(got[224 + 15], -25.0));  // sub 7: 5 * 0 - 25
}

TEST(KernelGguf, Q6_KHandBuiltBlock) {
  // d = 0x3400 = 0.25; scales = {1, -1, 2, -2, 3, -3, 4, -4, 127, -128, 5, -5, 6, -6, 7, -7}.
  // The 6-bit quant of element i is q(i) = (i + i / 32) % 64 (the i / 32 term makes the four
  // quarters that share a byte differ). It is placed as the format says: with h = i / 128,
  // k = (i % 128) / 32, l = i % 32: low 4 bits in ql[64h + l + 32(k & 1)] (low nibble if k < 2,
  // else high), high 2 bits at bit 2k of qh[32h + l]. y = (0.25 * scale[8h + l / 16 + 2k]) * (q - 32).
  const auto qof = [](int i) { return (i + i / 32) % 64; };
  std::vector<std::uint8_t> blk(210);
  const std::array<std::int8_t, 16> scales = {1, -1, 2, -2, 3, -3, 4, -4, 127, -128, 5, -5, 6, -6, 7, -7};
  for (int i = 0; i < 256; ++i) {
    const int q = qof(i);
    const int h = i / 128;
    const int kq = (i % 128) / 32;
    const int l = i % 32;
    blk[64 * h + l + 32 * (kq & 1)] |= static_cast<std::uint8_t>((q & 15) << (kq >= 2 ? 4 : 0));
    blk[128 + 32 * h + l] |= static_cast<std::uint8_t>((q >> 4) << (2 * kq));
  }
  for (int s = 0; s < 16; ++s) blk[192 + s] = static_cast<std::uint8_t>(scales[s]);
  put_u16(blk, 208, 0x3400);
  // Bytes worked out by hand: ql[0] = q(0) | (q(64) & 15) << 4 = 0 | 2 << 4 = 0x20;
  // ql[1] = q(1) | q(65) << 4 = 1 | 3 << 4 = 0x31; ql[32] = (q(32) & 15) | (q(96) & 15) << 4 =
  // (33 & 15) | (35 & 15) << 4 = 0x31; qh[0] = q(0) >> 4 | (q(32) >> 4) << 2 | (q(64) >> 4) << 4 |
  // (q(96) >> 4) << 6 = 0 | 2 << 2 | 0 | 2 << 6 = 0x88; scales at 192, d at 208.
  EXPECT_EQ(blk[0], 0x20);
  EXPECT_EQ(blk[1], 0x31);
  EXPECT_EQ(blk[32], 0x31);
  EXPECT_EQ(blk[128], 0x88);
  EXPECT_EQ(blk[192 + 9], 0x80);
  EXPECT_EQ(blk[208], 0x00);
  EXPECT_EQ(blk[209], 0x34);
  const std::vector<float> got = dequant_f32(blk, Dtype::q6_k, 256);
  EXPECT_TRUE(same_float(got[0], -8.0));      // scale[0] = 1:    q 0:  0.25 * 1 * (0 - 32)
  EXPECT_TRUE(same_float(got[17], 3.75));     // scale[1] = -1:   q 17: 0.25 * -1 * (17 - 32)
  EXPECT_TRUE(same_float(got[40], 4.5));      // scale[2] = 2:    q 41: 0.25 * 2 * (41 - 32)
  EXPECT_TRUE(same_float(got[100], 7.0));     // scale[6] = 4:    q 39: 0.25 * 4 * (39 - 32)
  EXPECT_TRUE(same_float(got[127], 30.0));    // scale[7] = -4:   q 2:  0.25 * -4 * (2 - 32)
  EXPECT_TRUE(same_float(got[128], -889.0));  // scale[8] = 127:  q 4:  0.25 * 127 * (4 - 32)
  EXPECT_TRUE(same_float(got[150], 192.0));   // scale[9] = -128: q 26: 0.25 * -128 * (26 - 32)
  EXPECT_TRUE(same_float(got[160], 6.25));    // scale[10] = 5:   q 37: 0.25 * 5 * (37 - 32)
  EXPECT_TRUE(same_float(got[255], 45.5));    // scale[15] = -7:  q 6:  0.25 * -7 * (6 - 32)
  for (int i = 0; i < 256; ++i) {
    const int h = i / 128;
    const int kq = (i % 128) / 32;
    const int l = i % 32;
    const float want = 0.25f * static_cast<float>(scales[8 * h + l / 16 + 2 * kq]) * static_cast<float>(qof(i) - 32);
    EXPECT_TRUE(same_float(got[i], want)) << "element " << i;
  }
}

// Random blocks (fixed seed) against the ggml-loop decoders above, through the public dequant.
TEST(KernelGguf, RandomBlocksMatchIndependentDecoders) {
  struct Case {
    Dtype type;
    int elems;
    int bytes;
    std::size_t d_at[2];  // where the f16 scale fields are (SIZE_MAX: none)
    std::vector<float> (*decode)(const std::uint8_t*);
  };
  constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
  const Case cases[] = {
      {Dtype::q8_0, 32, 34, {0, kNone}, ind_q8_0},
      {Dtype::q4_0, 32, 18, {0, kNone}, ind_q4_0},
      {Dtype::q4_k, 256, 144, {0, 2}, ind_q4_k},
      {Dtype::q6_k, 256, 210, {208, kNone}, ind_q6_k},
  };
  std::mt19937 rng(12345);
  for (const Case& c : cases) {
    constexpr int kBlocks = 96;
    std::vector<std::uint8_t> src(static_cast<std::size_t>(kBlocks) * c.bytes);
    for (auto& b : src) b = static_cast<std::uint8_t>(rng());
    for (int b = 0; b < kBlocks; ++b) {
      for (const std::size_t at : c.d_at) {
        if (at == kNone) continue;
        // Mostly finite scales of realistic magnitude (2^-14 .. 2^1); every 16th block keeps
        // its random bits (possibly inf / NaN / subnormal).
        if (b % 16 != 0) put_u16(src, b * c.bytes + at, static_cast<std::uint16_t>((rng() & 0x83ff) | ((1 + rng() % 16) << 10)));
      }
    }
    const std::uint64_t n = static_cast<std::uint64_t>(kBlocks) * c.elems;
    const std::vector<float> got = dequant_f32(src, c.type, n);
    const std::vector<std::uint16_t> got16 = dequant_u16(src, c.type, n, Dtype::fp16);
    const std::vector<std::uint16_t> gotbf = dequant_u16(src, c.type, n, Dtype::bf16);
    for (int b = 0; b < kBlocks; ++b) {
      const std::vector<float> want = c.decode(src.data() + static_cast<std::size_t>(b) * c.bytes);
      for (int i = 0; i < c.elems; ++i) {
        const std::size_t at = static_cast<std::size_t>(b) * c.elems + i;
        ASSERT_TRUE(same_float(got[at], want[i])) << vf::dtype_name(c.type) << " block " << b << " element " << i;
        if (std::isnan(want[i])) {
          ASSERT_TRUE(std::isnan(k::fp16_bits_to_float(got16[at])));
          ASSERT_TRUE(std::isnan(k::bf16_bits_to_float(gotbf[at])));
        } else {
          ASSERT_EQ(got16[at], ind_to_fp16(want[i])) << vf::dtype_name(c.type) << " element " << at;
          ASSERT_EQ(gotbf[at], ind_to_bf16(want[i])) << vf::dtype_name(c.type) << " element " << at;
        }
      }
    }
  }
}

// ===========================================================================================
// upcast through the public API

TEST(KernelUpcast, AllPairsMatchIndependentDecodeScaleRound) {
  const Dtype sources[] = {Dtype::fp8_e4m3fn, Dtype::fp8_e5m2, Dtype::fp16, Dtype::bf16};
  const Dtype targets[] = {Dtype::fp32, Dtype::fp16, Dtype::bf16};
  std::mt19937 rng(99);
  for (const Dtype from : sources) {
    const int in = from == Dtype::fp16 || from == Dtype::bf16 ? 2 : 1;
    const std::uint64_t n = in == 1 ? 256 : 8192;
    std::vector<std::uint8_t> src(n * in);
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::uint32_t code = in == 1 ? static_cast<std::uint32_t>(i) : rng() & 0xffffu;  // every fp8 code
      src[i * in] = static_cast<std::uint8_t>(code & 0xff);
      if (in == 2) src[i * in + 1] = static_cast<std::uint8_t>(code >> 8);
    }
    for (const Dtype to : targets) {
      for (const float scale : {1.0f, 0.75f, 3.0e-3f, 200.0f}) {
        const int out = to == Dtype::fp32 ? 4 : 2;
        std::vector<std::uint8_t> dst(n * out, 0xab);
        k::upcast(as_bytes(src), from, n, scale, std::as_writable_bytes(std::span<std::uint8_t>(dst)), to);
        for (std::uint64_t i = 0; i < n; ++i) {
          std::uint32_t code = src[i * in];
          if (in == 2) code |= static_cast<std::uint32_t>(src[i * in + 1]) << 8;
          const double v = from == Dtype::fp8_e4m3fn ? ind_e4m3(static_cast<std::uint8_t>(code))
                     : from == Dtype::fp8_e5m2 ? ind_e5m2(static_cast<std::uint8_t>(code))
                     : from == Dtype::fp16     ? ind_fp16(static_cast<std::uint16_t>(code))
                                               : ind_bf16(static_cast<std::uint16_t>(code));
          const float scaled = static_cast<float>(v) * scale;  // decode is exact, one fp32 rounding
          if (to == Dtype::fp32) {
            float got = 0;
            std::memcpy(&got, dst.data() + i * 4, 4);
            ASSERT_TRUE(same_float(got, scaled)) << vf::dtype_name(from) << " code " << code << " scale " << scale;
          } else {
            const auto got = static_cast<std::uint16_t>(dst[i * 2] | (dst[i * 2 + 1] << 8));
            const bool fp16 = to == Dtype::fp16;
            if (std::isnan(scaled)) {
              ASSERT_TRUE(std::isnan(fp16 ? k::fp16_bits_to_float(got) : k::bf16_bits_to_float(got)));
            } else {
              ASSERT_EQ(got, fp16 ? ind_to_fp16(scaled) : ind_to_bf16(scaled))
                  << vf::dtype_name(from) << "->" << vf::dtype_name(to) << " code " << code << " scale " << scale;
            }
          }
        }
      }
    }
  }
}

TEST(KernelUpcast, ScaleIsAppliedInFp32BeforeNarrowing) {
  // fp8_e4m3fn 0x7e = 448; 448 * 200 = 89600 > 65504: inf in fp16, exact in bf16 (0x47af).
  const std::vector<std::uint8_t> src = {0x7e, 0x38, 0x01, 0xff};  // 448, 1, 2^-9, NaN
  std::array<float, 4> f32{};
  k::upcast(as_bytes(src), Dtype::fp8_e4m3fn, 4, 0.5f, std::as_writable_bytes(std::span<float>(f32)), Dtype::fp32);
  EXPECT_TRUE(same_float(f32[0], 224.0));
  EXPECT_TRUE(same_float(f32[1], 0.5));
  EXPECT_TRUE(same_float(f32[2], 0x1p-10));
  EXPECT_TRUE(std::isnan(f32[3]));
  std::array<std::uint16_t, 4> h{};
  k::upcast(as_bytes(src), Dtype::fp8_e4m3fn, 4, 200.0f, std::as_writable_bytes(std::span<std::uint16_t>(h)), Dtype::fp16);
  EXPECT_EQ(h[0], 0x7c00);  // 89600: overflow to inf
  EXPECT_EQ(h[1], 0x5a40);  // 200 = 1.5625 * 2^7
  k::upcast(as_bytes(src), Dtype::fp8_e4m3fn, 4, 200.0f, std::as_writable_bytes(std::span<std::uint16_t>(h)), Dtype::bf16);
  EXPECT_EQ(h[0], 0x47af);  // 89600 = 1.3671875 * 2^16
  EXPECT_EQ(h[1], 0x4348);  // 200
  // A scale of 1 keeps fp16 NaN payloads bit for bit in fp32.
  const std::vector<std::uint8_t> nan16 = {0x01, 0xfe};  // 0xfe01
  float out = 0;
  k::upcast(as_bytes(nan16), Dtype::fp16, 1, 1.0f, std::as_writable_bytes(std::span<float>(&out, 1)), Dtype::fp32);
  EXPECT_EQ(bits(out), 0xffc02000u);
}

// ===========================================================================================
// bad arguments

TEST(KernelArgs, BadArgumentsThrowInputError) {
  std::vector<std::uint8_t> src(1024);
  std::vector<std::uint8_t> dst(4096);
  const auto s = as_bytes(src);
  const auto d = std::as_writable_bytes(std::span<std::uint8_t>(dst));
  // Unsupported pairs.
  EXPECT_THROW(k::upcast(s, Dtype::fp32, 4, 1.0f, d, Dtype::fp16), vf::InputError);
  EXPECT_THROW(k::upcast(s, Dtype::q4_k, 256, 1.0f, d, Dtype::fp16), vf::InputError);
  EXPECT_THROW(k::upcast(s, Dtype::fp16, 4, 1.0f, d, Dtype::fp8_e4m3fn), vf::InputError);
  EXPECT_THROW(k::upcast(s, Dtype::fp16, 4, 1.0f, d, Dtype::int8), vf::InputError);
  EXPECT_THROW(k::dequant(s, Dtype::fp16, 32, d, Dtype::fp32), vf::InputError);
  EXPECT_THROW(k::dequant(s, Dtype::q5_k, 256, d, Dtype::fp32), vf::InputError);
  EXPECT_THROW(k::dequant(s, Dtype::q8_0, 32, d, Dtype::q8_0), vf::InputError);
  // Non-finite scale.
  EXPECT_THROW(k::upcast(s, Dtype::fp8_e4m3fn, 4, std::numeric_limits<float>::quiet_NaN(), d, Dtype::fp16),
               vf::InputError);
  EXPECT_THROW(k::upcast(s, Dtype::fp8_e4m3fn, 4, std::numeric_limits<float>::infinity(), d, Dtype::fp16),
               vf::InputError);
  // Not a whole number of blocks.
  EXPECT_THROW(k::dequant(s, Dtype::q8_0, 33, d, Dtype::fp32), vf::InputError);
  EXPECT_THROW(k::dequant(s, Dtype::q4_k, 300, d, Dtype::fp32), vf::InputError);
  EXPECT_THROW(k::dequant(s, Dtype::q6_k, 128, d, Dtype::fp32), vf::InputError);
  // Buffers too small: 1025 fp8 elements from 1024 bytes; 1024 fp32 outputs need 4096 bytes.
  EXPECT_THROW(k::upcast(s, Dtype::fp8_e4m3fn, 1025, 1.0f, d, Dtype::fp16), vf::InputError);
  EXPECT_THROW(k::upcast(s, Dtype::fp8_e4m3fn, 1024, 1.0f, d.first(4095), Dtype::fp32), vf::InputError);
  EXPECT_THROW(k::dequant(s.first(33), Dtype::q8_0, 32, d, Dtype::fp32), vf::InputError);
  EXPECT_THROW(k::dequant(s, Dtype::q4_0, 32 * 57, d, Dtype::fp32), vf::InputError);  // 57 * 18 > 1024
  // Sizes that overflow 64 bits are input errors, never a wrap.
  EXPECT_THROW(k::upcast(s, Dtype::fp16, std::uint64_t{1} << 63, 1.0f, d, Dtype::fp32), vf::InputError);
  // The message names the field.
  try {
    k::dequant(s, Dtype::q8_0, 33, d, Dtype::fp32);
    FAIL() << "no throw";
  } catch (const vf::InputError& e) {
    EXPECT_EQ(e.path(), "kernels.dequant.n");
    EXPECT_NE(std::string(e.what()).find("q8_0"), std::string::npos) << e.what();
  }
  // Exactly-sized buffers and n = 0 are fine.
  EXPECT_NO_THROW(k::upcast(s, Dtype::fp8_e4m3fn, 1024, 1.0f, d, Dtype::fp32));
  EXPECT_NO_THROW(k::dequant(s.first(34), Dtype::q8_0, 32, d.first(128), Dtype::fp32));
  EXPECT_NO_THROW(k::upcast({}, Dtype::bf16, 0, 1.0f, {}, Dtype::fp16));
}

}  // namespace
