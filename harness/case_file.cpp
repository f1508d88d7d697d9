#include "harness/case_file.h"

#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "harness/core/json_schema.h"
#include "harness/scenario.h"

namespace vf {

namespace {

using namespace vf::schema;

bool is_word(std::string_view w) {
  if (w.empty()) return false;
  for (char c : w) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return false;
  }
  return true;
}

std::vector<std::string_view> split(std::string_view s) {
  std::vector<std::string_view> parts;
  for (std::size_t b = 0;;) {
    const std::size_t e = s.find(':', b);
    parts.push_back(s.substr(b, e == std::string_view::npos ? std::string_view::npos : e - b));
    if (e == std::string_view::npos) return parts;
    b = e + 1;
  }
}

// The scenario is checked by scenario_from_json, with its own messages; here only that it is one.
Check scenario_object() {
  return [](const JsonIn& j) {
    if (j.is_null()) j.fail("null is not allowed here");
    if (!j.is_object()) j.fail("expected a scenario object (vramfuzz.scenario/1)");
  };
}

Check environment() { return object({opt("backend", str()), opt("device", str())}); }

Check peaks() { return object({opt("reserved", u64()), opt("allocated", u64()), opt("live", u64()), opt("device_used", u64())}); }

Check signature_check(bool allow_error, bool allow_empty) {
  return str_where([=](std::string_view s) { return (allow_empty && s.empty()) || is_signature(s, allow_error); },
                   allow_error ? "a signature (KIND:PHASE:ACTIVITY:ALLOCATOR, or error:BACKEND:ALLOCATOR), or \"\""
                               : "a signature KIND:PHASE:ACTIVITY:ALLOCATOR (e.g. oom:forward:upcast:raw)");
}

const Check& finding_schema(bool result) {
  static const auto make = [](bool is_result) {
    return object({
        req("schema", str()),
        opt("tool", str()),
        req("signature", signature_check(is_result, is_result)),
        opt("verdict", object({req("kind", is_result ? one_of({"pass", "error"}) : one_of({"violation", "oom", "waste", "knee"})),
                               opt("message", str()), opt("stage", u64()), opt("op", u64()), opt("measured", u64()),
                               opt("predicted", u64()), opt("reserve", u64()), opt("overshoot", i64()),
                               opt("cause", str()), opt("explanation", str()), opt("rests_on", str()),
                               opt("activation_dependent", boolean()), opt("at_budget", str()), opt("knee_small", str()),
                               opt("knee_large", str())})),
        opt("campaign_seed", u64()),
        opt("case_index", u64()),
        opt("case_seed", u64()),
        opt("choices", array_of(u64())),
        opt("found_by", str()),
        opt("environment", environment()),
        opt("plan", object({opt("policy", str()), opt("predicted_peak", u64()), opt("reserve", u64()), opt("available", u64()),
                            opt("loads", array_of(str()))})),
        opt("peaks", peaks()),
        opt("trace_around_peak",
            array_of(object({req("op", u64()), opt("kind", str()), opt("phase", str()), opt("stream", u64()), opt("what", str()),
                             opt("bytes", u64()), opt("live", u64()), opt("allocated", u64()), opt("reserved", u64()),
                             opt("device_used", u64()), opt("vbar", u64()), opt("cast", u64()), opt("t_us", u64())}))),
        opt("replay", str()),
        req("scenario", scenario_object()),
    });
  };
  static const Check finding = make(false), res = make(true);
  return result ? res : finding;
}

// A dynamic VRAM repro's `dynamic` section (docs/formats.md): the run's counters and, for an OOM,
// the card at the failure, which the replay recomputes (it is read for the record, not trusted).
Check dynamic_object() {
  std::vector<Field> at_oom = {req("what", str())};
  for (const char* k : {"request", "free", "context", "others", "headroom", "needed_tensors", "needed_pages", "needed_cast",
                        "torch_cache", "cast_slack", "prefetch_pins", "other_weights", "resident_pages", "rounding", "necessary", "total"}) {
    at_oom.push_back(req(k, u64()));
  }
  std::vector<Field> f;
  for (const char* k : {"faults", "resident_hits", "copies", "refused", "pages_evicted", "polls", "elapsed_us", "vbar_peak", "cast_peak"}) {
    f.push_back(req(k, u64()));
  }
  f.push_back(opt("at_oom", object(std::move(at_oom))));
  return object(std::move(f));
}

const Check& repro_schema() {
  static const Check size =
      object({opt("models", u64()), opt("modules", u64()), opt("repeats", u64()), opt("tensors", u64()), opt("bytes", u64())});
  static const Check c = object({
      req("schema", str()),
      opt("title", str()),
      opt("tool", str()),
      req("signature", signature_check(false, false)),
      opt("verdict", object({req("kind", one_of({"violation", "oom", "waste", "knee"})), opt("message", str()), opt("stage", u64()), opt("op", u64())})),
      opt("bytes", object({opt("predicted", u64()), opt("reserve", u64()), opt("measured", u64()), opt("overshoot", i64()),
                           opt("original_overshoot", i64()), opt("largest_overshoot_seen", i64()), opt("shrink_margin", i64())})),
      opt("plan", object({opt("policy", str()), opt("predicted_peak", u64()), opt("available", u64()), opt("loads", array_of(str()))})),
      opt("peaks", peaks()),
      opt("trace_around_peak", str()),
      opt("cause", str()),
      opt("explanation", str()),
      opt("rests_on", str()),
      opt("activation_dependent", boolean()),
      opt("at_budget", str()),
      opt("knee", object({req("small", str()), req("large", str())})),
      opt("dynamic", dynamic_object()),
      opt("reliability", object({req("runs", u64_in(1, ~std::uint64_t{0})), req("reproduced", u64()), opt("rate", number_in(0, 1)),
                                 opt("flaky", boolean())})),
      opt("origin", object({opt("campaign_seed", u64()), opt("case_index", u64()), opt("case_seed", u64()),
                            opt("choices", array_of(u64())), opt("finding", str()), opt("found_by", str())})),
      opt("shrink", object({opt("executions", u64()), opt("cache_hits", u64()), opt("accepted", u64()),
                            opt("budget_exhausted", boolean()), opt("original", size), opt("final", size),
                            opt("steps", array_of(str()))})),
      opt("environment", environment()),
      opt("replay", str()),
      req("scenario", scenario_object()),
  });
  return c;
}

// What the schema cannot say alone: the verdict is the signature's, the counts add up. The
// document has passed its schema: the fields read here have their types.
void check_consistency(const JsonIn& j, bool result) {
  if (j.has("verdict")) {
    const std::string kind = j.at("verdict").at("kind").str();
    const std::string_view sig = j.at("signature").str_view();
    const std::string_view sig_kind = sig.substr(0, sig.find(':'));
    const bool ok = result ? (kind == "pass" ? sig.empty() : sig_kind == "error") : kind == sig_kind;
    if (!ok) {
      j.at("verdict").at("kind").fail(fmt::format("\"{}\" does not match the signature {}", kind, j.at("signature").excerpt()));
    }
  }
  if (j.has("reliability")) {
    const JsonIn r = j.at("reliability");
    const std::uint64_t runs = r.at("runs").u64(), reproduced = r.at("reproduced").u64();
    if (reproduced > runs) r.at("reproduced").fail(fmt::format("{} is more than the {} run(s)", reproduced, runs));
  }
}

}  // namespace

bool is_signature(std::string_view text, bool allow_error) {
  const std::vector<std::string_view> parts = split(text);
  for (std::string_view p : parts) {
    if (!is_word(p)) return false;
  }
  bool mode = false;
  for (AllocatorMode m : kAllAllocatorModes) mode = mode || parts.back() == allocator_mode_name(m);
  if (!mode) return false;
  if (parts.size() == 4) return parts[0] == "violation" || parts[0] == "oom" || parts[0] == "waste" || parts[0] == "knee";
  return allow_error && parts.size() == 3 && parts[0] == "error";
}

CaseDocKind check_case_document(const nlohmann::json& doc, const std::string& root) {
  return check_case_document(JsonIn(doc, root));
}

CaseDocKind check_case_document(const JsonIn& j) {
  if (!j.is_object() || !j.has("schema")) return CaseDocKind::scenario;
  const JsonIn schema = j.at("schema");
  if (!schema.is_string()) return CaseDocKind::scenario;  // the scenario reader names the type error
  const std::string_view name = schema.str_view();
  if (name.starts_with("vramfuzz.scenario/")) return CaseDocKind::scenario;  // the scenario reader checks the version
  CaseDocKind kind;
  if (name == kFindingSchema) {
    kind = CaseDocKind::finding;
  } else if (name == kResultSchema) {
    kind = CaseDocKind::result;
  } else if (name == "vramfuzz.repro/1") {
    kind = CaseDocKind::repro;
  } else {
    schema.fail(fmt::format("unsupported schema {} here (this build reads vramfuzz.scenario/1, {}, {} and vramfuzz.repro/1{})",
                            schema.excerpt(), kFindingSchema, kResultSchema,
                            name.starts_with("vramfuzz.summary/") ? "; a summary is read by `report` and `merge`" : ""));
  }
  if (kind == CaseDocKind::repro) {
    repro_schema()(j);
  } else {
    finding_schema(kind == CaseDocKind::result)(j);
  }
  check_consistency(j, kind == CaseDocKind::result);
  return kind;
}

}  // namespace vf
