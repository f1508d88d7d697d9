// CUDA kernels for the conversions a weight goes through when it reaches the GPU (upcast of fp8 /
// fp16 / bf16, dequant of GGUF blocks), the activation "touch" kernel and the copy baseline.
// A plain C++ API: include it from g++ code and link vf_kernels_cuda (which brings cudart_static).
//
// Errors: bad arguments throw vf::InputError before anything is launched (the same checks and
// messages as the host reference in kernels/reference.h, plus pointer alignment to the element
// size); CUDA failures (no device, a bad launch) are returned as the cudaError_t. Every launch is
// asynchronous on `stream`; pointers are device pointers; src and dst must not overlap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include <cuda_runtime_api.h>

#include "harness/core/dtype.h"

namespace vf::kernels {

// dst[i] = narrow_to(decode_from(src[i]) * scale), i < n. from: fp8_e4m3fn, fp8_e5m2, fp16, bf16;
// to: fp32, fp16, bf16.
cudaError_t launch_upcast(const void* src, Dtype from, void* dst, Dtype to, std::size_t n, float scale,
                          cudaStream_t stream);

// Dequantize n elements (whole blocks) of q8_0 / q4_0 / q4_k / q6_k into fp32, fp16 or bf16.
cudaError_t launch_dequant(const void* src, Dtype type, void* dst, Dtype to, std::size_t n,
                           cudaStream_t stream);

// One tensor of a batched conversion: an upcast when `from` is an fp8 / fp16 / bf16 type (with
// `scale`), a dequant when it is a GGUF block type (`scale` ignored).
struct ConvertDesc {
  const void* src = nullptr;
  void* dst = nullptr;
  std::uint64_t n = 0;  // elements
  Dtype from = Dtype::fp8_e4m3fn;
  Dtype to = Dtype::bf16;
  float scale = 1.0f;
};

// How many descriptors one batched launch carries (by value, in the kernel's parameter space).
inline constexpr std::size_t kBatchChunk = 64;

// Convert many tensors with one launch per kBatchChunk descriptors (not one per tensor). `descs`
// is a host array; the tensors' tiles are spread over one grid.
cudaError_t launch_convert_batch(std::span<const ConvertDesc> descs, cudaStream_t stream);

// Write `value` to every byte of [dst, dst + bytes): the stand-in for a module's compute, so an
// activation buffer is really written (any alignment).
cudaError_t launch_touch(void* dst, std::size_t bytes, std::uint8_t value, cudaStream_t stream);

// Device-to-device copy with a kernel that has the conversion kernels' access pattern (16-byte
// vectors, grid-stride), for comparing against the copy engine.
cudaError_t launch_copy(void* dst, const void* src, std::size_t bytes, cudaStream_t stream);

// Device-to-device copy through cudaMemcpyAsync: the bandwidth baseline (ci/gpu-check.sh).
cudaError_t copy_d2d(void* dst, const void* src, std::size_t bytes, cudaStream_t stream);

}  // namespace vf::kernels
