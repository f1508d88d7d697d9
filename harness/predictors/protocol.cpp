#include "harness/predictors/protocol.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "harness/core/json_text.h"
#include "harness/predictors/predictors.h"

namespace vf {

namespace {

using ojson = nlohmann::ordered_json;

std::string_view allocator_backend(AllocatorMode m) {
  // PyTorch's own name for what torch.cuda.memory reports (PYTORCH_CUDA_ALLOC_CONF=backend:...).
  return m == AllocatorMode::async ? "cudaMallocAsync" : m == AllocatorMode::raw ? "raw" : "native";
}

// A request's view: the scenario's device and allocator as the runtime's accounting sees them at
// the start of a case (a fresh process). Written by request_text, checked by check_view.
ojson view_json(const Scenario& s) {
  ojson view;
  view["total"] = s.device.total;
  view["free"] = s.device.available();
  view["torch_reserved"] = 0;
  view["torch_active"] = 0;
  view["allocator_backend"] = allocator_backend(s.allocator.mode);
  view["expandable_segments"] = s.allocator.mode == AllocatorMode::caching_expandable;
  return view;
}

// Modules by name, per model, built once per reply.
class ModuleNames {
 public:
  explicit ModuleNames(const Scenario& s) : s_(s), maps_(s.models.size()) {}
  std::uint32_t index(std::uint32_t model, const JsonIn& j) {
    const auto& mods = s_.models[model].spec->modules;
    if (j.is_number()) {
      // A module by its index in the request's module list (repeats expanded).
      if (!j.is_integer() || (j.i64() && *j.i64() < 0)) j.fail("expected a module name or a module index (0 or more)");
      const std::uint64_t i = j.u64();
      if (i >= mods.size()) {
        j.fail(fmt::format("module index {} is out of range: model \"{}\" has {} modules", i, s_.models[model].id, mods.size()));
      }
      return static_cast<std::uint32_t>(i);
    }
    std::optional<ModuleNameIndex>& m = maps_[model];
    if (!m) {
      m.emplace(ModuleNameOf{&mods}, mods.size());
      for (std::uint32_t i = 0; i < mods.size(); ++i) {
        if (!m->find(mods[i].name)) m->add(i);  // the first of a name, as a map's emplace kept
      }
    }
    const std::string name = j.str();
    const std::optional<std::uint32_t> at = m->find(name);
    if (!at) {
      j.fail(fmt::format("unknown module \"{}\" of model \"{}\" (the request's models[{}].modules name every module)",
                         name.size() > 80 ? name.substr(0, 80) + "..." : name, s_.models[model].id, model));
    }
    return *at;
  }
  const ModelSpec& spec(std::uint32_t model) const { return *s_.models[model].spec; }
  std::uint32_t model(const JsonIn& j) const {
    const std::string id = j.str();
    for (std::uint32_t m = 0; m < s_.models.size(); ++m) {
      if (s_.models[m].id == id) return m;
    }
    j.fail(fmt::format("unknown model \"{}\" (the request's models[].id name them)", id.size() > 80 ? id.substr(0, 80) + "..." : id));
  }

 private:
  const Scenario& s_;
  std::vector<std::optional<ModuleNameIndex>> maps_;  // built on first use
};

// The name of the module a JSON entry gives (a name or an index), for messages.
std::string entry_name(const JsonIn& e, const ModelSpec& spec, std::uint32_t i) {
  return e.is_string() ? e.str() : fmt::format("{} ({})", i, spec.modules[i].name);
}

// A set of module names as per-module flags (a name given twice: an error).
std::vector<std::uint8_t> read_flags(const JsonIn& j, std::uint32_t model, std::size_t count, ModuleNames& names) {
  std::vector<std::uint8_t> flags(count, 0);
  j.expect_array();
  for (std::size_t k = 0; k < j.size(); ++k) {
    const JsonIn e = j.at(k);
    const std::uint32_t i = names.index(model, e);
    if (flags[i]) e.fail(fmt::format("module \"{}\" given twice", entry_name(e, names.spec(model), i)));
    flags[i] = 1;
  }
  return flags;
}

std::vector<std::uint32_t> read_order(const JsonIn& j, std::uint32_t model, std::size_t count, ModuleNames& names) {
  std::vector<std::uint8_t> seen(count, 0);
  std::vector<std::uint32_t> order;
  j.expect_array();
  order.reserve(j.size());
  for (std::size_t k = 0; k < j.size(); ++k) {
    const JsonIn e = j.at(k);
    const std::uint32_t i = names.index(model, e);
    if (seen[i]) e.fail(fmt::format("module \"{}\" given twice", entry_name(e, names.spec(model), i)));
    seen[i] = 1;
    order.push_back(i);
  }
  return order;
}

// Per-module numbers: one per module of the model, in the request's order (or none at all).
std::vector<Bytes> read_per_module(const JsonIn& j, std::size_t count) {
  j.expect_array();
  if (j.size() != count) j.fail(fmt::format("has {} entries; give one per module of the model ({}) or leave it out", j.size(), count));
  std::vector<Bytes> v(count);
  for (std::size_t k = 0; k < count; ++k) v[k] = j.at(k).u64_in(0, kMaxDeviceBytes);
  return v;
}

Bytes opt_u64(const JsonIn& j, std::string_view key, Bytes fallback = 0) {
  const auto v = j.opt(key);
  return v ? v->u64_in(0, kMaxDeviceBytes) : fallback;
}

StagingPlan read_staging(const JsonIn& j, std::uint32_t model, std::size_t count, ModuleNames& names) {
  j.expect_object({"vbar_request", "vbar_pages", "staged", "vbar_end", "patches", "forced", "forced_bytes", "uncounted", "order",
                   "offload_cost", "slice_offset", "slice_size", "forced_modules", "slices_beyond_cap"});
  StagingPlan st;
  st.vbar_request = j.at("vbar_request").u64_in(0, kMaxDeviceBytes);
  st.vbar_pages = j.at("vbar_pages").u64_in(0, kMaxDeviceBytes);
  st.staged = j.at("staged").u64_in(0, kMaxDeviceBytes);
  st.vbar_end = j.at("vbar_end").u64_in(0, kMaxDeviceBytes);
  st.patches = j.at("patches").u32_in(0, UINT32_MAX);
  st.forced = j.at("forced").u32_in(0, UINT32_MAX);
  st.forced_bytes = j.at("forced_bytes").u64_in(0, kMaxDeviceBytes);
  st.uncounted = opt_u64(j, "uncounted");
  st.order = read_order(j.at("order"), model, count, names);
  st.slice_offset = read_per_module(j.at("slice_offset"), count);
  st.slice_size = read_per_module(j.at("slice_size"), count);
  for (std::size_t i = 0; i < count; ++i) {
    // Both are at most 1 PiB, so the sum cannot wrap.
    if (st.slice_offset[i] + st.slice_size[i] > st.vbar_request) {
      j.at("slice_size").at(i).fail(fmt::format("the slice at {} of {} bytes ends past the VBAR's {} bytes (vbar_request)",
                                                st.slice_offset[i], st.slice_size[i], st.vbar_request));
    }
  }
  if (const auto v = j.opt("offload_cost")) st.offload_cost = read_per_module(*v, count);
  st.forced_module = j.has("forced_modules") ? read_flags(j.at("forced_modules"), model, count, names) : std::vector<std::uint8_t>(count, 0);
  st.slices_beyond_cap = opt_u64(j, "slices_beyond_cap");
  return st;
}

LoadPlan read_load(const JsonIn& j, const Scenario& s, ModuleNames& names, std::uint32_t min_stage) {
  j.expect_object({"stage", "model", "free_before", "est_max", "est_min", "extra_mem", "min_req", "evictions", "usable", "full_load",
                   "loaded", "offloaded", "uncounted", "offload_buffer", "lowvram_patches", "resident", "lowvram", "sorted",
                   "offload_cost", "realistic_transient", "transient_module", "log_line", "dynamic", "staging", "free_target"});
  LoadPlan lp;
  const JsonIn stage = j.at("stage");
  lp.stage = stage.u32_in(0, static_cast<std::uint32_t>(s.stages.size() - 1));
  if (s.stages[lp.stage].op != StageOp::load) stage.fail(fmt::format("stage {} is a {} stage, not a load", lp.stage, stage_op_name(s.stages[lp.stage].op)));
  if (lp.stage < min_stage) stage.fail("loads must be given once each, in stage order");
  lp.model = s.stages[lp.stage].model;
  if (const auto m = j.opt("model"); m && names.model(*m) != lp.model) {
    m->fail(fmt::format("stage {} loads \"{}\"", lp.stage, s.models[lp.model].id));
  }
  const ModelSpec& spec = *s.models[lp.model].spec;
  const std::size_t count = spec.modules.size();
  lp.free_before = opt_u64(j, "free_before");
  lp.est_max = opt_u64(j, "est_max");
  lp.est_min = opt_u64(j, "est_min");
  lp.extra_mem = opt_u64(j, "extra_mem");
  lp.min_req = opt_u64(j, "min_req");
  if (const auto ev = j.opt("evictions")) {
    ev->expect_array();
    for (std::size_t k = 0; k < ev->size(); ++k) {
      const JsonIn e = ev->at(k);
      e.expect_object({"model", "modules", "bytes"});
      Eviction x;
      x.model = names.model(e.at("model"));
      x.modules = read_order(e.at("modules"), x.model, s.models[x.model].spec->modules.size(), names);
      Bytes sum = 0;
      for (const std::uint32_t i : x.modules) sum += s.models[x.model].spec->modules[i].bytes;
      x.bytes = opt_u64(e, "bytes", sum);
      lp.evictions.push_back(std::move(x));
    }
  }
  if (const auto u = j.opt("usable")) {
    const double d = u->number();
    if (d != static_cast<double>(static_cast<std::int64_t>(d)) || std::abs(d) > 9.0e15) u->fail("expected an integer byte count");
    lp.usable = u->is_integer() ? *u->i64() : static_cast<std::int64_t>(d);  // within +-9e15: it fits
  }
  lp.resident = read_flags(j.at("resident"), lp.model, count, names);
  lp.lowvram = j.has("lowvram") ? read_flags(j.at("lowvram"), lp.model, count, names) : std::vector<std::uint8_t>(count, 0);
  for (std::size_t i = 0; i < count; ++i) {
    if (lp.resident[i] && lp.lowvram[i]) {
      j.at("lowvram").fail(fmt::format("module \"{}\" is also in resident: a module is on the device or cast on the fly, not both",
                                       spec.modules[i].name));
    }
  }
  Bytes on = 0, cast = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (lp.resident[i]) on += spec.modules[i].bytes;
    if (lp.lowvram[i]) cast += spec.modules[i].bytes;
  }
  lp.full_load = j.has("full_load") ? j.at("full_load").boolean() : cast == 0;
  lp.loaded = opt_u64(j, "loaded", on);
  lp.offloaded = opt_u64(j, "offloaded", cast);
  lp.uncounted = opt_u64(j, "uncounted", sat_sub(sat_sub(spec.bytes, on), cast));
  lp.offload_buffer = j.at("offload_buffer").u64_in(0, kMaxDeviceBytes);
  lp.lowvram_patches = j.has("lowvram_patches") ? j.at("lowvram_patches").u32_in(0, UINT32_MAX) : 0;
  if (const auto v = j.opt("sorted")) lp.sorted = read_order(*v, lp.model, count, names);
  if (const auto v = j.opt("offload_cost")) lp.offload_cost = read_per_module(*v, count);
  lp.realistic_transient = opt_u64(j, "realistic_transient");
  if (const auto v = j.opt("transient_module")) lp.transient_module = names.index(lp.model, *v);
  if (lp.realistic_transient > 0 && !j.has("transient_module")) j.at("transient_module").fail("required with realistic_transient");
  if (const auto v = j.opt("log_line")) lp.log_line = v->str();
  lp.dynamic = j.has("dynamic") && j.at("dynamic").boolean();
  if (lp.dynamic != s.dynamic_model(lp.model)) {
    j.at("dynamic").fail(fmt::format("model \"{}\" is {} under this runtime", s.models[lp.model].id,
                                     s.dynamic_model(lp.model) ? "loaded by ModelPatcherDynamic (give \"dynamic\": true and its staging)"
                                                               : "loaded by the classic patcher"));
  }
  if (lp.dynamic) lp.staging = read_staging(j.at("staging"), lp.model, count, names);
  else if (j.has("staging")) j.at("staging").fail("only a dynamic load has a staging");
  lp.free_target = opt_u64(j, "free_target");
  return lp;
}

}  // namespace

std::string hello_line(const PredictorHello& h) {
  ojson j;
  j["schema"] = kPredictorSchema;
  j["type"] = "hello";
  j["name"] = h.name;
  j["version"] = h.version;
  j["runtime"] = fmt::format("comfy:{}", preset_name(h.runtime));
  if (h.spec_refs) j["supports"]["spec_refs"] = true;
  if (h.overrides) j["supports"]["overrides"] = *h.overrides;
  return j.dump() + "\n";
}

std::string unhonoured_override_message(const PredictorHello& h, std::string_view key) {
  std::string listed;
  for (const std::string& k : h.overrides.value_or(std::vector<std::string>{})) listed += (listed.empty() ? "" : ", ") + k;
  return fmt::format("the external predictor \"{}\" does not apply the override `{}` (its hello's supports.overrides: {}); it "
                     "would plan the case as if it were not set",
                     h.name, key, listed.empty() ? "none" : listed);
}

bool PredictorHello::honours(std::string_view key) const {
  return !overrides || std::find(overrides->begin(), overrides->end(), key) != overrides->end();
}

const std::string* PredictorHello::unapplied(const Policy& p) const {
  for (const auto& [key, value] : p.overrides) {
    if (!honours(key)) return &key;
  }
  return nullptr;
}

PredictorHello parse_hello(const nlohmann::json& doc, const std::string& origin) {
  const JsonIn j(doc, origin);
  if (!j.is_object()) j.fail("expected the hello object {\"schema\": \"vramfuzz.predictor/1\", \"type\": \"hello\", ...}");
  const std::string schema = j.at("schema").str();
  if (schema != kPredictorSchema) {
    j.at("schema").fail(fmt::format("the predictor speaks \"{}\"; this vramfuzz speaks \"{}\" (docs/predictor-protocol.md)",
                                    schema.size() > 60 ? schema.substr(0, 60) + "..." : schema, kPredictorSchema));
  }
  j.expect_object({"schema", "type", "name", "version", "runtime", "supports"});
  if (j.at("type").str() != "hello") j.at("type").fail("the first line must be the hello (\"type\": \"hello\")");
  PredictorHello h;
  h.name = j.at("name").str();
  if (h.name.empty() || h.name.size() > 200) j.at("name").fail("must be 1 to 200 characters");
  for (const char c : h.name) {
    if (static_cast<unsigned char>(c) < 0x20) j.at("name").fail("must not hold control characters");
  }
  h.version = j.at("version").str();
  if (h.version.size() > 200) j.at("version").fail("at most 200 characters");
  const JsonIn rt = j.at("runtime");
  std::string r = rt.str();
  if (r.rfind("comfy:", 0) != 0) rt.fail(fmt::format("\"{}\": give the ComfyUI preset whose runtime the plans are for (comfy:dec2025, comfy:sep2026, ...)", r));
  const auto p = parse_preset(std::string_view(r).substr(6));
  if (!p) rt.fail(fmt::format("unknown preset \"{}\" (use oct2025, nov2025, dec2025, feb2026, sep2026 or dynamic)", r.substr(6)));
  h.runtime = *p;
  if (const auto sup = j.opt("supports")) {
    // Capabilities this vramfuzz knows are read; others (of later versions) are ignored.
    if (!sup->is_object()) sup->fail("expected an object of capabilities (\"spec_refs\": true, \"overrides\": [...])");
    if (const auto v = sup->opt("spec_refs")) h.spec_refs = v->boolean();
    if (const auto v = sup->opt("overrides")) {
      // The names are vramfuzz's override keys; one this vramfuzz does not know is never sent,
      // so it is kept and harmless.
      v->expect_array();
      if (v->size() > 64) v->fail("at most 64 override names");
      std::vector<std::string> keys;
      for (std::size_t k = 0; k < v->size(); ++k) {
        const JsonIn e = v->at(k);
        std::string key = e.str();
        if (key.empty() || key.size() > 64) e.fail("an override name of 1 to 64 characters (reserve, num_streams, ...)");
        keys.push_back(std::move(key));
      }
      h.overrides = std::move(keys);
    }
  }
  return h;
}

namespace {

// The request's scenario and view, models inline. `refs`: per model, the spec_ref written with
// it; `sent`: per model, whether the predictor holds its spec already (then only the spec_ref
// stands for it). Written as text: a request is mostly the modules of new specs, and building a
// document for them cost five times the rest of a built-in case.
std::string request_text(const Scenario& s, std::uint64_t id, const std::vector<std::uint64_t>* refs, const std::vector<std::uint8_t>* sent,
                         const std::vector<std::uint64_t>& forget) {
  Scenario r;
  r.device = s.device;
  r.allocator = s.allocator;
  r.policy = s.policy;
  r.policy.predictor = PredictorKind::comfy;  // the runtime preset, with the case's overrides
  r.policy.external_name.clear();
  r.workload = s.workload;
  r.offload_streams = s.offload_streams;
  r.stages = s.stages;
  r.seed = s.seed;
  r.models.reserve(s.models.size());
  for (const ModelRef& m : s.models) {
    ModelRef x = m;
    x.source = "inline";
    x.catalog_full.reset();
    x.catalog_source.clear();
    r.models.push_back(std::move(x));
  }
  std::string out = fmt::format("{{\"type\":\"predict\",\"id\":{},\"view\":{},", id, view_json(s).dump());
  if (!forget.empty()) out += fmt::format("\"forget\":{},", ojson(forget).dump());
  out += "\"scenario\":";
  out += refs ? scenario_json_compact(r,
                                      [&](std::string& text, std::size_t i) {
                                        append_model_json(text, r.models[i], ModelTextOptions{(*refs)[i], (*sent)[i] != 0});
                                      })
              : scenario_json_compact(r);
  out += "}\n";
  return out;
}

}  // namespace

std::string request_line(const Scenario& s, std::uint64_t id) { return request_text(s, id, nullptr, nullptr, {}); }

void check_view(const JsonIn& view, const Scenario& s) {
  if (!view.is_object()) view.fail("expected an object");
  view.expect_object({"total", "free", "torch_reserved", "torch_active", "allocator_backend", "expandable_segments"});
  const ojson want = view_json(s);
  auto same = [&](std::string_view key, std::string_view what) {
    const JsonIn v = view.at(key);
    const Bytes got = v.u64();
    const Bytes expected = want[std::string(key)].get<Bytes>();
    if (got != expected) v.fail(fmt::format("{} but the scenario says {} ({})", got, expected, what));
  };
  same("total", "device.total");
  same("free", "device.total less the context and other processes");
  same("torch_reserved", "each case runs in a fresh process");
  same("torch_active", "each case runs in a fresh process");
  const JsonIn backend = view.at("allocator_backend");
  const std::string want_backend = want["allocator_backend"].get<std::string>();
  if (const std::string_view b = backend.str_view(); b != "native" && b != "cudaMallocAsync" && b != "raw") {
    backend.fail(fmt::format("\"{}\" is not a backend: native, cudaMallocAsync or raw", b));
  } else if (b != want_backend) {
    backend.fail(fmt::format("\"{}\" but the scenario's allocator is {} (\"{}\")", b, allocator_mode_name(s.allocator.mode), want_backend));
  }
  const JsonIn expandable = view.at("expandable_segments");
  if (expandable.boolean() != want["expandable_segments"].get<bool>()) {
    expandable.fail(fmt::format("{} but the scenario's allocator is {}", expandable.boolean(), allocator_mode_name(s.allocator.mode)));
  }
}

void SpecRefs::reset() {
  by_fp_.clear();
  lru_.clear();
  next_ = 1;
}

std::string request_line(const Scenario& s, std::uint64_t id, SpecRefs& refs) {
  std::vector<std::uint64_t> ref(s.models.size());
  std::vector<std::uint8_t> sent(s.models.size(), 0);
  // In model order, as the predictor reads them: a spec held (sent by an earlier request, or by
  // an earlier model of this one) is a reference; a new one is defined here and held from now on.
  for (std::size_t i = 0; i < s.models.size(); ++i) {
    const ScenarioFingerprint fp = refs.memo_.spec(s.models[i].spec);
    if (const auto it = refs.by_fp_.find(fp); it != refs.by_fp_.end()) {
      ref[i] = it->second.ref;
      sent[i] = 1;
      refs.lru_.splice(refs.lru_.begin(), refs.lru_, it->second.lru);
    } else {
      ref[i] = refs.next_++;
      refs.lru_.push_front(fp);
      refs.by_fp_.emplace(fp, SpecRefs::Held{ref[i], refs.lru_.begin()});
    }
  }
  // Beyond the capacity, the least recently used are forgotten: never one of this request's,
  // which are the most recent.
  std::vector<std::uint64_t> forget;
  while (refs.by_fp_.size() > std::max(refs.capacity_, s.models.size())) {
    const ScenarioFingerprint old = refs.lru_.back();
    forget.push_back(refs.by_fp_.at(old).ref);
    refs.by_fp_.erase(old);
    refs.lru_.pop_back();
  }
  return request_text(s, id, &ref, &sent, forget);
}

void SpecStore::forget(const JsonIn& request) {
  if (const auto f = request.opt("forget")) {
    f->expect_array();
    for (std::size_t k = 0; k < f->size(); ++k) specs.erase(f->at(k).u64());
  }
}

Plan plan_from_json(const JsonIn& j, const Scenario& s) {
  j.expect_object({"reserve", "fits", "loads", "stages"});
  ModuleNames names(s);
  Plan p;
  p.policy = s.policy.key();
  p.reserve = j.at("reserve").u64_in(0, kMaxDeviceBytes);
  p.streams = s.streams();
  p.available = s.device.available();
  p.dynamic = s.policy.dynamic();
  const JsonIn loads = j.at("loads");
  loads.expect_array();
  std::vector<int> load_of_stage(s.stages.size(), -1);
  std::uint32_t next = 0;
  for (std::size_t k = 0; k < loads.size(); ++k) {
    LoadPlan lp = read_load(loads.at(k), s, names, next);
    next = lp.stage + 1;
    load_of_stage[lp.stage] = static_cast<int>(p.loads.size());
    p.loads.push_back(std::move(lp));
  }
  for (std::uint32_t i = 0; i < s.stages.size(); ++i) {
    if (s.stages[i].op == StageOp::load && load_of_stage[i] < 0) loads.fail(fmt::format("no load for stage {} (a load of \"{}\")", i, s.models[s.stages[i].model].id));
  }
  const JsonIn stages = j.at("stages");
  stages.expect_array();
  if (stages.size() != s.stages.size()) stages.fail(fmt::format("has {} entries; the case has {} stages", stages.size(), s.stages.size()));
  for (std::uint32_t i = 0; i < s.stages.size(); ++i) {
    const JsonIn e = stages.at(i);
    e.expect_object({"checked", "resident_total", "offload_buffer", "activation_allowance", "run_batch", "passes", "predicted_peak",
                     "dynamic", "patcher_free", "decode_batch"});
    StagePlan sp;
    sp.stage = i;
    sp.op = s.stages[i].op;
    sp.model = s.stages[i].model;
    sp.load_plan = load_of_stage[i];
    sp.dynamic = e.has("dynamic") ? e.at("dynamic").boolean() : s.dynamic_model(sp.model);
    if (sp.dynamic != s.dynamic_model(sp.model)) e.at("dynamic").fail(fmt::format("model \"{}\" is {}dynamic under this runtime", s.models[sp.model].id, sp.dynamic ? "not " : ""));
    sp.checked = e.has("checked") ? e.at("checked").boolean() : sp.op != StageOp::unload && !sp.dynamic;
    sp.resident_total = e.at("resident_total").u64_in(0, kMaxDeviceBytes);
    sp.offload_buffer = e.at("offload_buffer").u64_in(0, kMaxDeviceBytes);
    sp.activation_allowance = e.at("activation_allowance").u64_in(0, kMaxDeviceBytes);
    sp.run_batch = e.at("run_batch").u32_in(1, 2 * kMaxBatch);
    sp.passes = e.at("passes").u32_in(1, 2 * kMaxBatch);
    if (sp.checked || e.has("predicted_peak")) sp.predicted_peak = e.at("predicted_peak").u64_in(0, kMaxDeviceBytes);
    sp.patcher_free = e.has("patcher_free") ? e.at("patcher_free").u64_in(0, kMaxDeviceBytes) : 0;
    sp.decode_batch = e.has("decode_batch") ? e.at("decode_batch").u32_in(0, kMaxBatch) : 0;
    size_stage_activation(s, sp);
    p.stages.push_back(sp);
  }
  for (const StagePlan& sp : p.stages) {
    if (sp.checked) p.predicted_peak = std::max(p.predicted_peak, sp.predicted_peak);
  }
  // The predictor may know more than its peak (a memory fraction it plans against): it can say a
  // case does not fit; it cannot make one fit that its own peak and reserve overflow.
  p.fits = p.predicted_peak + p.reserve <= p.available && (!j.has("fits") || j.at("fits").boolean());
  return p;
}

namespace {

// The plan as a reply carries it, written as text (predict-serve's every reply: building and
// dumping a document was an eighth of its instructions); plan_json is this text parsed. Checked
// byte for byte against a document built field by field (tests/test_predictor_protocol.cpp).
class PlanText {
 public:
  PlanText(std::string& out, const Scenario& s, bool by_index) : out_(out), s_(s), by_index_(by_index) {}

  void plan(const Plan& p) {
    out_ += "{\"reserve\":";
    append_uint(out_, p.reserve);
    out_ += ",\"fits\":";
    append_bool(out_, p.fits);
    out_ += ",\"loads\":[";
    for (std::size_t k = 0; k < p.loads.size(); ++k) {
      if (k) out_ += ',';
      load(p.loads[k]);
    }
    out_ += "],\"stages\":[";
    for (std::size_t k = 0; k < p.stages.size(); ++k) {
      if (k) out_ += ',';
      stage(p.stages[k]);
    }
    out_ += "]}";
  }

 private:
  void key(std::string_view k) {
    out_ += ",\"";
    out_ += k;
    out_ += "\":";
  }
  void u(std::string_view k, std::uint64_t v) {
    key(k);
    append_uint(out_, v);
  }
  void b(std::string_view k, bool v) {
    key(k);
    append_bool(out_, v);
  }
  void ref(const ModelSpec& spec, std::uint32_t i) {
    if (by_index_) append_uint(out_, i);
    else append_json_string(out_, spec.modules[i].name);
  }
  void flags(const ModelSpec& spec, const std::vector<std::uint8_t>& f) {
    out_ += '[';
    bool first = true;
    for (std::size_t i = 0; i < f.size() && i < spec.modules.size(); ++i) {
      if (!f[i]) continue;
      if (!first) out_ += ',';
      first = false;
      ref(spec, static_cast<std::uint32_t>(i));
    }
    out_ += ']';
  }
  void order(const ModelSpec& spec, const std::vector<std::uint32_t>& o) {
    out_ += '[';
    for (std::size_t k = 0; k < o.size(); ++k) {
      if (k) out_ += ',';
      ref(spec, o[k]);
    }
    out_ += ']';
  }
  template <class T>
  void numbers(const std::vector<T>& v) {
    out_ += '[';
    for (std::size_t k = 0; k < v.size(); ++k) {
      if (k) out_ += ',';
      append_uint(out_, v[k]);
    }
    out_ += ']';
  }

  void load(const LoadPlan& lp) {
    const ModelSpec& spec = *s_.models[lp.model].spec;
    out_ += "{\"stage\":";
    append_uint(out_, lp.stage);
    key("model");
    append_json_string(out_, s_.models[lp.model].id);
    u("free_before", lp.free_before);
    u("est_max", lp.est_max);
    u("est_min", lp.est_min);
    u("extra_mem", lp.extra_mem);
    u("min_req", lp.min_req);
    key("evictions");
    out_ += '[';
    for (std::size_t k = 0; k < lp.evictions.size(); ++k) {
      const Eviction& e = lp.evictions[k];
      if (k) out_ += ',';
      out_ += "{\"model\":";
      append_json_string(out_, s_.models[e.model].id);
      key("modules");
      order(*s_.models[e.model].spec, e.modules);
      u("bytes", e.bytes);
      out_ += '}';
    }
    out_ += ']';
    key("usable");
    append_int(out_, lp.usable);
    b("full_load", lp.full_load);
    u("loaded", lp.loaded);
    u("offloaded", lp.offloaded);
    u("uncounted", lp.uncounted);
    u("offload_buffer", lp.offload_buffer);
    u("lowvram_patches", lp.lowvram_patches);
    key("resident");
    flags(spec, lp.resident);
    key("lowvram");
    flags(spec, lp.lowvram);
    key("sorted");
    order(spec, lp.sorted);
    if (!lp.offload_cost.empty()) {
      key("offload_cost");
      numbers(lp.offload_cost);
    }
    u("realistic_transient", lp.realistic_transient);
    if (lp.transient_module < spec.modules.size()) {
      key("transient_module");
      ref(spec, lp.transient_module);
    }
    key("log_line");
    append_json_string(out_, lp.log_line);
    b("dynamic", lp.dynamic);
    if (lp.dynamic) {
      const StagingPlan& st = lp.staging;
      key("staging");
      out_ += "{\"vbar_request\":";
      append_uint(out_, st.vbar_request);
      u("vbar_pages", st.vbar_pages);
      u("staged", st.staged);
      u("vbar_end", st.vbar_end);
      u("patches", st.patches);
      u("forced", st.forced);
      u("forced_bytes", st.forced_bytes);
      u("uncounted", st.uncounted);
      key("order");
      order(spec, st.order);
      key("offload_cost");
      numbers(st.offload_cost);
      key("slice_offset");
      numbers(st.slice_offset);
      key("slice_size");
      numbers(st.slice_size);
      key("forced_modules");
      flags(spec, st.forced_module);
      u("slices_beyond_cap", st.slices_beyond_cap);
      out_ += '}';
    }
    u("free_target", lp.free_target);
    out_ += '}';
  }

  void stage(const StagePlan& sp) {
    out_ += "{\"checked\":";
    append_bool(out_, sp.checked);
    u("resident_total", sp.resident_total);
    u("offload_buffer", sp.offload_buffer);
    u("activation_allowance", sp.activation_allowance);
    u("run_batch", sp.run_batch);
    u("passes", sp.passes);
    u("predicted_peak", sp.predicted_peak);
    b("dynamic", sp.dynamic);
    u("patcher_free", sp.patcher_free);
    u("decode_batch", sp.decode_batch);
    out_ += '}';
  }

  std::string& out_;
  const Scenario& s_;
  bool by_index_;
};

}  // namespace

nlohmann::ordered_json plan_json(const Scenario& s, const Plan& p, bool by_index) {
  std::string text;
  PlanText(text, s, by_index).plan(p);
  return ojson::parse(text);
}

std::string plan_reply_line(const Scenario& s, const Plan& p, std::uint64_t id, bool by_index) {
  std::string out = "{\"type\":\"plan\",\"id\":";
  append_uint(out, id);
  out += ",\"plan\":";
  PlanText(out, s, by_index).plan(p);
  out += "}\n";
  return out;
}

std::string error_reply_line(std::uint64_t id, std::string_view message) {
  ojson j;
  j["type"] = "error";
  j["id"] = id;
  j["message"] = message;
  return j.dump() + "\n";
}

}  // namespace vf
