// The external-predictor protocol (harness/predictors/protocol.h, external.h): the plan's JSON
// form round-trips every field, a request carries everything the planner reads, and every way a
// predictor process can fail is the case's error verdict with a message that says which.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "harness/campaign.h"
#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "harness/generate.h"
#include "harness/predictors/external.h"
#include "harness/predictors/protocol.h"
#include "harness/scenario.h"
#include "harness/shrink.h"

namespace vf {
namespace {

Scenario generated(std::uint64_t seed, Catalog& catalog, const char* policy) {
  PrngChoices c(seed);
  GenConfig cfg;
  cfg.policy = policy;
  return generate_scenario(c, cfg, catalog);
}

nlohmann::json reparsed(const nlohmann::ordered_json& j) { return nlohmann::json::parse(j.dump()); }

// ---- the plan's JSON form ----------------------------------------------------------------------

// What reading `bad` back as a reply's plan for `s` says: its error, or "accepted".
std::string plan_error(const nlohmann::ordered_json& bad, const Scenario& s) {
  try {
    const nlohmann::json doc = reparsed(bad);
    (void)plan_from_json(JsonIn(doc, "reply.plan"), s);
  } catch (const InputError& e) {
    return std::string(e.what());
  }
  return std::string("accepted");
}

TEST(PredictorProtocol, ThePlanRoundTripsEveryFieldOnGeneratedCases) {
  Catalog catalog;
  int dynamic_loads = 0, offloaded = 0;
  for (const char* policy : {"comfy:oct2025", "comfy:nov2025", "comfy:dec2025", "comfy:feb2026", "comfy:sep2026", "exact:dec2025"}) {
    for (std::uint64_t seed = 1; seed <= 40; ++seed) {
      const Scenario s = generated(seed, catalog, policy);
      const Plan p = predict(s);
      const nlohmann::ordered_json j = plan_json(s, p);
      const nlohmann::json doc = reparsed(j);
      const Plan q = plan_from_json(JsonIn(doc, "plan"), s);
      ASSERT_EQ(plan_json(s, q).dump(), j.dump()) << policy << " seed " << seed;
      // What the harness recomputes from the case agrees with what the predictor computed.
      EXPECT_EQ(q.policy, p.policy);
      EXPECT_EQ(q.available, p.available);
      EXPECT_EQ(q.streams, p.streams);
      EXPECT_EQ(q.predicted_peak, p.predicted_peak);
      EXPECT_EQ(q.fits, p.fits);
      EXPECT_EQ(q.dynamic, p.dynamic);
      ASSERT_EQ(q.stages.size(), p.stages.size());
      for (std::size_t i = 0; i < p.stages.size(); ++i) {
        EXPECT_EQ(q.stages[i].activation_bytes, p.stages[i].activation_bytes) << policy << " seed " << seed << " stage " << i;
        EXPECT_EQ(q.stages[i].activation_formula, p.stages[i].activation_formula);
        EXPECT_EQ(q.stages[i].load_plan, p.stages[i].load_plan);
      }
      for (const LoadPlan& lp : p.loads) {
        dynamic_loads += lp.dynamic;
        offloaded += lp.offloaded > 0;
      }
    }
  }
  // The cases covered both kinds of load and partial loads.
  EXPECT_GT(dynamic_loads, 20);
  EXPECT_GT(offloaded, 20);
}

TEST(PredictorProtocol, ARequestCarriesEveryModelInlineAndNothingThePlannerDoesNotSee) {
  Catalog catalog;
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    const Scenario s = generated(seed, catalog, "comfy:dec2025,comfy:sep2026");
    const nlohmann::json req = nlohmann::json::parse(request_line(s, 7));
    EXPECT_EQ(req["type"], "predict");
    EXPECT_EQ(req["id"], 7);
    EXPECT_EQ(req["view"]["total"].get<Bytes>(), s.device.total);
    EXPECT_EQ(req["view"]["free"].get<Bytes>(), s.device.available());
    const nlohmann::json& sc = req["scenario"];
    EXPECT_FALSE(sc.contains("name"));
    EXPECT_FALSE(sc.contains("knee_of"));
    for (const auto& m : sc["models"]) EXPECT_EQ(m["source"], "inline");
    // Read back on its own (no catalog entry needed), it plans the same.
    Catalog empty;
    Scenario back = scenario_from_json(sc, empty, "request.scenario");
    EXPECT_EQ(plan_json(back, predict(back)).dump(), plan_json(s, predict(s)).dump()) << "seed " << seed;
  }
}

// What check_view says of a request's view against the scenario: its error, or "accepted".
std::string view_error(const nlohmann::json& view, const Scenario& s) {
  try {
    check_view(JsonIn(view, "request.view"), s);
  } catch (const InputError& e) {
    return std::string(e.what());
  }
  return std::string("accepted");
}

TEST(PredictorProtocol, AServerChecksTheViewAgainstTheScenario) {
  Catalog catalog;
  std::map<AllocatorMode, int> modes;
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    const Scenario s = generated(seed, catalog, "comfy:dec2025,comfy:sep2026");
    ++modes[s.allocator.mode];
    const nlohmann::json view = nlohmann::json::parse(request_line(s, 1))["view"];
    EXPECT_EQ(view_error(view, s), "accepted") << "seed " << seed;
  }
  EXPECT_GE(modes.size(), 3u);  // the generator draws the allocator: the backends are all checked

  Scenario s = generated(3, catalog, "comfy:dec2025");
  s.allocator.mode = AllocatorMode::caching;
  const nlohmann::json view = nlohmann::json::parse(request_line(s, 1))["view"];
  auto with = [&](const char* key, nlohmann::json value) {
    nlohmann::json v = view;
    v[key] = std::move(value);
    return view_error(v, s);
  };
  const Bytes free = s.device.available();
  EXPECT_EQ(with("free", free - 1),
            fmt::format("request.view.free: {} but the scenario says {} (device.total less the context and other processes)", free - 1, free));
  EXPECT_EQ(with("total", s.device.total + 512),
            fmt::format("request.view.total: {} but the scenario says {} (device.total)", s.device.total + 512, s.device.total));
  EXPECT_EQ(with("torch_reserved", 20 * MiB), "request.view.torch_reserved: 20971520 but the scenario says 0 (each case runs in a fresh process)");
  EXPECT_EQ(with("allocator_backend", "cudaMallocAsync"),
            "request.view.allocator_backend: \"cudaMallocAsync\" but the scenario's allocator is caching (\"native\")");
  EXPECT_EQ(with("allocator_backend", "native "), "request.view.allocator_backend: \"native \" is not a backend: native, cudaMallocAsync or raw");
  EXPECT_EQ(with("expandable_segments", true), "request.view.expandable_segments: true but the scenario's allocator is caching");
  EXPECT_NE(with("free", "24GiB").find("request.view.free: "), std::string::npos);
  EXPECT_NE(with("torch_activ", 0).find("torch_activ"), std::string::npos);  // a misspelt key is refused, not ignored
  nlohmann::json missing = view;
  missing.erase("torch_active");
  EXPECT_NE(view_error(missing, s).find("torch_active"), std::string::npos);
  EXPECT_EQ(view_error(nlohmann::json::array(), s).rfind("request.view: expected an object", 0), 0u);
}

// The request is written as text (scenario_json_compact), not through a document: the text is
// the document's, byte for byte, on generated cases (catalog and synthetic models, repeats,
// modules without the cast hook) and on names that need escaping.
TEST(PredictorProtocol, TheCompactTextIsTheDocumentsByteForByte) {
  Catalog catalog;
  std::size_t repeats = 0, hookless = 0;
  for (std::uint64_t seed = 1; seed <= 120; ++seed) {
    Scenario s = generated(seed, catalog, seed % 2 ? "comfy:dec2025" : "comfy:sep2026");
    ASSERT_EQ(scenario_json_compact(s), scenario_to_ordered_json(s).dump()) << "seed " << seed;
    // The same models inline, as a request carries them.
    for (ModelRef& m : s.models) {
      m.source = "inline";
      m.catalog_full.reset();
      m.catalog_source.clear();
      for (std::size_t i = 0; i < m.spec->modules.size(); ++i) repeats += repeat_run(m.spec->modules, i) > 1;
      for (const Module& mod : m.spec->modules) hookless += !mod.cast_hook;
    }
    ASSERT_EQ(scenario_json_compact(s), scenario_to_ordered_json(s).dump()) << "seed " << seed << " inline";
  }
  EXPECT_GT(hookless, 0u);  // the cases above did write "cast_hook": false
  Scenario s = generated(3, catalog, "comfy:dec2025");
  auto spec = std::make_shared<ModelSpec>(*s.models[0].spec);
  // A run of repeats (written as one entry with "repeat": 4) after the first module.
  for (int k = 3; k >= 0; --k) {
    Module copy = spec->modules[0];
    copy.name = fmt::format("stack.{}", k);
    spec->modules.insert(spec->modules.begin() + 1, copy);
  }
  for (std::size_t i = 0; i < spec->modules.size(); ++i) repeats += repeat_run(spec->modules, i) > 1;
  EXPECT_GT(repeats, 0u);
  spec->modules[0].name = "a \"quoted\" \\ name\twith\ncontrol \x01 and UTF-8 \xc3\xa9";
  spec->modules[0].tensors[0].name = "w\x7f";
  s.models[0].spec = spec;
  s.models[0].source = "inline";
  s.models[0].id = "id \"x\"";
  EXPECT_EQ(scenario_json_compact(s), scenario_to_ordered_json(s).dump());
  EXPECT_NE(scenario_json_compact(s).find(R"("a \"quoted\" \\ name\twith\ncontrol \u0001 and UTF-8 é")"), std::string::npos);
  EXPECT_NE(scenario_json_compact(s).find(R"({"name":"stack","repeat":4,"tensors":)"), std::string::npos);
  // Invalid UTF-8 is refused by both alike (nlohmann's own check).
  spec->modules[0].name = "bad \xff";
  EXPECT_THROW((void)scenario_to_ordered_json(s).dump(), nlohmann::json::type_error);
  EXPECT_THROW((void)scenario_json_compact(s), nlohmann::json::type_error);
}

// The oracle for the reply's text writer (PlanText in protocol.cpp): the plan as a document
// built field by field, in the protocol's key order (what predict-serve sent before its reply was
// written as text).
using ojson = nlohmann::ordered_json;

// How a plan names modules: by name, or by index (by_index).
ojson module_ref(const ModelSpec& spec, std::uint32_t i, bool by_index) { return by_index ? ojson(i) : ojson(spec.modules[i].name); }

ojson names_of(const ModelSpec& spec, const std::vector<std::uint8_t>& flags, bool by_index) {
  ojson a = ojson::array();
  for (std::size_t i = 0; i < flags.size() && i < spec.modules.size(); ++i) {
    if (flags[i]) a.push_back(module_ref(spec, static_cast<std::uint32_t>(i), by_index));
  }
  return a;
}

ojson names_in_order(const ModelSpec& spec, const std::vector<std::uint32_t>& order, bool by_index) {
  ojson a = ojson::array();
  for (const std::uint32_t i : order) a.push_back(module_ref(spec, i, by_index));
  return a;
}

template <class T>
ojson numbers(const std::vector<T>& v) {
  ojson a = ojson::array();
  for (const T& x : v) a.push_back(x);
  return a;
}

ojson load_json(const Scenario& s, const LoadPlan& lp, bool by_index) {
  const ModelSpec& spec = *s.models[lp.model].spec;
  ojson j;
  j["stage"] = lp.stage;
  j["model"] = s.models[lp.model].id;
  j["free_before"] = lp.free_before;
  j["est_max"] = lp.est_max;
  j["est_min"] = lp.est_min;
  j["extra_mem"] = lp.extra_mem;
  j["min_req"] = lp.min_req;
  ojson ev = ojson::array();
  for (const Eviction& e : lp.evictions) {
    const ModelSpec& es = *s.models[e.model].spec;
    ev.push_back({{"model", s.models[e.model].id}, {"modules", names_in_order(es, e.modules, by_index)}, {"bytes", e.bytes}});
  }
  j["evictions"] = std::move(ev);
  j["usable"] = lp.usable;
  j["full_load"] = lp.full_load;
  j["loaded"] = lp.loaded;
  j["offloaded"] = lp.offloaded;
  j["uncounted"] = lp.uncounted;
  j["offload_buffer"] = lp.offload_buffer;
  j["lowvram_patches"] = lp.lowvram_patches;
  j["resident"] = names_of(spec, lp.resident, by_index);
  j["lowvram"] = names_of(spec, lp.lowvram, by_index);
  j["sorted"] = names_in_order(spec, lp.sorted, by_index);
  if (!lp.offload_cost.empty()) j["offload_cost"] = numbers(lp.offload_cost);
  j["realistic_transient"] = lp.realistic_transient;
  if (lp.transient_module < spec.modules.size()) j["transient_module"] = module_ref(spec, lp.transient_module, by_index);
  j["log_line"] = lp.log_line;
  j["dynamic"] = lp.dynamic;
  if (lp.dynamic) {
    const StagingPlan& st = lp.staging;
    ojson sj;
    sj["vbar_request"] = st.vbar_request;
    sj["vbar_pages"] = st.vbar_pages;
    sj["staged"] = st.staged;
    sj["vbar_end"] = st.vbar_end;
    sj["patches"] = st.patches;
    sj["forced"] = st.forced;
    sj["forced_bytes"] = st.forced_bytes;
    sj["uncounted"] = st.uncounted;
    sj["order"] = names_in_order(spec, st.order, by_index);
    sj["offload_cost"] = numbers(st.offload_cost);
    sj["slice_offset"] = numbers(st.slice_offset);
    sj["slice_size"] = numbers(st.slice_size);
    sj["forced_modules"] = names_of(spec, st.forced_module, by_index);
    sj["slices_beyond_cap"] = st.slices_beyond_cap;
    j["staging"] = std::move(sj);
  }
  j["free_target"] = lp.free_target;
  return j;
}

ojson stage_json(const StagePlan& sp) {
  ojson j;
  j["checked"] = sp.checked;
  j["resident_total"] = sp.resident_total;
  j["offload_buffer"] = sp.offload_buffer;
  j["activation_allowance"] = sp.activation_allowance;
  j["run_batch"] = sp.run_batch;
  j["passes"] = sp.passes;
  j["predicted_peak"] = sp.predicted_peak;
  j["dynamic"] = sp.dynamic;
  j["patcher_free"] = sp.patcher_free;
  j["decode_batch"] = sp.decode_batch;
  return j;
}

ojson plan_document(const Scenario& s, const Plan& p, bool by_index) {
  ojson j;
  j["reserve"] = p.reserve;
  j["fits"] = p.fits;
  ojson loads = ojson::array();
  for (const LoadPlan& lp : p.loads) loads.push_back(load_json(s, lp, by_index));
  j["loads"] = std::move(loads);
  ojson stages = ojson::array();
  for (const StagePlan& sp : p.stages) stages.push_back(stage_json(sp));
  j["stages"] = std::move(stages);
  return j;
}


// predict-serve's reply is written as text (PlanText in protocol.cpp): the same bytes as the
// plan's document built field by field and dumped, for classic and dynamic plans, named by module and by index, with
// evictions (a pipeline of several models), LoRA patches, and a model id and module name that
// need escaping.
TEST(PredictorProtocol, ThePlanReplyTextIsTheDocumentsByteForByte) {
  Catalog catalog;
  std::size_t dynamic = 0, evictions = 0, costs = 0;
  auto reference = [](const Scenario& s, const Plan& p, std::uint64_t id, bool by_index) {
    nlohmann::ordered_json j;
    j["type"] = "plan";
    j["id"] = id;
    j["plan"] = plan_document(s, p, by_index);
    return j.dump() + "\n";
  };
  for (std::uint64_t seed = 1; seed <= 160; ++seed) {
    const Scenario s = generated(seed, catalog, seed % 2 ? "comfy:dec2025" : "comfy:sep2026");
    const Plan p = predict(s);
    for (const LoadPlan& lp : p.loads) {
      dynamic += lp.dynamic;
      evictions += lp.evictions.size();
      costs += !lp.offload_cost.empty();
    }
    for (const bool by_index : {false, true}) {
      ASSERT_EQ(plan_reply_line(s, p, seed * 1000003, by_index), reference(s, p, seed * 1000003, by_index))
          << "seed " << seed << (by_index ? " by index" : "");
    }
  }
  EXPECT_GT(dynamic, 0u);
  EXPECT_GT(evictions, 0u);
  EXPECT_GT(costs, 0u);
  // Names that need escaping, and a negative usable budget.
  Scenario s = generated(3, catalog, "comfy:dec2025");
  auto spec = std::make_shared<ModelSpec>(*s.models[0].spec);
  spec->modules[0].name = "a \"quoted\" \\ name\twith UTF-8 \xc3\xa9";
  s.models[0].spec = spec;
  s.models[0].id = "id \"x\"";
  Plan p = predict(s);
  ASSERT_FALSE(p.loads.empty());
  p.loads[0].usable = -123456789;
  p.loads[0].resident.assign(spec->modules.size(), 1);
  const std::string line = plan_reply_line(s, p, 7, false);
  EXPECT_EQ(line, reference(s, p, 7, false));
  EXPECT_NE(line.find(R"("a \"quoted\" \\ name\twith UTF-8 é")"), std::string::npos);
  EXPECT_NE(line.find(R"("usable":-123456789,)"), std::string::npos);
}

// With spec refs a held spec is its spec_ref; a new one is written whole, spec_ref its last key.
TEST(PredictorProtocol, ARequestsModelsKeepTheirKeyOrderWithASpecRefLast) {
  Catalog catalog;
  const Scenario s = generated(11, catalog, "comfy:dec2025");
  SpecRefs refs;
  const auto keys = [](const nlohmann::ordered_json& m) {
    std::vector<std::string> k;
    for (auto it = m.begin(); it != m.end(); ++it) k.push_back(it.key());
    return k;
  };
  const nlohmann::ordered_json first = nlohmann::ordered_json::parse(request_line(s, 1, refs));
  const nlohmann::ordered_json second = nlohmann::ordered_json::parse(request_line(s, 2, refs));
  const std::vector<std::string> whole = keys(first["scenario"]["models"][0]);
  ASSERT_GE(whole.size(), 10u);
  EXPECT_EQ(whole.front(), "arch");
  EXPECT_EQ(whole.back(), "spec_ref");
  EXPECT_TRUE(std::is_sorted(whole.begin(), whole.end() - 1));
  const std::vector<std::string> held = keys(second["scenario"]["models"][0]);
  EXPECT_EQ(held.back(), "spec_ref");
  for (const char* k : {"arch", "kind", "family", "memory_usage_factor", "modules"}) {
    EXPECT_EQ(std::count(held.begin(), held.end(), k), 0) << k;
    EXPECT_EQ(std::count(whole.begin(), whole.end(), k), 1) << k;
  }
  for (const char* k : {"compute", "id", "lora", "source"}) EXPECT_EQ(std::count(held.begin(), held.end(), k), 1) << k;
}

TEST(PredictorProtocol, ARepliedPlanIsCheckedAgainstTheCase) {
  Catalog catalog;
  const Scenario s = generated(3, catalog, "comfy:dec2025");
  const nlohmann::ordered_json good = plan_json(s, predict(s));
  const auto error_of = [&](const nlohmann::ordered_json& bad) { return plan_error(bad, s); };
  nlohmann::ordered_json bad = good;
  bad["loads"][0]["resident"].push_back("no.such.module");
  EXPECT_NE(error_of(bad).find("reply.plan.loads[0].resident["), std::string::npos) << error_of(bad);
  EXPECT_NE(error_of(bad).find("unknown module \"no.such.module\""), std::string::npos);
  bad = good;
  bad["stages"].erase(bad["stages"].size() - 1);
  EXPECT_NE(error_of(bad).find(fmt::format("reply.plan.stages: has {} entries; the case has {} stages", s.stages.size() - 1, s.stages.size())),
            std::string::npos)
      << error_of(bad);
  bad = good;
  bad["loads"] = nlohmann::ordered_json::array();
  EXPECT_NE(error_of(bad).find("reply.plan.loads: no load for stage 0"), std::string::npos) << error_of(bad);
  bad = good;
  bad["stages"][0].erase("predicted_peak");
  EXPECT_NE(error_of(bad).find("reply.plan.stages[0].predicted_peak"), std::string::npos) << error_of(bad);
  bad = good;
  bad["surprise"] = 1;
  EXPECT_NE(error_of(bad).find("surprise"), std::string::npos) << error_of(bad);
}

// A request to a predictor that said supports.spec_refs: what it reads back is the same case.
Scenario read_request(const std::string& line, SpecStore& store, Catalog& catalog) {
  const nlohmann::json doc = nlohmann::json::parse(line);
  store.forget(JsonIn(doc, "request"));
  const SpecRefScope scope(store.specs);
  return scenario_from_json(doc["scenario"], catalog, "request.scenario");
}

TEST(PredictorProtocol, ASpecIsSentOnceAndReferencedAfter) {
  Catalog catalog;
  const Scenario s = generated(11, catalog, "comfy:dec2025");
  SpecRefs refs;
  SpecStore store;
  const std::string first = request_line(s, 1, refs), second = request_line(s, 2, refs);
  const nlohmann::json a = nlohmann::json::parse(first), b = nlohmann::json::parse(second);
  ASSERT_EQ(a["scenario"]["models"].size(), s.models.size());
  for (std::size_t i = 0; i < s.models.size(); ++i) {
    const bool defined_earlier = [&] {
      for (std::size_t k = 0; k < i; ++k) {
        if (a["scenario"]["models"][k]["spec_ref"] == a["scenario"]["models"][i]["spec_ref"]) return true;
      }
      return false;
    }();
    EXPECT_EQ(a["scenario"]["models"][i].contains("modules"), !defined_earlier) << i;
    EXPECT_FALSE(b["scenario"]["models"][i].contains("modules")) << i;
    EXPECT_FALSE(b["scenario"]["models"][i].contains("kind")) << i;
    EXPECT_EQ(b["scenario"]["models"][i]["spec_ref"], a["scenario"]["models"][i]["spec_ref"]);
    EXPECT_EQ(b["scenario"]["models"][i]["compute"], a["scenario"]["models"][i]["compute"]);
  }
  EXPECT_LT(second.size() * 4, first.size()) << second.size() << " vs " << first.size();
  // Both read back as the case the plain request carries.
  const std::string plain = nlohmann::json::parse(request_line(s, 1))["scenario"].dump();
  EXPECT_EQ(scenario_to_json(read_request(first, store, catalog), -1), scenario_to_json(scenario_from_json(nlohmann::json::parse(plain), catalog, "x"), -1));
  EXPECT_EQ(scenario_to_json(read_request(second, store, catalog), -1), scenario_to_json(read_request(first, store, catalog), -1));
  // After a restart the process holds nothing: everything is sent again.
  refs.reset();
  EXPECT_TRUE(nlohmann::json::parse(request_line(s, 3, refs))["scenario"]["models"][0].contains("modules"));
}

TEST(PredictorProtocol, BeyondItsCapacityTheLeastRecentlyUsedSpecIsForgotten) {
  Catalog catalog;
  SpecRefs refs(2);
  SpecStore store;
  std::vector<Scenario> cases;
  for (std::uint64_t seed = 1; cases.size() < 3 && seed < 100; ++seed) {
    Scenario s = generated(seed, catalog, "comfy:dec2025");
    if (s.models.size() != 1) continue;
    bool fresh = true;
    for (const Scenario& c : cases) fresh &= scenario_to_json(c) != scenario_to_json(s);
    if (fresh) cases.push_back(std::move(s));
  }
  ASSERT_EQ(cases.size(), 3u);
  const auto send = [&](const Scenario& s, std::uint64_t id) {
    const std::string line = request_line(s, id, refs);
    (void)read_request(line, store, catalog);
    return nlohmann::json::parse(line);
  };
  EXPECT_FALSE(send(cases[0], 1).contains("forget"));
  EXPECT_FALSE(send(cases[1], 2).contains("forget"));
  const std::uint64_t ref0 = nlohmann::json::parse(request_line(cases[0], 3, refs))["scenario"]["models"][0]["spec_ref"];
  // cases[0] was just used again: the third spec pushes out cases[1]'s.
  const nlohmann::json third = send(cases[2], 4);
  ASSERT_TRUE(third.contains("forget"));
  ASSERT_EQ(third["forget"].size(), 1u);
  EXPECT_NE(third["forget"][0], ref0);
  EXPECT_EQ(refs.held(), 2u);
  EXPECT_EQ(store.specs.size(), 2u);
  // A reference to what was forgotten is an error naming the field.
  nlohmann::json stale = nlohmann::json::parse(request_line(cases[0], 5, refs));
  stale["scenario"]["models"][0]["spec_ref"] = third["forget"][0];
  try {
    (void)read_request(stale.dump(), store, catalog);
    ADD_FAILURE() << "read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("request.scenario.models[0].spec_ref: spec"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("was never sent, or was forgotten"), std::string::npos) << e.what();
  }
  // A scenario file never carries one.
  nlohmann::json file = nlohmann::json::parse(scenario_to_json(cases[0]));
  file["models"][0]["spec_ref"] = 1;
  try {
    (void)parse_scenario_json(file.dump(), catalog, "case.json");
    ADD_FAILURE() << "read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("only a predictor-protocol request names a spec_ref"), std::string::npos) << e.what();
  }
}

TEST(PredictorProtocol, AReplyMayNameModulesByIndex) {
  Catalog catalog;
  const Scenario s = generated(3, catalog, "comfy:dec2025");
  const Plan p = predict(s);
  const nlohmann::json by_name = reparsed(plan_json(s, p)), by_index = reparsed(plan_json(s, p, true));
  EXPECT_TRUE(by_index["loads"][0]["resident"].empty() || by_index["loads"][0]["resident"][0].is_number());
  EXPECT_EQ(plan_json(s, plan_from_json(JsonIn(by_index, "reply.plan"), s)), plan_json(s, plan_from_json(JsonIn(by_name, "reply.plan"), s)));
  nlohmann::json bad = by_index;
  bad["loads"][0]["resident"] = {s.models[p.loads[0].model].spec->modules.size()};
  try {
    (void)plan_from_json(JsonIn(bad, "reply.plan"), s);
    ADD_FAILURE() << "read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("reply.plan.loads[0].resident[0]: module index {} is out of range",
                                                     s.models[p.loads[0].model].spec->modules.size())),
              std::string::npos)
        << e.what();
  }
  bad["loads"][0]["resident"] = {0, 0};
  try {
    (void)plan_from_json(JsonIn(bad, "reply.plan"), s);
    ADD_FAILURE() << "read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("reply.plan.loads[0].resident[1]: module \"0 ("), std::string::npos) << e.what();
  }
}

// What parse_hello says of `text`: its error, or "accepted".
std::string hello_error(const std::string& text) {
  try {
    (void)parse_hello(nlohmann::json::parse(text), "hello");
  } catch (const InputError& e) {
    return std::string(e.what());
  }
  return std::string("accepted");
}

TEST(PredictorProtocol, AHelloSaysWhichOverridesItApplies) {
  const std::string head = R"({"schema": "vramfuzz.predictor/1", "type": "hello", "name": "p", "version": "1", "runtime": "comfy:dec2025")";
  const PredictorHello silent = parse_hello(nlohmann::json::parse(head + "}"), "hello");
  EXPECT_FALSE(silent.overrides.has_value());
  EXPECT_TRUE(silent.honours("dequant_term"));  // it did not say: everything is sent, as before
  const PredictorHello h =
      parse_hello(nlohmann::json::parse(head + R"(, "supports": {"overrides": ["reserve", "num_streams", "from_a_later_vramfuzz"]}})"),
                  "hello");
  ASSERT_TRUE(h.overrides.has_value());
  EXPECT_EQ(h.overrides->size(), 3u);
  EXPECT_TRUE(h.honours("reserve"));
  EXPECT_TRUE(h.honours("num_streams"));
  EXPECT_FALSE(h.honours("dequant_term"));
  EXPECT_FALSE(h.spec_refs);
  const PredictorHello none = parse_hello(nlohmann::json::parse(head + R"(, "supports": {"overrides": []}})"), "hello");
  EXPECT_FALSE(none.honours("reserve"));
  EXPECT_EQ(unhonoured_override_message(none, "reserve"),
            "the external predictor \"p\" does not apply the override `reserve` (its hello's supports.overrides: none); it would plan "
            "the case as if it were not set");
  // The hello line vramfuzz writes (predict-serve) says the same.
  const PredictorHello back = parse_hello(nlohmann::json::parse(hello_line(h)), "hello");
  EXPECT_EQ(back.overrides, h.overrides);
  EXPECT_EQ(hello_line(silent).find("supports"), std::string::npos);
  // Malformed lists name the field.
  EXPECT_NE(hello_error(head + R"(, "supports": {"overrides": "reserve"}})").find("hello.supports.overrides"), std::string::npos);
  EXPECT_NE(hello_error(head + R"(, "supports": {"overrides": ["reserve", 7]}})").find("hello.supports.overrides[1]"), std::string::npos);
  EXPECT_NE(hello_error(head + R"(, "supports": {"overrides": [""]}})").find("hello.supports.overrides[0]: an override name of 1 to 64"),
            std::string::npos);
}

// The keys a policy takes are the keys apply_policy_override accepts for it (one list, so the
// hello predict-serve writes cannot drift from what its requests can carry).
TEST(PredictorProtocol, EveryOverrideKeyAPolicyListsIsOneItAccepts) {
  const std::map<std::string_view, std::string_view> value = {
      {"reserve", "600MiB"},       {"inference_floor", "1GiB"},  {"weight_floor", "128MiB"},  {"min_weight_ratio", "0.5"},
      {"unload_factor", "1.5"},    {"cfg_mult", "2"},            {"cond_batch_safety", "1.2"}, {"lora_math_factor", "1"},
      {"account", "lookahead"},    {"dequant_term", "false"},    {"num_streams", "2"},         {"flash_attention", "true"},
      {"lora_patch_dtype", "fp32"}, {"patch_sync", "true"},      {"exact_reserve", "bound"},   {"vram_headroom", "256MiB"},
      {"poll_ms", "50"},           {"malloc_headroom", "64MiB"}};
  const std::map<std::string, std::size_t> expected = {
      {"comfy:dec2025", 14}, {"exact:dec2025", 15}, {"comfy:feb2026", 15}, {"comfy:sep2026", 17}};
  for (const auto& [label, count] : expected) {
    Policy p = parse_policy(label, "--policy");
    const auto keys = policy_override_keys(p);
    EXPECT_EQ(keys.size(), count) << label;
    for (const std::string_view k : keys) {
      ASSERT_TRUE(value.count(k)) << k;
      EXPECT_NO_THROW(apply_policy_override(p, k, value.at(k), "--set")) << label << " " << k;
    }
    // And a key it does not list is refused.
    for (const auto& [k, v] : value) {
      if (std::find(keys.begin(), keys.end(), k) != keys.end()) continue;
      Policy q = parse_policy(label, "--policy");
      EXPECT_THROW(apply_policy_override(q, k, v, "--set"), InputError) << label << " " << k;
    }
  }
}

// ---- predictor processes -----------------------------------------------------------------------

std::string faulty(const std::string& mode, const std::string& extra = "") {
  return fmt::format("exec:python3 {}/tests/predictors/faulty_predictor.py {}{}", VF_SOURCE_DIR, mode, extra.empty() ? "" : " " + extra);
}

// A small classic case under the predictor `policy` starts.
Scenario case_under(const std::string& policy, std::uint64_t seed = 5) {
  Catalog catalog;
  Scenario s = generated(seed, catalog, "comfy:dec2025");
  const auto overrides = s.policy.overrides;
  s.policy = parse_policy(policy, "--policy");
  for (const auto& [k, v] : overrides) apply_policy_override(s.policy, k, v, "policy");
  return s;
}

class ExternalPredictor : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = external_settings();
    ExternalSettings fast = saved_;
    fast.reply_timeout_s = 0.5;
    set_external_settings(fast);
    backend_ = make_backend("sim");
  }
  void TearDown() override { set_external_settings(saved_); }
  Verdict run(const Scenario& s) { return run_case(s, *backend_, false).verdict; }
  ExternalSettings saved_;
  std::unique_ptr<Backend> backend_;
};

TEST_F(ExternalPredictor, AWorkingPredictorsPlanIsLoweredAndJudged) {
  const Scenario s = case_under(faulty("ok"));
  EXPECT_EQ(s.policy.label(), "exec:faulty-ok");
  EXPECT_EQ(s.policy.external_version, "1");
  const CaseResult r = run_case(s, *backend_, false);
  EXPECT_NE(r.verdict.kind, VerdictKind::error) << r.verdict.message;
  // Everything resident, no offload buffer: the minimal planner's plan, with its log line.
  ASSERT_FALSE(r.plan.loads.empty());
  EXPECT_EQ(r.plan.loads[0].offload_buffer, 0u);
  EXPECT_EQ(r.plan.loads[0].loaded, s.models[r.plan.loads[0].model].spec->bytes);
  EXPECT_EQ(r.plan.loads[0].log_line.rfind("loaded completely; ", 0), 0u) << r.plan.loads[0].log_line;
  EXPECT_EQ(r.plan.reserve, 0u);
}

TEST_F(ExternalPredictor, ATimeoutIsTheCasesErrorAndThePredictorIsRestarted) {
  const Scenario s = case_under(faulty("timeout"));
  const Verdict v = run(s);
  EXPECT_EQ(v.kind, VerdictKind::error);
  EXPECT_NE(v.message.find("external predictor \"faulty-timeout\": no reply within 0.5 s"), std::string::npos) << v.message;
}

TEST_F(ExternalPredictor, ACrashSaysHowItExited) {
  const Scenario s = case_under(faulty("crash"));
  const Verdict v = run(s);
  EXPECT_EQ(v.kind, VerdictKind::error);
  EXPECT_NE(v.message.find("exited with status 3"), std::string::npos) << v.message;
}

TEST_F(ExternalPredictor, OneThatKeepsFailingIsGivenUpAndStopsTheCampaign) {
  const Scenario s = case_under(faulty("crash", "again"));
  CaseResult r1 = run_case(s, *backend_, false), r2 = run_case(s, *backend_, false), r3 = run_case(s, *backend_, false);
  EXPECT_FALSE(r1.exec.fatal);
  EXPECT_FALSE(r2.exec.fatal);
  EXPECT_TRUE(r3.exec.fatal);
  EXPECT_NE(r3.verdict.message.find("failed on 3 cases in a row, given up"), std::string::npos) << r3.verdict.message;
  const CaseResult r4 = run_case(s, *backend_, false);
  EXPECT_TRUE(r4.exec.fatal);
  EXPECT_NE(r4.verdict.message.find("was given up"), std::string::npos) << r4.verdict.message;
}

TEST_F(ExternalPredictor, ACrashedPredictorIsRestartedForTheNextCase) {
  const std::filesystem::path state = std::filesystem::temp_directory_path() / fmt::format("vf-crash-once-{}", ::getpid());
  std::filesystem::remove(state);
  const Scenario s = case_under(faulty("crash-once", state.string()));
  const Verdict first = run(s);
  EXPECT_EQ(first.kind, VerdictKind::error);
  const Verdict second = run(s);
  EXPECT_NE(second.kind, VerdictKind::error) << second.message;
  std::filesystem::remove(state);
}

TEST_F(ExternalPredictor, AMalformedReplyIsNamed) {
  Verdict v = run(case_under(faulty("malformed")));
  EXPECT_EQ(v.kind, VerdictKind::error);
  EXPECT_NE(v.message.find("its reply is not JSON"), std::string::npos) << v.message;
  EXPECT_NE(v.message.find("{this is not json"), std::string::npos) << v.message;
  v = run(case_under(faulty("unknown-module")));
  EXPECT_NE(v.message.find("malformed reply: reply.plan.loads[0].resident[0]: unknown module \"no.such.module\""), std::string::npos)
      << v.message;
  v = run(case_under(faulty("both")));
  EXPECT_NE(v.message.find("reply.plan.loads[0].lowvram: module"), std::string::npos) << v.message;
  EXPECT_NE(v.message.find("also in resident"), std::string::npos) << v.message;
  v = run(case_under(faulty("bad-id")));
  EXPECT_NE(v.message.find("reply.id: is not the request's id"), std::string::npos) << v.message;
}

TEST_F(ExternalPredictor, AnErrorReplyIsTheCasesErrorWithItsMessage) {
  const Scenario s = case_under(faulty("error"));
  for (int i = 0; i < 4; ++i) {  // not a failure of the process: never given up
    const CaseResult r = run_case(s, *backend_, false);
    EXPECT_EQ(r.verdict.kind, VerdictKind::error);
    EXPECT_FALSE(r.exec.fatal);
    EXPECT_NE(r.verdict.message.find("could not plan the case: no planner for this model family"), std::string::npos) << r.verdict.message;
  }
}

// A predictor that lists the overrides it applies gets the ones it lists, and a case that sets
// another is refused: from a flag before anything runs, from a file as that case's error.
TEST_F(ExternalPredictor, AnOverrideThePredictorDoesNotApplyIsRefusedNotSent) {
  Scenario s = case_under(faulty("honours-reserve"));
  ASSERT_EQ(s.policy.label(), "exec:faulty-honours-reserve");
  ASSERT_TRUE(s.policy.overrides.empty());
  apply_policy_override(s.policy, "reserve", "600MiB", "--reserve");
  const CaseResult r = run_case(s, *backend_, false);
  ASSERT_NE(r.verdict.kind, VerdictKind::error) << r.verdict.message;
  EXPECT_EQ(r.plan.reserve, 600 * MiB);  // sent, and applied by the predictor
  try {
    apply_policy_override(s.policy, "dequant_term", "false", "--set");
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--set dequant_term: the external predictor \"faulty-honours-reserve\" does not apply the override `dequant_term` (its "
              "hello's supports.overrides: reserve); it would plan the case as if it were not set");
  }
  // A key that is wrong in itself says so first; the policy is left as it was.
  try {
    apply_policy_override(s.policy, "dequant_trem", "false", "--set");
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--set dequant_trem: unknown policy constant"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(s.policy.constants.dequant_term);
  EXPECT_EQ(s.policy.overrides.size(), 1u);
  // The generator's overrides are flags too (fuzz --set, calibrate's reserve).
  EXPECT_THROW(apply_policy_override(s.policy, "num_streams", "2", "policy"), InputError);
  // A file (a repro made before the predictor stopped applying it): it loads, and the case is an
  // error that names the override; it is not sent, and the predictor is never given up for it.
  nlohmann::json doc = nlohmann::json::parse(scenario_to_json(s));
  doc["policy"]["overrides"]["dequant_term"] = false;
  Catalog catalog;
  const Scenario from_file = parse_scenario_json(doc.dump(), catalog, "case.json");
  ASSERT_EQ(from_file.policy.overrides.size(), 2u);
  for (int i = 0; i < 4; ++i) {
    const CaseResult e = run_case(from_file, *backend_, false);
    EXPECT_EQ(e.verdict.kind, VerdictKind::error);
    EXPECT_FALSE(e.exec.fatal);
    EXPECT_NE(e.verdict.message.find("does not apply the override `dequant_term` (its hello's supports.overrides: reserve)"),
              std::string::npos)
        << e.verdict.message;
  }
  // The same predictor still plans the case without it.
  EXPECT_NE(run_case(s, *backend_, false).verdict.kind, VerdictKind::error);
}

// Pipelining: the predictor answers request k only once request k+1 has arrived (else an error
// reply after 0.3 s), so a campaign that waited for each reply before sending the next request
// would get an error on every case. The last case has no next one: its error is the only one.
TEST_F(ExternalPredictor, ACampaignSendsTheNextCasesRequestBeforeItWaitsForThisOnes) {
  for (const std::uint32_t knee_every : {0u, 1u}) {
    SCOPED_TRACE(knee_every);
    Catalog catalog;
    CampaignConfig cfg;
    cfg.seed = 3;
    cfg.cases = 8;
    cfg.knee_every = knee_every;  // 1: every passing case's pair, sent ahead with it
    cfg.shrink = false;
    cfg.gen.policy = parse_policy_list(faulty("needs-ahead"), "--policy");
    const CampaignResult r = run_campaign(cfg, catalog, *backend_);
    EXPECT_EQ(r.cases, 8u);
    if (knee_every == 0) {
      EXPECT_EQ(r.errors, 1u) << "the campaign waited for a reply before sending the next request";
    } else {
      // The last request is the last case's pair, answered (with the error) only if that case
      // passed; a pair whose smaller half failed would re-run its larger half unannounced (none
      // of these eight does).
      EXPECT_GT(r.knee_pairs, 3u);
      EXPECT_LE(r.errors, 1u) << "the campaign waited for a reply before sending the next request";
    }
  }
}

TEST_F(ExternalPredictor, RequestsSentAheadAreClaimedInAnyOrderAndAnAbandonedOneIsDropped) {
  const Scenario s1 = case_under(faulty("ok"), 5), s2 = case_under(faulty("ok"), 6), s3 = case_under(faulty("ok"), 7);
  const std::string want1 = plan_json(s1, predict(s1)).dump(), want3 = plan_json(s3, predict(s3)).dump();
  SentAhead a1 = send_external_ahead(s1), a2 = send_external_ahead(s2), a3 = send_external_ahead(s3);
  ASSERT_TRUE(a1.sent() && a2.sent() && a3.sent());
  EXPECT_EQ(plan_json(s3, predict_external(s3, &a3)).dump(), want3);  // the replies to 1 and 2 are kept meanwhile
  EXPECT_FALSE(a3.sent());                                            // claimed
  a2.abandon();
  EXPECT_FALSE(a2.sent());
  EXPECT_EQ(plan_json(s1, predict_external(s1, &a1)).dump(), want1);
  // A request not sent (or abandoned) is sent at its claim; the dropped reply is not taken for it.
  EXPECT_EQ(plan_json(s2, predict_external(s2, &a2)).dump(), plan_json(s2, predict(s2)).dump());
  // A built-in case sends nothing ahead.
  Catalog catalog;
  EXPECT_FALSE(send_external_ahead(generated(5, catalog, "comfy:dec2025")).sent());
}

TEST_F(ExternalPredictor, ARequestLostWithACrashedProcessIsSentAgainToTheNextOne) {
  const std::filesystem::path state = std::filesystem::temp_directory_path() / fmt::format("vf-ahead-crash-once-{}", ::getpid());
  std::filesystem::remove(state);
  const Scenario s1 = case_under(faulty("crash-once", state.string()), 5), s2 = case_under(faulty("crash-once", state.string()), 6);
  SentAhead a1 = send_external_ahead(s1), a2 = send_external_ahead(s2);
  ASSERT_TRUE(a1.sent() && a2.sent());
  const CaseResult r1 = run_case(s1, *backend_, false, &a1);
  EXPECT_EQ(r1.verdict.kind, VerdictKind::error);
  EXPECT_NE(r1.verdict.message.find("exited with status 3"), std::string::npos) << r1.verdict.message;
  // a2 went to the process that crashed: the restarted one gets it anew, and answers.
  const CaseResult r2 = run_case(s2, *backend_, false, &a2);
  EXPECT_NE(r2.verdict.kind, VerdictKind::error) << r2.verdict.message;
  std::filesystem::remove(state);
}

// Stuck on a request sent before this case's: that request's failure. This case is asked again
// of a fresh process (which here hangs on it too: its own timeout, so two in all).
TEST_F(ExternalPredictor, ATimeoutBehindAnEarlierRequestIsAskedAgainOfAFreshProcess) {
  // Its own process (the other timeout test's is killed, and nothing is sent ahead to a stopped one).
  const Scenario s1 = case_under(faulty("timeout", "ahead"), 5), s2 = case_under(faulty("timeout", "ahead"), 6);
  SentAhead a1 = send_external_ahead(s1), a2 = send_external_ahead(s2);
  ASSERT_TRUE(a1.sent() && a2.sent());
  const auto start = std::chrono::steady_clock::now();
  const Verdict v = run_case(s2, *backend_, false, &a2).verdict;
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1000));
  EXPECT_EQ(v.kind, VerdictKind::error);
  EXPECT_NE(v.message.find("external predictor \"faulty-timeout-ahead\": no reply within 0.5 s (--predictor-timeout)"), std::string::npos)
      << v.message;
  EXPECT_FALSE(a1.live());  // lost with the first process
}

// The predictor answers in order: a request queued behind others gets the whole timeout from the
// reply before it, not from when it was sent (0.5 s here; four 0.2 s plans ahead of it, 1 s in all).
TEST_F(ExternalPredictor, ARequestQueuedBehindOthersHasItsOwnTimeout) {
  std::vector<Scenario> cases;
  std::vector<SentAhead> ahead;
  for (std::uint64_t seed = 5; seed < 9; ++seed) cases.push_back(case_under(faulty("slow"), seed));
  for (const Scenario& s : cases) ahead.push_back(send_external_ahead(s));
  const Verdict v = run(case_under(faulty("slow"), 9));  // asked now, answered fifth
  EXPECT_NE(v.kind, VerdictKind::error) << v.message;
  // Not by a restart (which would ask this case again of a fresh process and lose the others).
  for (const SentAhead& a : ahead) EXPECT_TRUE(a.live()) << "restarted: the queued request did not get its own timeout";
  for (std::size_t k = 0; k < cases.size(); ++k) EXPECT_NE(run_case(cases[k], *backend_, false, &ahead[k]).verdict.kind, VerdictKind::error);
}

// Waits up to 10 s for `marker` (the faulty predictor touches it as it exits), then a moment more.
void wait_for(const std::filesystem::path& marker) {
  for (int k = 0; k < 1000 && !std::filesystem::exists(marker); ++k) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(std::filesystem::exists(marker)) << marker;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

// A reply already written is read even when a later request sent ahead found the pipe broken; the
// death is reported at once even where a helper it started keeps its stdout open (-orphan).
TEST_F(ExternalPredictor, AReplyWrittenBeforeTheProcessDiedIsStillRead) {
  for (const char* mode : {"crash-after-1", "crash-after-1-orphan"}) {
    SCOPED_TRACE(mode);
    const std::filesystem::path state = std::filesystem::temp_directory_path() / fmt::format("vf-broken-pipe-{}-{}", mode, ::getpid());
    std::filesystem::remove(state);
    std::filesystem::remove(state.string() + ".exited");
    const std::string cmd = faulty(mode, state.string());
    const Scenario s1 = case_under(cmd, 5), s2 = case_under(cmd, 6), s3 = case_under(cmd, 7);
    SentAhead a1 = send_external_ahead(s1), a2 = send_external_ahead(s2);
    ASSERT_TRUE(a1.sent() && a2.sent());
    wait_for(state.string() + ".exited");  // it answered 1 and exited on 2
    SentAhead a3 = send_external_ahead(s3);  // into the closed pipe
    const CaseResult r1 = run_case(s1, *backend_, false, &a1);
    EXPECT_NE(r1.verdict.kind, VerdictKind::error) << r1.verdict.message;
    const auto start = std::chrono::steady_clock::now();
    const CaseResult r2 = run_case(s2, *backend_, false, &a2);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(450));  // not the 0.5 s timeout
    EXPECT_EQ(r2.verdict.kind, VerdictKind::error);
    EXPECT_NE(r2.verdict.message.find("exited with status 3"), std::string::npos) << r2.verdict.message;
    std::filesystem::remove(state);
    std::filesystem::remove(state.string() + ".exited");
  }
}

// After a restart, the cases queued behind are sent again (in run order) and nothing is charged
// to a case that did not fail: a campaign whose predictor dies once, on its second request.
TEST_F(ExternalPredictor, ACampaignGoesOnAfterARestartWithoutAnError) {
  const std::filesystem::path state = std::filesystem::temp_directory_path() / fmt::format("vf-campaign-restart-{}", ::getpid());
  std::filesystem::remove(state);
  Catalog catalog;
  CampaignConfig cfg;
  cfg.seed = 3;
  cfg.cases = 12;
  cfg.knee_every = 1;
  cfg.shrink = false;
  cfg.gen.policy = parse_policy_list(faulty("crash-second-once", state.string()), "--policy");
  const CampaignResult r = run_campaign(cfg, catalog, *backend_);
  EXPECT_TRUE(std::filesystem::exists(state));  // it did die once
  EXPECT_EQ(r.cases, 12u);
  // Its second request was case 0's pair (sent ahead with case 0): that pair's claim is the
  // counted one when case 0 passes; otherwise the pair was abandoned and nothing is an error.
  EXPECT_LE(r.errors, 1u);
  EXPECT_TRUE(r.fatal_error.empty()) << r.fatal_error;
  std::filesystem::remove(state);
}

// A process that dies on a request sent before this case's (here another case's, sent ahead)
// fails that request, not this case: this one is asked again of a fresh process, and the case
// whose request it died on is asked again at its own claim.
TEST_F(ExternalPredictor, AFailureOnAnEarlierRequestIsNotTheWaitingCasesError) {
  const std::filesystem::path state = std::filesystem::temp_directory_path() / fmt::format("vf-second-once-{}", ::getpid());
  std::filesystem::remove(state);
  const std::string cmd = faulty("crash-second-once", state.string());
  const Scenario s1 = case_under(cmd, 5), s2 = case_under(cmd, 6), s3 = case_under(cmd, 7);
  SentAhead a1 = send_external_ahead(s1), a2 = send_external_ahead(s2);
  ASSERT_TRUE(a1.sent() && a2.sent());
  const CaseResult r3 = run_case(s3, *backend_, false);  // behind 1 (answered) and 2 (it dies on it)
  EXPECT_NE(r3.verdict.kind, VerdictKind::error) << r3.verdict.message;
  EXPECT_TRUE(std::filesystem::exists(state));
  const CaseResult r1 = run_case(s1, *backend_, false, &a1), r2 = run_case(s2, *backend_, false, &a2);
  EXPECT_NE(r1.verdict.kind, VerdictKind::error) << r1.verdict.message;  // lost with the process: sent again
  EXPECT_NE(r2.verdict.kind, VerdictKind::error) << r2.verdict.message;
  std::filesystem::remove(state);
}

TEST_F(ExternalPredictor, AWrongSchemaOrNoHelloCannotStart) {
  try {
    (void)parse_policy(faulty("schema"), "--policy");
    ADD_FAILURE() << "started";
  } catch (const PredictorError& e) {
    EXPECT_TRUE(e.fatal());
    EXPECT_NE(std::string(e.what()).find("hello.schema: the predictor speaks \"vramfuzz.predictor/2\"; this vramfuzz speaks "
                                         "\"vramfuzz.predictor/1\""),
              std::string::npos)
        << e.what();
  }
  try {
    (void)parse_policy(faulty("no-hello"), "--policy");
    ADD_FAILURE() << "started";
  } catch (const PredictorError& e) {
    EXPECT_NE(std::string(e.what()).find("said no hello: closed its stdout; it exited with status 5"), std::string::npos) << e.what();
  }
}

TEST_F(ExternalPredictor, AFileNamesItsPredictorButNeverStartsACommand) {
  Scenario s = case_under(faulty("ok"));
  const std::string text = scenario_to_json(s);
  const nlohmann::json doc = nlohmann::json::parse(text);
  EXPECT_EQ(doc["policy"]["name"], "exec:faulty-ok");
  EXPECT_EQ(doc["policy"]["version"], "1");
  EXPECT_EQ(doc["policy"]["runtime"], "comfy:dec2025");
  EXPECT_EQ(text.find("faulty_predictor.py"), std::string::npos);
  // Read back while that predictor runs: the same case.
  Catalog catalog;
  const Scenario back = parse_scenario_json(text, catalog, "case.json");
  EXPECT_EQ(back.policy.label(), "exec:faulty-ok");
  EXPECT_EQ(scenario_to_json(back), text);
  // A name no flag started: the file loads, and predicting says what to give.
  nlohmann::json other = doc;
  other["policy"]["name"] = "exec:python3 -c 'import os; os.system(\"touch /tmp/vf-pwned\")'";
  const Scenario foreign = parse_scenario_json(other.dump(), catalog, "case.json");
  try {
    (void)predict(foreign);
    ADD_FAILURE() << "predicted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("vramfuzz never starts a command a file names: give it with --predictor COMMAND (replay, shrink) or --policy exec:COMMAND"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists("/tmp/vf-pwned"));
}

TEST_F(ExternalPredictor, TextFromAFileNeverStartsAPredictor) {
  const std::filesystem::path marker = std::filesystem::temp_directory_path() / fmt::format("vf-started-{}", ::getpid());
  std::filesystem::remove(marker);
  // What recovery and the summary read back from run.json: a name, parsed without starting it.
  try {
    (void)parse_policy(fmt::format("exec:touch {}", marker.string()), "run.json.config.policy", StartCommand::refuse);
    ADD_FAILURE() << "parsed";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("run.json.config.policy: names the external predictor \"touch "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("a file never starts a command"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(marker));
  // One a flag started is found by its name.
  (void)parse_policy(faulty("ok"), "--policy");
  EXPECT_EQ(parse_policy("exec:faulty-ok", "run.json.config.policy", StartCommand::refuse).label(), "exec:faulty-ok");
}

// The first case, from seed 1 on, that is a finding under the minimal planner (everything
// resident, 1 GiB for activations): the shrinker's input below.
Scenario a_finding(Backend& backend) {
  for (std::uint64_t seed = 1; seed < 200; ++seed) {
    Scenario s = case_under(faulty("ok"), seed);
    if (run_case(s, backend, false).verdict.finding()) return s;
  }
  ADD_FAILURE() << "no finding in 200 seeds";
  return {};
}

TEST_F(ExternalPredictor, AShrinkWhosePredictorStopsAnsweringKeepsTheFinding) {
  const Scenario found = a_finding(*backend_);
  ASSERT_FALSE(found.models.empty());
  const std::string signature = run_case(found, *backend_, false).verdict.signature;
  // The same case under a predictor that answers once (the shrinker's first run) and then replies
  // with errors to every plan the shrinker asks for, candidates and inspections alike.
  Scenario s = found;
  {
    const Policy p = parse_policy(faulty("error-after-1"), "--policy");
    s.policy.external_name = p.external_name;
  }
  ShrinkOptions opt;
  opt.max_execs = 60;
  const ShrinkResult r = shrink(s, *backend_, opt);
  EXPECT_EQ(r.signature, signature);
  EXPECT_EQ(case_size(r.minimal), case_size(s));  // nothing could be checked, so nothing was removed
  // One that crashes on every request after the first is given up: the shrink ends at once with
  // the case it had.
  const std::filesystem::path state = std::filesystem::temp_directory_path() / fmt::format("vf-crash-after-{}", ::getpid());
  std::filesystem::remove(state);
  {
    const Policy p = parse_policy(faulty("crash-after-1", state.string()), "--policy");
    s.policy.external_name = p.external_name;
  }
  const ShrinkResult g = shrink(s, *backend_, opt);
  EXPECT_EQ(g.signature, signature);
  EXPECT_TRUE(g.budget_exhausted);
  EXPECT_EQ(case_size(g.minimal), case_size(s));
  std::filesystem::remove(state);
}

// The shrinker's bisection sends the tries that follow a rejection to an external predictor while
// the one before runs (most are rejected): the shrink runs the same candidates in the same order,
// and ends at the same case, as a shrink that asks one candidate at a time. predict-serve's
// planner is the built-in one, so the built-in shrink is that reference.
TEST_F(ExternalPredictor, AShrinkSendsItsBisectionAheadAndEndsWhereTheBuiltInShrinkEnds) {
  const std::string served = fmt::format("exec:{} predict-serve --policy comfy:dec2025", VF_CLI);
  Catalog catalog;
  // The first generated classic finding whose shrink bisects a module list (accepts a drop).
  ShrinkOptions opt;
  opt.max_execs = 120;
  opt.max_seconds = 600;
  Scenario found;
  ShrinkResult builtin;
  const auto bisected = [](const ShrinkResult& r) {
    return std::any_of(r.log.begin(), r.log.end(), [](const std::string& l) { return l.rfind("drop modules", 0) == 0 || l.rfind("drop walk", 0) == 0; });
  };
  for (std::uint64_t seed = 1; seed < 400 && found.models.empty(); ++seed) {
    const Scenario s = generated(seed, catalog, "comfy:dec2025");
    if (!run_case(s, *backend_, false).verdict.finding()) continue;
    builtin = shrink(s, *backend_, opt);
    if (bisected(builtin)) found = s;
  }
  ASSERT_FALSE(found.models.empty());

  Scenario s = found;
  const auto overrides = s.policy.overrides;
  s.policy = parse_policy(served, "--policy");
  for (const auto& [k, v] : overrides) apply_policy_override(s.policy, k, v, "policy");
  const ExternalCounts before = external_counts(s.policy.external_name);
  const ShrinkResult external = shrink(s, *backend_, opt);
  const ExternalCounts after = external_counts(s.policy.external_name);

  EXPECT_EQ(external.signature, builtin.signature);
  EXPECT_EQ(external.executions, builtin.executions);
  EXPECT_EQ(external.accepted, builtin.accepted);
  EXPECT_EQ(external.log, builtin.log);
  EXPECT_EQ(case_size(external.minimal), case_size(builtin.minimal));
  Scenario same = external.minimal;
  same.policy = builtin.minimal.policy;  // the policy's name is all that differs
  EXPECT_EQ(scenario_fingerprint(same), scenario_fingerprint(builtin.minimal));
  // Sent ahead: at least a quarter of the candidates run were claimed from requests sent ahead;
  // what an acceptance left unclaimed was abandoned, never run.
  const std::uint64_t claimed = after.claimed_ahead - before.claimed_ahead;
  EXPECT_GE(claimed * 4, external.executions) << claimed << " of " << external.executions;
  EXPECT_GE(after.requests - before.requests, external.executions + (after.abandoned - before.abandoned));
}

TEST(PredictorProtocol, AStagingSliceMustLieInsideTheVbar) {
  Catalog catalog;
  // The first generated dynamic case with a dynamic load.
  for (std::uint64_t seed = 1; seed < 100; ++seed) {
    const Scenario s = generated(seed, catalog, "comfy:sep2026");
    const nlohmann::ordered_json good = plan_json(s, predict(s));
    std::size_t k = 0;
    while (k < good["loads"].size() && !good["loads"][k].contains("staging")) ++k;
    if (k == good["loads"].size()) continue;
    const auto error_of = [&](const nlohmann::ordered_json& bad) { return plan_error(bad, s); };
    EXPECT_EQ(error_of(good), "accepted");
    const std::uint64_t vbar = good["loads"][k]["staging"]["vbar_request"];
    nlohmann::ordered_json bad = good;
    bad["loads"][k]["staging"]["slice_offset"][0] = vbar - 4096;
    bad["loads"][k]["staging"]["slice_size"][0] = 8192;
    EXPECT_NE(error_of(bad).find(fmt::format("reply.plan.loads[{}].staging.slice_size[0]: the slice at {} of 8192 bytes ends past the "
                                             "VBAR's {} bytes (vbar_request)",
                                             k, vbar - 4096, vbar)),
              std::string::npos)
        << error_of(bad);
    bad = good;
    bad["loads"][k]["staging"]["vbar_request"] = std::uint64_t{1} << 62;
    EXPECT_NE(error_of(bad).find(fmt::format("reply.plan.loads[{}].staging.vbar_request", k)), std::string::npos) << error_of(bad);
    bad = good;
    bad["loads"][k]["offload_buffer"] = std::uint64_t{1} << 62;
    EXPECT_NE(error_of(bad).find(fmt::format("reply.plan.loads[{}].offload_buffer", k)), std::string::npos) << error_of(bad);
    return;
  }
  FAIL() << "no dynamic load in 100 generated sep2026 cases";
}

TEST(PredictorProtocol, AnExecPolicyTakesTheRestOfAPolicyList) {
  const auto list = split_policy_list("comfy:dec2025,exec:sh -c 'echo a,b'");
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[1], "exec:sh -c 'echo a,b'");
}

}  // namespace
}  // namespace vf
