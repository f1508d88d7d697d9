// Per-element conversion logic shared by the host reference (kernels/reference.cpp, g++) and the
// CUDA kernels (kernels/convert_kernels.cu, nvcc): fp8 / fp16 / bf16 decode, float -> fp16 / bf16
// narrowing with round-to-nearest-even, and GGUF block dequantization for q8_0, q4_0, q4_k, q6_k.
//
// Everything here is written from the format facts (docs/… and shared/reference/models-and-formats
// §B.7), byte by byte and little-endian, so it needs no alignment and no struct layout: a block is
// a `const uint8_t*` to its first byte.
//
// Exactness: every decode (fp8 / fp16 / bf16 -> float) is exact. Narrowing rounds to nearest,
// ties to even, overflows to inf and keeps subnormals. On the device the narrowing uses the
// hardware conversion (cvt.rn), which rounds identically; only the bits of a NaN may differ (see
// kernels/README.md). GGUF dequant does its float operations in the same order as ggml's
// reference (products first, then the subtraction), each rounded once; in every GGUF type here
// the products before a subtraction are exact, so FMA contraction cannot change a result either.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define VF_HD __host__ __device__
#else
#define VF_HD
#endif

namespace vf::kernels {

// --- bit casts ------------------------------------------------------------------------------

VF_HD inline float bits_to_float(std::uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
#endif
}

VF_HD inline std::uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
#endif
}

// Multiplication and subtraction rounded once each, never fused with a neighbour (the device
// intrinsics are never contracted into an FMA; the host library is built with -ffp-contract=off).
VF_HD inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

VF_HD inline float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// --- 16-bit floats -> float (exact) ---------------------------------------------------------

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa. Exponent 0 is zero / subnormal
// (mantissa * 2^-24), exponent 31 is inf (mantissa 0) or NaN (payload kept).
VF_HD inline float fp16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    // mantissa * 2^-24: at most 10 significant bits and a power-of-two factor, exact in float.
    const float mag = static_cast<float>(man) * 0x1p-24f;
    return sign != 0 ? -mag : mag;
  }
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));
  // Rebias 15 -> 127: add 112 to the exponent field.
  return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// bfloat16 is the top half of a binary32: exact for every code, NaN payloads included.
VF_HD inline float bf16_bits_to_float(std::uint16_t h) {
  return bits_to_float(static_cast<std::uint32_t>(h) << 16);
}

// --- fp8 -> float (exact) -------------------------------------------------------------------

// float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa; "fn" = finite: no infinities, only
// S.1111.111 (0x7f, 0xff) is NaN, so 0x7e = 1.75 * 2^8 = 448 is the largest value. Exponent 0
// is zero / subnormal: mantissa * 2^-9 (smallest 2^-9, largest 7 * 2^-9).
VF_HD inline float fp8_e4m3fn_to_float(std::uint8_t b) {
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const std::uint32_t em = b & 0x7fu;  // exponent and mantissa
  if (em == 0x7fu) return bits_to_float(sign | 0x7fc00000u);  // NaN (quiet, sign kept)
  if (em < 8u) {
    const float mag = static_cast<float>(em) * 0x1p-9f;
    return sign != 0 ? -mag : mag;
  }
  // em << 20 puts the exponent at bit 23 and the 3 mantissa bits at the top of float's 23;
  // rebias 7 -> 127 by adding 120 to the exponent field.
  return bits_to_float(sign | ((em << 20) + (120u << 23)));
}

// float8_e5m2: 1 sign, 5 exponent (bias 15), 2 mantissa, IEEE-like with inf and NaN; the
// largest finite value is 0x7b = 1.75 * 2^15 = 57344. It is exactly the top byte of a binary16,
// so it decodes as that binary16.
VF_HD inline float fp8_e5m2_to_float(std::uint8_t b) {
  return fp16_bits_to_float(static_cast<std::uint16_t>(static_cast<std::uint16_t>(b) << 8));
}

// --- float -> 16-bit floats (round to nearest, ties to even) --------------------------------

// Software binary16 narrowing (the host path; also usable on the device).
// NaN -> quiet NaN with the sign and the top payload bits kept; |f| >= 65520 -> inf (65520 is the
// tie between 65504 and 2^16, and 65504's mantissa is odd); results below 2^-14 are subnormal.
VF_HD inline std::uint16_t float_to_fp16_bits_soft(float f) {
  const std::uint32_t x = float_to_bits(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) {
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  }
  if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520, or inf
  if (ax >= 0x38800000u) {                                                    // >= 2^-14: normal
    // Add just under half an ulp (0xfff), plus one when the kept lsb is odd: ties go to even.
    // A carry out of the mantissa correctly bumps the exponent.
    const std::uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | ((rounded >> 13) - (112u << 10)));
  }
  // Below 2^-14: a binary16 subnormal (units of 2^-24) or zero. With the implicit bit,
  // value = m * 2^(e - 150), so in units of 2^-24 it is m >> (126 - e).
  const std::uint32_t e = ax >> 23;
  if (e < 102u) return sign;  // < 2^-25: rounds to zero (float subnormals included)
  const std::uint32_t m = (ax & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126u - e;  // 14 .. 24
  std::uint32_t q = m >> shift;
  const std::uint32_t rem = m & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u) != 0)) ++q;  // q == 0x400 is the smallest normal
  return static_cast<std::uint16_t>(sign | q);
}

// Software bfloat16 narrowing. NaN -> quiet NaN (top half of the input with the quiet bit set,
// so a payload only in the low 16 bits never becomes inf); overflow rounds to inf.
VF_HD inline std::uint16_t float_to_bf16_bits_soft(float f) {
  const std::uint32_t x = float_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// The narrowing the kernels use: the hardware conversion on the device (cvt.rn.f16.f32 /
// cvt.rn.bf16.f32: the same rounding, a canonical NaN), the software one on the host.
VF_HD inline std::uint16_t float_to_fp16_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(f));
#else
  return float_to_fp16_bits_soft(f);
#endif
}

VF_HD inline std::uint16_t float_to_bf16_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
  return float_to_bf16_bits_soft(f);
#endif
}

// The per-tensor fp8 scale (ComfyUI's `scale_weight` / `weight_scale`): decoded value times the
// fp32 scale, rounded once in fp32. A scale of exactly 1 skips the multiply (so NaN payloads
// survive an unscaled fp32 upcast bit for bit).
VF_HD inline float apply_scale(float v, float scale) { return scale == 1.0f ? v : mul_rn(v, scale); }

// --- GGUF blocks ----------------------------------------------------------------------------
//
// Each block type has kElems elements in kBytes bytes and a run8(blk, first, out) that writes the
// 8 consecutive elements [first, first + 8) of one block (first a multiple of 8). Every run of 8
// shares one scale (and one min), which is what the kernels' threads work on.

VF_HD inline std::uint16_t load_u16le(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}

// q8_0, 34 bytes / 32: [0,2) f16 d; [2,34) int8 q[32]. y[i] = q[i] * d.
struct BlockQ8_0 {
  static constexpr int kElems = 32;
  static constexpr int kBytes = 34;
  VF_HD static void run8(const std::uint8_t* blk, int first, float* out) {
    const float d = fp16_bits_to_float(load_u16le(blk));
    const std::uint8_t* q = blk + 2 + first;
    for (int k = 0; k < 8; ++k) out[k] = mul_rn(static_cast<float>(static_cast<std::int8_t>(q[k])), d);
  }
};

// q4_0, 18 bytes / 32: [0,2) f16 d; [2,18) 16 bytes of nibbles. Byte j holds element j in its low
// nibble and element j + 16 in its high nibble; y = (nibble - 8) * d.
struct BlockQ4_0 {
  static constexpr int kElems = 32;
  static constexpr int kBytes = 18;
  VF_HD static void run8(const std::uint8_t* blk, int first, float* out) {
    const float d = fp16_bits_to_float(load_u16le(blk));
    const std::uint8_t* q = blk + 2 + (first & 15);
    const int shift = first >= 16 ? 4 : 0;
    for (int k = 0; k < 8; ++k) {
      const int nib = (q[k] >> shift) & 0xf;
      out[k] = mul_rn(static_cast<float>(nib - 8), d);
    }
  }
};

// q4_k's 12 scale bytes hold 8 (scale, min) pairs of 6 bits each (ggml's get_scale_min_k4):
//   j < 4:  scale = b[j] & 63,                        min = b[j + 4] & 63
//   j >= 4: scale = (b[j + 4] & 15) | (b[j - 4] >> 6) << 4,
//           min   = (b[j + 4] >> 4) | (b[j] >> 6) << 4
// i.e. bytes 0-3 / 4-7 carry scales / mins 0-3 in their low 6 bits and the top 2 bits of scales /
// mins 4-7 in their top 2 bits; bytes 8-11 carry the low 4 bits of scale (low nibble) and
// min (high nibble) 4-7.
VF_HD inline void q4_k_scale_min(const std::uint8_t* b, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = b[j] & 63;
    *min = b[j + 4] & 63;
  } else {
    *scale = (b[j + 4] & 0xf) | ((b[j - 4] >> 6) << 4);
    *min = (b[j + 4] >> 4) | ((b[j] >> 6) << 4);
  }
}

// q4_k, 144 bytes / 256: [0,2) f16 d; [2,4) f16 dmin; [4,16) packed 6-bit scales/mins;
// [16,144) 128 bytes of nibbles. Sub-block s (32 elements, s = 0..7) uses scale/min pair s;
// elements 64c .. 64c+31 are the low nibbles of qs[32c .. 32c+31], 64c+32 .. 64c+63 their high
// nibbles. y = (d * scale) * q - (dmin * min).
struct BlockQ4K {
  static constexpr int kElems = 256;
  static constexpr int kBytes = 144;
  VF_HD static void run8(const std::uint8_t* blk, int first, float* out) {
    const float d = fp16_bits_to_float(load_u16le(blk));
    const float dmin = fp16_bits_to_float(load_u16le(blk + 2));
    const int sub = first / 32;
    int sc = 0;
    int mn = 0;
    q4_k_scale_min(blk + 4, sub, &sc, &mn);
    const float d1 = mul_rn(d, static_cast<float>(sc));
    const float m1 = mul_rn(dmin, static_cast<float>(mn));
    const std::uint8_t* q = blk + 16 + 32 * (sub / 2) + (first % 32);
    const int shift = (sub & 1) != 0 ? 4 : 0;
    for (int k = 0; k < 8; ++k) {
      const int nib = (q[k] >> shift) & 0xf;
      out[k] = sub_rn(mul_rn(d1, static_cast<float>(nib)), m1);
    }
  }
};

// q6_k, 210 bytes / 256: [0,128) ql (low 4 bits), [128,192) qh (high 2 bits), [192,208) 16 int8
// scales, [208,210) f16 d. Element i: half h = i / 128, quarter k = (i % 128) / 32, l = i % 32;
// low 4 bits: ql[64h + l + 32(k & 1)], low nibble for k < 2, high nibble for k >= 2;
// high 2 bits: bits 2k, 2k+1 of qh[32h + l]; scale: scales[8h + l / 16 + 2k];
// y = (d * scale) * (q - 32).
struct BlockQ6K {
  static constexpr int kElems = 256;
  static constexpr int kBytes = 210;
  VF_HD static void run8(const std::uint8_t* blk, int first, float* out) {
    const float d = fp16_bits_to_float(load_u16le(blk + 208));
    const int h = first / 128;
    const int k = (first % 128) / 32;
    const int l0 = first % 32;
    const std::uint8_t* ql = blk + 64 * h + 32 * (k & 1) + l0;
    const std::uint8_t* qh = blk + 128 + 32 * h + l0;
    const auto sc = static_cast<std::int8_t>(blk[192 + 8 * h + l0 / 16 + 2 * k]);
    const float ds = mul_rn(d, static_cast<float>(sc));
    const int lshift = k >= 2 ? 4 : 0;
    const int hshift = 2 * k;
    for (int j = 0; j < 8; ++j) {
      const int q = ((ql[j] >> lshift) & 0xf) | (((qh[j] >> hshift) & 3) << 4);
      out[j] = mul_rn(ds, static_cast<float>(q - 32));
    }
  }
};

// One whole block -> Q::kElems floats.
template <class Q>
VF_HD inline void dequant_block(const std::uint8_t* blk, float* out) {
  for (int first = 0; first < Q::kElems; first += 8) Q::run8(blk, first, out + first);
}

}  // namespace vf::kernels
