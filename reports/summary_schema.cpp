// summary.json (`vramfuzz.summary/1`) read back: its documented shape (docs/formats.md), checked
// whole before any report renders from it or a merge combines it. A damaged or tampered file is
// bad input naming the field: a count that is a string or negative, an unknown field, an
// impossible shard (index 5 of 2), a trace row of two cells (the HTML timeline read cells 2-5),
// counts that disagree with the findings they count.
#include "reports/summary_schema.h"

#include <fmt/format.h>

#include "harness/case_file.h"
#include "harness/core/error.h"
#include "harness/core/json_schema.h"
#include "harness/scenario.h"

namespace vf::report {

namespace {

using namespace vf::schema;
using nlohmann::json;

// "I/N" with I < N, both decimal; "merged" where `merged` allows it.
bool shard_text(std::string_view s, bool merged) {
  if (merged && s == "merged") return true;
  const std::size_t slash = s.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == s.size()) return false;
  std::uint64_t i = 0, n = 0;
  for (std::size_t k = 0; k < s.size(); ++k) {
    if (k == slash) continue;
    const char c = s[k];
    if (c < '0' || c > '9') return false;
    std::uint64_t& v = k < slash ? i : n;
    if (v > 1'000'000'000) return false;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return n >= 1 && i < n;
}

bool allocator_mode(std::string_view s) {
  for (AllocatorMode m : kAllAllocatorModes) {
    if (s == allocator_mode_name(m)) return true;
  }
  return false;
}

Check finding_signature() {
  return str_where([](std::string_view s) { return is_signature(s); }, "a signature KIND:PHASE:ACTIVITY:ALLOCATOR");
}

Check mode() { return str_where(allocator_mode, "an allocator mode (raw, caching, caching-expandable, async)"); }

// {index, count}: count >= 1, index < count.
Check shard_object() {
  return [](const JsonIn& j) {
    object({req("index", u64()), req("count", u64_in(1, ~std::uint64_t{0}))})(j);
    const std::uint64_t i = j.at("index").u64(), n = j.at("count").u64();
    if (i >= n) j.at("index").fail(fmt::format("shard {} of {} does not exist (the index is 0 to {})", i, n, n - 1));
  };
}

// A field a merge writes as "mixed" when its inputs disagree.
Check or_mixed(Check c, bool merge) { return merge ? either(std::move(c), one_of({"mixed"})) : c; }

// `config`: what fuzz, calibrate and merge record (docs/formats.md). `in_runs`: a merge's
// `runs[].config`, without what only bounds or places a run.
Check config(bool merge, bool in_runs) {
  std::vector<Field> f = {
      req("seed", or_mixed(u64(), merge)),
      opt("backend", or_mixed(str(), merge)),
      opt("policy", or_mixed(str(), merge)),
      opt("overrides", or_mixed(array_of(str()), merge)),
      opt("allocator", str()),
      opt("allocator_options", or_mixed(array_of(str()), merge)),
      opt("vram", or_mixed(either(u64(), one_of({"drawn"})), merge)),
      opt("model", or_mixed(str(), merge)),
      opt("reserve", or_mixed(str(), merge)),
      opt("margin", or_mixed(u64(), merge)),
      opt("min_overshoot", or_mixed(u64(), merge)),
      opt("activations", or_mixed(str(), merge)),
      opt("knee_every", or_mixed(u64_in(0, 0xffffffffu), merge)),
  };
  if (!in_runs) {
    f.push_back(opt("cases", or_mixed(u64(), merge)));
    f.push_back(opt("seconds", or_mixed(number_in(0, 1e12), merge)));
    f.push_back(opt("shard", str_where([merge](std::string_view s) { return shard_text(s, merge) || (merge && s == "mixed"); },
                                       merge ? "a shard I/N (I < N), or \"merged\"" : "a shard I/N with I < N")));
    f.push_back(opt("corpus", or_mixed(str(), merge)));
    f.push_back(opt("out", str()));
    if (merge) f.push_back(opt("merged_from", array_of(str())));
  }
  return object(std::move(f));
}

Check counts() {
  return object({opt("cases", u64()), opt("findings", u64()), opt("signatures", u64()), opt("new_signatures", u64()),
                 opt("expected_ooms", u64()), opt("errors", u64()), opt("knee_pairs", u64()), req("seconds", number_in(0, 1e12))});
}

Check peaks() { return object({req("reserved", u64()), req("allocated", u64()), req("live", u64()), req("device_used", u64())}); }

// A finding's `case`: the repro case as the reports draw it.
Check case_view_check() {
  static const Check c = [] {
    const Check around = object({req("op", u64()), req("kind", str()), req("phase", str()), req("stream", u64()), req("what", str()),
                                 req("bytes", u64()), req("live", u64()), req("allocated", u64()), req("reserved", u64()),
                                 req("device_used", u64())});
    const Check columns = [](const JsonIn& j) {
      static const json kColumns = json::array({"op", "stage", "live", "allocated", "reserved", "device_used"});
      array_of(str())(j);
      if (j.to_json() != kColumns) j.fail("expected [\"op\", \"stage\", \"live\", \"allocated\", \"reserved\", \"device_used\"]");
    };
    const Check parts_columns = [](const JsonIn& j) {
      static const json kColumns = json::array({"weights", "weight_transients", "activations"});
      array_of(str())(j);
      if (j.to_json() != kColumns) j.fail("expected [\"weights\", \"weight_transients\", \"activations\"]");
    };
    return object({
        req("title", str()),
        req("verdict", object({req("kind", one_of({"pass", "violation", "oom", "error", "waste", "knee"})), req("signature", str()), req("message", str()),
                               req("stage", u64()), req("op", u64()), req("measured", u64()), req("predicted", u64()),
                               req("reserve", u64()), req("overshoot", i64()), opt("cause", str()), opt("explanation", str()), opt("rests_on", str()),
                               opt("activation_dependent", boolean()), opt("at_budget", str())})),
        req("scenario", object({req("name", str()), req("device_total", u64()), req("available", u64()), req("allocator", str()),
                                req("policy", str()), req("streams", u64()), req("workload", str())})),
        req("oom", nullable(object({req("op", u64()), req("request", u64()), req("reserved", u64()), req("allocated", u64()),
                                    req("device_free", u64()), req("what", str())}))),
        req("stages", array_of(object({req("stage", u64()), req("op", str()), req("model", str()), req("begin", u64()), req("end", u64()),
                                       req("checked", boolean()), req("predicted", u64()), req("limit", u64()), req("measured", u64()),
                                       req("peak_op", u64()),
                                       opt("budget", object({req("weights", u64()), req("offload", u64()), req("activation", u64())}))}))),
        req("loads", array_of(object({req("model", str()), req("stage", u64()), req("loaded", u64()), req("offloaded", u64()),
                                      opt("uncounted", u64()), req("offload_buffer", u64()), req("modules", u64()), req("resident_modules", u64()),
                                      req("full_load", boolean()), req("log", str())}))),
        req("trace", object({req("columns", columns), req("ops", u64()), req("downsampled", boolean()),
                             req("rows", array_of(row({u64(), u64(), u64(), u64(), u64(), u64()}))),
                             opt("parts_columns", parts_columns), opt("parts", array_of(row({u64(), u64(), u64()}))),
                             opt("held", array_of(u64()))})),
        req("around_peak", array_of(around)),
        req("peaks", peaks()),
        req("replay", str()),
        opt("reliability", object({req("runs", u64_in(1, ~std::uint64_t{0})), req("reproduced", u64()), req("flaky", boolean())})),
        opt("shrink", object({req("executions", u64()), req("original_modules", u64()), req("final_modules", u64()),
                              req("budget_exhausted", boolean())})),
    });
  }();
  return c;
}

Check finding() {
  return object({
      req("signature", finding_signature()),
      req("policy", str()),
      req("count", u64_in(1, ~std::uint64_t{0})),
      req("worst_overshoot", i64()),
      req("first_case_seed", u64()),
      req("first_case_index", u64()),
      opt("campaign_seed", u64()),
      req("known", boolean()),
      opt("known_by", array_of(str())),
      opt("corpus_other_policies", array_of(str())),
      req("repro", str()),
      req("repro_modules", u64()),
      opt("repro_repeats", u64()),
      req("shrink_executions", u64()),
      req("flaky", boolean()),
      req("file", str()),
      req("kind", one_of({"violation", "oom", "waste", "knee"})),
      req("replay", str()),
      opt("why", str()),
      opt("severity", number_in(0, 1e6)),
      opt("noise", boolean()),
      opt("activation_dependent", boolean()),
      opt("reliability", object({req("runs", u64_in(1, ~std::uint64_t{0})), req("reproduced", u64())})),
      opt("case", case_view_check()),
  });
}

Check matrix() {
  const Check cell_finding = object({req("signature", finding_signature()), req("policy", str()), req("count", u64_in(1, ~std::uint64_t{0})),
                                     req("worst_overshoot", i64()), req("first_case_seed", u64()), req("first_case_index", u64())});
  return object({
      req("properties", array_of(object({req("id", str()), req("name", str()), req("kind", one_of({"violation", "oom", "waste", "knee"}))}))),
      req("policies", array_of(str())),
      req("allocators", array_of(str())),
      req("cells", array_of(object({req("policy", str()), req("allocator", str()), req("cases", u64()), req("expected_ooms", u64()),
                                    req("errors", u64()), opt("knee_pairs", u64()), req("findings", array_of(cell_finding))}))),
  });
}

Check corpus() {
  return object({req("dir", str()), req("replayed", u64()), req("still_fail", u64()), req("no_longer_reproduce", u64()),
                 opt("undetermined", u64()),
                 req("entries", array_of(object({req("file", str()), req("signature", finding_signature()), req("policy", str()),
                                                 req("still_fails", boolean()), opt("undetermined", boolean()), req("verdict", str())})))});
}

Check stats_fields(std::vector<Field> f) {
  for (const char* k : {"cases", "ooms", "expected_ooms", "errors", "violations", "need", "recommended", "reserve", "passing"}) {
    f.push_back(req(k, u64()));
  }
  for (const char* k : {"p50", "p90", "p99", "max", "slack_median"}) f.push_back(req(k, i64()));
  f.push_back(req("slack_share", number()));
  return object(std::move(f));
}

Check calibrate() {
  const Check sample_row = row({u64(), u64(), mode(), str(), i64(), boolean(), boolean(), u64(), u64(), str(), str()});
  const Check excluded_row = row({u64(), u64(), mode(), str(), boolean(), boolean()});
  const auto table = [](Check r, std::vector<std::string> names) {
    json cols = json::array();
    for (const std::string& n : names) cols.push_back(n);
    return object({req("columns", [cols](const JsonIn& j) {
                     if (j.is_null()) j.fail("null is not allowed here");
                     if (j.to_json() != cols) j.fail(fmt::format("expected {}", cols.dump()));
                   }),
                   req("rows", array_of(std::move(r)))});
  };
  const Check worst = object({req("case_index", u64()), req("case_seed", u64()), req("delta", i64()), req("oom", boolean()),
                              req("signature", str()), req("file", str()), req("modules", u64()), opt("case", case_view_check())});
  const Check histogram = object({req("bucket", i64()), req("lo", i64()), req("bins", array_of(u64())), req("ooms", array_of(u64())),
                                  req("clamped", u64())});
  return object({
      req("schema", one_of({"vramfuzz.calibrate/1"})),
      req("policy", str()),
      req("seed", u64()),
      req("cases_drawn", u64()),
      req("margin", u64()),
      opt("knob", one_of({"reserve", "vram_headroom"})),
      req("modes", array_of(stats_fields({req("allocator", mode()), req("verified_need", nullable(u64())), req("verified", boolean()),
                                          req("verification", one_of({"held", "not held", "not verified", "off"})),
                                          req("verify_ooms", u64()), req("histogram", histogram), opt("worst", worst)}))),
      req("classes", array_of(stats_fields({req("allocator", mode()), req("workload", str())}))),
      req("verify", array_of(object({req("allocator", mode()), req("shard", str()), req("round", u64()), req("reserve", u64()),
                                     req("cases", u64()), req("violations", u64()), req("ooms", u64()), req("max_delta", i64()),
                                     req("finished", boolean())}))),
      req("samples", table(sample_row, {"case_index", "case_seed", "allocator", "workload", "delta", "oom", "pass", "reserve",
                                        "device_total", "signature", "policy"})),
      req("excluded", table(excluded_row, {"case_index", "case_seed", "allocator", "workload", "expected_oom", "error"})),
  });
}

Check summary(bool merge) {
  std::vector<Field> f = {
      req("schema", one_of({std::string(kSummarySchema)})),
      req("tool", str()),
      req("command", str()),
      req("config", config(merge, false)),
      req("counts", counts()),
      req("findings", array_of(finding())),
      req("seeds", array_of(u64())),
      req("environment", object({req("backend", str()), req("device", str())})),
      req("run", object({req("command", one_of({"fuzz", "calibrate", "merge"})), req("timestamp", str()), req("hostname", str()),
                         req("interrupted", boolean())})),
      req("matrix", matrix()),
      opt("corpus", corpus()),
      opt("calibrate", calibrate()),
      opt("recovered", object({req("from", str()), req("not_recovered", array_of(str()))})),
  };
  if (merge) {
    f.push_back(req("shards", array_of(object({req("dir", str()), req("shard", str_where([](std::string_view s) { return shard_text(s, true); },
                                                                                        "a shard I/N (I < N), or \"merged\""))}))));
    f.push_back(req("runs", array_of(object({req("kind", one_of({"fuzz", "calibrate"})), req("shard", shard_object()),
                                             req("config", config(true, true))}))));
  } else {
    f.push_back(req("shard", shard_object()));
  }
  return object(std::move(f));
}

// What the shape cannot say: counts that count the findings, a config shard that is the shard.
void check_consistency(const json& doc, const JsonIn& j) {
  const json& findings = doc["findings"];
  std::uint64_t cases_with_findings = 0, fresh = 0;
  for (std::size_t i = 0; i < findings.size(); ++i) {
    const json& f = findings[i];
    const std::string& sig = f["signature"].get_ref<const std::string&>();
    if (sig.substr(0, sig.find(':')) != f["kind"].get_ref<const std::string&>()) {
      j.at("findings").at(i).at("kind").fail(fmt::format("{} does not match the signature {}", json_excerpt(f["kind"]), json_excerpt(f["signature"])));
    }
    if (f.contains("reliability") && f["reliability"]["reproduced"].get<std::uint64_t>() > f["reliability"]["runs"].get<std::uint64_t>()) {
      j.at("findings").at(i).at("reliability").at("reproduced").fail("is more than the runs");
    }
    cases_with_findings += f["count"].get<std::uint64_t>();
    fresh += f["known"].get<bool>() || (f.contains("noise") && f["noise"].get<bool>()) ? 0 : 1;
    if (f.contains("noise") && f["noise"].get<bool>() && f["kind"] != "violation" && f["kind"] != "knee") {
      j.at("findings").at(i).at("noise").fail("only a violation (or a knee of violations) can be noise (an OOM is an OOM)");
    }
  }
  const json& c = doc["counts"];
  const auto expect_count = [&](const char* key, std::uint64_t want, const char* what) {
    if (!c.contains(key)) return;
    if (c[key].get<std::uint64_t>() != want) {
      j.at("counts").at(key).fail(fmt::format("{} does not match the findings listed ({} {})", c[key].get<std::uint64_t>(), want, what));
    }
  };
  expect_count("signatures", findings.size(), "entries in findings");
  expect_count("new_signatures", fresh, "of them neither known nor noise");
  expect_count("findings", cases_with_findings, "cases counted by the findings");
  if (c.contains("findings") && c.contains("cases") && c["findings"].get<std::uint64_t>() > c["cases"].get<std::uint64_t>() &&
      !doc.contains("recovered")) {
    j.at("counts").at("findings").fail(fmt::format("{} findings in {} cases", c["findings"].get<std::uint64_t>(), c["cases"].get<std::uint64_t>()));
  }
  if (doc.contains("shard") && doc["config"].contains("shard")) {
    const std::string want = fmt::format("{}/{}", doc["shard"]["index"].get<std::uint64_t>(), doc["shard"]["count"].get<std::uint64_t>());
    if (doc["config"]["shard"] != want) j.at("config").at("shard").fail(fmt::format("{} is not the run's shard {}", json_excerpt(doc["config"]["shard"]), want));
  }
  if (doc.contains("corpus")) {
    const json& k = doc["corpus"];
    std::uint64_t still = 0, undetermined = 0;
    const JsonIn kj = j.at("corpus");
    for (std::size_t i = 0; i < k["entries"].size(); ++i) {
      const json& e = k["entries"][i];
      still += e["still_fails"].get<bool>() ? 1 : 0;
      const bool u = e.value("undetermined", false);
      if (u && e["still_fails"].get<bool>()) kj.at("entries").at(i).at("undetermined").fail("an entry that still fails is determined");
      undetermined += u ? 1 : 0;
    }
    if (k["replayed"].get<std::uint64_t>() != k["entries"].size()) kj.at("replayed").fail(fmt::format("is not the {} entries", k["entries"].size()));
    if (k["still_fail"].get<std::uint64_t>() != still) kj.at("still_fail").fail(fmt::format("is not the {} entries that still fail", still));
    if (k.value("undetermined", std::uint64_t{0}) != undetermined) {
      kj.at("undetermined").fail(fmt::format("is not the {} undetermined entries", undetermined));
    }
    if (k["no_longer_reproduce"].get<std::uint64_t>() != k["entries"].size() - still - undetermined) {
      kj.at("no_longer_reproduce").fail(fmt::format("is not the {} entries that no longer reproduce", k["entries"].size() - still - undetermined));
    }
  }
}

}  // namespace

schema::Check campaign_config_check() { return config(false, false); }

void check_summary(const json& doc, const std::string& path) {
  const JsonIn j(doc, path);
  if (!doc.is_object()) j.fail(fmt::format("not a {} file (expected an object)", kSummarySchema));
  if (!doc.contains("schema")) j.at("schema").fail(fmt::format("missing: not a {} file", kSummarySchema));
  if (doc["schema"] != kSummarySchema) {
    j.at("schema").fail(fmt::format("expected \"{}\", got {}: not a summary this build reads", kSummarySchema, json_excerpt(doc["schema"])));
  }
  // A merge (`merge`, or `fuzz --devices` merging its workers) lists its inputs instead of a shard.
  const bool merge = doc.contains("shards") || doc.contains("runs");
  summary(merge)(j);
  check_consistency(doc, j);
}

}  // namespace vf::report
