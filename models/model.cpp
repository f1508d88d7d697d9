#include "models/model.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>
#include <functional>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "harness/core/error.h"
#include "harness/core/flat_name_index.h"

namespace vf {

std::string_view role_name(TensorRole r) {
  switch (r) {
    case TensorRole::weight: return "weight";
    case TensorRole::bias: return "bias";
    case TensorRole::norm: return "norm";
    case TensorRole::embedding: return "embedding";
    case TensorRole::scale: return "scale";
    case TensorRole::other: return "other";
  }
  return "?";
}

std::string_view kind_name(ModelKind k) {
  switch (k) {
    case ModelKind::diffusion: return "diffusion";
    case ModelKind::text_encoder: return "text_encoder";
    case ModelKind::vae: return "vae";
  }
  return "?";
}

namespace {

struct FamilyName {
  Family family;
  std::string_view name;
};
constexpr std::array<FamilyName, 12> kFamilies = {{
    {Family::flux, "flux"},
    {Family::flux2, "flux2"},
    {Family::sd3, "sd3"},
    {Family::qwen_image, "qwen_image"},
    {Family::wan21, "wan21"},
    {Family::sdxl, "sdxl"},
    {Family::sd15, "sd15"},
    {Family::t5, "t5"},
    {Family::clip, "clip"},
    {Family::mistral, "mistral"},
    {Family::vae_kl, "vae_kl"},
    {Family::generic, "generic"},
}};

bool equals_ignore_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

std::string child_path(std::string_view parent, std::string_view field, std::size_t index) {
  if (parent.empty()) return fmt::format("{}[{}]", field, index);
  return fmt::format("{}.{}[{}]", parent, field, index);
}

// Scales and buffers are stored in the file but are not model parameters: an fp8 file carries
// one scale per quantized weight, and SD3.5 stores its fixed positional table as a buffer. The
// published parameter counts (and PyTorch's parameters()) leave both out.
bool counts_as_parameter(TensorRole r) { return r != TensorRole::scale && r != TensorRole::other; }

// The path of the module that owns `m` ("a.b" for "a.b.c", the root "" for "a"); the root has
// none.
std::optional<std::string_view> parent_of(std::string_view name) {
  if (name.empty()) return std::nullopt;
  const std::size_t dot = name.rfind('.');
  return dot == std::string_view::npos ? std::string_view() : name.substr(0, dot);
}

bool below(std::string_view name, std::string_view ancestor) {
  if (ancestor.empty()) return !name.empty();
  return name.size() > ancestor.size() && name.compare(0, ancestor.size(), ancestor) == 0 && name[ancestor.size()] == '.';
}

}  // namespace

bool owns_parameters(const Module& m) {
  return std::any_of(m.tensors.begin(), m.tensors.end(), [](const Tensor& t) { return t.role != TensorRole::other; });
}

namespace {

// A set of names (views into the modules' names, which outlive it).
class NameSet {
 public:
  explicit NameSet(std::size_t expected) : index_(ViewAt{&names_}, expected) { names_.reserve(expected); }
  // Inserts `name`; false if it was there already.
  bool insert(std::string_view name) {
    if (!index_.add_if_absent(static_cast<std::uint32_t>(names_.size()), name)) return false;
    names_.push_back(name);
    return true;
  }
  bool contains(std::string_view name) const { return index_.find(name).has_value(); }

 private:
  struct ViewAt {
    const std::vector<std::string_view>* names;
    std::string_view operator()(std::uint32_t i) const { return (*names)[i]; }
  };
  std::vector<std::string_view> names_;
  FlatNameIndex<ViewAt> index_;
};

}  // namespace

void mark_containers(std::vector<Module>& modules) {
  // Every module above one that owns parameters. A path already in the set has its own
  // ancestors in it too, so each chain stops at the first one it meets.
  // The paths are views into the modules' names, which this function does not change.
  // Siblings usually come one after another: a module whose parent is the previous chain's start
  // (inserted then, or found there already) has its chain in the set.
  NameSet parents(modules.size());
  std::optional<std::string_view> last;
  for (const Module& m : modules) {
    if (!owns_parameters(m)) continue;
    auto p = parent_of(m.name);
    if (p && last && *p == *last) continue;
    last = p;
    while (p && parents.insert(*p)) p = parent_of(*p);
  }
  for (Module& m : modules) m.container = parents.contains(m.name);
}

std::string_view family_name(Family f) {
  for (const FamilyName& n : kFamilies) {
    if (n.family == f) return n.name;
  }
  return "?";
}

std::optional<Family> parse_family(std::string_view name) {
  for (const FamilyName& n : kFamilies) {
    if (equals_ignore_case(n.name, name)) return n.family;
  }
  return std::nullopt;
}

namespace {

// One pass over the model. Error messages name the field (`models[0].modules[3].tensors[1]`);
// building those paths for every tensor was most of the cost of finalizing a model (the
// shrinker refinalizes every candidate), so the first pass runs without them (`named` false)
// and only a pass that failed runs again with them, to throw the error with its path.
void finalize_pass(ModelSpec& m, std::string_view path, bool named) {
  std::uint64_t params = 0;
  Bytes model_bytes = 0;
  const std::string params_what = named ? fmt::format("{}{}params", path, path.empty() ? "" : ".") : std::string();
  const std::string bytes_what = named ? fmt::format("{}{}bytes", path, path.empty() ? "" : ".") : std::string();
  mark_containers(m.modules);
  m.module_sizes.assign(m.modules.size(), 0);
  m.module_weight_numels.assign(m.modules.size(), 0);
  m.module_flags.assign(m.modules.size(), 0);
  m.tensor_first.assign(m.modules.size() + 1, 0);
  m.tensors_flat.clear();
  m.name_rank.clear();  // an edit may have reordered the names (set_name_ranks fills it again)
  for (std::size_t mi = 0; mi < m.modules.size(); ++mi) {
    Module& mod = m.modules[mi];
    m.tensor_first[mi] = static_cast<std::uint32_t>(m.tensors_flat.size());
    const std::string module_path = named ? child_path(path, "modules", mi) : std::string();
    if (mod.container && mod.cast_hook) {
      // ComfyUI's castable ops (Linear, Conv, Norm, Embedding) are leaves: a module with
      // parameters below it is a container, and its own tensors are raw.
      const auto child = std::find_if(m.modules.begin(), m.modules.end(),
                                      [&](const Module& c) { return below(c.name, mod.name) && owns_parameters(c); });
      throw InputError(child_path(path, "modules", mi) + ".cast_hook",
                       fmt::format("module \"{}\" has parameters below it (\"{}\"), so it is a container and its own tensors "
                                   "are raw: a container has no cast hook (set \"cast_hook\": false or leave it out)",
                                   mod.name, child->name));
    }
    Bytes module_bytes = 0;
    std::uint64_t weight_numel = 0;
    for (std::size_t ti = 0; ti < mod.tensors.size(); ++ti) {
      Tensor& t = mod.tensors[ti];
      const std::string tensor_path = named ? child_path(module_path, "tensors", ti) : std::string();
      t.numel = tensor_numel(t.shape, tensor_path);
      t.bytes = tensor_bytes(t.dtype, t.shape, tensor_path);
      module_bytes = checked_add(module_bytes, t.bytes, module_path);
      if (counts_as_parameter(t.role)) params = checked_add(params, t.numel, params_what);
      if (t.role == TensorRole::weight) weight_numel += t.numel;  // <= params, checked above
    }
    mod.bytes = module_bytes;
    mod.weight_numel = weight_numel;
    m.module_sizes[mi] = module_bytes;
    m.module_weight_numels[mi] = weight_numel;
    std::uint8_t flags = (mod.cast_hook ? kModuleCastHook : 0) | (mod.container ? kModuleContainer : 0);
    for (const Tensor& t : mod.tensors) {
      m.tensors_flat.push_back(FlatTensor{t.bytes, t.numel, t.dtype, t.role});
      if (t.role == TensorRole::scale) flags |= kModuleScaled;
      if (t.role != TensorRole::other) flags |= kModuleOwnsParameters;  // owns_parameters
    }
    m.module_flags[mi] = flags;
    model_bytes = checked_add(model_bytes, module_bytes, bytes_what);
  }
  m.tensor_first[m.modules.size()] = static_cast<std::uint32_t>(m.tensors_flat.size());
  m.params = params;
  m.bytes = model_bytes;
}

}  // namespace

namespace {

// The flat arrays against the modules: their lengths always (cheap), every entry in builds with
// assertions (the sanitized suites, which shrink and edit models the most).
void check_flat(const ModelSpec& m) {
  bool ok = m.module_sizes.size() == m.modules.size() && m.module_weight_numels.size() == m.modules.size() &&
            m.module_flags.size() == m.modules.size() && m.tensor_first.size() == m.modules.size() + 1 &&
            m.tensor_first.back() == m.tensors_flat.size();
#ifndef NDEBUG
  for (std::size_t i = 0; ok && i < m.modules.size(); ++i) {
    const Module& mod = m.modules[i];
    ok = m.module_sizes[i] == mod.bytes && m.module_weight_numels[i] == mod.weight_numel &&
         ((m.module_flags[i] & kModuleCastHook) != 0) == mod.cast_hook &&
         ((m.module_flags[i] & kModuleContainer) != 0) == mod.container &&
         ((m.module_flags[i] & kModuleOwnsParameters) != 0) == owns_parameters(mod) &&
         m.tensor_first[i + 1] - m.tensor_first[i] == mod.tensors.size();
    bool scaled = false;
    for (std::size_t t = 0; ok && t < mod.tensors.size(); ++t) {
      const Tensor& tensor = mod.tensors[t];
      const FlatTensor& f = m.tensors_flat[m.tensor_first[i] + t];
      ok = f.bytes == tensor.bytes && f.numel == tensor.numel && f.dtype == tensor.dtype && f.role == tensor.role;
      scaled = scaled || tensor.role == TensorRole::scale;
    }
    ok = ok && ((m.module_flags[i] & kModuleScaled) != 0) == scaled;
  }
#endif
  if (!ok) throw InfraError(fmt::format("model \"{}\": its modules changed after finalize_model", m.name));
}

}  // namespace

void set_name_ranks(ModelSpec& m) {
  std::vector<std::uint32_t> by_name(m.modules.size());
  for (std::uint32_t i = 0; i < by_name.size(); ++i) by_name[i] = i;
  std::sort(by_name.begin(), by_name.end(), [&](std::uint32_t a, std::uint32_t b) { return m.modules[a].name < m.modules[b].name; });
  m.name_rank.assign(m.modules.size(), 0);
  std::uint32_t rank = 0;
  for (std::size_t k = 0; k < by_name.size(); ++k) {
    if (k > 0 && m.modules[by_name[k]].name != m.modules[by_name[k - 1]].name) ++rank;
    m.name_rank[by_name[k]] = rank;
  }
}

const std::vector<Bytes>& module_sizes(const ModelSpec& m) {
  check_flat(m);
  return m.module_sizes;
}

void finalize_model(ModelSpec& m, std::string_view path) {
  try {
    finalize_pass(m, path, false);
  } catch (const InputError&) {
    finalize_pass(m, path, true);  // throws the same error, naming the field
    throw;                         // not reached: a pass fails the same way with or without names
  }
}

}  // namespace vf
