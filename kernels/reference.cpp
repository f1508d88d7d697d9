#include "kernels/reference.h"

#include <cmath>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "harness/core/error.h"
#include "kernels/convert.h"

namespace vf::kernels {
namespace {

std::string name(Dtype d) { return std::string(dtype_name(d)); }

void check_target(Dtype to, const char* op) {
  if (!is_convert_target(to)) {
    throw InputError(fmt::format("kernels.{}.to", op),
                     fmt::format("cannot write {}: the target must be fp32, fp16 or bf16", name(to)));
  }
}

void check_sizes(const ConvertBytes& need, std::size_t src_size, std::size_t dst_size, std::uint64_t n,
                 Dtype from, const char* op) {
  if (src_size < need.src) {
    throw InputError(fmt::format("kernels.{}.src", op),
                     fmt::format("holds {} bytes, {} {} elements need {}", src_size, n, name(from), need.src));
  }
  if (dst_size < need.dst) {
    throw InputError(fmt::format("kernels.{}.dst", op),
                     fmt::format("holds {} bytes, {} elements need {}", dst_size, n, need.dst));
  }
}

std::uint32_t load_code(const std::byte* p, int bytes) {
  if (bytes == 1) return std::to_integer<std::uint32_t>(p[0]);
  return std::to_integer<std::uint32_t>(p[0]) | (std::to_integer<std::uint32_t>(p[1]) << 8);
}

float decode(Dtype from, std::uint32_t code) {
  switch (from) {
    case Dtype::fp8_e4m3fn: return fp8_e4m3fn_to_float(static_cast<std::uint8_t>(code));
    case Dtype::fp8_e5m2: return fp8_e5m2_to_float(static_cast<std::uint8_t>(code));
    case Dtype::fp16: return fp16_bits_to_float(static_cast<std::uint16_t>(code));
    case Dtype::bf16: return bf16_bits_to_float(static_cast<std::uint16_t>(code));
    default: return 0.0f;  // unreachable: checked by check_upcast
  }
}

void store(Dtype to, float v, std::byte* out) {
  switch (to) {
    case Dtype::fp32: std::memcpy(out, &v, 4); return;
    case Dtype::fp16:
    case Dtype::bf16: {
      const std::uint16_t h = to == Dtype::fp16 ? float_to_fp16_bits(v) : float_to_bf16_bits(v);
      out[0] = static_cast<std::byte>(h & 0xffu);
      out[1] = static_cast<std::byte>(h >> 8);
      return;
    }
    default: return;  // unreachable: checked by check_target
  }
}

template <class Q>
void dequant_blocks(const std::byte* src, std::uint64_t blocks, std::byte* dst, Dtype to) {
  const std::uint32_t out_bytes = compute_elem_bytes(to);
  float y[Q::kElems];
  for (std::uint64_t b = 0; b < blocks; ++b) {
    dequant_block<Q>(reinterpret_cast<const std::uint8_t*>(src + b * Q::kBytes), y);
    std::byte* out = dst + b * Q::kElems * out_bytes;
    for (int i = 0; i < Q::kElems; ++i) store(to, y[i], out + static_cast<std::size_t>(i) * out_bytes);
  }
}

}  // namespace

bool is_upcast_source(Dtype d) {
  return d == Dtype::fp8_e4m3fn || d == Dtype::fp8_e5m2 || d == Dtype::fp16 || d == Dtype::bf16;
}

bool is_dequant_source(Dtype d) {
  return d == Dtype::q8_0 || d == Dtype::q4_0 || d == Dtype::q4_k || d == Dtype::q6_k;
}

bool is_convert_target(Dtype d) { return d == Dtype::fp32 || d == Dtype::fp16 || d == Dtype::bf16; }

ConvertBytes check_upcast(Dtype from, Dtype to, std::uint64_t n, float scale) {
  if (!is_upcast_source(from)) {
    throw InputError("kernels.upcast.from",
                     fmt::format("cannot upcast {}: the source must be fp8_e4m3fn, fp8_e5m2, fp16 or bf16",
                                 name(from)));
  }
  check_target(to, "upcast");
  if (!std::isfinite(scale)) {
    throw InputError("kernels.upcast.scale", fmt::format("must be finite, got {}", scale));
  }
  return {checked_mul(n, dtype_info(from).block_bytes, "kernels.upcast.src bytes"),
          checked_mul(n, compute_elem_bytes(to), "kernels.upcast.dst bytes")};
}

ConvertBytes check_dequant(Dtype type, Dtype to, std::uint64_t n) {
  if (!is_dequant_source(type)) {
    throw InputError("kernels.dequant.type",
                     fmt::format("cannot dequantize {}: the type must be q8_0, q4_0, q4_k or q6_k", name(type)));
  }
  check_target(to, "dequant");
  const DtypeInfo& info = dtype_info(type);
  if (n % info.block_elems != 0) {
    throw InputError("kernels.dequant.n", fmt::format("{} elements is not a whole number of {} blocks of {}",
                                                      n, name(type), info.block_elems));
  }
  return {checked_mul(n / info.block_elems, info.block_bytes, "kernels.dequant.src bytes"),
          checked_mul(n, compute_elem_bytes(to), "kernels.dequant.dst bytes")};
}

ConvertBytes check_convert(Dtype from, Dtype to, std::uint64_t n, float scale) {
  if (is_dequant_source(from)) return check_dequant(from, to, n);
  return check_upcast(from, to, n, scale);
}

void upcast(std::span<const std::byte> src, Dtype from, std::uint64_t n, float scale,
            std::span<std::byte> dst, Dtype to) {
  const ConvertBytes need = check_upcast(from, to, n, scale);
  check_sizes(need, src.size(), dst.size(), n, from, "upcast");
  const int in_bytes = static_cast<int>(dtype_info(from).block_bytes);
  const std::uint32_t out_bytes = compute_elem_bytes(to);
  for (std::uint64_t i = 0; i < n; ++i) {
    const float v = apply_scale(decode(from, load_code(src.data() + i * in_bytes, in_bytes)), scale);
    store(to, v, dst.data() + i * out_bytes);
  }
}

void dequant(std::span<const std::byte> src, Dtype type, std::uint64_t n, std::span<std::byte> dst,
             Dtype to) {
  const ConvertBytes need = check_dequant(type, to, n);
  check_sizes(need, src.size(), dst.size(), n, type, "dequant");
  const std::uint64_t blocks = n / dtype_info(type).block_elems;
  switch (type) {
    case Dtype::q8_0: dequant_blocks<BlockQ8_0>(src.data(), blocks, dst.data(), to); break;
    case Dtype::q4_0: dequant_blocks<BlockQ4_0>(src.data(), blocks, dst.data(), to); break;
    case Dtype::q4_k: dequant_blocks<BlockQ4K>(src.data(), blocks, dst.data(), to); break;
    case Dtype::q6_k: dequant_blocks<BlockQ6K>(src.data(), blocks, dst.data(), to); break;
    default: break;  // unreachable: checked by check_dequant
  }
}

}  // namespace vf::kernels
