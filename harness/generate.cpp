#include "harness/generate.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <span>

#include <fmt/format.h>

#include "harness/core/error.h"
#include "harness/predictors/external.h"
#include "models/activation.h"

namespace vf {
namespace {

struct PipelineShape {
  std::string_view name;
  std::array<std::string_view, 4> models;  // empty = unused; order = pipeline order
};

// Pipelines people run, text encoder(s) -> diffusion model -> VAE, plus single models, smallest
// first: RapidCheck shrinks every draw toward its lower bound, so index 0 must be the simplest.
constexpr PipelineShape kPipelines[] = {
    {"sd15", {"sd15-unet", "", "", ""}},
    {"sdxl", {"clip-l", "sdxl-unet", "", ""}},
    {"t5", {"t5xxl", "", "", ""}},
    {"flux1-dit", {"flux1-dev", "", "", ""}},
    {"sd35", {"t5xxl", "sd35-large", "", ""}},
    {"wan", {"wan21-14b", "", "", ""}},
    {"flux2-te", {"flux2-text-encoder", "", "", ""}},
    {"qwen", {"qwen-image", "", "", ""}},
    {"flux1", {"t5xxl", "clip-l", "flux1-dev", "flux-vae"}},
    {"flux2-dit", {"flux2-dev", "", "", ""}},
    {"flux2", {"flux2-text-encoder", "flux2-dev", "flux2-vae", ""}},
};

// Storage / compute pairs that carry the origin bugs: fp8 -> bf16 / fp32, bf16 -> fp32,
// GGUF -> fp16 / bf16, and the plain native case.
struct DtypePair {
  Dtype storage;
  Dtype compute;
};
constexpr DtypePair kDtypePairs[] = {
    {Dtype::bf16, Dtype::bf16},       {Dtype::fp8_e4m3fn, Dtype::bf16}, {Dtype::fp8_e4m3fn, Dtype::fp32},
    {Dtype::fp8_e5m2, Dtype::fp16},   {Dtype::bf16, Dtype::fp32},       {Dtype::fp16, Dtype::fp16},
    {Dtype::q8_0, Dtype::fp16},       {Dtype::q4_k, Dtype::bf16},       {Dtype::q5_k, Dtype::fp16},
    {Dtype::q6_k, Dtype::bf16},       {Dtype::q4_0, Dtype::fp16},       {Dtype::int8, Dtype::bf16},
};

// `exact` is not drawn: with no reserve it is a lower bound by construction (allocator rounding
// always exceeds it); it is checked against each mode's overhead bound by its own property.
constexpr std::string_view kPolicies[] = {"comfy:oct2025", "comfy:nov2025", "comfy:dec2025", "comfy:feb2026", "comfy:sep2026"};

// The torch allocator under dynamic VRAM: cudaMallocAsync is ComfyUI's default (forced for cu130
// torch builds), the native caching allocator is what --disable-cuda-malloc gives, raw what
// PYTORCH_NO_CUDA_MEMORY_CACHING=1 gives. Expandable segments ComfyUI strips.
constexpr AllocatorMode kDynamicAllocators[] = {AllocatorMode::async, AllocatorMode::async, AllocatorMode::caching,
                                                AllocatorMode::raw};

template <typename T, std::size_t N>
const T& pick(Choices& c, const T (&items)[N]) {
  return items[c.draw(0, N - 1)];
}

// A synthetic model with the outliers that break largest-layer reserves: an embedding, fused
// projections, one giant tensor followed by many tiny ones (the WAN text-encoder pattern).
std::shared_ptr<ModelSpec> synthetic_model(Choices& c, Dtype storage, std::string_view id) {
  auto m = std::make_shared<ModelSpec>();
  m->name = std::string(id);
  m->source = "inline";
  m->kind = ModelKind::diffusion;
  m->family = Family::generic;
  const std::uint64_t hidden = 256 * c.draw(4, 24);  // 1024 .. 6144
  m->arch = ArchShape{16, static_cast<std::uint32_t>(hidden), static_cast<std::uint32_t>(hidden * c.draw(3, 7)), 256, 2, 1, false, 0};
  // A hand-tuned factor, as ComfyUI's are, and no better or worse tuned than theirs: ComfyUI's
  // estimate over vramfuzz's formula at 1024 x 1024 (the margin) is drawn log-uniformly from the
  // range the catalog's diffusion models span (catalog_activation_margin(): 1.38, SDXL, to 14.8,
  // FLUX.2). Without that, a campaign would report its own under-tuned factors as ComfyUI bugs.
  const ActivationMarginRange& range = catalog_activation_margin();
  const double margin = range.lo * std::pow(range.hi / range.lo, static_cast<double>(c.draw(0, 1000)) / 1000.0);
  m->memory_usage_factor = 1.0;
  {
    const Workload reference;
    const double per_unit_factor = static_cast<double>(comfy_memory_required(*m, reference, 1, Dtype::bf16, true, "synthetic")) /
                                   static_cast<double>(activation_working_set(*m, reference, 1, Dtype::bf16, "synthetic"));
    m->memory_usage_factor = margin / per_unit_factor;
  }
  auto add = [&](std::string name, std::vector<std::uint64_t> shape, Dtype d, TensorRole role) {
    Module mod;
    mod.name = std::move(name);
    mod.tensors.push_back(Tensor{"weight", std::move(shape), d, role, 0, 0});
    m->modules.push_back(std::move(mod));
  };
  const bool quantized_ok = hidden % 256 == 0;
  const Dtype w = quantized_ok || !dtype_info(storage).gguf_quantized ? storage : Dtype::bf16;
  if (c.chance(1, 2)) add("embed", {256 * c.draw(64, 1024), hidden}, Dtype::bf16, TensorRole::embedding);
  if (c.chance(1, 2)) add("giant", {hidden * c.draw(4, 16), hidden}, w, TensorRole::weight);
  const std::uint64_t blocks = c.draw(1, 48);
  for (std::uint64_t b = 0; b < blocks; ++b) {
    const std::uint64_t fused = c.chance(1, 3) ? 3 : 1;
    add(fmt::format("blocks.{}.qkv", b), {hidden * fused, hidden}, w, TensorRole::weight);
    add(fmt::format("blocks.{}.mlp", b), {hidden * c.draw(2, 4), hidden}, w, TensorRole::weight);
    add(fmt::format("blocks.{}.norm", b), {hidden}, Dtype::fp32, TensorRole::norm);
  }
  const std::uint64_t tiny = c.draw(0, 64);
  for (std::uint64_t t = 0; t < tiny; ++t) add(fmt::format("tiny.{}", t), {c.draw(1, 64) * 64}, Dtype::fp32, TensorRole::norm);
  finalize_model(*m, id);
  return m;
}

// What only dynamic VRAM reacts to: sampling steps (weights faulted in step 1 stay resident), other
// processes changing memory while the case runs (seen through aimdo's 2 s poll), models that
// prefetch their blocks (synthetic ones stand in for LTX-AV / MiniMax), legacy patchers (custom
// nodes' GGUF loaders) next to dynamic models.
void draw_dynamic(Choices& c, Scenario& s) {
  const bool diffusion = std::any_of(s.models.begin(), s.models.end(), [](const ModelRef& m) { return m.spec->kind == ModelKind::diffusion; });
  if (diffusion) s.workload.steps = static_cast<std::uint32_t>(1 + c.draw(0, 2));
  for (ModelRef& m : s.models) {
    if (m.source == "inline" && m.spec->family == Family::generic && c.chance(1, 2)) m.prefetch = true;
    if (s.models.size() > 1 && c.chance(1, 8)) m.legacy = true;
  }
  if (c.chance(1, 4)) {
    const std::uint64_t n = c.draw(1, 3);
    std::uint64_t at_ms = 0;
    Bytes held = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
      at_ms += c.draw(0, 1500);
      OthersEvent ev;
      ev.at_us = at_ms * 1000;
      if (held > 0 && c.chance(1, 3)) {
        ev.take = false;
        ev.bytes = held;
        held = 0;
      } else {
        ev.bytes = c.draw(1, 64) * 32 * MiB;
        ev.bytes = std::min(ev.bytes, s.device.total / 2);
        held += ev.bytes;
      }
      s.device.events.push_back(ev);
    }
  }
}

}  // namespace

std::vector<std::string> split_policy_list(std::string_view text) {
  // `exec:COMMAND` takes the rest of the list: a command has commas of its own.
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    if (text.substr(start).rfind("exec:", 0) == 0) {
      out.emplace_back(text.substr(start));
      break;
    }
    const std::size_t comma = text.find(',', start);
    const std::size_t end = comma == std::string_view::npos ? text.size() : comma;
    out.emplace_back(text.substr(start, end - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string parse_policy_list(std::string_view text, std::string_view what,
                              const std::vector<std::pair<std::string, std::string>>& overrides, bool reserve_flag) {
  std::string out;
  for (const std::string& one : split_policy_list(text)) {
    if (one.empty()) throw InputError(std::string(what), fmt::format("an empty policy in \"{}\"", text));
    Policy p = parse_policy(one, what);
    for (const auto& [k, v] : overrides) apply_policy_override(p, k, v, reserve_flag && k == "reserve" ? "--reserve" : "--set");
    out += (out.empty() ? "" : ",") + p.label();
  }
  return out;
}

std::string policy_list_flag(std::string_view labels) {
  std::string out;
  for (const std::string& one : split_policy_list(labels)) {
    std::string text = one;
    if (one.rfind("exec:", 0) == 0) {
      if (const std::string cmd = external_command(one.substr(5)); !cmd.empty()) text = "exec:" + cmd;
    }
    out += (out.empty() ? "" : ",") + text;
  }
  return out;
}

Scenario generate_scenario(Choices& c, const GenConfig& cfg, Catalog& catalog) {
  Scenario s;
  // Device.
  s.device.name = "sim";
  s.device.total = cfg.vram ? *cfg.vram : Bytes{pick(c, kDeviceSizesGiB)} * GiB;
  if (c.chance(1, 2)) s.device.used_by_others = c.draw(0, 24) * 64 * MiB;  // a desktop, a second app
  if (s.device.used_by_others + s.device.context_overhead >= s.device.total / 2) s.device.used_by_others = 0;

  // Allocator and policy.
  s.allocator.mode = cfg.allocator ? *cfg.allocator : pick(c, kAllAllocatorModes);
  if (cfg.allocator) s.allocator.options = cfg.allocator_options;
  // The policies to draw from (--policy a,b or every preset), less those ComfyUI cannot run with
  // the allocator: expandable segments only under the classic presets (ComfyUI strips them
  // since), comfy:feb2026 only with cudaMallocAsync.
  std::vector<std::string> candidates;
  if (cfg.policy) {
    candidates = split_policy_list(*cfg.policy);
  } else {
    for (std::string_view p : kPolicies) candidates.emplace_back(p);
  }
  // (A drawn allocator is drawn again for a dynamic preset.)
  if (cfg.allocator && s.allocator.mode != AllocatorMode::async) {
    const bool expandable = s.allocator.mode == AllocatorMode::caching_expandable;
    std::erase_if(candidates, [&](const std::string& p) {
      const Policy probe = parse_policy(p, "--policy", StartCommand::refuse);
      return probe.dynamic() && (expandable || probe.preset == Preset::feb2026);
    });
  }
  if (candidates.empty()) {
    throw InputError("--policy", fmt::format("no policy of \"{}\" can run with the {} allocator", cfg.policy.value_or(""),
                                             allocator_mode_name(s.allocator.mode)));
  }
  const std::string policy = candidates[c.draw(0, candidates.size() - 1)];
  s.policy = parse_policy(policy, "--policy", StartCommand::refuse);
  if (s.policy.dynamic() && !cfg.allocator) {
    s.allocator.mode = s.policy.preset == Preset::feb2026 ? AllocatorMode::async : pick(c, kDynamicAllocators);
  }
  if (!cfg.policy && c.chance(1, 4)) apply_policy_override(s.policy, "reserve", fmt::format("{}MiB", c.draw(4, 24) * 50), "policy");
  for (const auto& [k, v] : cfg.policy_overrides) apply_policy_override(s.policy, k, v, "policy");

  // Models: a real pipeline, or a synthetic outlier model.
  DtypePair pair = pick(c, kDtypePairs);
  if (cfg.dtypes) pair = DtypePair{cfg.dtypes->first, cfg.dtypes->second};
  const bool lora = c.chance(1, 4);
  if (cfg.model) {
    ModelRef ref;
    ref.id = cfg.model->name;
    ref.source = cfg.model->source;
    ref.compute = pair.compute;  // the file fixes the storage; the compute dtype is still drawn
    ref.lora = lora && cfg.model->kind == ModelKind::diffusion;
    ref.spec = cfg.model;
    s.models.push_back(std::move(ref));
    s.name = cfg.model->name;
  } else if (c.chance(1, 6)) {
    ModelRef ref;
    ref.id = "synthetic";
    ref.source = "inline";
    ref.compute = pair.compute;
    ref.lora = lora;
    ref.spec = synthetic_model(c, pair.storage, "synthetic");
    s.models.push_back(std::move(ref));
    s.name = "synthetic";
  } else {
    const PipelineShape& shape = pick(c, kPipelines);
    s.name = std::string(shape.name);
    for (std::string_view name : shape.models) {
      if (name.empty()) continue;
      const CatalogEntry* e = find_catalog_entry(name);
      if (!e) continue;
      ModelRef ref;
      ref.id = std::string(name);
      ref.source = fmt::format("catalog:{}", name);
      // VAEs and small encoders keep their native dtype; the big models take the drawn pair.
      const bool small = e->kind == ModelKind::vae || name == "clip-l";
      ref.storage = StorageChoice{small ? e->native_dtype : pair.storage, c.chance(3, 4)};
      ref.storage_given = !small;
      ref.compute = small ? (e->kind == ModelKind::vae && c.chance(1, 3) ? Dtype::fp32 : Dtype::bf16) : pair.compute;
      ref.lora = lora && e->kind == ModelKind::diffusion;
      ref.spec = catalog.get(name, ref.storage, ref.id);
      s.models.push_back(std::move(ref));
    }
  }

  // Workload: resolutions across the budget knee, batches, video frames, CFG.
  s.workload.width = static_cast<std::uint32_t>(64 * c.draw(4, 32));
  s.workload.height = c.chance(1, 2) ? s.workload.width : static_cast<std::uint32_t>(64 * c.draw(4, 32));
  s.workload.batch = c.chance(2, 3) ? 1 : static_cast<std::uint32_t>(c.draw(2, 8));
  const bool video = s.models.size() == 1 && s.models[0].spec->family == Family::wan21;
  s.workload.frames = video ? static_cast<std::uint32_t>(1 + 4 * c.draw(0, 20)) : 1;
  static constexpr double kCfg[] = {1.0, 3.5, 7.0};
  s.workload.cfg = pick(c, kCfg);

  // Offload streams {0, 1, 2, 4}, or the preset's.
  static constexpr std::uint32_t kStreams[] = {0, 1, 2, 4};
  if (c.chance(1, 2)) s.offload_streams = pick(c, kStreams);
  if (s.policy.dynamic()) draw_dynamic(c, s);
  s.seed = c.draw(0, 0xffffffffu);
  s.stages = default_stages(s.models.size());
  s.activations = cfg.activations;
  if (s.activations.source == ActivationSource::profile) s.activations.fallback_to_model = true;
  validate_scenario(s);
  return s;
}

}  // namespace vf
