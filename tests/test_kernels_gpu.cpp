// CUDA conversion kernels (kernels/convert_kernels.h) against the host reference
// (kernels/reference.h) on random data: every (source, target) upcast pair, every GGUF type and
// target, the batched launch, touch and copy. Every output element must be written (each run is
// done twice over two different sentinels) and nothing past the end may be. Built only when nvcc
// was found; without a usable GPU every device test is skipped, loudly, never passed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "harness/core/error.h"
#include "kernels/convert.h"
#include "kernels/convert_kernels.h"
#include "kernels/reference.h"

namespace {

using vf::Dtype;
namespace k = vf::kernels;

constexpr std::size_t kGuard = 64;  // bytes after each output that must stay untouched

#define CUDA_OK(expr)                                                                  \
  do {                                                                                 \
    const cudaError_t err_ = (expr);                                                   \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_);         \
  } while (0)

class KernelGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount returned " << count << " ("
                   << cudaGetErrorString(err) << "); the CUDA kernels were NOT tested";
    }
  }
};

// A device buffer freed on scope exit.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(std::size_t bytes) {
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() {
    if (ptr != nullptr) cudaFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::uint8_t* bytes() const { return static_cast<std::uint8_t*>(ptr); }
};

int elem_bytes(Dtype d) { return static_cast<int>(vf::dtype_info(d).block_bytes); }

// The value an output element decodes to (for NaN-tolerant comparison).
float decode_out(Dtype to, const std::uint8_t* p) {
  if (to == Dtype::fp32) {
    float f = 0;
    std::memcpy(&f, p, 4);
    return f;
  }
  const auto h = static_cast<std::uint16_t>(p[0] | (p[1] << 8));
  return to == Dtype::fp16 ? k::fp16_bits_to_float(h) : k::bf16_bits_to_float(h);
}

// Output equals the reference bit for bit, except that a NaN may be any NaN (the device's
// narrowing returns the canonical NaN). Reports the first few mismatches.
void expect_same_output(const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want, Dtype to,
                        std::uint64_t n, const std::string& what) {
  const int eb = elem_bytes(to);
  int reported = 0;
  std::uint64_t bad = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint8_t* g = got.data() + i * eb;
    const std::uint8_t* w = want.data() + i * eb;
    if (std::memcmp(g, w, eb) == 0) continue;
    if (std::isnan(decode_out(to, g)) && std::isnan(decode_out(to, w))) continue;
    ++bad;
    if (reported++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " differs: got " << decode_out(to, g) << ", want "
                    << decode_out(to, w);
    }
  }
  EXPECT_EQ(bad, 0u) << what;
}

void fill_random(std::vector<std::uint8_t>& v, std::mt19937& rng) {
  for (auto& b : v) b = static_cast<std::uint8_t>(rng());
}

// Random GGUF blocks with mostly realistic f16 scales (every 32nd block keeps raw random bits).
std::vector<std::uint8_t> random_blocks(Dtype type, std::uint64_t blocks, std::mt19937& rng) {
  const auto& info = vf::dtype_info(type);
  std::vector<std::uint8_t> v(blocks * info.block_bytes);
  fill_random(v, rng);
  std::vector<std::size_t> fields;
  if (type == Dtype::q6_k) {
    fields = {208};
  } else if (type == Dtype::q4_k) {
    fields = {0, 2};
  } else {
    fields = {0};
  }
  for (std::uint64_t b = 0; b < blocks; ++b) {
    if (b % 32 == 0) continue;
    for (const std::size_t f : fields) {
      const auto h = static_cast<std::uint16_t>((rng() & 0x83ff) | ((1 + rng() % 16) << 10));
      v[b * info.block_bytes + f] = static_cast<std::uint8_t>(h & 0xff);
      v[b * info.block_bytes + f + 1] = static_cast<std::uint8_t>(h >> 8);
    }
  }
  return v;
}

// Runs `launch` (which writes n elements of `to` at dst_off into the device output buffer) twice,
// over sentinels 0xa5 and 0x5a, and checks both results against `want` and the guard bytes.
template <class Launch>
void run_and_check(Launch launch, const std::vector<std::uint8_t>& want, Dtype to, std::uint64_t n,
                   std::size_t dst_off, const std::string& what) {
  const std::size_t out_bytes = static_cast<std::size_t>(n) * elem_bytes(to);
  const std::size_t total = dst_off + out_bytes + kGuard;
  DeviceBuffer dst(total);
  ASSERT_NE(dst.ptr, nullptr) << "cudaMalloc " << total;
  for (const std::uint8_t sentinel : {std::uint8_t{0xa5}, std::uint8_t{0x5a}}) {
    CUDA_OK(cudaMemset(dst.ptr, sentinel, total));
    CUDA_OK(launch(dst.bytes() + dst_off));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<std::uint8_t> host(total);
    CUDA_OK(cudaMemcpy(host.data(), dst.ptr, total, cudaMemcpyDeviceToHost));
    const std::vector<std::uint8_t> got(host.begin() + static_cast<std::ptrdiff_t>(dst_off),
                                        host.begin() + static_cast<std::ptrdiff_t>(dst_off + out_bytes));
    expect_same_output(got, want, to, n, what + " sentinel " + std::to_string(sentinel));
    for (std::size_t i = 0; i < dst_off; ++i) ASSERT_EQ(host[i], sentinel) << what << ": wrote before the output";
    for (std::size_t i = dst_off + out_bytes; i < total; ++i) {
      ASSERT_EQ(host[i], sentinel) << what << ": wrote past the end, byte " << i - dst_off - out_bytes;
    }
  }
}

const Dtype kSources[] = {Dtype::fp8_e4m3fn, Dtype::fp8_e5m2, Dtype::fp16, Dtype::bf16};
const Dtype kGguf[] = {Dtype::q8_0, Dtype::q4_0, Dtype::q4_k, Dtype::q6_k};
const Dtype kTargets[] = {Dtype::fp32, Dtype::fp16, Dtype::bf16};

TEST_F(KernelGpu, UpcastEveryPairMatchesReference) {
  std::mt19937 rng(1);
  // 3 full tiles + a partial one whose length is not a multiple of 16 (vector part + scalar tail).
  const std::uint64_t n = 3 * 4096 + 1000 + 7;
  for (const Dtype from : kSources) {
    const int in = elem_bytes(from);
    std::vector<std::uint8_t> src(n * in);
    fill_random(src, rng);
    for (const Dtype to : kTargets) {
      for (const float scale : {1.0f, 0.3f}) {
        // Aligned, then both pointers off by one element (all scalar).
        for (const std::size_t off : {std::size_t{0}, std::size_t{1}}) {
          const std::size_t src_off = off * in;
          const std::size_t dst_off = off * elem_bytes(to);
          std::vector<std::uint8_t> want(n * elem_bytes(to));
          k::upcast(std::as_bytes(std::span(src)), from, n, scale, std::as_writable_bytes(std::span(want)), to);
          DeviceBuffer dsrc(src_off + src.size());
          ASSERT_NE(dsrc.ptr, nullptr);
          CUDA_OK(cudaMemcpy(dsrc.bytes() + src_off, src.data(), src.size(), cudaMemcpyHostToDevice));
          const std::string what = std::string(vf::dtype_name(from)) + "->" + std::string(vf::dtype_name(to)) +
                                   " scale " + std::to_string(scale) + " offset " + std::to_string(off);
          run_and_check([&](std::uint8_t* d) { return k::launch_upcast(dsrc.bytes() + src_off, from, d, to, n, scale, nullptr); },
                        want, to, n, dst_off, what);
        }
      }
    }
  }
}

TEST_F(KernelGpu, DequantEveryTypeMatchesReferenceBitForBit) {
  std::mt19937 rng(2);
  for (const Dtype type : kGguf) {
    const auto& info = vf::dtype_info(type);
    // Two full tiles of 4096 elements and a partial third.
    const std::uint64_t blocks = 2 * 4096 / info.block_elems + 3;
    const std::uint64_t n = blocks * info.block_elems;
    const std::vector<std::uint8_t> src = random_blocks(type, blocks, rng);
    for (const Dtype to : kTargets) {
      // Aligned; source off by 2 bytes (byte staging); destination off by one element.
      for (const int variant : {0, 1, 2}) {
        const std::size_t src_off = variant == 1 ? 2 : 0;
        const std::size_t dst_off = variant == 2 ? static_cast<std::size_t>(elem_bytes(to)) : 0;
        std::vector<std::uint8_t> want(n * elem_bytes(to));
        k::dequant(std::as_bytes(std::span(src)), type, n, std::as_writable_bytes(std::span(want)), to);
        DeviceBuffer dsrc(src_off + src.size());
        ASSERT_NE(dsrc.ptr, nullptr);
        CUDA_OK(cudaMemcpy(dsrc.bytes() + src_off, src.data(), src.size(), cudaMemcpyHostToDevice));
        const std::string what = std::string(vf::dtype_name(type)) + "->" + std::string(vf::dtype_name(to)) +
                                 " variant " + std::to_string(variant);
        run_and_check([&](std::uint8_t* d) { return k::launch_dequant(dsrc.bytes() + src_off, type, d, to, n, nullptr); },
                      want, to, n, dst_off, what);
      }
    }
  }
}

TEST_F(KernelGpu, BatchOfManyTensorsMatchesReference) {
  // 150 tensors (three launches of up to 64 descriptors), every source kind and target, sizes
  // from empty to several tiles, packed back to back in one source and one output allocation.
  std::mt19937 rng(3);
  struct Item {
    k::ConvertDesc desc;
    std::size_t src_at = 0;
    std::size_t dst_at = 0;
    std::vector<std::uint8_t> want;
  };
  std::vector<Item> items;
  std::vector<std::uint8_t> src_all;
  std::size_t dst_total = 0;
  const Dtype all_from[] = {Dtype::fp8_e4m3fn, Dtype::fp8_e5m2, Dtype::fp16, Dtype::bf16,
                            Dtype::q8_0,       Dtype::q4_0,     Dtype::q4_k, Dtype::q6_k};
  for (int i = 0; i < 150; ++i) {
    Item it;
    const Dtype from = all_from[i % 8];
    const Dtype to = kTargets[(i / 8) % 3];
    const auto& info = vf::dtype_info(from);
    const std::uint64_t units = i % 17 == 0 ? 0 : 1 + rng() % (i % 5 == 0 ? 9000 / info.block_elems + 40 : 300);
    const std::uint64_t n = units * info.block_elems;
    std::vector<std::uint8_t> src;
    if (info.gguf_quantized) {
      src = random_blocks(from, units, rng);
    } else {
      src.resize(n * info.block_bytes);
      fill_random(src, rng);
    }
    it.desc.from = from;
    it.desc.to = to;
    it.desc.n = n;
    it.desc.scale = i % 3 == 0 ? 1.0f : 0.5f + static_cast<float>(i) / 64.0f;
    it.want.resize(n * elem_bytes(to));
    const auto s = std::as_bytes(std::span(src));
    const auto w = std::as_writable_bytes(std::span(it.want));
    if (info.gguf_quantized) {
      k::dequant(s, from, n, w, to);
    } else {
      k::upcast(s, from, n, it.desc.scale, w, to);
    }
    // Mix alignments: most tensors 16-byte aligned, every 7th one shifted by one element.
    const std::size_t in_align = info.gguf_quantized ? 1 : info.block_bytes;
    src_all.resize((src_all.size() + 15) / 16 * 16 + (i % 7 == 3 ? in_align : 0));
    it.src_at = src_all.size();
    src_all.insert(src_all.end(), src.begin(), src.end());
    dst_total = (dst_total + 15) / 16 * 16 + (i % 7 == 4 ? static_cast<std::size_t>(elem_bytes(to)) : 0);
    it.dst_at = dst_total;
    dst_total += it.want.size() + kGuard;
    items.push_back(std::move(it));
  }
  DeviceBuffer dsrc(src_all.size() + 16);
  DeviceBuffer ddst(dst_total + 16);
  ASSERT_NE(dsrc.ptr, nullptr);
  ASSERT_NE(ddst.ptr, nullptr);
  CUDA_OK(cudaMemcpy(dsrc.ptr, src_all.data(), src_all.size(), cudaMemcpyHostToDevice));
  std::vector<k::ConvertDesc> descs;
  for (Item& it : items) {
    it.desc.src = dsrc.bytes() + it.src_at;
    it.desc.dst = ddst.bytes() + it.dst_at;
    descs.push_back(it.desc);
  }
  for (const std::uint8_t sentinel : {std::uint8_t{0xa5}, std::uint8_t{0x5a}}) {
    CUDA_OK(cudaMemset(ddst.ptr, sentinel, dst_total + 16));
    CUDA_OK(k::launch_convert_batch(descs, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<std::uint8_t> host(dst_total + 16);
    CUDA_OK(cudaMemcpy(host.data(), ddst.ptr, host.size(), cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < items.size(); ++i) {
      const Item& it = items[i];
      const std::vector<std::uint8_t> got(host.begin() + static_cast<std::ptrdiff_t>(it.dst_at),
                                          host.begin() + static_cast<std::ptrdiff_t>(it.dst_at + it.want.size()));
      const std::string what = "batch item " + std::to_string(i) + " " + std::string(vf::dtype_name(it.desc.from)) +
                               "->" + std::string(vf::dtype_name(it.desc.to)) + " n " + std::to_string(it.desc.n);
      expect_same_output(got, it.want, it.desc.to, it.desc.n, what);
      for (std::size_t g = 0; g < kGuard; ++g) {
        ASSERT_EQ(host[it.dst_at + it.want.size() + g], sentinel) << what << ": wrote past the end";
      }
    }
  }
}

TEST_F(KernelGpu, TouchWritesEveryByteAndNothingElse) {
  for (const std::size_t off : {std::size_t{0}, std::size_t{3}}) {
    for (const std::size_t bytes : {std::size_t{1}, std::size_t{15}, std::size_t{4097}, std::size_t{(1u << 20) + 13}}) {
      const std::size_t total = off + bytes + kGuard;
      DeviceBuffer buf(total);
      ASSERT_NE(buf.ptr, nullptr);
      CUDA_OK(cudaMemset(buf.ptr, 0x11, total));
      CUDA_OK(k::launch_touch(buf.bytes() + off, bytes, 0xc3, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      std::vector<std::uint8_t> host(total);
      CUDA_OK(cudaMemcpy(host.data(), buf.ptr, total, cudaMemcpyDeviceToHost));
      for (std::size_t i = 0; i < total; ++i) {
        const std::uint8_t want = i >= off && i < off + bytes ? 0xc3 : 0x11;
        ASSERT_EQ(host[i], want) << "offset " << off << " bytes " << bytes << " at " << i;
      }
    }
  }
}

TEST_F(KernelGpu, CopyKernelAndCopyEngineCopyExactly) {
  std::mt19937 rng(4);
  const std::size_t bytes = (1u << 20) + 77;
  std::vector<std::uint8_t> src(bytes + 16);
  fill_random(src, rng);
  DeviceBuffer dsrc(bytes + 16);
  DeviceBuffer ddst(bytes + 16 + kGuard);
  ASSERT_NE(dsrc.ptr, nullptr);
  ASSERT_NE(ddst.ptr, nullptr);
  CUDA_OK(cudaMemcpy(dsrc.ptr, src.data(), src.size(), cudaMemcpyHostToDevice));
  // (src offset, dst offset): aligned, equally misaligned, differently misaligned.
  for (const auto& [so, dof] : {std::pair<std::size_t, std::size_t>{0, 0}, {5, 5}, {3, 8}}) {
    for (const bool engine : {false, true}) {
      CUDA_OK(cudaMemset(ddst.ptr, 0xee, bytes + 16 + kGuard));
      CUDA_OK(engine ? k::copy_d2d(ddst.bytes() + dof, dsrc.bytes() + so, bytes, nullptr)
                     : k::launch_copy(ddst.bytes() + dof, dsrc.bytes() + so, bytes, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      std::vector<std::uint8_t> host(bytes + 16 + kGuard);
      CUDA_OK(cudaMemcpy(host.data(), ddst.ptr, host.size(), cudaMemcpyDeviceToHost));
      ASSERT_EQ(std::memcmp(host.data() + dof, src.data() + so, bytes), 0) << "engine " << engine << " " << so << "/" << dof;
      for (std::size_t i = 0; i < dof; ++i) ASSERT_EQ(host[i], 0xee);
      for (std::size_t i = dof + bytes; i < host.size(); ++i) ASSERT_EQ(host[i], 0xee);
    }
  }
}

// Argument checks happen before any CUDA call, so they run (and pass) without a GPU.
TEST(KernelCudaArgs, BadArgumentsThrowBeforeLaunching) {
  auto* fake = reinterpret_cast<void*>(std::uintptr_t{0x1000});
  EXPECT_THROW(k::launch_dequant(fake, Dtype::q8_0, fake, Dtype::fp32, 33, nullptr), vf::InputError);
  EXPECT_THROW(k::launch_dequant(fake, Dtype::q5_k, fake, Dtype::fp32, 256, nullptr), vf::InputError);
  EXPECT_THROW(k::launch_upcast(fake, Dtype::fp32, fake, Dtype::fp16, 16, 1.0f, nullptr), vf::InputError);
  EXPECT_THROW(k::launch_upcast(fake, Dtype::fp16, fake, Dtype::fp8_e5m2, 16, 1.0f, nullptr), vf::InputError);
  EXPECT_THROW(k::launch_upcast(fake, Dtype::fp8_e4m3fn, fake, Dtype::fp16, 16, NAN, nullptr), vf::InputError);
  EXPECT_THROW(k::launch_upcast(nullptr, Dtype::fp8_e4m3fn, fake, Dtype::fp16, 16, 1.0f, nullptr), vf::InputError);
  // fp16 source at an odd address; fp32 target not 4-byte aligned.
  auto* odd = reinterpret_cast<void*>(std::uintptr_t{0x1001});
  auto* two = reinterpret_cast<void*>(std::uintptr_t{0x1002});
  EXPECT_THROW(k::launch_upcast(odd, Dtype::fp16, fake, Dtype::fp32, 16, 1.0f, nullptr), vf::InputError);
  EXPECT_THROW(k::launch_upcast(fake, Dtype::fp16, two, Dtype::fp32, 16, 1.0f, nullptr), vf::InputError);
  const k::ConvertDesc bad{fake, fake, 100, Dtype::q4_k, Dtype::fp16, 1.0f};
  EXPECT_THROW(k::launch_convert_batch(std::span(&bad, 1), nullptr), vf::InputError);
  EXPECT_THROW(k::launch_touch(nullptr, 16, 0, nullptr), vf::InputError);
  // Nothing to do is not an error, and needs no device.
  EXPECT_EQ(k::launch_upcast(fake, Dtype::bf16, fake, Dtype::fp32, 0, 1.0f, nullptr), cudaSuccess);
  EXPECT_EQ(k::launch_convert_batch({}, nullptr), cudaSuccess);
}

}  // namespace
