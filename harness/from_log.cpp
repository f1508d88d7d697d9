#include "harness/from_log.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "harness/campaign.h"
#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "harness/oracle.h"
#include "harness/predict.h"

namespace vf {

std::string_view sureness_name(Sureness s) {
  switch (s) {
    case Sureness::read: return "read";
    case Sureness::derived: return "derived";
    case Sureness::guessed: return "guessed";
    case Sureness::given: return "given";
    case Sureness::assumed: return "assumed";
  }
  return "?";
}

std::string_view comparison_status_name(LogComparison::Status s) {
  switch (s) {
    case LogComparison::Status::reproduced: return "reproduced";
    case LogComparison::Status::plan_matches: return "plan matches";
    case LogComparison::Status::no_oom: return "plan matches, no OOM on this backend";
    case LogComparison::Status::oom_elsewhere: return "plan matches, OOM elsewhere";
    case LogComparison::Status::plan_differs: return "plan differs";
  }
  return "?";
}

namespace {

// ComfyUI's class names ("Requested to load CLASS": the model's Python class) and the catalog
// models that stand for them. Several catalog names: the plan line's size picks one.
struct ClassEntry {
  std::string_view cls;
  std::vector<std::string_view> catalog;
  std::string_view note;  // what the stand-in leaves out
};
const std::vector<ClassEntry>& class_table() {
  static const std::vector<ClassEntry> t = {
      {"Flux", {"flux1-dev"}, "FLUX.1 dev, schnell and Kontext share this class and its layout"},
      {"Flux2", {"flux2-dev"}, ""},
      {"Flux2TEModel_", {"flux2-text-encoder"}, ""},
      {"FluxClipModel_",
       {"t5xxl"},
       "FLUX.1's text encoder patcher holds CLIP-L and T5-XXL; vramfuzz stands for it with T5-XXL (97% of its bytes), CLIP-L's "
       "235 MiB are left out"},
      {"WAN21", {"wan21-14b"}, "the Wan 2.1 14B layout (a 1.3B model does not match its size)"},
      {"QwenImage", {"qwen-image"}, ""},
      {"SDXL", {"sdxl-unet"}, ""},
      {"BaseModel", {"sd15-unet"}, "SD1.x's model class (BaseModel) is also the base of other families"},
      {"SD3", {"sd35-large"}, "the SD3.5 Large layout (Medium does not match its size)"},
      {"SD1ClipModel", {"clip-l"}, ""},
      {"AutoencodingEngine", {"flux-vae", "flux2-vae"}, ""},
      {"AutoencoderKL", {"flux-vae", "flux2-vae"}, ""},
  };
  return t;
}

const ClassEntry* find_class(std::string_view cls) {
  for (const ClassEntry& e : class_table()) {
    if (e.cls == cls) return &e;
  }
  return nullptr;
}

// ComfyUI's torch dtype names as vramfuzz dtypes.
std::optional<Dtype> torch_to_dtype(std::string_view name) {
  if (name == "float32") return Dtype::fp32;
  if (name == "float16") return Dtype::fp16;
  if (name == "bfloat16") return Dtype::bf16;
  if (name == "float8_e4m3fn") return Dtype::fp8_e4m3fn;
  if (name == "float8_e5m2") return Dtype::fp8_e5m2;
  if (name == "int8") return Dtype::int8;
  return std::nullopt;
}

// The storage choices a size match tries, when the log does not say the storage dtype.
std::vector<StorageChoice> storage_candidates(const LogLoad& l) {
  std::vector<StorageChoice> out;
  auto add = [&](Dtype d) {
    const DtypeInfo& i = dtype_info(d);
    if (i.fp8 || d == Dtype::int8) {
      out.push_back({d, true});
      out.push_back({d, false});
    } else {
      out.push_back({d, false});
    }
  };
  if (!l.gguf_qtype.empty()) {
    if (auto d = parse_dtype(l.gguf_qtype)) {
      add(*d);
      return out;
    }
  }
  if (auto d = torch_to_dtype(l.weight_dtype); d && !dtype_info(*d).compute) {
    add(*d);
    return out;
  }
  if (l.scaled_fp8_line) {
    // ComfyUI's scaled-fp8 ops: the weights are fp8 with a scale each (e4m3fn: what such files use).
    out.push_back({Dtype::fp8_e4m3fn, true});
    out.push_back({Dtype::fp8_e5m2, true});
    return out;
  }
  if (auto d = torch_to_dtype(l.weight_dtype)) {
    add(*d);
    return out;
  }
  for (Dtype d : {Dtype::bf16, Dtype::fp16, Dtype::fp32, Dtype::fp8_e4m3fn, Dtype::fp8_e5m2, Dtype::q8_0, Dtype::q6_k, Dtype::q5_k,
                  Dtype::q5_0, Dtype::q5_1, Dtype::q4_k, Dtype::q4_0, Dtype::q4_1, Dtype::q3_k, Dtype::q2_k}) {
    add(d);
  }
  return out;
}

std::string line_ref(std::uint32_t line, std::string_view text) {
  std::string t(text);
  if (t.size() > 110) t = t.substr(0, 107) + "...";
  return fmt::format("line {}: {}", line, t);
}

// The ComfyUI releases the presets stand for (docs/from-log.md has the table with its sources).
struct VersionPreset {
  Preset preset;
  Sureness sure;
  std::string why;
};
// "0.3.73" -> {0, 3, 73}; nullopt when it is not dotted numbers.
std::optional<std::array<int, 3>> parse_version(std::string_view v) {
  std::array<int, 3> out{0, 0, 0};
  std::size_t k = 0;
  std::size_t pos = 0;
  while (pos <= v.size() && k < 3) {
    std::size_t end = pos;
    while (end < v.size() && v[end] >= '0' && v[end] <= '9') ++end;
    if (end == pos) return k == 0 ? std::nullopt : std::optional(out);
    int n = 0;
    const auto [ptr, ec] = std::from_chars(v.data() + pos, v.data() + end, n);
    if (ec != std::errc() || ptr != v.data() + end) return std::nullopt;  // out of range: not a version
    out[k++] = n;
    if (end >= v.size() || v[end] != '.') break;
    pos = end + 1;
  }
  return out;
}

// The classic preset of a release, from the first release that carried each PR (docs/from-log.md).
VersionPreset classic_preset_for(const ComfyLog& log, bool has_buffer_field) {
  const auto v = parse_version(log.comfy_version);
  if (!has_buffer_field) {
    // The "B MB buffer reserved" figure came with PR #10733: a partial line without it, or a
    // line of the oldest form, is older.
    return {Preset::oct2025, Sureness::derived,
            "its plan lines predate PR #10733 (the oldest form, or \"loaded partially\" without a buffer figure)"};
  }
  if (!v) {
    return {Preset::dec2025, Sureness::guessed,
            "no \"ComfyUI version\" line; comfy:dec2025 is the classic path of every release since December 2025 (give --policy "
            "comfy:nov2025 for a November 2025 build)"};
  }
  // #10733 (the offload buffer) and #10953 (two streams) are first in 0.3.76 (2025-12-01), #11096
  // and #11171 in 0.4.0 (2025-12-09): docs/from-log.md.
  const std::array<int, 3> nov{0, 3, 76};
  const std::array<int, 3> dec{0, 4, 0};
  if (*v < nov) {
    return {Preset::oct2025, Sureness::derived,
            fmt::format("ComfyUI {} predates 0.3.76 (PR #10733); but its plan lines have the buffer figure: check the version", log.comfy_version)};
  }
  if (*v < dec) return {Preset::nov2025, Sureness::derived, fmt::format("ComfyUI {}: PR #10733 and #10953, not yet #11096 (0.4.0)", log.comfy_version)};
  return {Preset::dec2025, Sureness::derived, fmt::format("ComfyUI {}: the classic path since 0.4.0", log.comfy_version)};
}

VersionPreset dynamic_preset_for(const ComfyLog& log) {
  const auto v = parse_version(log.comfy_version);
  if (!v) {
    return {Preset::sep2026, Sureness::guessed, "no \"ComfyUI version\" line; comfy:sep2026 is dynamic VRAM as it runs today"};
  }
  // Dynamic VRAM was opt-in from 0.12 (aimdo 0.2 from 0.15.0) and the default from 0.16.0 (PR
  // #12658, 2026-03-05); 0.31 - 0.38 ran comfy-aimdo 0.4.10 - 0.5.5.
  const std::array<int, 3> first_default{0, 16, 0};
  const std::array<int, 3> after_feb{0, 17, 0};
  const std::array<int, 3> aug{0, 31, 0};
  if (*v < std::array<int, 3>{0, 12, 0}) {
    return {Preset::feb2026, Sureness::guessed,
            fmt::format("ComfyUI {} predates dynamic VRAM (0.12), yet the log shows it: a fork or a mislabelled build; comfy:feb2026 is the "
                        "oldest dynamic preset",
                        log.comfy_version)};
  }
  if (*v < after_feb) {
    return {Preset::feb2026, Sureness::derived,
            fmt::format("ComfyUI {}: dynamic VRAM as first {} (comfy-aimdo 0.2.x)", log.comfy_version,
                        *v < first_default ? "opted into" : "made the default, 0.16")};
  }
  if (*v < aug) {
    return {Preset::sep2026, Sureness::guessed,
            fmt::format("ComfyUI {} ran comfy-aimdo 0.2.3 - 0.4.9; comfy:sep2026 is the nearer preset", log.comfy_version)};
  }
  return {Preset::sep2026, Sureness::derived, fmt::format("ComfyUI {}: comfy:sep2026 covers 0.31 - 0.38", log.comfy_version)};
}

// Where the traceback puts the OOM: which kind of model's stage and what it was doing.
struct OomPlace {
  std::optional<ModelKind> kind;  // the model whose stage it is (nullopt: unknown)
  bool in_load = false;
  std::string activity;            // weight-cast, load, compute, "" (no traceback)
};
OomPlace place_oom(const LogOom& o) {
  OomPlace p;
  if (o.frames.empty()) return p;
  auto fn = [](const std::string& f) { return std::string_view(f).substr(f.rfind(':') + 1); };
  auto file = [](const std::string& f) { return std::string_view(f).substr(0, f.rfind(':')); };
  for (const std::string& f : o.frames) {
    const std::string_view name = fn(f);
    const std::string_view path = file(f);
    if (path.find("comfy/sd.py") != std::string_view::npos) {
      if (name.find("encode_from_tokens") != std::string_view::npos || name.find("encode_token_weights") != std::string_view::npos) {
        p.kind = ModelKind::text_encoder;
      } else if (name.find("decode") != std::string_view::npos || name.find("encode") != std::string_view::npos) {
        p.kind = ModelKind::vae;
      }
    }
    if (path.find("comfy/samplers.py") != std::string_view::npos || path.find("k_diffusion") != std::string_view::npos) {
      p.kind = ModelKind::diffusion;
    }
  }
  // The innermost ComfyUI frame says what it was doing.
  for (auto it = o.frames.rbegin(); it != o.frames.rend(); ++it) {
    const std::string_view path = file(*it);
    const std::string_view name = fn(*it);
    if (path.rfind("comfy/", 0) != 0 && path.rfind("comfy_extras/", 0) != 0 && path.rfind("custom_nodes/", 0) != 0) continue;
    if (path == "comfy/ops.py" || name.find("cast_") != std::string_view::npos || name == "cast_to") {
      p.activity = "weight-cast";
    } else if (path == "comfy/model_patcher.py" || (path == "comfy/model_management.py" && name.find("load") != std::string_view::npos)) {
      p.activity = "load";
      p.in_load = true;
    } else {
      p.activity = "compute";
    }
    break;
  }
  if (p.activity.empty()) p.activity = "compute";
  return p;
}

std::string model_id_for(ModelKind k, const std::vector<ModelRef>& taken) {
  const std::string base = k == ModelKind::text_encoder ? "te" : k == ModelKind::vae ? "vae" : "dit";
  std::string id = base;
  for (int n = 2;; ++n) {
    bool used = false;
    for (const ModelRef& m : taken) used = used || m.id == id;
    if (!used) return id;
    id = fmt::format("{}{}", base, n);
  }
}

// What one load's plan line says the model weighs, in MiB: loaded + offloaded (classic), the
// staged figure (dynamic). nullopt without a plan line, or a partial full load of nothing.
std::optional<double> plan_size(const LogPlanLine& p) {
  switch (p.kind) {
    case LogPlanLine::Kind::partial: return p.offloaded ? std::optional(p.loaded + *p.offloaded) : std::nullopt;
    case LogPlanLine::Kind::complete: return p.full_load.value_or(true) ? std::optional(p.loaded) : std::nullopt;
    case LogPlanLine::Kind::dynamic: return static_cast<double>(p.staged_mb);
  }
  return std::nullopt;
}

// The same figure from the predictor for one model alone on the device, and how far it is from
// the log's line: the MiB apart, plus (dynamic lines) the force-loaded weights' count and KB, which
// tell an fp8 file with scales from one without when the staged bytes are the same.
struct SizeMatch {
  double mib = 0;
  double err = 0;
};
SizeMatch predicted_size(const Scenario& base, const ModelRef& m, const LogPlanLine& line, double size) {
  Scenario s;
  s.device = base.device;
  s.device.used_by_others = 0;
  s.policy = base.policy;
  s.allocator = base.allocator;
  s.models = {m};
  s.models[0].legacy = false;
  s.stages = {Stage{StageOp::load, 0}};
  const Plan p = predict(s);
  const LoadPlan& lp = p.loads.at(0);
  SizeMatch out;
  if (lp.dynamic) {
    out.mib = static_cast<double>(lp.staging.staged / MiB);
    out.err = std::abs(out.mib - size);
    if (line.kind == LogPlanLine::Kind::dynamic) {
      if (lp.staging.forced != line.forced) out.err += 0.5;
      out.err += std::abs(static_cast<double>(lp.staging.forced_bytes / KiB) - static_cast<double>(line.forced_kb)) / 1024.0;
    }
    return out;
  }
  out.mib = to_mib(lp.loaded + lp.offloaded);
  out.err = std::abs(out.mib - size);
  return out;
}

ModelRef catalog_ref(std::string_view name, StorageChoice st, Dtype compute, const std::string& id, Catalog& catalog) {
  nlohmann::json j = {{"id", id}, {"source", fmt::format("catalog:{}", name)}, {"storage", dtype_name(st.dtype)}, {"compute", dtype_name(compute)}};
  if (dtype_info(st.dtype).fp8 || st.dtype == Dtype::int8) j["scaled"] = st.scaled;
  return model_from_json(j, catalog, "");
}

ModelRef file_ref(const std::string& path, Dtype compute, const std::string& id, Catalog& catalog) {
  const std::string flag = "--model " + path;
  const bool json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  try {
    if (json) {
      nlohmann::json doc = parse_json_text(read_text_file(path), path);
      if (doc.is_object() && !doc.contains("weight_map")) {
        doc["id"] = id;
        if (!doc.contains("compute")) doc["compute"] = dtype_name(compute);
        return model_from_json(doc, catalog, "", std::filesystem::path(path).parent_path().string());
      }
    }
    const nlohmann::json j = {{"id", id}, {"source", "file:" + std::filesystem::absolute(path).string()}, {"compute", dtype_name(compute)}};
    return model_from_json(j, catalog, "");
  } catch (const InputError& e) {
    throw InputError(flag, e.what());
  }
}

struct Builder {
  const ComfyLog& log;
  const FromLogOptions& o;
  Catalog& catalog;
  Reconstruction r;
  std::vector<std::string> model_class;  // per scenario model: its ComfyUI class
  std::vector<bool> used_files;

  Builder(const ComfyLog& l, const FromLogOptions& op, Catalog& c) : log(l), o(op), catalog(c), used_files(op.models.size(), false) {}

  void fact(std::string what, std::string value, Sureness sure, std::string source, std::string flag) {
    r.facts.push_back({std::move(what), std::move(value), sure, std::move(source), std::move(flag)});
  }

  // The OOM the scenario ends at: the first one (later ones follow from ComfyUI's retries and
  // the unload after it).
  const LogOom* oom() const { return log.ooms.empty() ? nullptr : &log.ooms.front(); }

  void device() {
    Scenario& s = r.scenario;
    if (o.vram) {
      s.device.total = *o.vram;
      fact("device total", format_mib(*o.vram), Sureness::given, "", "--vram");
    } else if (log.total_vram_mb) {
      s.device.total = parse_device_total(fmt::format("{}MiB", *log.total_vram_mb), "Total VRAM");
      fact("device total", format_mib(s.device.total), Sureness::read,
           line_ref(log.total_vram_line, fmt::format("Total VRAM {} MB (whole MB: within 0.5 MiB)", *log.total_vram_mb)), "--vram");
    } else {
      std::string hint;
      if (const LogOom* oo = oom(); oo && oo->total) {
        hint = fmt::format(" (PyTorch's message at line {} says a total capacity of {}: --vram {}MiB is that, to its 2 decimals)", oo->line,
                           format_mib(*oo->total), (*oo->total + MiB / 2) / MiB);
      }
      throw InputError("--vram", fmt::format("the log has no \"Total VRAM N MB\" line (ComfyUI prints it at startup): give the card's "
                                             "memory with --vram, e.g. --vram 12GiB{}",
                                             hint));
    }
    s.device.name = log.device.empty() ? "from log" : log.device;
    if (!log.device.empty()) fact("device", log.device, Sureness::read, line_ref(log.device_line, "Device: " + log.device), "");
  }

  void allocator() {
    Scenario& s = r.scenario;
    if (!o.allocator.empty()) {
      s.allocator.mode = parse_allocator_mode_field(o.allocator, "--allocator");
      fact("allocator", std::string(allocator_mode_name(s.allocator.mode)), Sureness::given, "", "--allocator");
      return;
    }
    std::string backend = log.backend;
    std::string source = backend.empty() ? "" : line_ref(log.device_line, "Device: ... : " + backend);
    Sureness sure = Sureness::read;
    if (backend.empty() && oom() && oom()->backend != "driver") {
      backend = oom()->backend;
      source = line_ref(oom()->line, fmt::format("the OOM message is the {} backend's", backend));
      sure = Sureness::derived;
    }
    if (backend.empty() && log_flag(log, "--disable-cuda-malloc")) {
      backend = "native";
      source = line_ref(log.flags_line, "--disable-cuda-malloc");
    }
    if (backend.empty()) {
      // ComfyUI's cuda_malloc.py turns cudaMallocAsync on for CUDA builds of torch 2 unless the
      // card is on its blacklist or --fast autotune is on; only 0.12 - 0.14 turned it off again
      // when opted-in dynamic VRAM started comfy-aimdo (docs/from-log.md).
      const auto v = parse_version(log.comfy_version);
      const bool native = log.dynamic_vram.value_or(false) && v && *v >= std::array<int, 3>{0, 12, 0} && *v < std::array<int, 3>{0, 15, 0};
      s.allocator.mode = native ? AllocatorMode::caching : AllocatorMode::async;
      fact("allocator", native ? "caching (PyTorch backend native)" : "async (PyTorch backend cudaMallocAsync)", Sureness::assumed,
           native ? "no \"Device:\" line and no OOM message: ComfyUI 0.12 - 0.14 with dynamic VRAM turned cudaMallocAsync off"
                  : "no \"Device:\" line and no OOM message: ComfyUI enables cudaMallocAsync on CUDA builds of torch 2 (not on its card "
                    "blacklist, not with --fast autotune)",
           "--allocator");
      return;
    }
    const auto m = parse_allocator_mode(backend);
    if (!m) {
      s.allocator.mode = AllocatorMode::caching;
      fact("allocator", "caching", Sureness::assumed, fmt::format("{} (unknown backend \"{}\")", source, backend), "--allocator");
      return;
    }
    s.allocator.mode = *m;
    fact("allocator", fmt::format("{} (PyTorch backend {})", allocator_mode_name(*m), backend), sure, source, "--allocator");
  }

  void policy() {
    Scenario& s = r.scenario;
    bool dynamic = log.dynamic_vram.value_or(false);
    bool buffer_field = true;
    std::uint32_t evidence = log.dynamic_vram_line;
    for (const LogLoad& l : log.loads) {
      if (!l.plan) continue;
      if (l.plan->kind == LogPlanLine::Kind::dynamic) {
        dynamic = true;
        if (evidence == 0) evidence = l.plan->line;
      } else {
        if (l.plan->old_form || (l.plan->kind == LogPlanLine::Kind::partial && !l.plan->buffer)) buffer_field = false;
      }
    }
    if (!o.policy.empty()) {
      s.policy = parse_policy(o.policy, "--policy");
      fact("policy", s.policy.label(), Sureness::given, "", "--policy");
    } else {
      const VersionPreset vp = dynamic ? dynamic_preset_for(log) : classic_preset_for(log, buffer_field);
      s.policy = parse_policy(fmt::format("comfy:{}", preset_name(vp.preset)), "policy");
      std::string src = vp.why;
      if (dynamic) src += fmt::format("; dynamic VRAM: line {}", evidence);
      if (log.comfy_version_line) src = fmt::format("line {}: ComfyUI version {}; {}", log.comfy_version_line, log.comfy_version, src);
      fact("policy", s.policy.label(), vp.sure, src, "--policy");
    }
    // --reserve-vram (GiB) is the classic reserve and, under comfy:sep2026, aimdo's headroom.
    const bool reserve_given = std::any_of(o.overrides.begin(), o.overrides.end(), [](const auto& kv) { return kv.first == "reserve"; });
    if (reserve_given) {
      // --reserve below.
    } else if (auto rv = log_flag(log, "--reserve-vram"); rv && !rv->empty()) {
      const Bytes b = gib_flag("--reserve-vram", *rv);
      apply_policy_override(s.policy, "reserve", fmt::format("{}", b), "--reserve-vram");
      fact("reserve", format_mib(b), Sureness::read, line_ref(log.flags_line, fmt::format("--reserve-vram {}", *rv)), "--reserve");
    } else if (const bool win = o.os ? *o.os == "windows" : log.windows_line != 0; win && !s.policy.dynamic()) {
      // EXTRA_RESERVED_VRAM on Windows: 600 MiB, 700 MiB above 15 GiB of VRAM (PR #9093).
      const Bytes b = s.device.total > 15 * GiB ? 700 * MiB : 600 * MiB;
      apply_policy_override(s.policy, "reserve", fmt::format("{}", b), "--os");
      fact("reserve", format_mib(b), o.os ? Sureness::given : Sureness::derived,
           o.os ? "" : line_ref(log.windows_line, "a Windows path: ComfyUI reserves 600 MiB there (700 MiB above 15 GiB)"), "--reserve / --os");
    } else if (s.policy.dynamic()) {
      fact("reserve", format_mib(s.policy.constants.reserve), Sureness::assumed,
           std::string(log.flags_line ? "no --reserve-vram on the logged command line" : "the log shows no command line") +
               ": under dynamic VRAM comfy-aimdo's headroom keeps its 256 MiB and the classic reserve (400 MiB, Windows 600 MiB) "
               "applies to legacy models only",
           "--reserve");
    } else {
      fact("reserve", format_mib(s.policy.constants.reserve), Sureness::assumed,
           fmt::format("{}; the preset's {} ({})", log.flags_line ? "no --reserve-vram on the logged command line" : "the log shows no command line",
                       format_mib(s.policy.constants.reserve),
                       o.os ? "--os linux" : "no Windows path in the log; --os windows for 600 MiB"),
           "--reserve");
    }
    for (const auto& [k, v] : o.overrides) {
      apply_policy_override(s.policy, k, v, k == "reserve" ? "--reserve" : "--set");
      fact(k == "reserve" ? "reserve" : fmt::format("policy {}", k), v, Sureness::given, "", k == "reserve" ? "--reserve" : "--set");
    }
    if (auto vh = log_flag(log, "--vram-headroom"); vh && !vh->empty() && s.policy.dynamic()) {
      const Bytes b = gib_flag("--vram-headroom", *vh);
      apply_policy_override(s.policy, "vram_headroom", fmt::format("{}", b), "--vram-headroom");
      fact("vram headroom", format_mib(b), Sureness::read, line_ref(log.flags_line, "--vram-headroom " + *vh), "--set vram_headroom=");
    }
  }

  // A ComfyUI flag's value in GiB on the logged command line ("--reserve-vram 2.5"), as bytes.
  Bytes gib_flag(std::string_view flag, const std::string& value) const {
    char* end = nullptr;
    const double g = std::strtod(value.c_str(), &end);
    if (end == value.c_str() || *end != '\0' || !(g >= 0) || g > 1024) {
      throw InputError(fmt::format("{}:line {}", o.file, log.flags_line), fmt::format("{} \"{}\" is not a number of GiB", flag, value));
    }
    return static_cast<Bytes>(std::llround(g * static_cast<double>(GiB)));
  }

  void streams() {
    Scenario& s = r.scenario;
    if (log.async_streams) {
      s.offload_streams = std::min(*log.async_streams, kMaxOffloadStreams);
      fact("offload streams", std::to_string(*s.offload_streams), Sureness::read,
           line_ref(log.async_streams_line, fmt::format("Using async weight offloading with {} streams", *log.async_streams)), "");
    } else if (log_flag(log, "--disable-async-offload")) {
      s.offload_streams = 0;
      fact("offload streams", "0", Sureness::read, line_ref(log.flags_line, "--disable-async-offload"), "");
    } else {
      fact("offload streams", std::to_string(s.streams()), Sureness::assumed,
           "no \"Using async weight offloading\" line: the preset's default", "--set num_streams=");
    }
  }

  // Picks the model for load `l` (its class's first load) and builds it.
  ModelRef model_for(const LogLoad& l) {
    Scenario& s = r.scenario;
    // The compute dtype: the loader's manual cast, the text encoder's or VAE's dtype.
    std::optional<Dtype> compute;
    std::string compute_src;
    if (auto d = torch_to_dtype(l.manual_cast); d && dtype_info(*d).compute) {
      compute = d;
      compute_src = line_ref(l.weight_dtype_line, "manual cast: " + l.manual_cast);
    } else if (auto d2 = torch_to_dtype(l.weight_dtype); d2 && dtype_info(*d2).compute && l.manual_cast == "None") {
      compute = d2;
      compute_src = line_ref(l.weight_dtype_line, "model weight dtype " + l.weight_dtype + ", manual cast: None");
    } else if (auto d3 = torch_to_dtype(l.te_dtype); d3 && dtype_info(*d3).compute) {
      compute = d3;
      compute_src = line_ref(l.te_dtype_line, "text encoder dtype: " + l.te_dtype);
    } else if (auto d4 = torch_to_dtype(l.vae_dtype); d4 && dtype_info(*d4).compute) {
      compute = d4;
      compute_src = line_ref(l.vae_dtype_line, "VAE dtype: " + l.vae_dtype);
    }
    const Dtype c = compute.value_or(Dtype::bf16);
    // A --model for this class, or the first unnamed one not used yet.
    std::optional<std::size_t> file;
    for (std::size_t k = 0; k < o.models.size(); ++k) {
      if (o.models[k].first == l.model_class && !used_files[k]) file = k;
    }
    const ClassEntry* entry = find_class(l.model_class);
    if (!file && !entry) {
      for (std::size_t k = 0; k < o.models.size(); ++k) {
        if (o.models[k].first.empty() && !used_files[k]) {
          file = k;
          break;
        }
      }
    }
    // A plain value beside its flag: gcc 12 cannot see through the optional here (maybe-uninitialized).
    const std::optional<double> size_opt = l.plan ? plan_size(*l.plan) : std::nullopt;
    const bool has_size = size_opt.has_value();
    const double size_v = size_opt.value_or(0.0);
    ModelRef m;
    const std::string id_hint = l.requested ? fmt::format("line {}: Requested to load {}", l.line, l.model_class)
                                            : fmt::format("line {}: a plan line with no \"Requested to load\" before it", l.line);
    if (file) {
      used_files[*file] = true;
      m = file_ref(o.models[*file].second, c, "model", catalog);
      m.id = model_id_for(m.spec->kind, s.models);
      fact(fmt::format("model {}", m.id), fmt::format("{} ({}, {})", o.models[*file].second, storage_label(m), format_mib(m.spec->bytes)),
           Sureness::given, id_hint, "--model");
    } else {
      if (!entry) {
        if (l.model_class.empty()) {
          throw InputError("--model", fmt::format("{}: the log does not say which model it is; give its checkpoint with --model FILE", id_hint));
        }
        throw InputError("--model",
                         fmt::format("{}: no catalog model stands for the class {} (vramfuzz models list); give its checkpoint with --model "
                                     "{}=FILE (safetensors, index.json, GGUF or a models import JSON), or --leave-out {} to reconstruct "
                                     "without it",
                                     id_hint, l.model_class, l.model_class, l.model_class));
      }
      // The catalog model and storage whose plan figure matches the log's best.
      struct Best {
        std::string_view name;
        StorageChoice st;
        double mib = 0;
        double err = 1e300;
      } best;
      std::vector<std::string> tied;  // other storages that weigh the same
      bool compute_broke_tie = false;
      auto storage_text = [](StorageChoice st) {
        const bool scalable = dtype_info(st.dtype).fp8 || st.dtype == Dtype::int8;
        return fmt::format("{}{}", dtype_name(st.dtype), !scalable ? "" : st.scaled ? " scaled" : " unscaled");
      };
      const std::vector<StorageChoice> cands = storage_candidates(l);
      const std::string id = model_id_for(find_catalog_entry(entry->catalog.front())->kind, s.models);
      for (std::string_view name : entry->catalog) {
        const CatalogEntry* ce = find_catalog_entry(name);
        std::vector<StorageChoice> try_these = cands;
        // No size to match: the dtype the loader's lines name, else the release dtype.
        if (!has_size) try_these = {cands.size() <= 2 ? cands.front() : StorageChoice{ce->native_dtype, false}};
        for (const StorageChoice& st : try_these) {
          ModelRef cand;
          try {
            cand = catalog_ref(name, st, c, id, catalog);
          } catch (const InputError&) {
            continue;  // a storage this model cannot take
          }
          const SizeMatch sm = has_size ? predicted_size(s, cand, *l.plan, size_v) : SizeMatch{};
          // A tie (fp16 and bf16 weigh the same): the storage the compute dtype names wins, and
          // the value is only guessed.
          // Within the line's printed precision (0.005 MB): scaled and unscaled fp8 print alike.
          const bool tie = std::abs(sm.err - best.err) <= 0.005 + 1e-9;
          if (tie && best.name == name) {
            if (st.dtype == c && best.st.dtype != c) {
              tied.push_back(storage_text(best.st));
              best = {name, st, sm.mib, sm.err};
              compute_broke_tie = true;
            } else {
              tied.push_back(storage_text(st));
            }
          } else if (sm.err < best.err) {
            best = {name, st, sm.mib, sm.err};
            tied.clear();
            compute_broke_tie = false;
          }
        }
      }
      if (best.name.empty()) throw InputError("--model", fmt::format("{}: no storage of {} could be built", id_hint, entry->catalog.front()));
      m = catalog_ref(best.name, best.st, c, id, catalog);
      const std::string what = fmt::format("model {}", m.id);
      const std::string stored = fmt::format("{}{}", dtype_name(best.st.dtype), best.st.scaled && (dtype_info(best.st.dtype).fp8 || best.st.dtype == Dtype::int8) ? " scaled" : "");
      if (has_size) {
        const double sz = size_v;
        const double rel = sz > 0 ? std::abs(best.mib - sz) / sz : 0;
        const double pct = sz > 0 ? 100.0 * (best.mib - sz) / sz : 0.0;
        if (rel > 0.03) {
          throw InputError("--model", fmt::format("line {}: {} weighs {:.2f} MB in the log's plan line; the nearest catalog stand-in, {} stored {}, "
                                                  "weighs {:.2f} MiB ({:+.1f}%): give its checkpoint with --model {}=FILE, or --leave-out {}",
                                                  l.plan->line, l.model_class, sz, best.name, stored, best.mib, pct, l.model_class, l.model_class));
        }
        fact(what, fmt::format("catalog:{} stored {}", best.name, stored), rel <= 0.005 && tied.empty() ? Sureness::derived : Sureness::guessed,
             fmt::format("{}; its plan line's {:.2f} MB against {:.2f} MiB ({:+.2f}%){}{}", id_hint, sz, best.mib, pct,
                         tied.empty() ? ""
                                      : fmt::format("; {} weigh(s) the same ({})", fmt::join(tied, ", "),
                                                    compute_broke_tie ? "the compute dtype decided" : "the first tried was taken"),
                         entry->note.empty() ? "" : "; " + std::string(entry->note)),
             "--model CLASS=FILE");
      } else {
        const bool named = cands.size() <= 2;
        std::string why = !named ? "its release dtype"
                          : l.gguf_line ? line_ref(l.gguf_line, "gguf qtypes")
                          : l.scaled_fp8_line ? line_ref(l.scaled_fp8_line, "Using scaled fp8 (e4m3fn, as such files are)")
                                              : line_ref(l.weight_dtype_line, "model weight dtype " + l.weight_dtype);
        fact(what, fmt::format("catalog:{} stored {}", best.name, stored), named ? Sureness::guessed : Sureness::assumed,
             fmt::format("{}; its plan line gives no size to match: {}{}", id_hint, why, entry->note.empty() ? "" : "; " + std::string(entry->note)),
             "--model CLASS=FILE");
      }
    }
    fact(fmt::format("model {} compute", m.id), std::string(dtype_name(c)), compute ? Sureness::read : Sureness::assumed,
         compute ? compute_src : "no manual-cast or dtype line for it: bf16 (the scenario's models[].compute changes it)", "");
    return m;
  }

  // The memory ComfyUI's planner saw taken at its first classic load: back-solved from the plan
  // line's "usable" figure by running the predictor with others = 0 .. total.
  void others_and_context() {
    Scenario& s = r.scenario;
    if (o.context) {
      s.device.context_overhead = *o.context;
      fact("CUDA context", format_mib(*o.context), Sureness::given, "", "--context");
    } else {
      s.device.context_overhead = kPyTorchContextOverhead;  // the log is a PyTorch process's
    }
    solve_others();
    // Said once it is settled (the back-solve can move it, and then says so itself).
    if (!o.context && s.device.context_overhead == kPyTorchContextOverhead) {
      fact("CUDA context", format_mib(kPyTorchContextOverhead), Sureness::assumed, "a PyTorch process's (PyTorch #86509); not in the log",
           "--context");
    }
  }

  void solve_others() {
    Scenario& s = r.scenario;
    if (o.others) {
      if (*o.others >= sat_sub(s.device.total, s.device.context_overhead)) {
        throw InputError("--others", fmt::format("{} leaves nothing of the {} card beside the {} context", format_mib(*o.others),
                                                 format_mib(s.device.total), format_mib(s.device.context_overhead)));
      }
      s.device.used_by_others = *o.others;
      fact("used by others", format_mib(*o.others), Sureness::given, "", "--others");
      return;
    }
    // Only the first load's plan line sees the device as the process started.
    const LogPlanExpect* first = nullptr;
    double target = 0;  // its "U MB usable"
    if (!s.from_log->plans.empty()) {
      const auto pl = parse_plan_line(s.from_log->plans.front().text, "from_log");
      if (pl && pl->usable && pl->kind != LogPlanLine::Kind::dynamic) {
        first = &s.from_log->plans.front();
        target = *pl->usable;
      }
    }
    const LogOom* oo = oom();
    std::optional<Bytes> oom_others;
    bool oom_bound = false;  // the cudaMallocAsync estimate: an upper bound
    if (oo && !oo->other_processes.empty() && oo->process_used) {
      // "Process N has X" lines besides "this process has W": the others, named by PyTorch.
      Bytes sum = 0;
      for (Bytes b : oo->other_processes) sum += b;
      oom_others = sum;
    } else if (oo && !oo->other_processes.empty() && oo->total && oo->free && oo->allocated && oo->reserved_unallocated &&
               *oo->total >= *oo->free + *oo->allocated + *oo->reserved_unallocated + s.device.context_overhead) {
      // Process lines without "this process" (PyTorch did not recognise its own PID, e.g. in a
      // container): one of them is this process; what is neither free nor PyTorch's nor the
      // context is the others' (an upper bound: this process's other CUDA memory counts in it).
      oom_others = *oo->total - *oo->free - *oo->allocated - *oo->reserved_unallocated - s.device.context_overhead;
      oom_bound = true;
    } else if (oo && oo->total && oo->free && oo->process_used && *oo->total >= *oo->free + *oo->process_used) {
      oom_others = *oo->total - *oo->free - *oo->process_used;
    } else if (oo && oo->backend == "cudaMallocAsync" && oo->total && oo->free && oo->allocated &&
               *oo->total >= *oo->free + *oo->allocated + s.device.context_overhead) {
      // The async message has no per-process figures: what is neither free, nor PyTorch's, nor
      // the context (the pool's reserved-but-unused bytes included: an upper bound).
      oom_others = *oo->total - *oo->free - *oo->allocated - s.device.context_overhead;
      oom_bound = true;
    }
    if (first) {
      Scenario probe = s;
      probe.stages.resize(first->stage + 1);
      probe.from_log.reset();
      auto usable_at = [&](Bytes others, Bytes context) {
        probe.device.used_by_others = others;
        probe.device.context_overhead = context;
        return static_cast<double>(predict(probe).loads.back().usable) / static_cast<double>(MiB);
      };
      auto printed = [](double v) { return std::round(v * 100.0) / 100.0; };
      const Bytes ctx = s.device.context_overhead;
      const Bytes room = sat_sub(s.device.total, ctx);
      // usable falls as others rise: the smallest others whose printed usable is <= the log's.
      Bytes lo = 0, hi = room;
      if (printed(usable_at(0, ctx)) < target) {
        // More usable than this card gives with nothing else on it: the context is smaller
        // (unless --context says what it is).
        Bytes clo = 0, chi = ctx;
        if (o.context || printed(usable_at(0, 0)) < target) {
          r.notes.push_back(fmt::format("line {}: the log's {:.2f} MB usable is more than this device could give ({:.2f} MiB with {} and "
                                        "nothing else on it): the reserve, the preset or the context differs from the run's",
                                        first->line, target, usable_at(0, o.context ? ctx : 0),
                                        o.context ? "the given context" : "no context"));
          fact("used by others", "0 MiB", Sureness::assumed, "the usable figure could not be matched", "--others");
          return;
        }
        while (clo < chi) {
          const Bytes mid = clo + (chi - clo + 1) / 2;
          if (printed(usable_at(0, mid)) >= target) clo = mid;
          else chi = mid - 1;
        }
        s.device.context_overhead = clo;
        s.device.used_by_others = 0;
        fact("used by others", "0.00 MiB", Sureness::derived,
             fmt::format("line {}: even a PyTorch process's context leaves less than the log's usable figure: nothing else was on the card",
                         first->line),
             "--others");
        fact("CUDA context", format_mib(clo), Sureness::derived,
             fmt::format("line {}: {:.2f} MB usable is more than a PyTorch process's context ({}) leaves: context back-solved, nothing used by others",
                         first->line, target, format_mib(ctx)),
             "--context");
        return;
      }
      while (lo < hi) {
        const Bytes mid = lo + (hi - lo) / 2;
        if (printed(usable_at(mid, ctx)) <= target) hi = mid;
        else lo = mid + 1;
      }
      const double got = printed(usable_at(lo, ctx));
      // Every value up to `last` prints the same figure (the log's two decimals span 10 KiB):
      // the roundest of them (whole MiB, else KiB) is the likeliest, else the middle.
      Bytes a = lo, b = room;
      while (a < b) {
        const Bytes mid = a + (b - a + 1) / 2;
        if (printed(usable_at(mid, ctx)) >= got) a = mid;
        else b = mid - 1;
      }
      const Bytes last = a;
      Bytes pick = lo + (last - lo) / 2;
      for (const Bytes unit : {MiB, KiB}) {
        const Bytes round = round_up(lo, unit);
        if (round <= last) {
          pick = round;
          break;
        }
      }
      lo = pick;
      s.device.used_by_others = lo;
      std::string cross;
      if (oom_others) {
        cross = fmt::format("; PyTorch's OOM message (line {}) puts others at {}{} (to its 10 MiB precision, at the OOM)", oo->line,
                            oom_bound ? "no more than " : "", format_mib(*oom_others));
      }
      if (std::abs(got - target) > 0.0051) {
        r.notes.push_back(fmt::format("line {}: no amount of other memory gives exactly {:.2f} MB usable (nearest {:.2f}): a figure of the plan "
                                      "does not move with free memory there",
                                      first->line, target, got));
      }
      fact("used by others", format_mib(lo), Sureness::derived,
           fmt::format("line {}: back-solved so that the plan says {:.2f} MB usable (with the context at {}){}", first->line, target,
                       format_mib(ctx), cross),
           "--others");
      return;
    }
    if (oom_others) {
      s.device.used_by_others = *oom_others;
      fact("used by others", format_mib(*oom_others), Sureness::derived,
           line_ref(oo->line, oom_bound && !oo->other_processes.empty()
                                  ? "total capacity - free - PyTorch's reserved - the context in the OOM message (its process list does not say "
                                    "which is this process; an upper bound)"
                              : !oo->other_processes.empty() ? "the other processes PyTorch's OOM message lists (2 decimals: within ~10 MiB)"
                              : oo->process_used ? "total capacity - free - this process's memory in PyTorch's OOM message (2 decimals: within ~10 MiB)"
                                                 : "device limit - free - currently allocated - the context in the cudaMallocAsync message (an upper "
                                                   "bound: the pool's unused reserve counts in it)"),
           "--others");
      return;
    }
    fact("used by others", "0 MiB", Sureness::assumed, "no classic plan line to back-solve it from and no OOM figures", "--others");
  }

  void workload() {
    Workload& w = r.scenario.workload;
    auto one = [&](const char* what, std::optional<std::uint32_t> v, std::uint32_t& dst, const char* flag) {
      if (v) {
        dst = *v;
        fact(what, std::to_string(*v), Sureness::given, "", flag);
      } else {
        fact(what, std::to_string(dst), Sureness::assumed, "ComfyUI does not log it", flag);
      }
    };
    one("width", o.width, w.width, "--width");
    one("height", o.height, w.height, "--height");
    one("batch", o.batch, w.batch, "--batch");
    bool video = false;
    for (const ModelRef& m : r.scenario.models) video = video || m.spec->family == Family::wan21;
    if (video || o.frames) one("frames", o.frames, w.frames, "--frames");
    if (o.steps) {
      w.steps = *o.steps;
      fact("steps", std::to_string(*o.steps), Sureness::given, "", "--steps");
    } else if (log.steps) {
      w.steps = std::min(log.steps, kMaxSteps);
      fact("steps", std::to_string(w.steps), Sureness::guessed,
           line_ref(log.steps_line, fmt::format("the last progress bar's .../{} before the OOM (a sampler's, or a custom node's){}", log.steps,
                                                log.steps > kMaxSteps ? fmt::format("; at most {} are modelled", kMaxSteps) : "")),
           "--steps");
    } else {
      fact("steps", "1", Sureness::assumed, "no progress bar before the OOM", "--steps");
    }
    bool diffusion = false;
    for (const ModelRef& m : r.scenario.models) diffusion = diffusion || m.spec->kind == ModelKind::diffusion;
    if (o.cfg) {
      w.cfg = *o.cfg;
      fact("cfg", fmt::format("{}", *o.cfg), Sureness::given, "", "--cfg");
    } else if (diffusion) {
      // ComfyUI does not log the CFG scale; above 1 the sampler runs cond and uncond, which the
      // classic estimate doubles (cfg_mult): a plan line of a diffusion model that differs may
      // need --cfg.
      fact("cfg", "1", Sureness::assumed, "ComfyUI does not log it (above 1 the classic estimate doubles the batch)", "--cfg");
    }
  }

  void run() {
    Scenario& s = r.scenario;
    s.from_log = FromLog{};
    s.from_log->file = log_text_clean(o.file);
    s.from_log->digest = log.digest;
    s.name = log_text_clean(fmt::format("from {}", std::filesystem::path(o.file).filename().string()));
    device();
    allocator();
    policy();
    streams();
    const LogOom* oo = oom();
    const OomPlace place = oo ? place_oom(*oo) : OomPlace{};
    // The loads before the OOM, in log order; a class is one model.
    std::vector<const LogLoad*> loads;
    std::vector<bool> left_used(o.leave_out.size(), false);
    const LogLoad* last_before = nullptr;
    for (const LogLoad& l : log.loads) {
      if (!oo || l.line < oo->line) last_before = &l;
    }
    for (const LogLoad& l : log.loads) {
      if (oo && l.line >= oo->line) continue;
      const auto lo = std::find(o.leave_out.begin(), o.leave_out.end(), l.model_class);
      if (lo != o.leave_out.end()) {
        if (oo && &l == last_before && !l.plan && (oo->frames.empty() || place.in_load)) {
          throw InputError("--leave-out " + *lo, fmt::format("the OOM at line {} is in the load of {} (line {}): it cannot be left out; give "
                                                             "it with --model {}=FILE",
                                                             oo->line, l.model_class, l.line, l.model_class));
        }
        left_used[static_cast<std::size_t>(lo - o.leave_out.begin())] = true;
        const std::optional<double> size = l.plan ? plan_size(*l.plan) : std::nullopt;
        r.notes.push_back(fmt::format("line {}: {} left out (--leave-out){}: the memory it held is not in the scenario, so the plans after it "
                                      "may see more free memory than ComfyUI did",
                                      l.line, l.model_class, size ? fmt::format(", {:.2f} MB by its plan line", *size) : ""));
        continue;
      }
      loads.push_back(&l);
    }
    for (std::size_t k = 0; k < o.leave_out.size(); ++k) {
      if (!left_used[k]) {
        throw InputError("--leave-out " + o.leave_out[k], fmt::format("no load of the class {} before the OOM", o.leave_out[k]));
      }
    }
    if (loads.empty()) {
      throw InputError(o.file, oo ? fmt::format("no \"Requested to load\" before the OOM at line {}: nothing to reconstruct", oo->line)
                                  : "no \"Requested to load\" line: nothing to reconstruct");
    }
    std::vector<bool> loaded;
    std::optional<std::uint32_t> oom_stage;
    std::optional<ModelKind> ambiguous_kind;  // the traceback's kind, when two models of it were loaded
    for (std::size_t k = 0; k < loads.size(); ++k) {
      const LogLoad& l = *loads[k];
      const bool last = k + 1 == loads.size();
      // The load the OOM is in: the last one, without a plan line, unless the traceback says the
      // OOM came later (in a forward).
      const bool oom_here = oo && last && !l.plan && (oo->frames.empty() || place.in_load);
      if (l.abandoned && !oom_here) {
        r.notes.push_back(fmt::format("line {}: {} requested but its load never printed a plan line (the prompt failed or was "
                                      "interrupted, or it was requested again first): left out",
                                      l.line, l.model_class.empty() ? "a model" : l.model_class));
        continue;
      }
      std::size_t mi = 0;
      while (mi < model_class.size() && model_class[mi] != l.model_class) ++mi;
      if (!l.requested && mi == model_class.size() && l.plan && l.plan->kind != LogPlanLine::Kind::dynamic && !s.models.empty()) {
        // A classic plan line with no request: ComfyUI re-planning a model it already has (it
        // logs no request then); which one the line does not say.
        r.notes.push_back(fmt::format("line {}: a plan line without a request (ComfyUI loading more of a model it already has): not "
                                      "compared",
                                      l.plan->line));
        continue;
      }
      if (!l.requested && mi < model_class.size() && loaded[mi]) {
        r.notes.push_back(fmt::format("line {}: {} staged again without a request: not a new load, not compared", l.line, l.model_class));
        continue;
      }
      if (mi == model_class.size()) {
        s.models.push_back(model_for(l));
        model_class.push_back(l.model_class);
        loaded.push_back(false);
        // A LoRA shows in the plan line as patches on offloaded ("lowvram patches: N") or staged
        // ("P patches attached") weights; merged into resident weights it does not show at all.
        const std::uint32_t patches = !l.plan ? 0 : l.plan->kind == LogPlanLine::Kind::dynamic ? l.plan->patches : l.plan->lowvram_patches;
        const bool given = std::find(o.lora.begin(), o.lora.end(), l.model_class) != o.lora.end();
        if (given || patches > 0) {
          s.models.back().lora = true;
          fact(fmt::format("model {} lora", s.models.back().id), "a LoRA on every weight", given ? Sureness::given : Sureness::guessed,
               given ? "" : line_ref(l.plan->line, fmt::format("{} patches in its plan line: a LoRA on some weights (vramfuzz patches every "
                                                              "weight; the patch counts are compared)", patches)),
               "--lora CLASS");
        }
        if (l.plan && l.plan->kind != LogPlanLine::Kind::dynamic && s.policy.dynamic()) {
          s.models.back().legacy = true;
          fact(fmt::format("model {} patcher", s.models.back().id), "legacy", Sureness::read,
               line_ref(l.plan->line, "a classic plan line under dynamic VRAM: a legacy patcher (e.g. a custom node's GGUF loader)"), "");
        }
      }
      const auto mi32 = static_cast<std::uint32_t>(mi);
      if (loaded[mi]) {
        // ComfyUI logs "Requested to load" only for a model that is not loaded: it was unloaded
        // since (by an eviction the log does not show, or "Got an OOM, unloading all").
        s.stages.push_back({StageOp::unload, mi32});
        r.notes.push_back(fmt::format("line {}: {} requested again: ComfyUI had unloaded it (it logs a request only for a model not "
                                      "loaded), so the pipeline unloads and loads it again",
                                      l.line, l.model_class));
      }
      s.stages.push_back({StageOp::load, mi32});
      loaded[mi] = true;
      if (l.plan) s.from_log->plans.push_back({l.plan->line, static_cast<std::uint32_t>(s.stages.size() - 1), l.plan->text});
      if (oom_here) {
        // The load never printed its plan line: the OOM is in it.
        oom_stage = static_cast<std::uint32_t>(s.stages.size() - 1);
        break;
      }
      s.stages.push_back({StageOp::forward, mi32});
      if (s.stages.size() > kMaxStages || s.models.size() > kMaxModels) {
        throw InputError(fmt::format("{}:line {}", o.file, l.line),
                         fmt::format("the log reconstructs to more than {} stages or {} models (a scenario's limits): cut it to the prompts "
                                     "before the OOM",
                                     kMaxStages, kMaxModels));
      }
    }
    if (s.stages.empty()) {
      throw InputError(o.file, fmt::format("no load {}printed its plan line or failed where the OOM is: nothing to reconstruct (the notes "
                                           "above say what was left out)",
                                           oo ? "before the OOM " : ""));
    }
    if (oo && !oom_stage) {
      // In a forward: the traceback's model kind, else the last model loaded.
      std::optional<std::uint32_t> at;
      if (place.kind) {
        std::size_t of_kind = 0;
        for (const ModelRef& m : s.models) of_kind += m.spec->kind == *place.kind ? 1 : 0;
        if (of_kind > 1) ambiguous_kind = place.kind;
        for (std::size_t i = s.stages.size(); i-- > 0;) {
          if (s.stages[i].op == StageOp::forward && s.models[s.stages[i].model].spec->kind == *place.kind) {
            at = static_cast<std::uint32_t>(i);
            break;
          }
        }
      }
      if (!at) at = static_cast<std::uint32_t>(s.stages.size() - 1);
      oom_stage = at;
      s.stages.resize(*at + 1);
      // Plan lines of loads after the OOM's stage are gone with them.
      auto& plans = s.from_log->plans;
      plans.erase(std::remove_if(plans.begin(), plans.end(), [&](const LogPlanExpect& p) { return p.stage > *at; }), plans.end());
    }
    if (oo) {
      LogOomExpect e;
      e.line = oo->line;
      e.stage = oom_stage;
      e.activity = place.activity;
      e.text = oo->text;
      s.from_log->oom = std::move(e);
      if (log.memory_summary && (log.memory_summary->reserved_peak || log.memory_summary->allocated_peak)) {
        s.from_log->summary_line = log.memory_summary->line;
        s.from_log->summary_reserved_peak = log.memory_summary->reserved_peak;
        s.from_log->summary_allocated_peak = log.memory_summary->allocated_peak;
      }
      const Stage& st = s.stages[*oom_stage];
      fact("OOM", fmt::format("{} in stage {} ({} {}){}", oo->backend == "driver" ? "the driver's error (no sizes)" : format_mib(oo->requested) + " requested", *oom_stage, stage_op_name(st.op),
                              s.models[st.model].id, place.activity.empty() ? "" : ", " + place.activity),
           oo->frames.empty() || ambiguous_kind ? Sureness::guessed : Sureness::derived,
           oo->frames.empty() ? line_ref(oo->line, st.op == StageOp::load ? "no traceback: in the last load, which printed no plan line"
                                                                          : "no traceback: in the forward of the last model loaded")
                              : line_ref(oo->line, fmt::format("traceback ends in {}{}", oo->frames.back(),
                                                               ambiguous_kind ? fmt::format("; it names a {} and two were loaded: the later one",
                                                                                            kind_name(*ambiguous_kind))
                                                                              : "")),
           "");
      if (log.ooms.size() > 1) {
        r.notes.push_back(fmt::format("{} more OOM message(s) after line {} (ComfyUI's retries and the unload after an OOM): only the first is "
                                      "reconstructed",
                                      log.ooms.size() - 1, oo->line));
      }
    }
    for (std::size_t k = 0; k < o.models.size(); ++k) {
      if (!used_files[k]) {
        throw InputError("--model", fmt::format("{}{}: no load in the log {}", o.models[k].first.empty() ? "" : o.models[k].first + "=",
                                                o.models[k].second,
                                                o.models[k].first.empty() ? "before the OOM was left without a catalog model to take it"
                                                                          : "before the OOM requests the class " + o.models[k].first));
      }
    }
    workload();
    validate_scenario(s);
    others_and_context();
    validate_scenario(s);
  }
};

}  // namespace

Reconstruction reconstruct_from_log(const ComfyLog& log, const FromLogOptions& options, Catalog& catalog) {
  Builder b(log, options, catalog);
  b.run();
  return std::move(b.r);
}

std::string format_facts(const Reconstruction& r) {
  std::size_t w0 = 0, w1 = 0;
  for (const LogFact& f : r.facts) {
    w0 = std::max(w0, f.what.size());
    w1 = std::max(w1, std::min<std::size_t>(f.value.size(), 48));
  }
  std::string out;
  for (const LogFact& f : r.facts) {
    std::string tail = f.source;
    if (!f.flag.empty() && (f.sure == Sureness::assumed || f.sure == Sureness::guessed)) {
      tail += fmt::format("{}set it with {}", tail.empty() ? "" : "; ", f.flag);
    }
    out += fmt::format("  {:<{}}  {:<{}}  {:<8} {}\n", f.what, w0, f.value, w1, sureness_name(f.sure), tail);
  }
  for (const std::string& n : r.notes) out += fmt::format("  note: {}\n", n);
  return out;
}

namespace {

// The sim's failing op as the log's words: weight-cast (a transfer or conversion of a weight, or
// aimdo's fault and cast path), load, compute.
std::string sim_activity(const Scenario& s, const CaseResult& r, std::uint32_t op) {
  if (op >= r.program.ops.size()) return "";
  const Op& o = r.program.ops[op];
  if (o.phase == Phase::load || o.phase == Phase::patch) return "load";
  const std::string_view a = op_activity(s, r.program, op);
  if (a == "h2d" || a == "upcast" || a == "dequant" || a == "lora" || a.find("vbar") != std::string_view::npos ||
      a.find("cast") != std::string_view::npos) {
    return "weight-cast";
  }
  return "compute";
}

}  // namespace

std::string format_comparison(const LogComparison& c) {
  std::string out;
  for (const std::string& l : c.lines) out += fmt::format("  {}\n", l);
  return out + fmt::format("against the log: {}\n", c.summary);
}

LogComparison compare_with_log(const Scenario& s, const CaseResult& r, Bytes tolerance) {
  LogComparison c;
  if (!s.from_log) return c;
  const FromLog& f = *s.from_log;
  const double tol = 0.005 + to_mib(tolerance);
  bool differs = false;
  for (const LogPlanExpect& e : f.plans) {
    const auto lp = parse_plan_line(e.text, "from_log");
    const LoadPlan* ours = nullptr;
    for (const LoadPlan& p : r.plan.loads) {
      if (p.stage == e.stage) ours = &p;
    }
    const std::string who = fmt::format("line {} ({} {})", e.line, stage_op_name(s.stages[e.stage].op), s.models[s.stages[e.stage].model].id);
    if (!ours) {
      c.lines.push_back(fmt::format("{}: the run has no plan for stage {}", who, e.stage));
      differs = true;
      continue;
    }
    std::vector<std::string> diffs;
    std::vector<std::string> same;
    auto cmp = [&](const char* what, double log_v, double our_v, double t) {
      const double d = our_v - log_v;
      if (std::abs(d) > t) diffs.push_back(fmt::format("{} {:.2f} here, {:.2f} in the log ({:+.2f})", what, our_v, log_v, d));
      else same.push_back(what);
    };
    if (lp->kind == LogPlanLine::Kind::dynamic) {
      if (!ours->dynamic) {
        diffs.push_back("the log stages it for dynamic VRAM, the run loads it the classic way");
      } else {
        cmp("MB staged", static_cast<double>(lp->staged_mb), static_cast<double>(ours->staging.staged / MiB), 0.5 + to_mib(tolerance));
        // Early dynamic builds print neither the patches nor the force-loaded weights.
        if (lp->patches_given && lp->patches != ours->staging.patches) {
          diffs.push_back(fmt::format("{} patches here, {} in the log", ours->staging.patches, lp->patches));
        }
        if (lp->patches_given && lp->forced != ours->staging.forced) {
          diffs.push_back(fmt::format("{} force-loaded weights here, {} in the log", ours->staging.forced, lp->forced));
        }
        if (lp->patches_given && lp->patches == ours->staging.patches) same.push_back("patches");
        if (lp->patches_given && lp->forced == ours->staging.forced) same.push_back("force-loaded weights");
      }
    } else if (ours->dynamic) {
      diffs.push_back(fmt::format("the log {} it, the run stages it for dynamic VRAM", plan_kind_name(lp->kind)));
    } else {
      const bool our_partial = ours->log_line.rfind("loaded partially", 0) == 0;
      if (our_partial != (lp->kind == LogPlanLine::Kind::partial)) {
        diffs.push_back(fmt::format("the run {}, the log {}", our_partial ? "loaded partially" : "loaded completely", plan_kind_name(lp->kind)));
      }
      if (lp->usable) cmp("MB usable", *lp->usable, static_cast<double>(ours->usable) / static_cast<double>(MiB), tol);
      cmp("MB loaded", lp->loaded, to_mib(ours->loaded), tol);
      if (lp->kind == LogPlanLine::Kind::partial) {
        if (lp->offloaded) cmp("MB offloaded", *lp->offloaded, to_mib(ours->offloaded), tol);
        if (lp->buffer) cmp("MB buffer", *lp->buffer, to_mib(ours->offload_buffer), tol);
        if (lp->lowvram_patches != ours->lowvram_patches) {
          diffs.push_back(fmt::format("{} lowvram patches here, {} in the log", ours->lowvram_patches, lp->lowvram_patches));
        } else {
          same.push_back("lowvram patches");
        }
      }
    }
    if (diffs.empty()) {
      c.lines.push_back(fmt::format("{}: matches ({})", who, same.empty() ? "its form" : fmt::format("{}", fmt::join(same, ", "))));
    } else {
      differs = true;
      c.lines.push_back(fmt::format("{}: differs: {}", who, fmt::join(diffs, "; ")));
      c.lines.push_back(fmt::format("    log: {}", e.text));
      c.lines.push_back(fmt::format("    run: {}", ours->log_line));
    }
  }
  if (differs) {
    c.status = LogComparison::Status::plan_differs;
    c.summary = "plan differs: the run did not plan what the log's ComfyUI planned (above); an OOM comparison would mean little";
    return c;
  }
  if (!f.oom) {
    c.status = LogComparison::Status::plan_matches;
    c.summary = f.plans.empty() ? "nothing to compare: the log has no plan line and no OOM"
                                : fmt::format("plan matches: {} plan line(s) as the log printed them; the log has no OOM", f.plans.size());
    return c;
  }
  const auto lo = parse_oom_text(f.oom->text, "from_log.oom");
  const bool sized = lo->backend != "driver";  // "CUDA error: out of memory" gives no sizes
  const std::string log_side =
      fmt::format("the log's OOM (line {}): {}{}{}", f.oom->line,
                  sized ? format_mib(lo->requested) + " requested" : "the driver's error (no sizes)",
                  lo->free ? fmt::format(" with {} free", format_mib(*lo->free)) : "",
                  f.oom->stage ? fmt::format(" in stage {} ({} {}{})", *f.oom->stage, stage_op_name(s.stages[*f.oom->stage].op),
                                             s.models[s.stages[*f.oom->stage].model].id,
                                             f.oom->activity.empty() ? "" : ", " + f.oom->activity)
                               : "");
  std::string summary_line;
  if (f.summary_line != 0) {
    // torch.cuda.memory_summary's peaks (whole units, floored) beside the run's.
    summary_line = fmt::format("the log's memory summary (line {}): reserved peak {}, allocated peak {}; the run's: {}, {}", f.summary_line,
                               f.summary_reserved_peak ? format_mib(*f.summary_reserved_peak) : "?",
                               f.summary_allocated_peak ? format_mib(*f.summary_allocated_peak) : "?", format_mib(r.exec.reserved_peak),
                               format_mib(r.exec.allocated_peak));
  }
  if (!r.exec.oom) {
    c.status = LogComparison::Status::no_oom;
    // What the run would need: the least free memory it had in the OOM's stage against what the
    // log's request found.
    std::string need;
    // The run's device use in the OOM's stage: the allocator's reserved peak there, the context
    // and the others (under dynamic VRAM, whose weights are not the allocator's: the whole run's
    // device peak).
    const bool staged = f.oom->stage && *f.oom->stage < r.exec.stage_reserved_peak.size() && !r.exec.dynamic;
    const Bytes used = staged ? r.exec.stage_reserved_peak[*f.oom->stage] + s.device.context_overhead + s.device.used_by_others
                              : r.exec.device_peak;
    const Bytes tightest = sat_sub(s.device.total, used);
    need = fmt::format("; the run's device use peaked at {} of {}{} ({} free at its tightest{})", format_mib(used), format_mib(s.device.total),
                       staged ? fmt::format(" in stage {}", *f.oom->stage) : "", format_mib(tightest),
                       lo->free ? fmt::format("; the log's request found {} free", format_mib(*lo->free)) : "");
    const Bytes log_free = lo->free.value_or(0);
    if (r.exec.dynamic) {
      need += "; under dynamic VRAM comfy-aimdo evicts weight pages to make room, so the log's OOM needs memory it cannot evict "
              "(torch's cache, cast buffers, another process) that the run does not hold: more memory used by other processes "
              "(--others), a different allocator (--allocator) or activations larger than modelled (--activations bytes or profile)";
    } else if (staged && lo->free && tightest <= log_free) {
      need += "; the run was as tight as the log or tighter and did not fail: not a shortage of free memory, but how the allocator "
              "could use it (fragmentation, another stream's cache: --allocator, --option)";
    } else if (staged && lo->free) {
      const bool load_stage = s.stages[*f.oom->stage].op == StageOp::load;
      need += fmt::format("; to fail as the log did it would hold about {} more there: {}", format_mib(sat_sub(tightest, log_free)),
                          load_stage ? "more memory used by other processes (--others), or weights the catalog model lacks (--model)"
                                     : "activations larger than modelled (--activations bytes or profile), or more memory used by "
                                       "other processes (--others)");
    }
    c.lines.push_back(log_side + "; the run does not OOM" + need);
    if (!summary_line.empty()) c.lines.push_back(summary_line);
    c.summary = fmt::format("{}, no OOM on {}: the run stays within the card where the log ran out",
                            f.plans.empty() ? "no plan line to compare" : "plan matches", r.exec.backend);
    return c;
  }
  const OomEvent& ev = *r.exec.oom;
  const std::uint32_t st = ev.op < r.program.ops.size() ? r.program.ops[ev.op].stage : 0;
  const std::string act = sim_activity(s, r, ev.op);
  const std::string run_side = fmt::format("the run's OOM (op {}): {} requested with {} free in stage {} ({} {}, {})", ev.op,
                                           format_mib(ev.request), format_mib(ev.device_free), st, stage_op_name(s.stages[st].op),
                                           s.models[s.stages[st].model].id, act);
  const bool same_stage = !f.oom->stage || *f.oom->stage == st;
  const bool same_act = f.oom->activity.empty() || f.oom->activity == act;
  const Bytes diff = ev.request > lo->requested ? ev.request - lo->requested : lo->requested - ev.request;
  const bool same_size = sized && diff <= lo->precision;
  c.lines.push_back(log_side);
  c.lines.push_back(run_side);
  if (!summary_line.empty()) c.lines.push_back(summary_line);
  if (same_stage && same_act) {
    c.status = LogComparison::Status::reproduced;
    c.summary = fmt::format("reproduced: the run OOMs in the log's stage{}, {}", f.oom->activity.empty() ? "" : " and activity",
                            !sized      ? "requesting " + format_mib(ev.request) + " (the log's message gives no size)"
                            : same_size ? "with the same request size (to the message's printed precision)"
                                        : fmt::format("requesting {} where the log's request was {}", format_mib(ev.request), format_mib(lo->requested)));
    return c;
  }
  c.status = LogComparison::Status::oom_elsewhere;
  c.summary = fmt::format("{}, OOM elsewhere: the run OOMs in stage {} ({}), the log in {}", f.plans.empty() ? "no plan line to compare" : "plan matches", st, act,
                          f.oom->stage ? fmt::format("stage {} ({})", *f.oom->stage, f.oom->activity) : "an unplaced stage");
  return c;
}

std::string_view preset_releases(Preset p) {
  switch (p) {
    case Preset::oct2025: return "ComfyUI 0.3.75 or older (before PR #10733; the emulation is commit a125cd84, 0.3.64)";
    case Preset::nov2025: return "ComfyUI 0.3.76 (PR #10733 and #10953, before #11096)";
    case Preset::dec2025: return "ComfyUI 0.4.0 or newer on the classic path (from 0.16 on: with --disable-dynamic-vram, or a legacy patcher)";
    case Preset::feb2026: return "ComfyUI 0.16.x (dynamic VRAM by default since PR #12658; comfy-aimdo 0.2.x)";
    case Preset::sep2026: return "ComfyUI 0.31 to 0.38 (comfy-aimdo 0.4.10 to 0.5.5), the nearest preset for 0.17 to 0.30 and for newer releases";
  }
  return "?";
}

std::string comfyui_reproduction(const Scenario& s, Bytes reserve) {
  const Policy& pol = s.policy;
  std::vector<std::string> flags;
  std::vector<std::string> env;
  std::vector<std::string> notes;
  const bool dyn = pol.dynamic();
  if (pol.predictor == PredictorKind::exact) notes.push_back("`exact` is vramfuzz's own lower bound, not a ComfyUI planner: run it under the classic path below");
  if (!dyn && pol.preset == Preset::dec2025) {
    flags.push_back("--disable-dynamic-vram");
    notes.push_back("`--disable-dynamic-vram` is for ComfyUI 0.16 and newer; leave it out before");
  }
  const Preset dflt_preset = pol.preset;
  const ComfyConstants dflt = preset_constants(dflt_preset);
  if (reserve != dflt.reserve) flags.push_back(fmt::format("--reserve-vram {:.3g}", static_cast<double>(reserve) / static_cast<double>(GiB)));
  if (dyn && pol.constants.dynamic.vram_headroom != 0) {
    flags.push_back(fmt::format("--vram-headroom {:.3g}", static_cast<double>(pol.constants.dynamic.vram_headroom) / static_cast<double>(GiB)));
  }
  const std::uint32_t ns = s.streams();
  if (ns != dflt.num_streams) flags.push_back(ns == 0 ? "--disable-async-offload" : fmt::format("--async-offload {}", ns));
  switch (s.allocator.mode) {
    case AllocatorMode::caching:
      flags.push_back("--disable-cuda-malloc");
      break;
    case AllocatorMode::caching_expandable:
      flags.push_back("--disable-cuda-malloc");
      env.push_back("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True");
      notes.push_back("ComfyUI releases after August 2026 strip `expandable_segments:True` from PYTORCH_CUDA_ALLOC_CONF: check "
                      "torch.cuda.memory's settings, or use an older release");
      break;
    case AllocatorMode::async:
      notes.push_back("cudaMallocAsync is ComfyUI's default (the startup line ends in `: cudaMallocAsync`); ComfyUI 0.12 - 0.14 "
                      "with dynamic VRAM turned it off, `--cuda-malloc` asks for it");
      break;
    case AllocatorMode::raw:
      env.push_back("PYTORCH_NO_CUDA_MEMORY_CACHING=1");
      notes.push_back("`raw` is plain cudaMalloc / cudaFree per tensor: PyTorch does that with its cache turned off");
      break;
  }
  for (const auto& [k, v] : s.allocator.options) {
    if (k == "max_split_size_mb" || k == "garbage_collection_threshold" || k == "roundup_power2_divisions") env.push_back(fmt::format("PYTORCH_CUDA_ALLOC_CONF={}:{}", k, v));
    else notes.push_back(fmt::format("allocator option {}={} has no ComfyUI flag", k, v));
  }
  // The look-ahead buffer without the upcast term: ComfyUI's master of 2025-12-04 to 12-08, not
  // a release (it says 0.3.76).
  const bool dec04 = !dyn && pol.preset == Preset::dec2025 && !pol.constants.dequant_term;
  for (const auto& [k, v] : pol.overrides) {
    if (k == "reserve" || k == "vram_headroom" || k == "num_streams" || (dec04 && k == "dequant_term")) continue;
    notes.push_back(fmt::format("the policy override {}={} is a change to ComfyUI's code, not a flag", k, v));
  }
  std::string md = "## Reproduce in ComfyUI\n\n";
  if (dec04) {
    std::erase(flags, std::string("--disable-dynamic-vram"));
    std::erase_if(notes, [](const std::string& n) { return n.find("--disable-dynamic-vram") != std::string::npos; });
  }
  md += fmt::format("On a GPU, with {}:\n\n```\n{}{}python main.py{}{}\n```\n\n",
                    dec04 ? std::string_view("ComfyUI's master between PR #11096 and #11171 (2025-12-04 to 12-08; it says 0.3.76)")
                          : preset_releases(pol.preset),
                    fmt::join(env, " "),
                    env.empty() ? "" : " ", flags.empty() ? "" : " ", fmt::join(flags, " "));
  // The card: a larger one behaves like this device when the difference is taken first.
  const Bytes want_free = sat_sub(s.device.total, s.device.used_by_others);
  md += fmt::format("The card: {} in all, {} of it taken by other processes at the start. On a larger card, take the difference "
                    "first in another process and keep it for the whole run, e.g. for a card of C bytes:\n\n"
                    "```\npython -c \"import torch,time; x=torch.empty(C - {}, dtype=torch.uint8, device='cuda'); time.sleep(1e9)\"\n```\n\n"
                    "and lower the size until `nvidia-smi` shows {} free before ComfyUI starts (the taking process's own CUDA context "
                    "counts too). "
                    "(ComfyUI still reads the card's own total: what depends on it, such as comfy-aimdo's VBAR page cap or Windows' 700 MiB "
                    "reserve above 15 GiB, follows the larger card.)\n\n",
                    format_size(s.device.total), format_mib(s.device.used_by_others), want_free, format_mib(want_free));
  md += "The workflow: ";
  std::vector<std::string> steps;
  for (const Stage& st : s.stages) {
    if (st.op != StageOp::forward) continue;
    const ModelRef& m = s.models[st.model];
    const std::string_view node = m.spec->kind == ModelKind::text_encoder ? "CLIPTextEncode"
                                  : m.spec->kind == ModelKind::vae       ? "VAEDecode"
                                                                         : "KSampler";
    std::string what = m.source.rfind("catalog:", 0) == 0 ? fmt::format("{} stored {}", m.source.substr(8), storage_label(m))
                       : m.source.rfind("file:", 0) == 0  ? m.source.substr(5)
                                                          : fmt::format("a synthetic {} model (no ComfyUI checkpoint has its tensors)",
                                                                        family_name(m.spec->family));
    steps.push_back(fmt::format("{} with `{}` ({}, compute {}{})", node, m.id, what, dtype_name(m.compute), m.lora ? ", a LoRA on every weight" : ""));
  }
  md += steps.empty() ? "load the models only" : fmt::format("{}", fmt::join(steps, ", then "));
  if (s.from_log) {
    notes.push_back(fmt::format("this case was shrunk from one `vramfuzz from-log` rebuilt from `{}`: in ComfyUI, run that workflow with its "
                                "real models (the scenario from-log wrote), not this smaller one",
                                s.from_log->file));
  }
  md += fmt::format(", at {}{}.\n\n", workload_label(s.workload), s.workload.cfg > 1 ? fmt::format(", cfg {}", s.workload.cfg) : "");
  for (const std::string& n : notes) md += "- " + n + "\n";
  if (!notes.empty()) md += "\n";
  return md;
}

}  // namespace vf
