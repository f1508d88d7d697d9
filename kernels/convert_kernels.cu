// CUDA kernels: upcast, GGUF dequant, batched conversion, touch and copy. Memory-bound design:
//
// - Work is cut into tiles of kTileElems elements; a block of kThreads threads owns a tile and
//   blocks walk the tiles grid-stride. A single tensor and a batch share the tile functions.
// - Upcast: each thread converts one 16-byte output chunk per step (4 or 8 elements) with one
//   4-, 8- or 16-byte load and one 16-byte store, consecutive threads on consecutive chunks, when
//   both pointers are 16-byte aligned; the rest of the tile (and misaligned tensors) go element
//   by element, coalesced.
// - Dequant: the tile's blocks (a whole number of them, tile starts 16-byte aligned) are staged
//   into shared memory with coalesced 16-byte loads, then each thread turns runs of 8 elements
//   (one scale each) into 16-byte stores.
// - Per-element arithmetic is kernels/convert.h, the same code the host reference runs.
#include "kernels/convert_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "harness/core/error.h"
#include "kernels/convert.h"
#include "kernels/reference.h"

namespace vf::kernels {
namespace {

constexpr int kThreads = 256;                       // threads per block
constexpr std::uint32_t kTileElems = 4096;          // elements per tile (a block's unit of work)
constexpr int kRun = 8;                             // dequant elements per run (one scale)
constexpr int kBlocksPerSm = 2048 / kThreads;       // resident blocks per SM at full occupancy
constexpr std::uint32_t kSmemBytes = kTileElems / BlockQ8_0::kElems * BlockQ8_0::kBytes;  // largest tile

static_assert(kTileElems % (kThreads * 8) == 0, "a tile is whole upcast steps of 16-byte chunks");
static_assert(kTileElems % BlockQ4K::kElems == 0 && kTileElems % BlockQ8_0::kElems == 0);
static_assert(kTileElems / BlockQ4_0::kElems * BlockQ4_0::kBytes <= kSmemBytes);
static_assert(kTileElems / BlockQ4K::kElems * BlockQ4K::kBytes <= kSmemBytes);
static_assert(kTileElems / BlockQ6K::kElems * BlockQ6K::kBytes <= kSmemBytes);
// Tile starts in the source stay 16-byte aligned: a tile is a multiple of 16 bytes for each type.
static_assert(kTileElems / BlockQ8_0::kElems * BlockQ8_0::kBytes % 16 == 0);
static_assert(kTileElems / BlockQ4_0::kElems * BlockQ4_0::kBytes % 16 == 0);
static_assert(kTileElems / BlockQ4K::kElems * BlockQ4K::kBytes % 16 == 0);
static_assert(kTileElems / BlockQ6K::kElems * BlockQ6K::kBytes % 16 == 0);

// --- element traits -------------------------------------------------------------------------

struct SrcE4M3 {
  static constexpr int kBytes = 1;
  __device__ static float decode(std::uint32_t c) { return fp8_e4m3fn_to_float(static_cast<std::uint8_t>(c)); }
};
struct SrcE5M2 {
  static constexpr int kBytes = 1;
  __device__ static float decode(std::uint32_t c) { return fp8_e5m2_to_float(static_cast<std::uint8_t>(c)); }
};
struct SrcF16 {
  static constexpr int kBytes = 2;
  __device__ static float decode(std::uint32_t c) { return fp16_bits_to_float(static_cast<std::uint16_t>(c)); }
};
struct SrcBF16 {
  static constexpr int kBytes = 2;
  __device__ static float decode(std::uint32_t c) { return bf16_bits_to_float(static_cast<std::uint16_t>(c)); }
};

struct DstF32 {
  static constexpr int kBytes = 4;
};
struct DstF16 {
  static constexpr int kBytes = 2;
  __device__ static std::uint16_t one(float v) { return float_to_fp16_bits(v); }
  // Two elements, the first in the low half (cvt.rn.f16x2.f32).
  __device__ static std::uint32_t two(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    return (static_cast<std::uint32_t>(__half_as_ushort(__high2half(h))) << 16) |
           __half_as_ushort(__low2half(h));
  }
};
struct DstBF16 {
  static constexpr int kBytes = 2;
  __device__ static std::uint16_t one(float v) { return float_to_bf16_bits(v); }
  __device__ static std::uint32_t two(float a, float b) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return (static_cast<std::uint32_t>(__bfloat16_as_ushort(__high2bfloat16(h))) << 16) |
           __bfloat16_as_ushort(__low2bfloat16(h));
  }
};

template <class D>
__device__ void store_one(std::uint8_t* dst, std::uint64_t i, float v) {
  if constexpr (D::kBytes == 4) {
    reinterpret_cast<float*>(dst)[i] = v;
  } else {
    reinterpret_cast<std::uint16_t*>(dst)[i] = D::one(v);
  }
}

// Store N floats at element e0 with 16-byte stores: 4 or 8 (an upcast chunk, a half run or a
// whole dequant run).
template <class D, int N>
__device__ void store_vec(std::uint8_t* dst, std::uint64_t e0, const float* v) {
  uint4* out = reinterpret_cast<uint4*>(dst + e0 * D::kBytes);
  if constexpr (D::kBytes == 4) {
#pragma unroll
    for (int k = 0; k < N / 4; ++k) {
      out[k] = make_uint4(__float_as_uint(v[4 * k]), __float_as_uint(v[4 * k + 1]),
                          __float_as_uint(v[4 * k + 2]), __float_as_uint(v[4 * k + 3]));
    }
  } else {
#pragma unroll
    for (int k = 0; k < N / 8; ++k) {
      const float* w = v + 8 * k;
      out[k] = make_uint4(D::two(w[0], w[1]), D::two(w[2], w[3]), D::two(w[4], w[5]), D::two(w[6], w[7]));
    }
  }
}

__device__ bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// Elements of tile `tile` (the last one may be partial).
__device__ std::uint32_t tile_count(std::uint64_t n, std::uint64_t base) {
  const std::uint64_t left = n - base;
  return left < kTileElems ? static_cast<std::uint32_t>(left) : kTileElems;
}

// --- upcast ---------------------------------------------------------------------------------

template <class S, class D>
__device__ void upcast_tile(const std::uint8_t* __restrict__ src, std::uint8_t* __restrict__ dst,
                            std::uint64_t n, float scale, std::uint64_t tile) {
  // One 16-byte output chunk per thread and step (4 fp32 or 8 16-bit elements), chunk c + k *
  // blockDim for step k: a warp's stores cover 512 contiguous bytes and its loads (4, 8 or 16
  // bytes a thread) are contiguous too. (Sixteen elements a thread, as before, left every store
  // instruction writing half of each 32-byte sector it touched: fp32 outputs ran at half the
  // D2D copy's bandwidth on an H200, reports/gpu/h200-2026-12-04.json.)
  constexpr int kElems = 16 / D::kBytes;              // elements per output chunk
  constexpr int kWords = kElems * S::kBytes / 4;      // source words per chunk: 1, 2 or 4
  const std::uint64_t base = tile * kTileElems;
  const std::uint32_t count = tile_count(n, base);
  const std::uint32_t nchunks = aligned16(src) && aligned16(dst) ? count / kElems : 0;

  for (std::uint32_t c = threadIdx.x; c < nchunks; c += blockDim.x) {
    const std::uint64_t e0 = base + static_cast<std::uint64_t>(c) * kElems;
    const std::uint8_t* in = src + e0 * S::kBytes;
    std::uint32_t w[kWords];
    if constexpr (kWords == 4) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(in));
      w[0] = v.x;
      w[1] = v.y;
      w[2] = v.z;
      w[3] = v.w;
    } else if constexpr (kWords == 2) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(in));
      w[0] = v.x;
      w[1] = v.y;
    } else {
      w[0] = __ldg(reinterpret_cast<const unsigned int*>(in));
    }
    float f[kElems];
#pragma unroll
    for (int j = 0; j < kElems; ++j) {
      const std::uint32_t code = S::kBytes == 1 ? (w[j / 4] >> (8 * (j % 4))) & 0xffu
                                                : (w[j / 2] >> (16 * (j % 2))) & 0xffffu;
      f[j] = apply_scale(S::decode(code), scale);
    }
    store_vec<D, kElems>(dst, e0, f);
  }
  // Scalar tail: the part of the tile not covered by whole chunks (all of it when misaligned).
  for (std::uint32_t i = nchunks * kElems + threadIdx.x; i < count; i += blockDim.x) {
    const std::uint64_t e = base + i;
    const std::uint32_t code =
        S::kBytes == 1 ? src[e] : static_cast<std::uint32_t>(reinterpret_cast<const std::uint16_t*>(src)[e]);
    store_one<D>(dst, e, apply_scale(S::decode(code), scale));
  }
}

template <class S, class D>
__global__ void __launch_bounds__(kThreads)
    upcast_kernel(const std::uint8_t* __restrict__ src, std::uint8_t* __restrict__ dst, std::uint64_t n,
                  float scale, std::uint64_t tiles) {
  for (std::uint64_t t = blockIdx.x; t < tiles; t += gridDim.x) upcast_tile<S, D>(src, dst, n, scale, t);
}

// --- dequant --------------------------------------------------------------------------------

template <class Q, class D>
__device__ void dequant_tile(const std::uint8_t* __restrict__ src, std::uint8_t* __restrict__ dst,
                             std::uint64_t n, std::uint64_t tile, std::uint8_t* smem) {
  constexpr std::uint32_t kBlocksPerTile = kTileElems / Q::kElems;
  const std::uint64_t base = tile * kTileElems;
  const std::uint32_t count = tile_count(n, base);
  const std::uint32_t bytes = count / Q::kElems * Q::kBytes;
  const std::uint8_t* s = src + tile * kBlocksPerTile * Q::kBytes;

  // Stage the tile's blocks in shared memory: coalesced 16-byte loads, bytes for the remainder.
  std::uint32_t staged = 0;
  if (aligned16(s)) {
    const std::uint32_t nv = bytes / 16;
    for (std::uint32_t k = threadIdx.x; k < nv; k += blockDim.x) {
      reinterpret_cast<uint4*>(smem)[k] = __ldg(reinterpret_cast<const uint4*>(s) + k);
    }
    staged = nv * 16;
  }
  for (std::uint32_t k = staged + threadIdx.x; k < bytes; k += blockDim.x) smem[k] = s[k];
  __syncthreads();

  const bool vec = aligned16(dst);
  const std::uint32_t runs = count / kRun;
  if constexpr (D::kBytes == 4 && Q::kElems == 32) {
    // fp32 out of a 32-element type: a run is 32 bytes, two 16-byte chunks. One chunk a thread
    // and step keeps each warp's stores contiguous (a whole run a thread wrote half of every
    // 32-byte sector per store: 57% of a D2D copy on an H200); the run's cheap decode is done
    // twice. The 256-element K-quants decode too much for that and keep whole runs.
    if (vec) {
      for (std::uint32_t h = threadIdx.x; h < 2 * runs; h += blockDim.x) {
        const std::uint32_t e = (h / 2) * kRun;
        float v[kRun];
        Q::run8(smem + (e / Q::kElems) * Q::kBytes, static_cast<int>(e % Q::kElems), v);
        const std::uint32_t half = (h % 2) * (kRun / 2);
        store_vec<D, kRun / 2>(dst, base + e + half, v + half);
      }
      __syncthreads();  // the next tile overwrites smem
      return;
    }
  }
  for (std::uint32_t r = threadIdx.x; r < runs; r += blockDim.x) {
    const std::uint32_t e = r * kRun;
    float v[kRun];
    Q::run8(smem + (e / Q::kElems) * Q::kBytes, static_cast<int>(e % Q::kElems), v);
    if (vec) {
      store_vec<D, kRun>(dst, base + e, v);
    } else {
#pragma unroll
      for (int k = 0; k < kRun; ++k) store_one<D>(dst, base + e + k, v[k]);
    }
  }
  __syncthreads();  // the next tile overwrites smem
}

template <class Q, class D>
__global__ void __launch_bounds__(kThreads)
    dequant_kernel(const std::uint8_t* __restrict__ src, std::uint8_t* __restrict__ dst, std::uint64_t n,
                   std::uint64_t tiles) {
  __shared__ __align__(16) std::uint8_t smem[kSmemBytes];
  for (std::uint64_t t = blockIdx.x; t < tiles; t += gridDim.x) dequant_tile<Q, D>(src, dst, n, t, smem);
}

// --- batch ----------------------------------------------------------------------------------

struct BatchArgs {
  std::uint32_t count;                     // descriptors in use, >= 1
  ConvertDesc desc[kBatchChunk];
  std::uint64_t tile_end[kBatchChunk];     // inclusive prefix sum of each descriptor's tiles
};
static_assert(sizeof(BatchArgs) <= 4096, "kernel parameters stay under the classic 4 KiB limit");

template <class D>
__device__ void convert_tile_to(const ConvertDesc& d, std::uint64_t tile, std::uint8_t* smem) {
  const auto* src = static_cast<const std::uint8_t*>(d.src);
  auto* dst = static_cast<std::uint8_t*>(d.dst);
  switch (d.from) {
    case Dtype::fp8_e4m3fn: upcast_tile<SrcE4M3, D>(src, dst, d.n, d.scale, tile); break;
    case Dtype::fp8_e5m2: upcast_tile<SrcE5M2, D>(src, dst, d.n, d.scale, tile); break;
    case Dtype::fp16: upcast_tile<SrcF16, D>(src, dst, d.n, d.scale, tile); break;
    case Dtype::bf16: upcast_tile<SrcBF16, D>(src, dst, d.n, d.scale, tile); break;
    case Dtype::q8_0: dequant_tile<BlockQ8_0, D>(src, dst, d.n, tile, smem); break;
    case Dtype::q4_0: dequant_tile<BlockQ4_0, D>(src, dst, d.n, tile, smem); break;
    case Dtype::q4_k: dequant_tile<BlockQ4K, D>(src, dst, d.n, tile, smem); break;
    case Dtype::q6_k: dequant_tile<BlockQ6K, D>(src, dst, d.n, tile, smem); break;
    default: break;  // rejected on the host
  }
}

// The descriptors live in parameter space (__grid_constant__: read in place, never copied to
// local memory). Block-uniform branches only, so the dequant tiles' __syncthreads are safe.
__global__ void __launch_bounds__(kThreads) batch_kernel(const __grid_constant__ BatchArgs args) {
  __shared__ __align__(16) std::uint8_t smem[kSmemBytes];
  const std::uint64_t total = args.tile_end[args.count - 1];
  for (std::uint64_t t = blockIdx.x; t < total; t += gridDim.x) {
    std::uint32_t lo = 0;
    std::uint32_t hi = args.count - 1;
    while (lo < hi) {  // first descriptor whose tiles end after t
      const std::uint32_t mid = (lo + hi) / 2;
      if (args.tile_end[mid] > t) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    const ConvertDesc& d = args.desc[lo];
    const std::uint64_t local = t - (lo == 0 ? 0 : args.tile_end[lo - 1]);
    switch (d.to) {
      case Dtype::fp32: convert_tile_to<DstF32>(d, local, smem); break;
      case Dtype::fp16: convert_tile_to<DstF16>(d, local, smem); break;
      case Dtype::bf16: convert_tile_to<DstBF16>(d, local, smem); break;
      default: break;
    }
  }
}

// --- touch and copy -------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads)
    touch_kernel(std::uint8_t* dst, std::uint64_t head, std::uint64_t nvec, std::uint64_t bytes,
                 std::uint8_t value) {
  const std::uint64_t tid = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint32_t w = 0x01010101u * value;
  const uint4 v = make_uint4(w, w, w, w);
  uint4* body = reinterpret_cast<uint4*>(dst + head);
  for (std::uint64_t i = tid; i < nvec; i += stride) body[i] = v;
  for (std::uint64_t i = tid; i < head; i += stride) dst[i] = value;
  for (std::uint64_t i = head + nvec * 16 + tid; i < bytes; i += stride) dst[i] = value;
}

// head bytes before the first 16-byte boundary, nvec 16-byte vectors, then the tail. Used only
// when src and dst are equally misaligned; otherwise nvec = 0 and head = bytes (byte copy).
__global__ void __launch_bounds__(kThreads)
    copy_kernel(std::uint8_t* __restrict__ dst, const std::uint8_t* __restrict__ src, std::uint64_t head,
                std::uint64_t nvec, std::uint64_t bytes) {
  const std::uint64_t tid = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const uint4* in = reinterpret_cast<const uint4*>(src + head);
  uint4* out = reinterpret_cast<uint4*>(dst + head);
  for (std::uint64_t i = tid; i < nvec; i += stride) out[i] = __ldg(in + i);
  for (std::uint64_t i = tid; i < head; i += stride) dst[i] = src[i];
  for (std::uint64_t i = head + nvec * 16 + tid; i < bytes; i += stride) dst[i] = src[i];
}

// --- host side ------------------------------------------------------------------------------

// Grid for `work` units: enough blocks to fill every SM, never more than there is work.
cudaError_t grid_for(std::uint64_t work, unsigned* grid) {
  int dev = 0;
  int sms = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return err;
  const std::uint64_t cap = static_cast<std::uint64_t>(std::max(sms, 1)) * kBlocksPerSm;
  *grid = static_cast<unsigned>(std::max<std::uint64_t>(1, std::min(work, cap)));
  return cudaSuccess;
}

std::uint64_t tiles_of(std::uint64_t n) { return n / kTileElems + (n % kTileElems != 0 ? 1 : 0); }

void check_pointers(const void* src, const void* dst, Dtype from, Dtype to, std::uint64_t n, const char* op) {
  if (n == 0) return;
  if (src == nullptr || dst == nullptr) {
    throw InputError(std::string("kernels.") + op, "src and dst must be device pointers, not null");
  }
  const std::uint32_t in = is_dequant_source(from) ? 1 : dtype_info(from).block_bytes;
  const std::uint32_t out = compute_elem_bytes(to);
  if (reinterpret_cast<std::uintptr_t>(src) % in != 0 || reinterpret_cast<std::uintptr_t>(dst) % out != 0) {
    throw InputError(std::string("kernels.") + op,
                     "src and dst must be aligned to their element sizes (" + std::to_string(in) + " and " +
                         std::to_string(out) + " bytes)");
  }
}

template <class S>
cudaError_t upcast_from(const std::uint8_t* src, std::uint8_t* dst, Dtype to, std::uint64_t n, float scale,
                        cudaStream_t stream) {
  const std::uint64_t tiles = tiles_of(n);
  unsigned grid = 0;
  if (const cudaError_t err = grid_for(tiles, &grid); err != cudaSuccess) return err;
  switch (to) {
    case Dtype::fp32: upcast_kernel<S, DstF32><<<grid, kThreads, 0, stream>>>(src, dst, n, scale, tiles); break;
    case Dtype::fp16: upcast_kernel<S, DstF16><<<grid, kThreads, 0, stream>>>(src, dst, n, scale, tiles); break;
    case Dtype::bf16: upcast_kernel<S, DstBF16><<<grid, kThreads, 0, stream>>>(src, dst, n, scale, tiles); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <class Q>
cudaError_t dequant_from(const std::uint8_t* src, std::uint8_t* dst, Dtype to, std::uint64_t n,
                         cudaStream_t stream) {
  const std::uint64_t tiles = tiles_of(n);
  unsigned grid = 0;
  if (const cudaError_t err = grid_for(tiles, &grid); err != cudaSuccess) return err;
  switch (to) {
    case Dtype::fp32: dequant_kernel<Q, DstF32><<<grid, kThreads, 0, stream>>>(src, dst, n, tiles); break;
    case Dtype::fp16: dequant_kernel<Q, DstF16><<<grid, kThreads, 0, stream>>>(src, dst, n, tiles); break;
    case Dtype::bf16: dequant_kernel<Q, DstBF16><<<grid, kThreads, 0, stream>>>(src, dst, n, tiles); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_upcast(const void* src, Dtype from, void* dst, Dtype to, std::size_t n, float scale,
                          cudaStream_t stream) {
  check_upcast(from, to, n, scale);
  check_pointers(src, dst, from, to, n, "upcast");
  if (n == 0) return cudaSuccess;
  const auto* s = static_cast<const std::uint8_t*>(src);
  auto* d = static_cast<std::uint8_t*>(dst);
  switch (from) {
    case Dtype::fp8_e4m3fn: return upcast_from<SrcE4M3>(s, d, to, n, scale, stream);
    case Dtype::fp8_e5m2: return upcast_from<SrcE5M2>(s, d, to, n, scale, stream);
    case Dtype::fp16: return upcast_from<SrcF16>(s, d, to, n, scale, stream);
    case Dtype::bf16: return upcast_from<SrcBF16>(s, d, to, n, scale, stream);
    default: return cudaErrorInvalidValue;  // rejected by check_upcast
  }
}

cudaError_t launch_dequant(const void* src, Dtype type, void* dst, Dtype to, std::size_t n,
                           cudaStream_t stream) {
  check_dequant(type, to, n);
  check_pointers(src, dst, type, to, n, "dequant");
  if (n == 0) return cudaSuccess;
  const auto* s = static_cast<const std::uint8_t*>(src);
  auto* d = static_cast<std::uint8_t*>(dst);
  switch (type) {
    case Dtype::q8_0: return dequant_from<BlockQ8_0>(s, d, to, n, stream);
    case Dtype::q4_0: return dequant_from<BlockQ4_0>(s, d, to, n, stream);
    case Dtype::q4_k: return dequant_from<BlockQ4K>(s, d, to, n, stream);
    case Dtype::q6_k: return dequant_from<BlockQ6K>(s, d, to, n, stream);
    default: return cudaErrorInvalidValue;  // rejected by check_dequant
  }
}

cudaError_t launch_convert_batch(std::span<const ConvertDesc> descs, cudaStream_t stream) {
  // Validate everything before launching anything.
  for (const ConvertDesc& d : descs) {
    check_convert(d.from, d.to, d.n, d.scale);
    check_pointers(d.src, d.dst, d.from, d.to, d.n, "batch");
  }
  BatchArgs args{};
  auto flush = [&]() -> cudaError_t {
    if (args.count == 0) return cudaSuccess;
    unsigned grid = 0;
    if (const cudaError_t err = grid_for(args.tile_end[args.count - 1], &grid); err != cudaSuccess) return err;
    batch_kernel<<<grid, kThreads, 0, stream>>>(args);
    args.count = 0;
    return cudaGetLastError();
  };
  for (const ConvertDesc& d : descs) {
    if (d.n == 0) continue;
    const std::uint64_t before = args.count == 0 ? 0 : args.tile_end[args.count - 1];
    args.desc[args.count] = d;
    args.tile_end[args.count] = before + tiles_of(d.n);
    if (++args.count == kBatchChunk) {
      if (const cudaError_t err = flush(); err != cudaSuccess) return err;
    }
  }
  return flush();
}

cudaError_t launch_touch(void* dst, std::size_t bytes, std::uint8_t value, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr) throw InputError("kernels.touch", "dst must be a device pointer, not null");
  const std::uint64_t mis = reinterpret_cast<std::uintptr_t>(dst) & 15u;
  const std::uint64_t head = std::min<std::uint64_t>(bytes, mis == 0 ? 0 : 16 - mis);
  const std::uint64_t nvec = (bytes - head) / 16;
  unsigned grid = 0;
  if (const cudaError_t err = grid_for(nvec / kThreads + 1, &grid); err != cudaSuccess) return err;
  touch_kernel<<<grid, kThreads, 0, stream>>>(static_cast<std::uint8_t*>(dst), head, nvec, bytes, value);
  return cudaGetLastError();
}

cudaError_t launch_copy(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) {
    throw InputError("kernels.copy", "src and dst must be device pointers, not null");
  }
  const std::uint64_t mis_d = reinterpret_cast<std::uintptr_t>(dst) & 15u;
  const std::uint64_t mis_s = reinterpret_cast<std::uintptr_t>(src) & 15u;
  std::uint64_t head = bytes;
  std::uint64_t nvec = 0;
  if (mis_d == mis_s) {
    head = std::min<std::uint64_t>(bytes, mis_d == 0 ? 0 : 16 - mis_d);
    nvec = (bytes - head) / 16;
  }
  unsigned grid = 0;
  if (const cudaError_t err = grid_for(std::max(nvec, head) / kThreads + 1, &grid); err != cudaSuccess) return err;
  copy_kernel<<<grid, kThreads, 0, stream>>>(static_cast<std::uint8_t*>(dst), static_cast<const std::uint8_t*>(src),
                                             head, nvec, bytes);
  return cudaGetLastError();
}

cudaError_t copy_d2d(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
}

}  // namespace vf::kernels
