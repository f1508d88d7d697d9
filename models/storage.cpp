#include "models/storage.h"

#include <array>
#include <string>

#include "harness/core/bytes.h"

namespace vf {
namespace {

// ---- fp8 / int8 safetensors ("fp8_scaled", "int8_blockwise") -----------------------------------
// Only matmul / conv weights (2-D and up) are quantized; biases, norms, embeddings and buffers
// stay in the release dtype, as ComfyUI's quantized files keep them.
bool quantized_in_8bit(const Tensor& t) { return t.role == TensorRole::weight && t.shape.size() >= 2; }

// ComfyUI's int8 blockwise format scales 128 x 128 tiles of a weight.
constexpr std::uint64_t kInt8ScaleBlock = 128;

// The scale that travels with a quantized weight: one fp32 scalar `scale_weight` for fp8 (the
// legacy ComfyUI name), a [ceil(N/128), ceil(K/128)] fp32 grid `weight_scale` for int8, where N
// is the output dimension and K everything else (the input width for a Linear).
Tensor scale_for(const Tensor& weight) {
  Tensor s;
  s.dtype = Dtype::fp32;
  s.role = TensorRole::scale;
  if (weight.dtype != Dtype::int8) {
    s.name = "scale_weight";
    return s;  // empty shape: a scalar
  }
  const std::uint64_t out = weight.shape.front();
  std::uint64_t in = 1;
  for (std::size_t i = 1; i < weight.shape.size(); ++i) in *= weight.shape[i];
  s.name = "weight_scale";
  s.shape = {ceil_div(out, kInt8ScaleBlock), ceil_div(in, kInt8ScaleBlock)};
  return s;
}

void apply_8bit(Module& m, StorageChoice storage, Dtype native) {
  std::vector<Tensor> out;
  out.reserve(m.tensors.size() * 2);
  for (Tensor& t : m.tensors) {
    if (!quantized_in_8bit(t)) {
      t.dtype = native;
      out.push_back(std::move(t));
      continue;
    }
    t.dtype = storage.dtype;
    const bool scaled = storage.scaled;
    Tensor scale = scaled ? scale_for(t) : Tensor{};
    out.push_back(std::move(t));
    if (scaled) out.push_back(std::move(scale));
  }
  m.tensors = std::move(out);
}

// ---- GGUF (city96 ComfyUI-GGUF convert, then llama.cpp's quantizer) -----------------------------
// Tensors of at most this many elements are kept F32 (convert.py's QUANTIZATION_THRESHOLD).
constexpr std::uint64_t kGgufSmallTensor = 1024;
// The latent has 4 channels in SD / SDXL: convs into or out of it stay F32.
constexpr std::uint64_t kGgufLatentChannels = 4;

// Input / output projections and timestep embedders whose `.weight` stays F32.
constexpr std::array<std::string_view, 8> kGgufKeepWide = {
    "time_embedding.", "add_embedding.", "time_in.", "txt_in.", "vector_in.", "img_in.", "guidance_in.", "final_layer.",
};

bool keep_wide_by_name(std::string_view module, const Tensor& t) {
  if (t.name != "weight") return false;
  const std::string key = std::string(module) + ".";
  for (std::string_view k : kGgufKeepWide) {
    if (key.find(k) != std::string::npos) return true;
  }
  return false;
}

std::uint64_t numel_unchecked(const Tensor& t) {
  std::uint64_t n = 1;
  for (std::uint64_t d : t.shape) n *= d;
  return n;
}

// llama.cpp's fallback for K-quants on rows that are not whole 256-element super-blocks.
Dtype k_quant_fallback(Dtype d) {
  switch (d) {
    case Dtype::q2_k:
    case Dtype::q3_k: return Dtype::q4_0;
    case Dtype::q4_k: return Dtype::q5_0;
    case Dtype::q5_k: return Dtype::q5_1;
    case Dtype::q6_k: return Dtype::q8_0;
    default: return d;
  }
}

}  // namespace

Dtype gguf_row_fallback(Dtype requested, std::uint64_t row) {
  Dtype d = requested;
  if (dtype_info(d).block_elems == 256 && row % 256 != 0) d = k_quant_fallback(d);
  if (dtype_info(d).block_elems == 32 && row % 32 != 0) d = Dtype::fp16;
  return d;
}

Dtype gguf_tensor_type(std::string_view module, const Tensor& t, Dtype requested) {
  if (t.shape.size() <= 1) return Dtype::fp32;                // biases, norms: barely any bytes
  if (numel_unchecked(t) <= kGgufSmallTensor) return Dtype::fp32;
  if (t.shape.size() >= 4) return Dtype::fp32;                // conv kernels
  if (t.shape[0] == kGgufLatentChannels || t.shape[1] == kGgufLatentChannels) return Dtype::fp32;
  if (keep_wide_by_name(module, t)) return Dtype::fp32;
  if (t.name == "modulation") return Dtype::fp32;             // Wan's raw parameters (keys_hiprec)
  return gguf_row_fallback(requested, t.shape.back());
}

void apply_storage(std::vector<Module>& modules, StorageChoice storage, Dtype native) {
  const DtypeInfo& info = dtype_info(storage.dtype);
  for (Module& m : modules) {
    if (info.compute) {
      for (Tensor& t : m.tensors) t.dtype = storage.dtype;  // a plain float file: one dtype throughout
    } else if (info.gguf_quantized) {
      for (Tensor& t : m.tensors) t.dtype = gguf_tensor_type(m.name, t, storage.dtype);
    } else {
      apply_8bit(m, storage, native);  // fp8_e4m3fn, fp8_e5m2, int8
    }
  }
}

}  // namespace vf
