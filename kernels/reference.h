// Host reference implementations of the upcast and dequant kernels: plain loops over the shared
// per-element logic in kernels/convert.h. The CUDA kernels must equal these (kernels/README.md
// gives the contract); the argument checks here are also the CUDA launchers' checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "harness/core/bytes.h"
#include "harness/core/dtype.h"

namespace vf::kernels {

// fp8_e4m3fn, fp8_e5m2, fp16, bf16: the sources of an upcast.
bool is_upcast_source(Dtype d);
// q8_0, q4_0, q4_k, q6_k: the GGUF block types this library dequantizes.
bool is_dequant_source(Dtype d);
// fp32, fp16, bf16: what an upcast or a dequant writes.
bool is_convert_target(Dtype d);

struct ConvertBytes {
  Bytes src = 0;  // bytes read
  Bytes dst = 0;  // bytes written
};

// Validate an upcast of `n` elements `from` -> `to` with an fp32 `scale` (finite) and return the
// bytes it reads and writes. Throws vf::InputError naming what is wrong.
ConvertBytes check_upcast(Dtype from, Dtype to, std::uint64_t n, float scale);
// Validate a dequant of `n` elements (a whole number of blocks) of GGUF `type` -> `to`.
ConvertBytes check_dequant(Dtype type, Dtype to, std::uint64_t n);
// Either of the two, chosen by `from`.
ConvertBytes check_convert(Dtype from, Dtype to, std::uint64_t n, float scale);

// dst[i] = narrow_to(decode_from(src[i]) * scale) for i < n. Element i of src / dst is at byte
// i * element size; little-endian; no alignment needed; src and dst must not overlap. Throws
// vf::InputError on an unsupported pair, a non-finite scale, or a buffer smaller than n elements.
void upcast(std::span<const std::byte> src, Dtype from, std::uint64_t n, float scale,
            std::span<std::byte> dst, Dtype to);

// Dequantize n elements (n / block_elems whole blocks, stored back to back) of a GGUF block type
// into `to`. Throws vf::InputError on an unsupported type or target, n not a multiple of the
// block, or a buffer too small.
void dequant(std::span<const std::byte> src, Dtype type, std::uint64_t n, std::span<std::byte> dst,
             Dtype to);

}  // namespace vf::kernels
