#include "harness/scenario.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <unordered_map>
#include <set>
#include <span>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "harness/case_file.h"
#include "harness/comfy_log.h"
#include "harness/core/error.h"
#include "harness/core/flat_name_index.h"
#include "harness/core/json_in.h"
#include "harness/core/json_text.h"
#include "harness/predictors/external.h"
#include "harness/sim/allocator.h"
#include "models/import.h"

namespace vf {

// ---- names ------------------------------------------------------------------------------------

std::string_view preset_name(Preset p) {
  switch (p) {
    case Preset::oct2025: return "oct2025";
    case Preset::nov2025: return "nov2025";
    case Preset::dec2025: return "dec2025";
    case Preset::feb2026: return "feb2026";
    case Preset::sep2026: return "sep2026";
  }
  return "?";
}

std::optional<Preset> parse_preset(std::string_view s) {
  for (Preset p : kAllPresets) {
    if (s == preset_name(p)) return p;
  }
  if (s == "dynamic") return Preset::sep2026;
  return std::nullopt;
}

std::string_view account_mode_name(AccountMode a) {
  switch (a) {
    case AccountMode::none: return "none";
    case AccountMode::largest: return "largest";
    case AccountMode::lookahead: return "lookahead";
  }
  return "?";
}

std::string_view stage_op_name(StageOp s) {
  switch (s) {
    case StageOp::load: return "load";
    case StageOp::forward: return "forward";
    case StageOp::unload: return "unload";
  }
  return "?";
}

// ---- presets ----------------------------------------------------------------------------------

// 0.8 GiB the way ComfyUI computes it (1024^3 * 0.8, truncated to whole bytes).
inline constexpr Bytes kInferenceFloor = 858993459;

ComfyConstants preset_constants(Preset p) {
  ComfyConstants c;
  c.reserve = 400 * MiB;  // EXTRA_RESERVED_VRAM on Linux, all three dates
  c.inference_floor = kInferenceFloor;
  c.min_weight_ratio = 0.0;
  c.unload_factor = 1.1;
  c.cfg_mult = 2.0;
  c.cond_batch_safety = 1.5;
  c.flash_attention = true;
  switch (p) {
    case Preset::oct2025:
      // ComfyUI a125cd84 (2025-10-11): no offload accounting, 128 MiB weight floor, async
      // offload off unless --async-offload, LoRA merged in fp32 without a per-module sync.
      c.weight_floor = 128 * MiB;
      c.account = AccountMode::none;
      c.dequant_term = false;
      c.num_streams = 0;
      c.lora_math_factor = 2.0;
      c.lora_patch_dtype = Dtype::fp32;
      c.patch_sync = false;
      break;
    case Preset::nov2025:
      // After #10733 (2025-11-13: buffer = cost + NS x largest module) and #10953 (2025-11-27:
      // two offload streams by default on NVIDIA).
      c.weight_floor = 0;
      c.account = AccountMode::largest;
      c.dequant_term = false;
      c.num_streams = 2;
      c.lora_math_factor = 2.0;
      c.lora_patch_dtype = Dtype::fp32;
      c.patch_sync = false;
      break;
    case Preset::dec2025:
    case Preset::feb2026:
    case Preset::sep2026:
      // After #11096 (look-ahead buffer), #11171 (upcast/dequant term), #11173 (LoRA math factor
      // 2) and #11144 (synchronize after patching each module; LoRA merged in fp16). The classic
      // path has not changed since (comfyui-dynamic-vram.md §3): the dynamic presets plan their
      // legacy models with these constants.
      c.weight_floor = 0;
      c.account = AccountMode::lookahead;
      c.dequant_term = true;
      c.num_streams = 2;
      c.lora_math_factor = 2.0;
      c.lora_patch_dtype = Dtype::fp16;
      c.patch_sync = true;
      break;
  }
  DynamicConstants& d = c.dynamic;
  if (p == Preset::feb2026) {
    // ComfyUI 0.16.0 (PR #12658, merged 2026-02-28, dynamic VRAM on by default) with comfy-aimdo 0.2.2
    // (tag v0.2.2, 2026-02-25): budget_deficit read cuMemGetInfo on every call and had no
    // --reserve-vram / --vram-headroom input; the cudaMallocAsync hook checked it once per 2 s
    // and otherwise evicted only after a failure; every hooked allocation was booked as whole
    // 2 MiB pages; a fault evicted only when a page failed; a page was pinned or not; and
    // aimdo's VRAMBuffer had no Python binding yet, so a module whose fault failed was cast
    // through a plain torch allocation.
    d.reserve_sets_headroom = false;
    d.poll_ms = 0;
    d.async_check_ms = 2000;
    d.malloc_headroom = 0;
    d.ledger_pages = true;
    d.fault_surplus = false;
    d.pin_counts = false;
    d.aimdo_cast_buffers = false;
  }
  return c;
}

std::string Policy::label() const {
  if (predictor == PredictorKind::external) return "exec:" + external_name;
  return fmt::format("{}:{}", predictor == PredictorKind::comfy ? "comfy" : "exact", preset_name(preset));
}

namespace {

// A size in the one form it has: the largest binary unit that divides it exactly.
std::string canonical_size(Bytes b) {
  if (b == 0) return "0";
  if (b % GiB == 0) return fmt::format("{}GiB", b / GiB);
  if (b % MiB == 0) return fmt::format("{}MiB", b / MiB);
  if (b % KiB == 0) return fmt::format("{}KiB", b / KiB);
  return fmt::format("{}B", b);
}

}  // namespace

std::string Policy::key() const {
  const ComfyConstants base = preset_constants(preset);
  const ComfyConstants& c = constants;
  std::string out = label();
  auto add = [&](bool differs, std::string_view k, const std::string& v) {
    if (differs) out += fmt::format(" {}={}", k, v);
  };
  auto boolean = [](bool b) { return std::string(b ? "true" : "false"); };
  // Sorted by key.
  add(c.account != base.account, "account", std::string(account_mode_name(c.account)));
  add(c.cfg_mult != base.cfg_mult, "cfg_mult", fmt::format("{}", c.cfg_mult));
  add(c.cond_batch_safety != base.cond_batch_safety, "cond_batch_safety", fmt::format("{}", c.cond_batch_safety));
  add(c.dequant_term != base.dequant_term, "dequant_term", boolean(c.dequant_term));
  add(exact_reserve_bound || exact_reserve_only.has_value(), "exact_reserve",
      exact_reserve_bound ? std::string("bound") : canonical_size(exact_reserve_only.value_or(0)));
  add(c.flash_attention != base.flash_attention, "flash_attention", boolean(c.flash_attention));
  add(c.inference_floor != base.inference_floor, "inference_floor", canonical_size(c.inference_floor));
  add(c.lora_math_factor != base.lora_math_factor, "lora_math_factor", fmt::format("{}", c.lora_math_factor));
  add(c.lora_patch_dtype != base.lora_patch_dtype, "lora_patch_dtype", std::string(dtype_name(c.lora_patch_dtype)));
  add(c.min_weight_ratio != base.min_weight_ratio, "min_weight_ratio", fmt::format("{}", c.min_weight_ratio));
  add(c.num_streams != base.num_streams, "num_streams", std::to_string(c.num_streams));
  add(c.patch_sync != base.patch_sync, "patch_sync", boolean(c.patch_sync));
  // `reserve` is not part of the key (see scenario.h).
  add(c.unload_factor != base.unload_factor, "unload_factor", fmt::format("{}", c.unload_factor));
  add(c.weight_floor != base.weight_floor, "weight_floor", canonical_size(c.weight_floor));
  // Dynamic VRAM's constants (the reserve's share, the simple headroom, is left out as above).
  const DynamicConstants& d = c.dynamic;
  const DynamicConstants& bd = base.dynamic;
  add(d.malloc_headroom != bd.malloc_headroom, "malloc_headroom", canonical_size(d.malloc_headroom));
  add(d.poll_ms != bd.poll_ms, "poll_ms", std::to_string(d.poll_ms));
  add(d.vram_headroom != bd.vram_headroom, "vram_headroom", canonical_size(d.vram_headroom));
  return out;
}

Policy parse_policy(std::string_view text, std::string_view what, StartCommand start) {
  Policy p;
  std::string_view kind = text;
  std::string_view preset = "dec2025";
  if (const auto colon = text.find(':'); colon != std::string_view::npos) {
    kind = text.substr(0, colon);
    preset = text.substr(colon + 1);
  }
  if (kind == "exec") {
    // The rest is the command (or the name a started predictor said hello with), colons and all.
    const std::string rest(text.substr(5));
    const PredictorHello* h = find_external(rest);
    if (!h && start == StartCommand::refuse) {
      throw InputError(std::string(what), fmt::format("names the external predictor \"{}\", which no flag of this run started; "
                                                      "a file never starts a command (give it with --predictor COMMAND or "
                                                      "--policy exec:COMMAND)",
                                                      rest));
    }
    if (!h) {
      try {
        h = &start_external(rest);
      } catch (const InputError& e) {
        throw InputError(std::string(what), e.what());
      }
    }
    p.predictor = PredictorKind::external;
    p.external_name = h->name;
    p.external_version = h->version;
    p.preset = h->runtime;
    p.constants = preset_constants(h->runtime);
    return p;
  }
  if (kind == "comfy") {
    p.predictor = PredictorKind::comfy;
  } else if (kind == "exact") {
    p.predictor = PredictorKind::exact;
    // `exact:PRESET` names a ComfyUI preset, which the README and the reports spell
    // `comfy:dec2025`: `exact:comfy:dec2025` is the same policy as `exact:dec2025`.
    if (preset.starts_with("comfy:")) preset.remove_prefix(6);
  } else {
    throw InputError(std::string(what), fmt::format("unknown predictor \"{}\" (use comfy:oct2025, comfy:nov2025, comfy:dec2025, "
                                                    "comfy:feb2026, comfy:sep2026 (= comfy:dynamic), exact, exact:PRESET such as "
                                                    "exact:dec2025 or exact:comfy:dec2025, or exec:COMMAND)",
                                                    text));
  }
  const auto pr = parse_preset(preset);
  if (!pr) {
    throw InputError(std::string(what), fmt::format("unknown preset \"{}\" (use oct2025, nov2025, dec2025, feb2026, sep2026 or dynamic)", preset));
  }
  if (p.predictor == PredictorKind::exact && is_dynamic(*pr)) {
    throw InputError(std::string(what), fmt::format("exact takes its placement from a classic preset; {} is dynamic VRAM, which "
                                                    "places weights at run time (use exact:dec2025, or comfy:{})", preset, preset));
  }
  p.preset = *pr;
  p.constants = preset_constants(*pr);
  return p;
}

namespace {

bool parse_bool_text(std::string_view v, const std::string& path) {
  if (v == "true" || v == "1" || v == "yes" || v == "on") return true;
  if (v == "false" || v == "0" || v == "no" || v == "off") return false;
  throw InputError(path, fmt::format("expected true or false, got \"{}\"", v));
}

double parse_double_text(std::string_view v, double lo, double hi, const std::string& path) {
  double d = 0;
  try {
    size_t used = 0;
    d = std::stod(std::string(v), &used);
    if (used != v.size()) throw std::invalid_argument("junk");
  } catch (const std::exception&) {
    throw InputError(path, fmt::format("expected a number, got \"{}\"", v));
  }
  if (!(d >= lo && d <= hi)) throw InputError(path, fmt::format("must be between {} and {}, got {}", lo, hi, v));
  return d;
}

}  // namespace

namespace {

// The override keys, in the order docs/formats.md lists them: every preset's, then the dynamic
// presets' own (what policy_override_keys selects from and the unknown-key error lists).
constexpr std::string_view kPresetOverrideKeys[] = {"reserve",          "inference_floor", "weight_floor",     "min_weight_ratio",
                                                    "unload_factor",    "cfg_mult",        "cond_batch_safety", "lora_math_factor",
                                                    "account",          "dequant_term",    "num_streams",      "flash_attention",
                                                    "lora_patch_dtype", "patch_sync"};
constexpr std::string_view kDynamicOverrideKeys[] = {"vram_headroom", "poll_ms", "malloc_headroom"};

std::string joined(std::span<const std::string_view> keys) {
  std::string out;
  for (const std::string_view k : keys) out += (out.empty() ? "" : ", ") + std::string(k);
  return out;
}

}  // namespace

std::vector<std::string_view> policy_override_keys(const Policy& p) {
  std::vector<std::string_view> keys(std::begin(kPresetOverrideKeys), std::end(kPresetOverrideKeys));
  if (p.predictor == PredictorKind::exact) keys.emplace_back("exact_reserve");
  if (p.dynamic()) {
    if (p.preset != Preset::feb2026) keys.emplace_back("vram_headroom");
    keys.emplace_back("poll_ms");
    if (p.preset != Preset::feb2026) keys.emplace_back("malloc_headroom");
  }
  return keys;
}

void apply_policy_override(Policy& p, std::string_view key, std::string_view value, std::string_view what, OverrideFrom from) {
  // A field of a file ("policy.overrides.reserve") or a flag and its key ("--set cfg_mult").
  const std::string path = what.starts_with("--") ? fmt::format("{} {}", what, key) : fmt::format("{}.{}", what, key);
  if (p.predictor == PredictorKind::external && from == OverrideFrom::flag) {
    // A predictor that said which overrides it applies would plan this case without it: refuse
    // it here rather than report what the predictor did not do. A key or value that is wrong in
    // itself is named as such first (tried on a copy, so `p` is left as it was).
    if (const PredictorHello* h = find_external(p.external_name); h && !h->honours(key)) {
      Policy probe = p;
      apply_policy_override(probe, key, value, what, OverrideFrom::file);
      throw InputError(path, unhonoured_override_message(*h, key));
    }
  }
  ComfyConstants& c = p.constants;
  const bool dynamic_key = std::find(std::begin(kDynamicOverrideKeys), std::end(kDynamicOverrideKeys), key) != std::end(kDynamicOverrideKeys);
  if (dynamic_key && !p.dynamic()) {
    throw InputError(path, fmt::format("applies to the dynamic VRAM presets only (comfy:feb2026, comfy:sep2026), not {}", p.label()));
  }
  if (key == "reserve") {
    const Bytes r = parse_size(value, path);
    if (p.predictor == PredictorKind::exact) p.exact_reserve = r;
    c.reserve = r;
    // --reserve-vram sets aimdo's simple headroom too, where the preset's aimdo takes it.
    if (p.dynamic() && c.dynamic.reserve_sets_headroom) c.dynamic.simple_headroom = r;
  } else if (key == "vram_headroom") {
    if (p.preset == Preset::feb2026) throw InputError(path, "comfy-aimdo 0.2.2 (comfy:feb2026) has no --vram-headroom; it came on 2026-06-15");
    c.dynamic.vram_headroom = parse_size(value, path);
    if (c.dynamic.vram_headroom > kMaxDeviceBytes) throw InputError(path, "larger than any device");
  } else if (key == "poll_ms") {
    const double ms = parse_double_text(value, 0, 3600000, path);
    if (ms != static_cast<double>(static_cast<std::uint32_t>(ms))) throw InputError(path, fmt::format("expected whole milliseconds, got \"{}\"", value));
    c.dynamic.poll_ms = static_cast<std::uint32_t>(ms);
  } else if (key == "malloc_headroom") {
    if (p.preset == Preset::feb2026) throw InputError(path, "comfy-aimdo 0.2.2 (comfy:feb2026) has no cuMemAlloc hook headroom");
    c.dynamic.malloc_headroom = parse_size(value, path);
    if (c.dynamic.malloc_headroom > kMaxDeviceBytes) throw InputError(path, "larger than any device");
  } else if (key == "exact_reserve") {
    if (p.predictor != PredictorKind::exact) throw InputError(path, "applies to the exact predictor only");
    p.exact_reserve_bound = value == "bound";
    p.exact_reserve_only.reset();
    if (!p.exact_reserve_bound) p.exact_reserve_only = parse_size(value, path);
  } else if (key == "inference_floor") {
    c.inference_floor = parse_size(value, path);
  } else if (key == "weight_floor") {
    c.weight_floor = parse_size(value, path);
  } else if (key == "min_weight_ratio") {
    c.min_weight_ratio = parse_double_text(value, 0.0, 1.0, path);
  } else if (key == "unload_factor") {
    c.unload_factor = parse_double_text(value, 1.0, 10.0, path);
  } else if (key == "cfg_mult") {
    c.cfg_mult = parse_double_text(value, 1.0, 16.0, path);
  } else if (key == "cond_batch_safety") {
    c.cond_batch_safety = parse_double_text(value, 1.0, 16.0, path);
  } else if (key == "lora_math_factor") {
    c.lora_math_factor = parse_double_text(value, 0.0, 16.0, path);
  } else if (key == "account") {
    if (value == "none") c.account = AccountMode::none;
    else if (value == "largest") c.account = AccountMode::largest;
    else if (value == "lookahead") c.account = AccountMode::lookahead;
    else throw InputError(path, fmt::format("unknown account mode \"{}\" (use none, largest or lookahead)", value));
  } else if (key == "dequant_term") {
    c.dequant_term = parse_bool_text(value, path);
  } else if (key == "num_streams") {
    const auto n = static_cast<std::uint32_t>(parse_double_text(value, 0, kMaxOffloadStreams, path));
    if (std::to_string(n) != value) throw InputError(path, fmt::format("expected an integer 0..{}, got \"{}\"", kMaxOffloadStreams, value));
    c.num_streams = n;
  } else if (key == "flash_attention") {
    c.flash_attention = parse_bool_text(value, path);
  } else if (key == "lora_patch_dtype") {
    const auto d = parse_dtype(value);
    if (!d || !dtype_info(*d).compute) throw InputError(path, fmt::format("expected fp16, bf16 or fp32, got \"{}\"", value));
    c.lora_patch_dtype = *d;
  } else if (key == "patch_sync") {
    c.patch_sync = parse_bool_text(value, path);
  } else {
    throw InputError(path, fmt::format("unknown policy constant (known: {}, exact_reserve; dynamic presets: {})", joined(kPresetOverrideKeys),
                                       joined(kDynamicOverrideKeys)));
  }
  // Keep the latest value of each key once, in the order first given, for round-tripping.
  auto it = std::find_if(p.overrides.begin(), p.overrides.end(), [&](const auto& kv) { return kv.first == key; });
  if (it != p.overrides.end()) it->second = std::string(value);
  else p.overrides.emplace_back(std::string(key), std::string(value));
}

Bytes parse_device_total(std::string_view text, std::string_view what) {
  const Bytes b = parse_size(text, what);
  if (b == 0) throw InputError(std::string(what), "device total must be greater than 0");
  if (b > kMaxDeviceBytes) {
    throw InputError(std::string(what), fmt::format("{} is larger than the {} a device can have here", text, format_size(kMaxDeviceBytes)));
  }
  return b;
}

std::vector<Stage> default_stages(std::size_t model_count) {
  std::vector<Stage> stages;
  for (std::size_t i = 0; i < model_count; ++i) {
    stages.push_back({StageOp::load, static_cast<std::uint32_t>(i)});
    stages.push_back({StageOp::forward, static_cast<std::uint32_t>(i)});
  }
  return stages;
}

// ---- parsing ----------------------------------------------------------------------------------

namespace {

// Size limits that keep every later sum far from 2^64 while admitting any real device or model
// (the device's, kMaxDeviceBytes, is in scenario.h: the CLI's --vram applies it too).
inline constexpr Bytes kMaxModelBytes = Bytes{1} << 48;   // 256 TiB
inline constexpr std::uint32_t kMaxTextTokens = 1u << 16;
inline constexpr std::size_t kMaxTensorRank = 8;
inline constexpr std::size_t kMaxModulesPerModel = 1u << 20;
inline constexpr std::uint64_t kMaxTensorsPerModel = 1u << 22;  // 4,194,304
inline constexpr std::size_t kMaxOthersEvents = 1024;
inline constexpr double kMaxEventMs = 86400000.0;  // a day of modelled time

Dtype parse_dtype_field(const JsonIn& j) {
  const std::string s = j.str();
  const auto d = parse_dtype(s);
  if (!d) j.fail(fmt::format("unknown dtype \"{}\" (known: {})", s, dtype_list()));
  return *d;
}

TensorRole parse_role(const JsonIn& j) {
  const std::string s = j.str();
  for (TensorRole r : {TensorRole::weight, TensorRole::bias, TensorRole::norm, TensorRole::embedding,
                       TensorRole::scale, TensorRole::other}) {
    if (s == role_name(r)) return r;
  }
  j.fail(fmt::format("unknown role \"{}\" (known: weight, bias, norm, embedding, scale, other)", s));
}

// Other processes' memory changes over the case, in time order (docs/formats.md "device.events").
std::vector<OthersEvent> parse_events(const JsonIn& j, const DeviceSpec& d) {
  std::vector<OthersEvent> events;
  if (j.size() > kMaxOthersEvents) j.fail(fmt::format("more than {} events", kMaxOthersEvents));
  Bytes held = d.used_by_others;
  std::uint64_t last_us = 0;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const JsonIn e = j.at(i);
    e.expect_object({"at_ms", "take", "free"});
    OthersEvent ev;
    const JsonIn at = e.at("at_ms");
    ev.at_us = static_cast<std::uint64_t>(std::llround(at.number_in(0.0, kMaxEventMs) * 1000.0));
    if (ev.at_us < last_us) at.fail(fmt::format("events must be in time order: {} ms comes after {} ms", at.number(), last_us / 1000.0));
    last_us = ev.at_us;
    if (e.has("take") == e.has("free")) e.fail("give exactly one of \"take\" (bytes another process allocates) or \"free\" (bytes it gives back)");
    ev.take = e.has("take");
    const JsonIn amount = e.at(ev.take ? "take" : "free");
    ev.bytes = amount.bytes();
    if (ev.bytes == 0) amount.fail("must be more than 0 bytes");
    if (ev.take) {
      if (ev.bytes > d.total) amount.fail(fmt::format("more than the {} device", format_size(d.total)));
      held += ev.bytes;  // what they would hold if it succeeds; a take may fail at run time
    } else {
      if (ev.bytes > held) amount.fail(fmt::format("other processes hold at most {} by then", format_mib(held)));
      held -= ev.bytes;
    }
    events.push_back(ev);
  }
  return events;
}

DeviceSpec parse_device(const JsonIn& j) {
  j.expect_object({"name", "total", "used_by_others", "context_overhead", "events", "h2d_gbps", "tflops"});
  DeviceSpec d;
  if (auto v = j.opt("name")) d.name = v->str();
  d.total = j.at("total").bytes();
  if (d.total == 0) j.at("total").fail("device total must be greater than 0");
  if (d.total > kMaxDeviceBytes) j.at("total").fail(fmt::format("larger than the {} a device can have here", format_size(kMaxDeviceBytes)));
  if (auto v = j.opt("used_by_others")) d.used_by_others = v->bytes();
  if (auto v = j.opt("context_overhead")) d.context_overhead = v->bytes();
  if (d.used_by_others >= d.total || d.context_overhead >= d.total - d.used_by_others) {
    j.at(d.used_by_others >= d.total ? "used_by_others" : "context_overhead")
        .fail(fmt::format("memory used by others ({}) plus the context ({}) leave nothing of the {} device",
                          format_mib(d.used_by_others), format_mib(d.context_overhead), format_size(d.total)));
  }
  if (auto v = j.opt("h2d_gbps")) d.h2d_gbps = v->number_in(0.1, 10000.0);
  if (auto v = j.opt("tflops")) d.tflops = v->number_in(0.01, 100000.0);
  if (auto v = j.opt("events")) d.events = parse_events(*v, d);
  return d;
}

AllocatorConfig parse_allocator(const JsonIn& j) {
  AllocatorConfig c;
  auto mode_of = [](const JsonIn& v) { return parse_allocator_mode_field(v.str(), v.path()); };
  if (j.is_string()) {
    c.mode = mode_of(j);
  } else {
    j.expect_object({"mode", "options"});
    c.mode = mode_of(j.at("mode"));
    if (auto o = j.opt("options")) {
      if (!o->is_object()) o->fail("expected an object of option: value");
      for (std::size_t i = 0; i < o->member_count(); ++i) c.options.emplace_back(std::string(o->key(i)), o->member(i).scalar_text());
    }
  }
  sim::normalize_allocator_config(c, j.path());
  return c;
}

Policy parse_policy_json(const JsonIn& j) {
  if (j.is_string() && j.str().rfind("exec:", 0) == 0) {
    j.fail("an external predictor is written as {\"name\": \"exec:NAME\", \"version\": ..., \"runtime\": \"comfy:PRESET\"}");
  }
  if (j.is_string()) return parse_policy(j.str(), j.path());
  Policy p;
  const std::string name = j.at("name").str();
  if (name.rfind("exec:", 0) == 0) {
    // A file names its external predictor and never its command: the predictor that runs it is the
    // one the flags started under this name (harness/predictors/external.h).
    j.expect_object({"name", "version", "runtime", "overrides"});
    p.predictor = PredictorKind::external;
    p.external_name = name.substr(5);
    if (p.external_name.empty()) j.at("name").fail("exec: needs the predictor's name (exec:NAME)");
    if (const auto v = j.opt("version")) p.external_version = v->str();
    const JsonIn rt = j.at("runtime");
    const std::string r = rt.str();
    const auto pr = r.rfind("comfy:", 0) == 0 ? parse_preset(std::string_view(r).substr(6)) : std::nullopt;
    if (!pr) rt.fail(fmt::format("\"{}\": expected a ComfyUI preset (comfy:dec2025, comfy:sep2026, ...)", r));
    p.preset = *pr;
    p.constants = preset_constants(*pr);
  } else {
    j.expect_object({"name", "overrides"});
    p = parse_policy(name, j.path() + ".name");
  }
  if (auto o = j.opt("overrides")) {
    if (!o->is_object()) o->fail("expected an object of constant: value");
    for (std::size_t i = 0; i < o->member_count(); ++i) {
      apply_policy_override(p, std::string(o->key(i)), o->member(i).scalar_text(), o->path(), OverrideFrom::file);
    }
  }
  return p;
}

// `base`: what a field left out is (knee_of's: the workload's own).
Workload parse_workload(const JsonIn& j, const Workload& base = Workload{}) {
  j.expect_object({"width", "height", "batch", "frames", "cfg", "text_tokens", "steps"});
  Workload w = base;
  auto side = [&](std::string_view key, std::uint32_t& out) {
    if (auto v = j.opt(key)) {
      const std::uint64_t x = v->u64();
      if (x < kMinImageSide || x > kMaxImageSide) {
        v->fail(fmt::format("must be between {} and {} pixels, got {}", kMinImageSide, kMaxImageSide, x));
      }
      out = static_cast<std::uint32_t>(x);
    }
  };
  side("width", w.width);
  side("height", w.height);
  if (auto v = j.opt("batch")) w.batch = v->u32_in(1, kMaxBatch);
  if (auto v = j.opt("frames")) w.frames = v->u32_in(1, kMaxFrames);
  if (auto v = j.opt("cfg")) w.cfg = v->number_in(0.0, 100.0);
  if (auto v = j.opt("text_tokens")) w.text_tokens = v->u32_in(0, kMaxTextTokens);
  if (auto v = j.opt("steps")) w.steps = v->u32_in(1, kMaxSteps);
  return w;
}

}  // namespace

Dtype parse_dtype_json(const JsonIn& j) { return parse_dtype_field(j); }
Workload parse_workload_json(const JsonIn& j) { return parse_workload(j); }

namespace {

ArchShape parse_arch(const JsonIn& j) {
  j.expect_object({"latent_channels", "hidden", "widest", "text_tokens", "patch", "temporal_down", "gated",
                   "kept_hidden_states"});
  ArchShape a;
  constexpr std::uint32_t kMaxWidth = 1u << 24;
  if (auto v = j.opt("latent_channels")) a.latent_channels = v->u32_in(0, 1024);
  if (auto v = j.opt("hidden")) a.hidden = v->u32_in(0, kMaxWidth);
  if (auto v = j.opt("widest")) a.widest = v->u32_in(0, kMaxWidth);
  if (auto v = j.opt("text_tokens")) a.text_tokens = v->u32_in(0, kMaxTextTokens);
  if (auto v = j.opt("patch")) a.patch = v->u32_in(1, 16);
  if (auto v = j.opt("temporal_down")) a.temporal_down = v->u32_in(1, 16);
  if (auto v = j.opt("gated")) a.gated = v->boolean();
  if (auto v = j.opt("kept_hidden_states")) a.kept_hidden_states = v->u32_in(0, 256);
  return a;
}

// The first tensor whose name an earlier one of the list has: (that earlier one, it), or nullopt.
std::optional<std::pair<std::size_t, std::size_t>> first_repeated_name(const std::vector<Tensor>& tensors) {
  if (tensors.size() <= 16) {
    for (std::size_t u = 1; u < tensors.size(); ++u) {
      for (std::size_t w = 0; w < u; ++w) {
        if (tensors[w].name == tensors[u].name) return std::pair{w, u};
      }
    }
    return std::nullopt;
  }
  std::vector<std::size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return tensors[a].name < tensors[b].name; });
  std::optional<std::pair<std::size_t, std::size_t>> best;
  for (std::size_t k = 1; k < order.size(); ++k) {
    // In a run of equal names (by index, stable), the second is where a reader meets the repeat.
    if (tensors[order[k]].name == tensors[order[k - 1]].name && (k < 2 || tensors[order[k - 2]].name != tensors[order[k]].name)) {
      if (!best || order[k] < best->second) best = std::pair{order[k - 1], order[k]};
    }
  }
  return best;
}


// A name a report, a log line or a terminal shows (a model id, a module or tensor name): no control
// bytes. A name with \u0000 or an escape sequence in it is a damaged or hostile file, and would cut
// or garble every line that quotes it.
std::string printable_name(const JsonIn& v) {
  std::string name = v.str();
  for (std::size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f) v.fail(fmt::format("must not contain control characters (byte 0x{:02x} at offset {} of the name)", c, i));
  }
  return name;
}

std::vector<Module> parse_modules(const JsonIn& j) {
  std::vector<Module> modules;
  const std::size_t n = j.size();
  if (n == 0) j.fail("a model needs at least one module");
  if (n > kMaxModulesPerModel) j.fail(fmt::format("too many modules ({} > {})", n, kMaxModulesPerModel));
  modules.reserve(n);
  // Running totals over the model, so an overflow names the field that causes it (finalize_model
  // would only name the total).
  Bytes model_bytes = 0;
  std::uint64_t model_numel = 0;
  std::vector<std::uint8_t> hook_given;
  // The names a file would give the tensors (module path + "." + name): unique in a model, as in
  // the safetensors and GGUF files the importer reads. "" is the root module.
  // Where a name was given: entry `entry` of the list (copy `copy` of a repeat), its tensor
  // `tensor` for a tensor name. Worded only when an error quotes it.
  struct Given {
    std::size_t entry;
    std::size_t tensor;
    std::uint64_t copy;
    bool repeated;
  };
  const auto module_where = [&](const Given& g) {
    return g.repeated ? fmt::format("{}[{}] (copy {})", j.path(), g.entry, g.copy) : fmt::format("{}[{}]", j.path(), g.entry);
  };
  const auto tensor_where = [&](const Given& g) {
    const std::string at = fmt::format("{}[{}].tensors[{}]", j.path(), g.entry, g.tensor);
    return g.repeated ? fmt::format("{} (copy {})", at, g.copy) : at;
  };
  ModuleNameIndex module_at(ModuleNameOf{&modules}, n);  // the names so far (where each was given: given_at)
  std::uint64_t tensor_count = 0, tensor_count_step = 0;
  std::vector<std::size_t> entry_of;                  // per module: the entry that gave it (repeat expands one entry)
  // Full tensor names ("a.b.weight") -> where each was given. While no tensor name has a dot,
  // a full name splits at its last dot into one (module, tensor) pair, and module names are
  // unique, so two tensors can share a full name only within one module: that is checked there,
  // and the map is filled (with every full name so far) only once a dotted tensor name appears.
  std::unordered_map<std::string, Given> full_names;
  bool dotted = false;
  std::vector<std::uint8_t> entry_repeated;  // per entry: given with "repeat"
  // Where module e was given: its entry, and which copy of a repeat it is.
  const auto given_at = [&](std::size_t e) {
    std::uint64_t copy = 0;
    while (copy < e && entry_of[e - copy - 1] == entry_of[e]) ++copy;
    return Given{entry_of[e], 0, copy, entry_repeated[entry_of[e]] != 0};
  };
  const auto full_name = [](const Module& mod, const Tensor& t) { return mod.name.empty() ? t.name : mod.name + "." + t.name; };
  for (std::size_t i = 0; i < n; ++i) {
    const JsonIn mj = j.at(i);
    mj.expect_object({"name", "repeat", "tensors", "cast_hook"});
    Module tmpl;
    tmpl.name = printable_name(mj.at("name"));
    // "repeat": N stands for N copies of the module named NAME.0 ... NAME.(N-1) (the compact form
    // of a rounding-sum repro: "212 x [2 MiB + 512 B fp16]").
    std::optional<std::uint64_t> repeat;
    const std::size_t room = kMaxModulesPerModel - std::min(modules.size(), kMaxModulesPerModel);
    if (auto v = mj.opt("repeat")) {
      repeat = v->u64();
      if (*repeat < 1 || *repeat > room) {
        v->fail(fmt::format("must be between 1 and {} (the model's limit of {} modules, {} already given)", room, kMaxModulesPerModel,
                            modules.size()));
      }
    } else if (room == 0) {
      mj.fail(fmt::format("too many modules (more than {})", kMaxModulesPerModel));
    }
    entry_repeated.push_back(repeat ? 1 : 0);
    bool hook = false;
    if (auto v = mj.opt("cast_hook")) {
      tmpl.cast_hook = v->boolean();
      hook = true;
    }
    const JsonIn tj = mj.at("tensors");
    if (tj.size() == 0) tj.fail("a module needs at least one tensor");
    Bytes tmpl_bytes = 0;
    std::uint64_t tmpl_numel = 0;
    for (std::size_t t = 0; t < tj.size(); ++t) {
      const JsonIn x = tj.at(t);
      x.expect_object({"name", "shape", "dtype", "role"});
      Tensor tensor;
      tensor.name = printable_name(x.at("name"));
      if (tensor.name.empty()) x.at("name").fail("must not be empty (a tensor is named within its module: \"weight\", \"bias\")");
      const JsonIn sj = x.at("shape");
      if (sj.size() > kMaxTensorRank) sj.fail(fmt::format("rank {} is more than {} dimensions", sj.size(), kMaxTensorRank));
      for (std::size_t d = 0; d < sj.size(); ++d) {
        const JsonIn dim = sj.at(d);
        const std::uint64_t v = dim.u64();
        if (v == 0) dim.fail("a dimension must be at least 1");
        tensor.shape.push_back(v);
      }
      tensor.dtype = parse_dtype_field(x.at("dtype"));
      // One tensor too large for 64 bits is its shape's fault; a model whose total overflows is
      // the fault of the tensor that takes it over.
      // Checked without a path (an overflow is rare; building the path for every tensor is not).
      std::uint64_t numel = 0;
      Bytes bytes = 0;
      try {
        numel = tensor_numel(tensor.shape, "");
        bytes = tensor_bytes(tensor.dtype, tensor.shape, "");
      } catch (const InputError& e) {
        throw InputError(sj.path(), e.what());
      }
      if (__builtin_add_overflow(model_bytes, bytes, &model_bytes) || __builtin_add_overflow(model_numel, numel, &model_numel)) {
        x.fail(fmt::format("the model's total size overflows 64 bits with this tensor ({} bytes)", bytes));
      }
      tmpl_bytes += bytes;
      tmpl_numel += numel;
      tensor.role = TensorRole::weight;
      if (auto r = x.opt("role")) tensor.role = parse_role(*r);
      else if (tensor.shape.size() <= 1) tensor.role = tensor.name == "bias" ? TensorRole::bias : TensorRole::norm;
      tmpl.tensors.push_back(std::move(tensor));
    }
    const std::uint64_t copies = repeat.value_or(1);
    // Tensors in all, as a listed model's file would hold them: a small file must not expand to
    // more than a real checkpoint's worth (the largest have a few thousand).
    if (__builtin_mul_overflow(tmpl.tensors.size(), copies, &tensor_count_step) || tensor_count + tensor_count_step > kMaxTensorsPerModel) {
      (repeat ? mj.at("repeat") : mj.at("tensors")).fail(fmt::format("the model would have more than {} tensors", kMaxTensorsPerModel));
    }
    tensor_count += tensor_count_step;
    if (copies > 1) {
      // The first copy is counted above; the others add to the totals together.
      Bytes more_bytes = 0;
      std::uint64_t more_numel = 0;
      if (__builtin_mul_overflow(tmpl_bytes, copies - 1, &more_bytes) || __builtin_mul_overflow(tmpl_numel, copies - 1, &more_numel) ||
          __builtin_add_overflow(model_bytes, more_bytes, &model_bytes) || __builtin_add_overflow(model_numel, more_numel, &model_numel)) {
        mj.at("repeat").fail(fmt::format("the model's total size overflows 64 bits with {} copies of {} bytes", copies, tmpl_bytes));
      }
      if (model_bytes > kMaxModelBytes) {
        mj.at("repeat").fail(fmt::format("model is {} bytes with {} copies, more than the {} limit", model_bytes, copies, format_size(kMaxModelBytes)));
      }
    }
    for (std::uint64_t k = 0; k < copies; ++k) {
      Module m = tmpl;
      if (repeat) m.name = fmt::format("{}{}{}", tmpl.name, tmpl.name.empty() ? "" : ".", k);
      if (const std::optional<std::uint32_t> prior = module_at.find(m.name)) {
        mj.at("name").fail(
            fmt::format("duplicate module name \"{}\" ({} has it; give its tensors to one module)", m.name, module_where(given_at(*prior))));
      }
      if (!dotted && std::any_of(m.tensors.begin(), m.tensors.end(), [](const Tensor& t) { return t.name.find('.') != std::string::npos; })) {
        dotted = true;  // from here on, every full name goes through the map: first those so far
        full_names.reserve(2 * n);
        std::uint64_t copy = 0;
        for (std::size_t e = 0; e < modules.size(); ++e) {
          copy = e > 0 && entry_of[e - 1] == entry_of[e] ? copy + 1 : 0;
          for (std::size_t u = 0; u < modules[e].tensors.size(); ++u) {
            full_names.emplace(full_name(modules[e], modules[e].tensors[u]), Given{entry_of[e], u, copy, entry_repeated[entry_of[e]] != 0});
          }
        }
      }
      if (dotted) {
        for (std::size_t u = 0; u < m.tensors.size(); ++u) {
          if (const auto [it, fresh] = full_names.emplace(full_name(m, m.tensors[u]), Given{i, u, k, repeat.has_value()}); !fresh) {
            tj.at(u).at("name").fail(fmt::format("duplicate tensor name \"{}\" ({} has it)", it->first, tensor_where(it->second)));
          }
        }
      } else if (k == 0) {  // the copies of a repeat have the template's names
        if (const auto dup = first_repeated_name(m.tensors)) {
          tj.at(dup->second).at("name").fail(fmt::format("duplicate tensor name \"{}\" ({} has it)", full_name(m, m.tensors[dup->second]),
                                                         tensor_where(Given{i, dup->first, k, repeat.has_value()})));
        }
      }
      hook_given.push_back(hook ? 1 : 0);
      entry_of.push_back(i);
      modules.push_back(std::move(m));
      module_at.add(static_cast<std::uint32_t>(modules.size() - 1));
    }
  }
  // The names say which modules are containers (parameters below them): their own tensors are
  // raw, so they have no cast hook unless the file says otherwise (finalize_model rejects that).
  mark_containers(modules);
  for (std::size_t i = 0; i < modules.size(); ++i) {
    if (!hook_given[i]) modules[i].cast_hook = !modules[i].container;
    if (hook_given[i] && modules[i].cast_hook && modules[i].container) {
      // finalize_model says the same, but at the module's index after "repeat" expanded the
      // entries: name the entry that gave it.
      const auto child = std::find_if(modules.begin(), modules.end(), [&](const Module& c) {
        return c.name.size() > modules[i].name.size() + 1 && c.name.compare(0, modules[i].name.size() + 1, modules[i].name + ".") == 0 &&
               !c.tensors.empty();
      });
      j.at(entry_of[i]).at("cast_hook").fail(fmt::format(
          "module \"{}\" has parameters below it (\"{}\"), so it is a container and its own tensors are raw: a container has no "
          "cast hook (set \"cast_hook\": false or leave it out)",
          modules[i].name, child == modules.end() ? std::string("?") : child->name));
    }
  }
  return modules;
}

thread_local std::unordered_map<std::uint64_t, std::shared_ptr<const ModelSpec>>* g_spec_refs = nullptr;

// `base_dir`: where a relative "file:PATH" source is looked up (the scenario file's directory).
ModelRef parse_model(const JsonIn& j, Catalog& catalog, const std::string& base_dir) {
  j.expect_object({"id", "source", "storage", "scaled", "compute", "lora", "patcher", "prefetch", "kind", "family",
                   "memory_usage_factor", "arch", "modules", "keep", "drop", "spec_ref"});
  ModelRef ref;
  std::optional<std::uint64_t> spec_ref;
  if (auto v = j.opt("spec_ref")) {
    if (!g_spec_refs) v->fail("only a predictor-protocol request names a spec_ref; a scenario gives its models whole");
    spec_ref = v->u64();
  }
  if (auto v = j.opt("patcher")) {
    const std::string p = v->str();
    if (p == "legacy") ref.legacy = true;
    else if (p != "dynamic") v->fail(fmt::format("unknown patcher \"{}\" (use dynamic or legacy)", p));
  }
  if (auto v = j.opt("prefetch")) ref.prefetch = v->boolean();
  if (auto v = j.opt("compute")) {
    ref.compute = parse_dtype_field(*v);
    if (!dtype_info(ref.compute).compute) v->fail(fmt::format("{} is not a compute dtype (use fp32, fp16 or bf16)", dtype_name(ref.compute)));
  }
  if (auto v = j.opt("lora")) ref.lora = v->boolean();
  const bool inline_model = j.has("modules") || spec_ref;
  ref.source = inline_model ? "inline" : "";
  if (auto v = j.opt("source")) ref.source = v->str();
  if (ref.source.empty()) j.at("source").fail("required: \"catalog:NAME\", \"file:PATH\", or give \"modules\" inline");

  if (ref.source.rfind("catalog:", 0) == 0) {
    for (std::string_view k : {"kind", "family", "memory_usage_factor", "arch", "modules"}) {
      if (j.has(k)) j.at(k).fail("not allowed with a catalog model (the catalog defines it)");
    }
    const std::string name = ref.source.substr(8);
    const CatalogEntry* e = find_catalog_entry(name);
    if (!e) {
      // build_catalog_model throws the message that lists the catalog.
      (void)build_catalog_model(name, {}, j.path() + ".source");
      j.at("source").fail(fmt::format("unknown catalog model \"{}\"", name));
    }
    ref.storage.dtype = e->native_dtype;
    if (auto v = j.opt("storage")) {
      ref.storage.dtype = parse_dtype_field(*v);
      ref.storage_given = true;
    }
    if (auto v = j.opt("scaled")) {
      ref.storage.scaled = v->boolean();
      // Per-weight scales exist for fp8 and int8 storage only (ComfyUI's fp8_scaled files); true
      // with bf16 or a GGUF type would describe a file that cannot exist. false there is what
      // the storage is anyway.
      if (ref.storage.scaled && !dtype_info(ref.storage.dtype).fp8 && ref.storage.dtype != Dtype::int8) {
        v->fail(fmt::format("true applies to fp8 and int8 storage only, not {}", dtype_name(ref.storage.dtype)));
      }
    }
    ref.id = name;
    ref.spec = catalog.get(name, ref.storage, j.path());
    // "keep": [MODULE...] or "drop": [MODULE...]: the catalog model with modules left out (a
    // shrunk repro that still names the model it came from).
    if (j.has("keep") && j.has("drop")) j.at("drop").fail("give \"keep\" or \"drop\", not both");
    if (j.has("keep") || j.has("drop")) {
      const bool keep = j.has("keep");
      const JsonIn lj = j.at(keep ? "keep" : "drop");
      const ModelSpec& full = *ref.spec;
      std::map<std::string, std::size_t> index;
      for (std::size_t i = 0; i < full.modules.size(); ++i) index.emplace(full.modules[i].name, i);
      std::vector<std::uint8_t> listed(full.modules.size(), 0);
      if (lj.size() == 0) lj.fail(keep ? "keeps no module (leave \"keep\" out for the whole model)" : "drops no module (leave \"drop\" out)");
      for (std::size_t k = 0; k < lj.size(); ++k) {
        const JsonIn item = lj.at(k);
        const std::string mod = item.str();
        const auto it = index.find(mod);
        if (it == index.end()) item.fail(fmt::format("no module \"{}\" in {} (a catalog model of {} modules, named by their PyTorch paths)", mod, name, full.modules.size()));
        if (listed[it->second]) item.fail(fmt::format("module \"{}\" is listed twice", mod));
        listed[it->second] = 1;
      }
      auto sub = std::make_shared<ModelSpec>(full);
      sub->modules.clear();
      for (std::size_t i = 0; i < full.modules.size(); ++i) {
        if ((listed[i] != 0) == keep) sub->modules.push_back(full.modules[i]);
      }
      if (sub->modules.empty()) lj.fail("drops every module of the model");
      finalize_model(*sub, j.path());
      ref.catalog_full = ref.spec;
      ref.catalog_source = ref.source;
      ref.spec = std::move(sub);
    }
  } else if (ref.source == "inline" && spec_ref && !j.has("modules")) {
    for (std::string_view k : {"storage", "scaled", "keep", "drop", "kind", "family", "memory_usage_factor", "arch"}) {
      if (j.has(k)) j.at(k).fail("not allowed with a spec_ref (the spec it names has it)");
    }
    const auto it = g_spec_refs->find(*spec_ref);
    if (it == g_spec_refs->end()) j.at("spec_ref").fail(fmt::format("spec {} was never sent, or was forgotten", *spec_ref));
    ref.id = "model";
    ref.spec = it->second;
  } else if (ref.source == "inline") {
    for (std::string_view k : {"storage", "scaled", "keep", "drop"}) {
      if (j.has(k)) j.at(k).fail("not allowed with an inline model (each tensor names its dtype)");
    }
    auto spec = std::make_shared<ModelSpec>();
    spec->source = "inline";
    spec->kind = ModelKind::diffusion;
    if (auto v = j.opt("kind")) {
      const std::string k = v->str();
      if (k == "diffusion") spec->kind = ModelKind::diffusion;
      else if (k == "text_encoder") spec->kind = ModelKind::text_encoder;
      else if (k == "vae") spec->kind = ModelKind::vae;
      else v->fail(fmt::format("unknown kind \"{}\" (use diffusion, text_encoder or vae)", k));
    }
    if (auto v = j.opt("family")) {
      const auto f = parse_family(v->str());
      if (!f) v->fail(fmt::format("unknown family \"{}\"", v->str()));
      spec->family = *f;
    }
    if (auto v = j.opt("memory_usage_factor")) spec->memory_usage_factor = v->number_in(0.0, 1000.0);
    if (auto v = j.opt("arch")) spec->arch = parse_arch(*v);
    spec->modules = parse_modules(j.at("modules"));
    ref.id = "model";
    spec->name = ref.id;
    finalize_model(*spec, j.path());
    if (spec->bytes > kMaxModelBytes) j.at("modules").fail(fmt::format("model is {} bytes, more than the {} limit", spec->bytes, format_size(kMaxModelBytes)));
    ref.spec = std::move(spec);
    if (spec_ref) (*g_spec_refs)[*spec_ref] = ref.spec;
  } else if (ref.source.rfind("file:", 0) == 0) {
    // A safetensors / GGUF file (or a sharded index.json), imported now (models/import.h).
    for (std::string_view k : {"storage", "scaled", "kind", "memory_usage_factor", "arch", "modules", "keep", "drop"}) {
      if (j.has(k)) j.at(k).fail("not allowed with a file model (the file defines it)");
    }
    ImportOptions opts;
    if (auto v = j.opt("family")) {
      const auto f = parse_family(v->str());
      if (!f) v->fail(fmt::format("unknown family \"{}\"", v->str()));
      opts.family = *f;
    }
    const std::filesystem::path file(ref.source.substr(5));
    if (file.empty()) j.at("source").fail("\"file:\" needs a path");
    const std::string resolved = file.is_absolute() || base_dir.empty() ? file.string() : (std::filesystem::path(base_dir) / file).string();
    ImportedModel imported;
    try {
      imported = import_model_file(resolved, opts);
    } catch (const InputError& e) {
      throw InputError(j.path() + ".source", e.what());
    }
    ref.source = imported.model.source;  // "file:<absolute path>": a finding written elsewhere still replays
    ref.id = imported.model.name;
    ref.spec = std::make_shared<const ModelSpec>(std::move(imported.model));
  } else {
    j.at("source").fail(fmt::format("unknown source \"{}\" (use \"catalog:NAME\", \"file:PATH\" or give \"modules\" inline)", ref.source));
  }
  if (auto v = j.opt("id")) {
    ref.id = printable_name(*v);
    if (ref.id.empty()) v->fail("must not be empty");
  }
  return ref;
}

std::vector<Stage> parse_pipeline(const JsonIn& j, const std::vector<ModelRef>& models) {
  std::vector<Stage> stages;
  std::vector<bool> loaded(models.size(), false);
  const std::size_t n = j.size();
  if (n == 0) j.fail("the pipeline needs at least one stage");
  if (n > kMaxStages) j.fail(fmt::format("more than {} stages", kMaxStages));
  for (std::size_t i = 0; i < n; ++i) {
    const JsonIn s = j.at(i);
    s.expect_object({"op", "model"});
    Stage st;
    const std::string op = s.at("op").str();
    if (op == "load") st.op = StageOp::load;
    else if (op == "forward") st.op = StageOp::forward;
    else if (op == "unload") st.op = StageOp::unload;
    else s.at("op").fail(fmt::format("unknown stage op \"{}\" (use load, forward or unload)", op));
    const std::string id = s.at("model").str();
    const auto it = std::find_if(models.begin(), models.end(), [&](const ModelRef& m) { return m.id == id; });
    if (it == models.end()) s.at("model").fail(fmt::format("no model with id \"{}\"", id));
    st.model = static_cast<std::uint32_t>(it - models.begin());
    // The same order rule validate_scenario enforces, checked here so the path carries the
    // document's prefix ("scenario.pipeline[2]" inside a finding file).
    if (st.op == StageOp::load) loaded[st.model] = true;
    else if (!loaded[st.model]) s.fail(fmt::format("{} of \"{}\" before it is loaded", op, id));
    if (st.op == StageOp::unload) loaded[st.model] = false;
    stages.push_back(st);
  }
  return stages;
}

}  // namespace

namespace {

// Every model the pipeline runs a forward of has its activations sized: a `bytes` entry (or
// "*"), a matching profile entry (unless the profile falls back to the formula); every `bytes`
// key names a model.
void validate_activations(const Scenario& s) {
  const ActivationSpec& a = s.activations;
  if (a.source == ActivationSource::bytes) {
    for (const auto& entry : a.bytes) {
      const std::string& id = entry.first;
      const bool named = id == "*" || std::any_of(s.models.begin(), s.models.end(), [&](const ModelRef& m) { return m.id == id; });
      if (!named) throw InputError("activations.bytes." + id, fmt::format("no model has the id \"{}\"", id));
    }
  }
  if (a.source != ActivationSource::bytes && (a.source != ActivationSource::profile || a.fallback_to_model)) return;
  for (const Stage& st : s.stages) {
    if (st.op != StageOp::forward) continue;
    const ModelRef& m = s.models[st.model];
    if (a.source == ActivationSource::bytes) {
      const bool covered = std::any_of(a.bytes.begin(), a.bytes.end(), [&](const auto& e) { return e.first == m.id || e.first == "*"; });
      if (!covered) throw InputError("activations.bytes", fmt::format("no bytes for model \"{}\", which the pipeline runs (add it, or \"*\")", m.id));
      continue;
    }
    const bool matched = std::any_of(a.profile.begin(), a.profile.end(), [&](const ActivationProfileEntry& e) {
      return profile_entry_matches(e, *m.spec, m.id, m.compute);
    });
    if (!matched) {
      throw InputError("activations.entries", fmt::format("no entry for model \"{}\" ({}, computing in {}), which the pipeline runs "
                                                          "(add one, or set \"fallback\": \"model\")",
                                                          m.id, m.spec->name, dtype_name(m.compute)));
    }
  }
}

// knee_of is the same workload made larger in width, height, batch or frames (the paired check
// of class G): everything else equal, nothing smaller, something larger.
void validate_knee_of(const Workload& w, const Workload& k) {
  if (k.width < kMinImageSide || k.width > kMaxImageSide || k.height < kMinImageSide || k.height > kMaxImageSide) {
    throw InputError(k.width < kMinImageSide || k.width > kMaxImageSide ? "knee_of.width" : "knee_of.height",
                     fmt::format("must be between {} and {} pixels", kMinImageSide, kMaxImageSide));
  }
  if (k.batch < 1 || k.batch > kMaxBatch) throw InputError("knee_of.batch", fmt::format("must be between 1 and {}", kMaxBatch));
  if (k.frames < 1 || k.frames > kMaxFrames) throw InputError("knee_of.frames", fmt::format("must be between 1 and {}", kMaxFrames));
  const std::pair<const char*, std::pair<std::uint32_t, std::uint32_t>> dims[] = {
      {"width", {w.width, k.width}}, {"height", {w.height, k.height}}, {"batch", {w.batch, k.batch}}, {"frames", {w.frames, k.frames}}};
  bool larger = false;
  for (const auto& [name, v] : dims) {
    if (v.second < v.first) {
      throw InputError(fmt::format("knee_of.{}", name),
                       fmt::format("{} is smaller than the workload's {}: knee_of is the larger workload of the pair", v.second, v.first));
    }
    larger = larger || v.second > v.first;
  }
  if (!larger) throw InputError("knee_of", "equals the workload: knee_of must be larger in width, height, batch or frames");
  if (k.cfg != w.cfg) throw InputError("knee_of.cfg", fmt::format("{} differs from the workload's {}: only the size may differ", k.cfg, w.cfg));
  if (k.text_tokens != w.text_tokens) {
    throw InputError("knee_of.text_tokens", fmt::format("{} differs from the workload's {}: only the size may differ", k.text_tokens, w.text_tokens));
  }
  if (k.steps != w.steps) throw InputError("knee_of.steps", fmt::format("{} differs from the workload's {}: only the size may differ", k.steps, w.steps));
}

}  // namespace

void validate_scenario(const Scenario& s) {
  if (s.models.empty()) throw InputError("models", "a scenario needs at least one model");
  std::set<std::string> ids;
  Bytes total = 0;
  for (std::size_t i = 0; i < s.models.size(); ++i) {
    const ModelRef& m = s.models[i];
    if (!m.spec) throw InputError(fmt::format("models[{}]", i), "model is not resolved");
    if (!ids.insert(m.id).second) throw InputError(fmt::format("models[{}].id", i), fmt::format("duplicate model id \"{}\"", m.id));
    if (!dtype_info(m.compute).compute) throw InputError(fmt::format("models[{}].compute", i), "not a compute dtype");
    total = checked_add(total, m.spec->bytes, fmt::format("models[{}]", i));
  }
  if (s.device.total == 0) throw InputError("device.total", "device total must be greater than 0");
  if (s.device.total > kMaxDeviceBytes) {
    throw InputError("device.total", fmt::format("larger than the {} a device can have here", format_size(kMaxDeviceBytes)));
  }
  if (s.device.available() == 0) throw InputError("device", "memory used by others plus the context leave nothing of the device");
  if (s.workload.steps < 1 || s.workload.steps > kMaxSteps) throw InputError("workload.steps", fmt::format("must be between 1 and {}", kMaxSteps));
  {
    Bytes held = s.device.used_by_others;
    for (std::size_t i = 0; i < s.device.events.size(); ++i) {
      const OthersEvent& e = s.device.events[i];
      const std::string field = fmt::format("device.events[{}]", i);
      if (i > 0 && e.at_us < s.device.events[i - 1].at_us) throw InputError(field, "events must be in time order");
      if (e.bytes == 0) throw InputError(field, "must be more than 0 bytes");
      if (e.take) {
        held += e.bytes;
      } else {
        if (e.bytes > held) throw InputError(field, fmt::format("frees {} while other processes hold at most {}", format_mib(e.bytes), format_mib(held)));
        held -= e.bytes;
      }
    }
  }
  if (s.policy.dynamic()) {
    // What ComfyUI can run under dynamic VRAM: its cuda_malloc.py strips expandable_segments from
    // PYTORCH_CUDA_ALLOC_CONF, and comfy-aimdo 0.2.2 (feb2026) replaced cudaMalloc by a VMM buffer
    // per allocation, which vramfuzz does not model (its cudaMallocAsync hook it does).
    if (s.allocator.mode == AllocatorMode::caching_expandable) {
      throw InputError("allocator.mode", fmt::format("{} cannot run with expandable segments: ComfyUI's cuda_malloc.py removes "
                                                     "expandable_segments:True (use caching, raw or async)", s.policy.label()));
    }
    if (s.policy.preset == Preset::feb2026 && s.allocator.mode != AllocatorMode::async) {
      throw InputError("allocator.mode", fmt::format("comfy:feb2026 is modelled with cudaMallocAsync only (ComfyUI's default; "
                                                     "comfy-aimdo 0.2.2 turned every cudaMalloc into a VMM buffer, which is not "
                                                     "modelled), not {}", allocator_mode_name(s.allocator.mode)));
    }
  }
  if (s.offload_streams && *s.offload_streams > kMaxOffloadStreams) {
    throw InputError("offload_streams", fmt::format("must be between 0 and {}", kMaxOffloadStreams));
  }
  if (s.workload.width < kMinImageSide || s.workload.height < kMinImageSide || s.workload.width > kMaxImageSide ||
      s.workload.height > kMaxImageSide) {
    throw InputError(s.workload.width < kMinImageSide || s.workload.width > kMaxImageSide ? "workload.width" : "workload.height",
                     fmt::format("must be between {} and {} pixels", kMinImageSide, kMaxImageSide));
  }
  if (s.workload.batch < 1 || s.workload.batch > kMaxBatch) throw InputError("workload.batch", fmt::format("must be between 1 and {}", kMaxBatch));
  if (s.workload.frames < 1 || s.workload.frames > kMaxFrames) throw InputError("workload.frames", fmt::format("must be between 1 and {}", kMaxFrames));
  if (s.knee_of) validate_knee_of(s.workload, *s.knee_of);
  // Stage order: forward and unload need the model on the device.
  std::vector<bool> loaded(s.models.size(), false);
  if (s.stages.empty()) throw InputError("pipeline", "the pipeline needs at least one stage");
  for (std::size_t i = 0; i < s.stages.size(); ++i) {
    const Stage& st = s.stages[i];
    if (st.model >= s.models.size()) throw InputError(fmt::format("pipeline[{}].model", i), "no such model");
    if (st.op == StageOp::load) loaded[st.model] = true;
    else if (!loaded[st.model]) {
      throw InputError(fmt::format("pipeline[{}]", i), fmt::format("{} of \"{}\" before it is loaded", stage_op_name(st.op), s.models[st.model].id));
    }
    if (st.op == StageOp::unload) loaded[st.model] = false;
  }
  validate_activations(s);
}

Scenario parse_scenario_json(std::string_view text, Catalog& catalog, std::string_view origin) {
  return read_scenario(JsonIn(parse_json_doc(text, origin), ""), catalog, std::filesystem::path(std::string(origin)).parent_path().string());
}

Scenario load_case_file(const std::string& path, Catalog& catalog) {
  return parse_case_json(read_text_file(path), catalog, path);
}

Scenario parse_case_json(std::string_view text, Catalog& catalog, std::string_view origin) {
  const std::string path(origin);
  const std::string base_dir = std::filesystem::path(path).parent_path().string();
  const JsonIn j(parse_json_doc(text, origin), "");
  // A finding, result or repro is checked whole (case_file.h); its scenario is read below.
  if (check_case_document(j) != CaseDocKind::scenario) return read_scenario(j.at("scenario"), catalog, base_dir);
  return read_scenario(j, catalog, base_dir);
}

namespace {

// "from_log": the log a reconstructed scenario came from and what run compares it with. Each
// plan line and the OOM are kept as the log printed them and read with the log reader's own
// parsers, so a file cannot hold figures that disagree with its text.
FromLog parse_from_log(const JsonIn& j, const Scenario& s) {
  j.expect_object({"file", "digest", "plans", "oom", "memory_summary"});
  FromLog f;
  f.file = j.at("file").str();
  const JsonIn d = j.at("digest");
  const std::string ds = d.str();
  constexpr std::string_view kPrefix = "fnv1a64:";
  if (ds.size() != kPrefix.size() + 16 || ds.compare(0, kPrefix.size(), kPrefix) != 0 ||
      ds.find_first_not_of("0123456789abcdef", kPrefix.size()) != std::string::npos) {
    d.fail(fmt::format("\"{}\" is not \"fnv1a64:\" followed by 16 lower-case hex digits", ds));
  }
  f.digest = std::stoull(ds.substr(kPrefix.size()), nullptr, 16);
  if (auto pj = j.opt("plans")) {
    pj->expect_array();
    for (std::size_t i = 0; i < pj->size(); ++i) {
      const JsonIn e = pj->at(i);
      e.expect_object({"line", "stage", "text"});
      LogPlanExpect p;
      p.line = e.at("line").u32_in(1, UINT32_MAX);
      const JsonIn st = e.at("stage");
      p.stage = st.u32_in(0, UINT32_MAX);
      if (p.stage >= s.stages.size() || s.stages[p.stage].op != StageOp::load) {
        st.fail(fmt::format("{} is not a load stage of the pipeline (it has {} stages)", p.stage, s.stages.size()));
      }
      for (const LogPlanExpect& q : f.plans) {
        if (q.stage == p.stage) st.fail(fmt::format("stage {} has a plan line already (from_log.plans lists each load once)", p.stage));
      }
      const JsonIn t = e.at("text");
      p.text = t.str();
      if (!parse_plan_line(p.text, t.path())) t.fail("not a ComfyUI plan line (\"loaded completely; ...\", \"loaded partially; ...\" or \"Model X prepared for dynamic VRAM loading. ...\")");
      f.plans.push_back(std::move(p));
    }
  }
  if (auto oj = j.opt("oom")) {
    oj->expect_object({"line", "stage", "activity", "text"});
    LogOomExpect o;
    o.line = oj->at("line").u32_in(1, UINT32_MAX);
    if (auto st = oj->opt("stage")) {
      o.stage = st->u32_in(0, UINT32_MAX);
      if (*o.stage >= s.stages.size()) st->fail(fmt::format("{} is not a stage of the pipeline (it has {} stages)", *o.stage, s.stages.size()));
    }
    if (auto a = oj->opt("activity")) {
      o.activity = a->str();
      if (o.activity != "weight-cast" && o.activity != "load" && o.activity != "compute") {
        a->fail(fmt::format("\"{}\" is not weight-cast, load or compute", o.activity));
      }
    }
    const JsonIn t = oj->at("text");
    o.text = t.str();
    if (!parse_oom_text(o.text, t.path())) t.fail("not PyTorch's out-of-memory message (\"CUDA out of memory. Tried to allocate ...\" or \"Allocation on device N would exceed allowed memory\")");
    f.oom = std::move(o);
  }
  if (auto mj = j.opt("memory_summary")) {
    mj->expect_object({"line", "reserved_peak", "allocated_peak"});
    f.summary_line = mj->at("line").u32_in(1, UINT32_MAX);
    if (auto v = mj->opt("reserved_peak")) f.summary_reserved_peak = v->bytes();
    if (auto v = mj->opt("allocated_peak")) f.summary_allocated_peak = v->bytes();
  }
  return f;
}

nlohmann::ordered_json from_log_json(const FromLog& f) {
  nlohmann::ordered_json j;
  j["file"] = f.file;
  j["digest"] = fmt::format("fnv1a64:{:016x}", f.digest);
  if (!f.plans.empty()) {
    nlohmann::ordered_json plans = nlohmann::ordered_json::array();
    for (const LogPlanExpect& p : f.plans) plans.push_back({{"line", p.line}, {"stage", p.stage}, {"text", p.text}});
    j["plans"] = std::move(plans);
  }
  if (f.oom) {
    nlohmann::ordered_json o;
    o["line"] = f.oom->line;
    if (f.oom->stage) o["stage"] = *f.oom->stage;
    if (!f.oom->activity.empty()) o["activity"] = f.oom->activity;
    o["text"] = f.oom->text;
    j["oom"] = std::move(o);
  }
  if (f.summary_line != 0) {
    nlohmann::ordered_json m;
    m["line"] = f.summary_line;
    if (f.summary_reserved_peak) m["reserved_peak"] = *f.summary_reserved_peak;
    if (f.summary_allocated_peak) m["allocated_peak"] = *f.summary_allocated_peak;
    j["memory_summary"] = std::move(m);
  }
  return j;
}

}  // namespace

Scenario scenario_from_json(const nlohmann::json& doc, Catalog& catalog, const std::string& path, const std::string& base_dir) {
  return read_scenario(JsonIn(doc, path), catalog, base_dir);
}

Scenario read_scenario(const JsonIn& j, Catalog& catalog, const std::string& base_dir) {
  j.expect_object({"schema", "name", "seed", "device", "allocator", "policy", "models", "workload", "knee_of", "offload_streams",
                   "pipeline", "activations", "from_log"});
  if (auto v = j.opt("schema")) {
    if (v->str() != kScenarioSchema) v->fail(fmt::format("unsupported schema \"{}\" (this build reads {})", v->str(), kScenarioSchema));
  }
  Scenario s;
  if (auto v = j.opt("name")) s.name = v->str();
  if (auto v = j.opt("seed")) s.seed = v->u64();
  s.device = parse_device(j.at("device"));
  if (auto v = j.opt("allocator")) s.allocator = parse_allocator(*v);
  if (auto v = j.opt("policy")) s.policy = parse_policy_json(*v);
  else s.policy = parse_policy("comfy:dec2025", "policy");
  const JsonIn mj = j.at("models");
  if (mj.size() == 0) mj.fail("a scenario needs at least one model");
  if (mj.size() > kMaxModels) mj.fail(fmt::format("more than {} models", kMaxModels));
  for (std::size_t i = 0; i < mj.size(); ++i) {
    s.models.push_back(parse_model(mj.at(i), catalog, base_dir));
    for (std::size_t k = 0; k < i; ++k) {
      if (s.models[k].id == s.models[i].id) {
        throw InputError(mj.at(i).path() + ".id",
                         fmt::format("duplicate model id \"{}\" (give each model an \"id\")", s.models[i].id));
      }
    }
  }
  if (auto v = j.opt("workload")) s.workload = parse_workload(*v);
  if (auto v = j.opt("knee_of")) s.knee_of = parse_workload(*v, s.workload);
  if (auto v = j.opt("offload_streams")) s.offload_streams = v->u32_in(0, kMaxOffloadStreams);
  if (auto v = j.opt("pipeline")) s.stages = parse_pipeline(*v, s.models);
  else s.stages = default_stages(s.models.size());
  if (auto v = j.opt("activations")) s.activations = parse_activation_spec(*v, base_dir);
  if (auto v = j.opt("from_log")) s.from_log = parse_from_log(*v, s);
  validate_scenario(s);
  return s;
}

ModelRef model_from_json(const nlohmann::json& doc, Catalog& catalog, const std::string& path, const std::string& base_dir) {
  return parse_model(JsonIn(doc, path), catalog, base_dir);
}

Scenario load_scenario_file(const std::string& path, Catalog& catalog) {
  return parse_scenario_json(read_text_file(path), catalog, path);
}

// ---- writing ----------------------------------------------------------------------------------

nlohmann::json size_json(Bytes b) {
  // Exact multiples print as readable strings; anything else stays an exact byte count.
  if (b != 0 && b % GiB == 0) return fmt::format("{}GiB", b / GiB);
  if (b != 0 && b % MiB == 0) return fmt::format("{}MiB", b / MiB);
  return b;
}

namespace {

nlohmann::json workload_json(const Workload& w) {
  nlohmann::json j = {{"width", w.width}, {"height", w.height}, {"batch", w.batch},
                      {"frames", w.frames}, {"cfg", w.cfg},     {"text_tokens", w.text_tokens}};
  if (w.steps != 1) j["steps"] = w.steps;
  return j;
}

nlohmann::json option_value_json(const std::string& v) {
  // Options are kept as text; numbers and booleans go back out as JSON numbers / booleans.
  if (v == "true") return true;
  if (v == "false") return false;
  const auto j = nlohmann::json::parse(v, nullptr, false);
  if (!j.is_discarded() && j.is_number()) return j;
  return v;
}

}  // namespace

bool same_contents(const Module& a, const Module& b) {
  if (a.cast_hook != b.cast_hook || a.tensors.size() != b.tensors.size()) return false;
  for (std::size_t t = 0; t < a.tensors.size(); ++t) {
    const Tensor& x = a.tensors[t];
    const Tensor& y = b.tensors[t];
    if (x.name != y.name || x.shape != y.shape || x.dtype != y.dtype || x.role != y.role) return false;
  }
  return true;
}

bool is_module_subset(const ModelSpec& sub, const ModelSpec& full) {
  std::map<std::string_view, std::size_t> index;
  for (std::size_t i = 0; i < full.modules.size(); ++i) index.emplace(full.modules[i].name, i);
  std::size_t next = 0;
  for (const Module& m : sub.modules) {
    const auto it = index.find(m.name);
    if (it == index.end() || it->second < next) return false;
    if (!same_contents(m, full.modules[it->second])) return false;
    next = it->second + 1;
  }
  return !sub.modules.empty();
}

std::size_t repeat_run(const std::vector<Module>& modules, std::size_t i) {
  constexpr std::size_t kMinRepeatRun = 3;
  const Module& first = modules[i];
  if (first.name.size() < 3 || first.name.compare(first.name.size() - 2, 2, ".0") != 0) return 1;
  const std::string_view base(first.name.data(), first.name.size() - 1);  // "NAME."
  std::size_t k = 1;
  while (i + k < modules.size()) {
    const Module& m = modules[i + k];
    if (m.name.size() <= base.size() || m.name.compare(0, base.size(), base) != 0 || m.name.substr(base.size()) != std::to_string(k) ||
        !same_contents(m, first)) {
      break;
    }
    ++k;
  }
  return k >= kMinRepeatRun ? k : 1;
}

namespace {

// The modules of an inline spec, each run of repeats as one entry.
nlohmann::json modules_json(const ModelSpec& spec) {
  nlohmann::json mods = nlohmann::json::array();
  for (std::size_t i = 0; i < spec.modules.size();) {
    const Module& mod = spec.modules[i];
    // A run of modules NAME.0, NAME.1, ... with the same tensors is written as one entry with
    // "repeat" (what the reader expands back to the same modules).
    const std::size_t run = repeat_run(spec.modules, i);
    nlohmann::json tj = nlohmann::json::array();
    for (const Tensor& t : mod.tensors) {
      tj.push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", dtype_name(t.dtype)}, {"role", role_name(t.role)}});
    }
    nlohmann::json mj = {{"name", run > 1 ? mod.name.substr(0, mod.name.size() - 2) : mod.name}};
    if (run > 1) mj["repeat"] = run;
    mj["tensors"] = std::move(tj);
    if (!mod.cast_hook) mj["cast_hook"] = false;
    mods.push_back(std::move(mj));
    i += run;
  }
  return mods;
}

// `modules`: false leaves an inline spec's modules out (append_model_json writes them itself).
nlohmann::json model_json(const ModelRef& m, bool modules = true) {
  nlohmann::json j;
  j["id"] = m.id;
  if (m.source == "inline") {
    const ModelSpec& spec = *m.spec;
    j["source"] = "inline";
    j["kind"] = kind_name(spec.kind);
    j["family"] = family_name(spec.family);
    j["memory_usage_factor"] = spec.memory_usage_factor;
    j["arch"] = {{"latent_channels", spec.arch.latent_channels}, {"hidden", spec.arch.hidden},
                 {"widest", spec.arch.widest},                   {"text_tokens", spec.arch.text_tokens},
                 {"patch", spec.arch.patch},                     {"temporal_down", spec.arch.temporal_down},
                 {"gated", spec.arch.gated},                     {"kept_hidden_states", spec.arch.kept_hidden_states}};
    if (modules) j["modules"] = modules_json(spec);
  } else if (m.source.rfind("file:", 0) == 0) {
    j["source"] = m.source;
    j["family"] = family_name(m.spec->family);  // detected or given: either way it reloads the same
  } else {
    j["source"] = m.source;
    j["storage"] = dtype_name(m.storage.dtype);
    if (dtype_info(m.storage.dtype).fp8 || m.storage.dtype == Dtype::int8) j["scaled"] = m.storage.scaled;
    if (m.catalog_full && m.spec->modules.size() != m.catalog_full->modules.size()) {
      // The shorter list: the modules kept, or those dropped.
      std::set<std::string> kept;
      for (const Module& mod : m.spec->modules) kept.insert(mod.name);
      nlohmann::json keep = nlohmann::json::array(), drop = nlohmann::json::array();
      for (const Module& mod : m.catalog_full->modules) (kept.count(mod.name) ? keep : drop).push_back(mod.name);
      if (keep.size() <= drop.size()) j["keep"] = std::move(keep);
      else j["drop"] = std::move(drop);
    }
  }
  j["compute"] = dtype_name(m.compute);
  j["lora"] = m.lora;
  if (m.legacy) j["patcher"] = "legacy";
  if (m.prefetch) j["prefetch"] = true;
  return j;
}

}  // namespace

namespace {
std::map<Dtype, Bytes> weight_bytes_by_dtype(const ModelSpec& spec) {
  std::map<Dtype, Bytes> by;
  for (const Module& mod : spec.modules) {
    for (const Tensor& t : mod.tensors) {
      if (t.role == TensorRole::weight) by[t.dtype] += t.bytes;
    }
  }
  return by;
}

// The dtype with the most bytes (`fallback` when there are none).
Dtype dominant(const std::map<Dtype, Bytes>& by, Dtype fallback) {
  Dtype d = fallback;
  Bytes most = 0;
  for (const auto& [dtype, b] : by) {
    if (b > most) {
      most = b;
      d = dtype;
    }
  }
  return d;
}
}  // namespace

Dtype dominant_storage(const ModelRef& m) { return dominant(weight_bytes_by_dtype(*m.spec), m.compute); }

std::string storage_label(const ModelRef& m) {
  if (m.source.rfind("catalog:", 0) == 0) return std::string(dtype_name(m.storage.dtype));
  const std::map<Dtype, Bytes> by = weight_bytes_by_dtype(*m.spec);
  const Dtype main = dominant(by, m.compute);
  if (by.size() <= 1) return std::string(dtype_name(main));
  Bytes all = 0;
  for (const auto& [d, b] : by) all += b;
  std::string out = fmt::format("{} {:.0f}%", dtype_name(main), 100.0 * static_cast<double>(by.at(main)) / static_cast<double>(all));
  for (const auto& [d, b] : by) {
    if (d != main) out += fmt::format(" + {}", dtype_name(d));
  }
  return out;
}

SpecRefScope::SpecRefScope(std::unordered_map<std::uint64_t, std::shared_ptr<const ModelSpec>>& specs) : saved_(g_spec_refs) {
  g_spec_refs = &specs;
}
SpecRefScope::~SpecRefScope() { g_spec_refs = saved_; }

std::string scenario_to_json(const Scenario& s, int indent) { return indent < 0 ? scenario_json_compact(s) : scenario_to_ordered_json(s).dump(indent); }

namespace {

// What scenario_to_ordered_json writes before "models" (into a new document) and after it.
nlohmann::ordered_json scenario_head_json(const Scenario& s) {
  nlohmann::ordered_json j;
  j["schema"] = kScenarioSchema;
  if (!s.name.empty()) j["name"] = s.name;
  j["seed"] = s.seed;
  j["device"] = {{"name", s.device.name},
                 {"total", size_json(s.device.total)},
                 {"used_by_others", size_json(s.device.used_by_others)},
                 {"context_overhead", size_json(s.device.context_overhead)}};
  if (s.device.h2d_gbps != kDefaultH2dGBps) j["device"]["h2d_gbps"] = s.device.h2d_gbps;
  if (s.device.tflops != kDefaultTflops) j["device"]["tflops"] = s.device.tflops;
  if (!s.device.events.empty()) {
    nlohmann::json ev = nlohmann::json::array();
    for (const OthersEvent& e : s.device.events) {
      ev.push_back({{"at_ms", static_cast<double>(e.at_us) / 1000.0}, {e.take ? "take" : "free", size_json(e.bytes)}});
    }
    j["device"]["events"] = std::move(ev);
  }
  nlohmann::json opts = nlohmann::json::object();
  for (const auto& [k, v] : s.allocator.options) opts[k] = option_value_json(v);
  j["allocator"] = {{"mode", allocator_mode_name(s.allocator.mode)}, {"options", opts}};
  if (s.policy.predictor == PredictorKind::external) {
    nlohmann::json ov = nlohmann::json::object();
    for (const auto& [k, v] : s.policy.overrides) ov[k] = option_value_json(v);
    j["policy"] = {{"name", s.policy.label()},
                   {"version", s.policy.external_version},
                   {"runtime", fmt::format("comfy:{}", preset_name(s.policy.preset))},
                   {"overrides", ov}};
  } else if (s.policy.overrides.empty()) {
    j["policy"] = s.policy.label();
  } else {
    nlohmann::json ov = nlohmann::json::object();
    for (const auto& [k, v] : s.policy.overrides) ov[k] = option_value_json(v);
    j["policy"] = {{"name", s.policy.label()}, {"overrides", ov}};
  }
  return j;
}

void add_scenario_tail_json(const Scenario& s, nlohmann::ordered_json& j) {
  j["workload"] = workload_json(s.workload);
  if (s.knee_of) j["knee_of"] = workload_json(*s.knee_of);
  if (s.offload_streams) j["offload_streams"] = *s.offload_streams;
  nlohmann::json pipe = nlohmann::json::array();
  for (const Stage& st : s.stages) pipe.push_back({{"op", stage_op_name(st.op)}, {"model", s.models[st.model].id}});
  j["pipeline"] = std::move(pipe);
  if (nlohmann::json a = activation_spec_json(s.activations); !a.is_null()) j["activations"] = std::move(a);
  if (s.from_log) j["from_log"] = from_log_json(*s.from_log);
}

// The modules of an inline spec as model_json writes them: [{"cast_hook":false,"name":...,
// "repeat":N,"tensors":[{"dtype":...,"name":...,"role":...,"shape":[...]}]}] (nlohmann::json
// orders keys alphabetically; cast_hook and repeat only when they are written).
void append_modules_json(std::string& out, const ModelSpec& spec) {
  out += '[';
  for (std::size_t i = 0; i < spec.modules.size();) {
    const Module& mod = spec.modules[i];
    const std::size_t run = repeat_run(spec.modules, i);
    if (i != 0) out += ',';
    out += '{';
    if (!mod.cast_hook) out += "\"cast_hook\":false,";
    out += "\"name\":";
    append_json_string(out, run > 1 ? std::string_view(mod.name).substr(0, mod.name.size() - 2) : std::string_view(mod.name));
    if (run > 1) {
      out += ",\"repeat\":";
      append_uint(out, run);
    }
    out += ",\"tensors\":[";
    for (std::size_t t = 0; t < mod.tensors.size(); ++t) {
      const Tensor& x = mod.tensors[t];
      if (t != 0) out += ',';
      out += "{\"dtype\":";
      append_json_string(out, dtype_name(x.dtype));
      out += ",\"name\":";
      append_json_string(out, x.name);
      out += ",\"role\":";
      append_json_string(out, role_name(x.role));
      out += ",\"shape\":[";
      for (std::size_t d = 0; d < x.shape.size(); ++d) {
        if (d != 0) out += ',';
        append_uint(out, x.shape[d]);
      }
      out += "]}";
    }
    out += "]}";
    i += run;
  }
  out += ']';
}

}  // namespace

nlohmann::ordered_json scenario_to_ordered_json(const Scenario& s) {
  nlohmann::ordered_json j = scenario_head_json(s);
  nlohmann::json models = nlohmann::json::array();
  for (const ModelRef& m : s.models) models.push_back(model_json(m));
  j["models"] = std::move(models);
  add_scenario_tail_json(s, j);
  return j;
}

void append_model_json(std::string& out, const ModelRef& m, const ModelTextOptions& o) {
  // The document without its modules (a few fields), written by nlohmann, with an inline spec's
  // modules written here in their place: "modules" is written as null and its text replaced. The
  // first `,"modules":null` is that key's: inside a string nlohmann writes a quote as \", so no
  // string holds that sequence; the keys before it ("arch" first, so the comma is there) are
  // fixed names. A catalog or file model has no spec to write or leave out.
  const bool writes_modules = m.source == "inline" && !o.spec_held;
  nlohmann::json j = model_json(m, /*modules=*/false);
  if (m.source == "inline" && o.spec_held) {
    for (const char* k : {"kind", "family", "memory_usage_factor", "arch"}) j.erase(k);
  }
  if (writes_modules) j["modules"] = nullptr;
  std::string text = j.dump();
  if (o.spec_ref) {
    text.pop_back();  // the closing brace: spec_ref goes last, as the protocol's writer put it
    text += ",\"spec_ref\":";
    append_uint(text, *o.spec_ref);
    text += '}';
  }
  if (!writes_modules) {
    out += text;
    return;
  }
  constexpr std::string_view kPlaceholder = ",\"modules\":null";
  const std::size_t at = text.find(kPlaceholder);
  if (at == std::string::npos) throw InfraError("append_model_json: the modules placeholder is missing");
  out.append(text, 0, at);
  out += ",\"modules\":";
  append_modules_json(out, *m.spec);
  out.append(text, at + kPlaceholder.size());
}

std::string scenario_json_compact(const Scenario& s, CallableRef<void(std::string&, std::size_t)> model) {
  // The head's and the tail's text around the models': {HEAD,"models":[...],TAIL}. Both are
  // objects with keys (schema and seed; workload and pipeline).
  std::string out = scenario_head_json(s).dump();
  out.pop_back();
  out += ",\"models\":[";
  for (std::size_t i = 0; i < s.models.size(); ++i) {
    if (i != 0) out += ',';
    model(out, i);
  }
  out += ']';
  nlohmann::ordered_json tail = nlohmann::ordered_json::object();
  add_scenario_tail_json(s, tail);
  const std::string t = tail.dump();
  out += ',';
  out.append(t, 1);
  return out;
}

std::string scenario_json_compact(const Scenario& s) {
  return scenario_json_compact(s, [&](std::string& out, std::size_t i) { append_model_json(out, s.models[i]); });
}

// ---- fingerprint ------------------------------------------------------------------------------

namespace {

// Two independent multiply-rotate lanes over 64-bit words, finished with splitmix64's mixer.
class Fingerprinter {
 public:
  void word(std::uint64_t w) {
    a_ = std::rotl((a_ ^ w) * 0x9e3779b97f4a7c15ull, 31);
    b_ = std::rotl((b_ + w) * 0xc2b2ae3d27d4eb4full, 27) ^ 0x165667b19e3779f9ull;
  }
  void num(double d) { word(std::bit_cast<std::uint64_t>(d)); }
  void text(std::string_view t) {
    word(t.size());
    std::size_t i = 0;
    for (; i + 8 <= t.size(); i += 8) {
      std::uint64_t w = 0;
      std::memcpy(&w, t.data() + i, 8);
      word(w);
    }
    std::uint64_t w = 0;
    std::memcpy(&w, t.data() + i, t.size() - i);
    word(w);
  }
  void fp(const ScenarioFingerprint& f) {
    word(f.a);
    word(f.b);
  }
  ScenarioFingerprint done() const { return {mix(a_ ^ 0x243f6a8885a308d3ull), mix(b_ + 0x13198a2e03707344ull)}; }

 private:
  static std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  std::uint64_t a_ = 0x6a09e667f3bcc908ull;
  std::uint64_t b_ = 0xbb67ae8584caa73bull;
};

// What model_json writes of an inline spec.
ScenarioFingerprint spec_fingerprint(const ModelSpec& spec) {
  Fingerprinter h;
  h.word(static_cast<std::uint64_t>(spec.kind));
  h.word(static_cast<std::uint64_t>(spec.family));
  h.num(spec.memory_usage_factor);
  const ArchShape& a = spec.arch;
  for (const std::uint64_t v : {std::uint64_t{a.latent_channels}, std::uint64_t{a.hidden}, std::uint64_t{a.widest},
                                std::uint64_t{a.text_tokens}, std::uint64_t{a.patch}, std::uint64_t{a.temporal_down},
                                std::uint64_t{a.gated}, std::uint64_t{a.kept_hidden_states}}) {
    h.word(v);
  }
  h.word(spec.modules.size());
  for (const Module& mod : spec.modules) {
    h.text(mod.name);
    h.word(mod.cast_hook);
    h.word(mod.tensors.size());
    for (const Tensor& t : mod.tensors) {
      h.text(t.name);
      h.word(t.shape.size());
      for (const std::uint64_t d : t.shape) h.word(d);
      h.word(static_cast<std::uint64_t>(t.dtype));
      h.word(static_cast<std::uint64_t>(t.role));
    }
  }
  return h.done();
}

void options_fingerprint(Fingerprinter& h, const std::vector<std::pair<std::string, std::string>>& options) {
  h.word(options.size());
  for (const auto& [k, v] : options) {
    h.text(k);
    h.text(v);
  }
}

}  // namespace

ScenarioFingerprint FingerprintMemo::spec(const std::shared_ptr<const ModelSpec>& spec) {
  if (auto it = by_spec_.find(spec.get()); it != by_spec_.end() && it->second.owner.lock() == spec) return it->second.fp;
  if (by_spec_.size() >= 4096) {
    std::erase_if(by_spec_, [](const auto& e) { return e.second.owner.expired(); });
  }
  const ScenarioFingerprint fp = spec_fingerprint(*spec);
  by_spec_[spec.get()] = Entry{spec, fp};
  return fp;
}

ScenarioFingerprint scenario_fingerprint(const Scenario& s, FingerprintMemo* memo) {
  Fingerprinter h;
  h.text(s.name);
  h.word(s.seed);
  h.text(s.device.name);
  h.word(s.device.total);
  h.word(s.device.used_by_others);
  h.word(s.device.context_overhead);
  h.num(s.device.h2d_gbps);
  h.num(s.device.tflops);
  h.word(s.device.events.size());
  for (const OthersEvent& e : s.device.events) {
    h.word(e.at_us);
    h.word(e.bytes);
    h.word(e.take);
  }
  h.word(static_cast<std::uint64_t>(s.allocator.mode));
  options_fingerprint(h, s.allocator.options);
  h.text(s.policy.label());
  if (s.policy.predictor == PredictorKind::external) {
    h.text(s.policy.external_version);
    h.word(static_cast<std::uint64_t>(s.policy.preset));
  }
  options_fingerprint(h, s.policy.overrides);
  h.word(s.models.size());
  for (const ModelRef& m : s.models) {
    h.text(m.id);
    h.text(m.source);
    if (m.source == "inline") {
      h.fp(memo ? memo->spec(m.spec) : spec_fingerprint(*m.spec));
    } else if (m.source.rfind("file:", 0) == 0) {
      h.word(static_cast<std::uint64_t>(m.spec->family));
    } else {
      h.word(static_cast<std::uint64_t>(m.storage.dtype));
      if (dtype_info(m.storage.dtype).fp8 || m.storage.dtype == Dtype::int8) h.word(m.storage.scaled);  // as model_json
      const bool subset = m.catalog_full && m.spec->modules.size() != m.catalog_full->modules.size();
      h.word(subset);
      if (subset) {
        h.word(m.spec->modules.size());
        for (const Module& mod : m.spec->modules) h.text(mod.name);
      }
    }
    h.word(static_cast<std::uint64_t>(m.compute));
    h.word(m.lora);
    h.word(m.legacy);
    h.word(m.prefetch);
  }
  const Workload& w = s.workload;
  for (const std::uint64_t v : {std::uint64_t{w.width}, std::uint64_t{w.height}, std::uint64_t{w.batch}, std::uint64_t{w.frames},
                                std::uint64_t{w.text_tokens}, std::uint64_t{w.steps}}) {
    h.word(v);
  }
  h.num(w.cfg);
  h.word(s.knee_of.has_value());
  if (s.knee_of) {
    const Workload& k = *s.knee_of;
    for (const std::uint64_t v : {std::uint64_t{k.width}, std::uint64_t{k.height}, std::uint64_t{k.batch}, std::uint64_t{k.frames},
                                  std::uint64_t{k.text_tokens}, std::uint64_t{k.steps}}) {
      h.word(v);
    }
    h.num(k.cfg);
  }
  h.word(s.offload_streams.has_value());
  h.word(s.offload_streams.value_or(0));
  h.word(s.stages.size());
  for (const Stage& st : s.stages) {
    h.word(static_cast<std::uint64_t>(st.op));
    h.text(s.models[st.model].id);
  }
  const ActivationSpec& a = s.activations;
  h.word(static_cast<std::uint64_t>(a.source));
  h.word(a.bytes.size());
  for (const auto& [m, b] : a.bytes) {
    h.text(m);
    h.word(b);
  }
  h.word(a.profile.size());
  for (const ActivationProfileEntry& e : a.profile) {
    h.text(e.model);
    h.word(e.compute_given ? 1 + static_cast<std::uint64_t>(e.compute) : 0);
    for (const std::uint64_t v : {std::uint64_t{e.workload.width}, std::uint64_t{e.workload.height}, std::uint64_t{e.workload.batch},
                                  std::uint64_t{e.workload.frames}, std::uint64_t{e.workload.text_tokens}, e.peak}) {
      h.word(v);
    }
  }
  h.text(a.profile_origin);
  h.word(a.fallback_to_model);
  h.word(a.cap_at_budget);
  h.word(s.from_log.has_value());
  if (s.from_log) h.text(from_log_json(*s.from_log).dump());  // rare and small: its text is its fingerprint
  return h.done();
}

}  // namespace vf
