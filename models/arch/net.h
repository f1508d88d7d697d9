// The small vocabulary the architecture rules are written in: a Net collects modules in forward
// order while a rule walks the network, one call per PyTorch layer (Linear, Conv, Norm, ...).
// Every tensor is created in the model's native dtype; the storage rules (storage.h) re-type
// them afterwards, and finalize_model fills in the sizes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "models/model.h"

namespace vf::arch {

using Shape = std::vector<std::uint64_t>;

// "a.b" from a parent path and a child name; the root has an empty path.
inline std::string sub(std::string_view parent, std::string_view child) {
  if (parent.empty()) return std::string(child);
  return fmt::format("{}.{}", parent, child);
}
inline std::string sub(std::string_view parent, std::uint64_t index) { return sub(parent, fmt::format("{}", index)); }

class Net {
 public:
  explicit Net(Dtype native) : native_(native) {}

  // nn.Linear: weight [out, in], bias [out].
  void linear(std::string_view path, std::uint64_t in, std::uint64_t out, bool bias = true) {
    Module& m = add(path, true);
    push(m, "weight", {out, in}, TensorRole::weight);
    if (bias) push(m, "bias", {out}, TensorRole::bias);
  }

  // nn.Conv2d with a square kernel: weight [out, in, k, k], bias [out].
  void conv2d(std::string_view path, std::uint64_t in, std::uint64_t out, std::uint64_t kernel, bool bias = true) {
    Module& m = add(path, true);
    push(m, "weight", {out, in, kernel, kernel}, TensorRole::weight);
    if (bias) push(m, "bias", {out}, TensorRole::bias);
  }

  // nn.Conv3d: weight [out, in, kt, kh, kw], bias [out] (Wan's patch embedding).
  void conv3d(std::string_view path, std::uint64_t in, std::uint64_t out, std::uint64_t kt, std::uint64_t kh,
              std::uint64_t kw) {
    Module& m = add(path, true);
    push(m, "weight", {out, in, kt, kh, kw}, TensorRole::weight);
    push(m, "bias", {out}, TensorRole::bias);
  }

  // An affine norm (LayerNorm / GroupNorm: "weight" + "bias"; RMSNorm: "weight" only, or
  // "scale" in the BFL checkpoints). Norms without affine parameters own no tensors and are
  // simply not declared.
  void norm(std::string_view path, std::uint64_t dim, bool shift, std::string_view scale_name = "weight") {
    Module& m = add(path, true);
    push(m, scale_name, {dim}, TensorRole::norm);
    if (shift) push(m, "bias", {dim}, TensorRole::norm);
  }

  // nn.Embedding: a lookup table [rows, dim].
  void embedding(std::string_view path, std::uint64_t rows, std::uint64_t dim) {
    Module& m = add(path, true);
    push(m, "weight", {rows, dim}, TensorRole::embedding);
  }

  // A raw nn.Parameter or buffer owned by `path` outside any castable op (Wan's per-block
  // `modulation`, SD3.5's `pos_embed`, a BatchNorm's running stats): no cast hook, so ComfyUI
  // never offloads it. Consecutive raw tensors of one owner share its module.
  void raw(std::string_view path, std::string_view name, Shape shape, TensorRole role) {
    const bool same_owner = !modules_.empty() && !modules_.back().cast_hook && modules_.back().name == path;
    Module& m = same_owner ? modules_.back() : add(path, false);
    push(m, name, std::move(shape), role);
  }

  std::vector<Module> take() && { return std::move(modules_); }

 private:
  Module& add(std::string_view path, bool cast_hook) {
    Module m;
    m.name = std::string(path);
    m.cast_hook = cast_hook;
    modules_.push_back(std::move(m));
    return modules_.back();
  }
  void push(Module& m, std::string_view name, Shape shape, TensorRole role) {
    Tensor t;
    t.name = std::string(name);
    t.shape = std::move(shape);
    t.dtype = native_;
    t.role = role;
    m.tensors.push_back(std::move(t));
  }

  Dtype native_;
  std::vector<Module> modules_;
};

// What a rule returns: the modules plus the numbers the activation rules and ComfyUI's
// estimate need. catalog.cpp adds the name, kind, family and storage.
struct Built {
  std::vector<Module> modules;
  ArchShape arch;
  double memory_usage_factor = 1.0;
};

// One function per catalog model, grouped by family in models/arch/*.cpp.
Built flux1_dev(Dtype native);
Built flux2_dev(Dtype native);
Built sd35_large(Dtype native);
Built qwen_image(Dtype native);
Built wan21_14b(Dtype native);
Built sdxl_unet(Dtype native);
Built sd15_unet(Dtype native);
Built t5xxl_encoder(Dtype native);
Built clip_l(Dtype native);
Built flux2_text_encoder(Dtype native);
Built flux_vae(Dtype native);
Built flux2_vae(Dtype native);

}  // namespace vf::arch
