#include "harness/activation_source.h"

#include <cmath>
#include <filesystem>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "harness/scenario.h"
#include "models/activation.h"

namespace vf {

std::string_view activation_source_name(ActivationSource s) {
  switch (s) {
    case ActivationSource::model: return "model";
    case ActivationSource::estimate: return "estimate";
    case ActivationSource::bytes: return "bytes";
    case ActivationSource::profile: return "profile";
  }
  return "?";
}

namespace {

// "fallback": "model" | "error" of a profile (document or scenario member).
bool parse_fallback(const JsonIn& f) {
  const std::string v = f.str();
  if (v != "model" && v != "error") f.fail(fmt::format("unknown fallback \"{}\" (use \"model\" or \"error\")", v));
  return v == "model";
}

// The units activations scale with: positions per batch element x rows.
double entry_units(const ModelSpec& spec, const Workload& w, std::uint32_t rows) {
  return static_cast<double>(activation_positions(spec, w)) * static_cast<double>(rows);
}

std::vector<ActivationProfileEntry> parse_entries(const JsonIn& j) {
  j.expect_array();
  if (j.size() == 0) j.fail("an activation profile needs at least one entry");
  std::vector<ActivationProfileEntry> out;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const JsonIn e = j.at(i);
    e.expect_object({"model", "compute", "width", "height", "batch", "frames", "text_tokens", "peak", "note"});
    ActivationProfileEntry p;
    p.model = e.at("model").str();
    if (p.model.empty()) e.at("model").fail("must name a model (a scenario id or a model name)");
    if (auto c = e.opt("compute")) {
      p.compute_given = true;
      p.compute = parse_dtype_json(*c);
      if (!dtype_info(p.compute).compute) c->fail(fmt::format("{} is not a compute dtype (use fp32, fp16 or bf16)", dtype_name(p.compute)));
    }
    // The workload fields of a scenario, with its limits (cfg and steps do not apply to one pass).
    nlohmann::json w = nlohmann::json::object();
    for (const char* k : {"width", "height", "batch", "frames", "text_tokens"}) {
      if (e.has(k)) w[k] = e.at(k).to_json();
    }
    p.workload = parse_workload_json(JsonIn(w, e.path()));
    p.peak = e.at("peak").bytes();
    if (p.peak == 0) e.at("peak").fail("must be more than 0 bytes (a forward pass holds some activations)");
    if (p.peak > kMaxDeviceBytes) e.at("peak").fail("is more than 1 PiB");
    if (auto n = e.opt("note")) (void)n->str();
    out.push_back(std::move(p));
  }
  return out;
}

ActivationSpec profile_from_document(const JsonIn& j, const std::string& origin) {
  j.expect_object({"schema", "source", "entries", "fallback"});
  const std::string schema = j.at("schema").str();
  if (schema != kActivationProfileSchema) {
    j.at("schema").fail(fmt::format("unsupported schema \"{}\" (this build reads {})", schema, kActivationProfileSchema));
  }
  if (auto s = j.opt("source")) (void)s->str();
  ActivationSpec a;
  a.source = ActivationSource::profile;
  a.profile = parse_entries(j.at("entries"));
  a.profile_origin = origin;
  if (auto f = j.opt("fallback")) a.fallback_to_model = parse_fallback(*f);
  return a;
}

}  // namespace

bool profile_entry_matches(const ActivationProfileEntry& e, const ModelSpec& spec, const std::string& id, Dtype compute) {
  if (e.model != id && e.model != spec.name) return false;
  return !e.compute_given || e.compute == compute;
}

static ActivationSizing size_uncapped(const ActivationSpec& a, const ModelSpec& spec, const std::string& id, Dtype compute,
                                 const Workload& w, std::uint32_t rows, Bytes estimate, Bytes formula) {
  ActivationSizing out;
  out.source = a.source;
  switch (a.source) {
    case ActivationSource::model: out.bytes = formula; return out;
    case ActivationSource::estimate: out.bytes = estimate; return out;
    case ActivationSource::bytes:
      for (const auto& [m, b] : a.bytes) {
        if (m == id) {
          out.bytes = b;
          return out;
        }
      }
      for (const auto& [m, b] : a.bytes) {
        if (m == "*") {
          out.bytes = b;
          return out;
        }
      }
      // validate_scenario refuses a forward of a model the list does not cover.
      throw InputError("activations.bytes", fmt::format("no bytes for model \"{}\" (add it, or a \"*\" entry)", id));
    case ActivationSource::profile: break;
  }
  const double want = entry_units(spec, w, rows);
  if (want == 0) return out;  // no positions (a text encoder with no tokens): nothing to hold
  const ActivationProfileEntry* best = nullptr;
  double best_distance = std::numeric_limits<double>::infinity();
  double best_units = 0;
  for (const ActivationProfileEntry& e : a.profile) {
    if (!profile_entry_matches(e, spec, id, compute)) continue;
    const double units = entry_units(spec, e.workload, e.workload.batch);
    if (units == 0) continue;  // an entry of no positions cannot be scaled from
    const double d = std::fabs(std::log(units / want));
    if (d < best_distance) {  // the first of equally near entries wins: the file's order decides
      best = &e;
      best_distance = d;
      best_units = units;
    }
  }
  if (!best) {
    if (!a.fallback_to_model) {
      throw InputError("activations.entries", fmt::format("no entry for model \"{}\" ({}, {})", id, spec.name, dtype_name(compute)));
    }
    out.bytes = formula;
    out.source = ActivationSource::model;
    out.fallback = true;
    return out;
  }
  if (best_units == want) {
    out.bytes = best->peak;
    return out;
  }
  out.scaled = true;
  // Rounded to the nearest byte (the units are exact integers; long double keeps 64 bits of them).
  const long double scaled = static_cast<long double>(best->peak) * static_cast<long double>(want) / static_cast<long double>(best_units);
  if (scaled > static_cast<long double>(kMaxDeviceBytes)) {
    throw InputError("activations.entries", fmt::format("scaling {}'s measured peak to this workload gives more than 1 PiB", id));
  }
  out.bytes = static_cast<Bytes>(std::llround(scaled));
  return out;
}

ActivationSizing size_activation(const ActivationSpec& a, const ModelSpec& spec, const std::string& id, Dtype compute,
                                 const Workload& w, std::uint32_t rows, Bytes estimate, Bytes formula) {
  ActivationSizing out = size_uncapped(a, spec, id, compute, w, rows, estimate, formula);
  if (a.cap_at_budget && out.bytes > estimate) {
    out.bytes = estimate;
    out.capped = true;
  }
  return out;
}

static ActivationSpec parse_uncapped_spec(const JsonIn& j, const std::string& base_dir);

ActivationSpec parse_activation_spec(const JsonIn& j, const std::string& base_dir) {
  ActivationSpec a;
  if (j.is_string()) {
    const std::string v = j.str();
    if (v == "model") return a;
    if (v == "estimate") {
      a.source = ActivationSource::estimate;
      return a;
    }
    if (v == "capped") {
      a.cap_at_budget = true;
      return a;
    }
    j.fail(fmt::format("unknown activation source \"{}\" (use \"model\", \"estimate\", \"capped\", or an object with "
                       "\"source\": \"bytes\" or \"profile\")",
                       v));
  }
  j.expect_object({"source", "bytes", "file", "entries", "fallback", "origin", "cap"});
  bool cap = false;
  if (auto c = j.opt("cap")) {
    if (c->str() != "budget") c->fail(fmt::format("unknown cap \"{}\" (the one cap is \"budget\": the predictor's activation budget)", c->str()));
    cap = true;
  }
  a = parse_uncapped_spec(j, base_dir);
  a.cap_at_budget = cap;
  return a;
}

static ActivationSpec parse_uncapped_spec(const JsonIn& j, const std::string& base_dir) {
  ActivationSpec a;
  const std::string source = j.at("source").str();
  if (source == "model" || source == "estimate") {
    for (const char* k : {"bytes", "file", "entries", "fallback", "origin"}) {
      if (j.has(k)) j.at(k).fail(fmt::format("does not apply to source \"{}\"", source));
    }
    a.source = source == "model" ? ActivationSource::model : ActivationSource::estimate;
    return a;
  }
  if (source == "bytes") {
    for (const char* k : {"file", "entries", "fallback", "origin"}) {
      if (j.has(k)) j.at(k).fail("does not apply to source \"bytes\"");
    }
    a.source = ActivationSource::bytes;
    const JsonIn b = j.at("bytes");
    if (!b.is_object()) b.fail("expected an object of model id: bytes per forward pass");
    if (b.member_count() == 0) b.fail("needs at least one model (or \"*\" for every model)");
    for (std::size_t i = 0; i < b.member_count(); ++i) {
      const JsonIn v = b.member(i);
      const Bytes x = v.bytes();
      if (x > kMaxDeviceBytes) v.fail("is more than 1 PiB");
      a.bytes.emplace_back(std::string(b.key(i)), x);
    }
    return a;
  }
  if (source != "profile") {
    j.at("source").fail(fmt::format("unknown activation source \"{}\" (use model, estimate, bytes or profile)", source));
  }
  if (j.has("bytes")) j.at("bytes").fail("does not apply to source \"profile\"");
  if (j.has("file") == j.has("entries")) j.fail("a profile source needs either \"file\" or \"entries\" (not both)");
  if (auto f = j.opt("file")) {
    std::filesystem::path p(f->str());
    if (p.empty()) f->fail("needs a path");
    if (p.is_relative() && !base_dir.empty()) p = std::filesystem::path(base_dir) / p;
    try {
      a = load_activation_profile(p.string());
    } catch (const InputError& e) {
      throw InputError(f->path(), e.what());
    }
    if (j.has("origin")) j.at("origin").fail("is written by vramfuzz next to \"entries\"; give \"file\" alone");
  } else {
    a.source = ActivationSource::profile;
    a.profile = parse_entries(j.at("entries"));
    if (auto o = j.opt("origin")) a.profile_origin = o->str();
  }
  if (auto f = j.opt("fallback")) a.fallback_to_model = parse_fallback(*f);
  return a;
}

ActivationSpec load_activation_profile(const std::string& path) {
  const nlohmann::json doc = parse_json_text(read_text_file(path), path);
  try {
    return profile_from_document(JsonIn(doc, ""), std::filesystem::path(path).filename().string());
  } catch (const InputError& e) {
    // A field inside the file is named with the file: "prof.json: entries[0].width: ...".
    throw InputError(e.path().empty() ? path : path + ": " + e.path(), std::string(e.what()).substr(e.path().empty() ? 0 : e.path().size() + 2));
  }
}

ActivationSpec parse_activation_flag(std::string_view text, std::string_view what) {
  if (text == "model") return {};
  if (text == "estimate" || text == "capped") {
    ActivationSpec a;
    if (text == "estimate") a.source = ActivationSource::estimate;
    else a.cap_at_budget = true;
    return a;
  }
  if (text.rfind("profile:", 0) == 0 && text.size() > 8) {
    ActivationSpec a;
    try {
      a = load_activation_profile(std::string(text.substr(8)));
    } catch (const InputError& e) {
      throw InputError(std::string(what), e.what());
    }
    return a;
  }
  throw InputError(std::string(what), fmt::format("unknown activation source \"{}\" (use model, estimate, capped or profile:FILE)", text));
}

static nlohmann::json uncapped_json(const ActivationSpec& a);
static std::string uncapped_rests_on(const ActivationSpec& a);

nlohmann::json activation_spec_json(const ActivationSpec& a) {
  if (!a.cap_at_budget) return uncapped_json(a);
  if (a.source == ActivationSource::model) return "capped";
  nlohmann::json j = uncapped_json(a);
  if (j.is_string()) j = {{"source", j}};
  j["cap"] = "budget";
  return j;
}

std::string activation_rests_on(const ActivationSpec& a) {
  if (!a.cap_at_budget) return uncapped_rests_on(a);
  return uncapped_rests_on(a) + ", each forward capped at the predictor's activation budget";
}

static nlohmann::json uncapped_json(const ActivationSpec& a) {
  switch (a.source) {
    case ActivationSource::model: return nullptr;
    case ActivationSource::estimate: return "estimate";
    case ActivationSource::bytes: {
      nlohmann::json b = nlohmann::json::object();
      for (const auto& [m, x] : a.bytes) b[m] = size_json(x);
      return {{"source", "bytes"}, {"bytes", std::move(b)}};
    }
    case ActivationSource::profile: break;
  }
  nlohmann::json entries = nlohmann::json::array();
  for (const ActivationProfileEntry& e : a.profile) {
    nlohmann::json o = {{"model", e.model},
                        {"width", e.workload.width},
                        {"height", e.workload.height},
                        {"batch", e.workload.batch},
                        {"frames", e.workload.frames},
                        {"text_tokens", e.workload.text_tokens},
                        {"peak", size_json(e.peak)}};
    if (e.compute_given) o["compute"] = dtype_name(e.compute);
    entries.push_back(std::move(o));
  }
  nlohmann::json j = {{"source", "profile"}, {"entries", std::move(entries)}, {"fallback", a.fallback_to_model ? "model" : "error"}};
  if (!a.profile_origin.empty()) j["origin"] = a.profile_origin;
  return j;
}

static std::string uncapped_rests_on(const ActivationSpec& a) {
  switch (a.source) {
    case ActivationSource::model: return "activations from vramfuzz's structural formula (models/activation.cpp), not a measurement";
    case ActivationSource::estimate:
      return "activations sized at the predictor's own activation budget (max(memory_required, the inference floor)), so "
             "weights, transients and the allocator alone decide";
    case ActivationSource::bytes: return "activations as given in the scenario (bytes per forward pass)";
    case ActivationSource::profile: break;
  }
  return fmt::format("activations from a measured profile ({}{}{}), scaled linearly in positions x batch from the nearest entry{}",
                     a.profile.size(), a.profile.size() == 1 ? " entry" : " entries",
                     a.profile_origin.empty() ? std::string() : ", " + a.profile_origin,
                     a.fallback_to_model ? "; models without an entry from vramfuzz's formula" : "");
}

}  // namespace vf
