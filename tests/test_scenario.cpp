// The `vramfuzz.scenario/1` loader (harness/scenario.h): the example loads and round-trips, inline
// models and policies survive a write + read unchanged, and every malformed input is an InputError
// that names the offending field exactly as the user wrote it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "harness/core/error.h"
#include "harness/generate.h"
#include "harness/scenario.h"
#include "models/catalog.h"

namespace vf {
namespace {

using nlohmann::json;

const std::string kExample = std::string(VF_SOURCE_DIR) + "/docs/examples/flux2-te-fp8-fp32-12gib.json";

// A small valid scenario: one catalog text encoder, explicit pipeline.
json base_catalog() {
  return json::parse(R"({
    "schema": "vramfuzz.scenario/1",
    "name": "base",
    "device": {"name": "test", "total": "12GiB"},
    "allocator": {"mode": "raw"},
    "policy": "comfy:dec2025",
    "models": [{"id": "te", "source": "catalog:clip-l", "compute": "fp16"}],
    "workload": {"width": 1024, "height": 1024, "batch": 1},
    "pipeline": [{"op": "load", "model": "te"}, {"op": "forward", "model": "te"}]
  })");
}

// A small valid scenario with one inline model of three modules.
json base_inline() {
  return json::parse(R"({
    "schema": "vramfuzz.scenario/1",
    "device": {"total": "8GiB", "used_by_others": "512MiB", "context_overhead": 300000000},
    "allocator": "raw",
    "policy": "comfy:nov2025",
    "models": [{
      "id": "tiny",
      "kind": "text_encoder",
      "family": "generic",
      "memory_usage_factor": 1.25,
      "arch": {"hidden": 64, "widest": 256, "text_tokens": 77, "gated": true},
      "compute": "bf16",
      "modules": [
        {"name": "embed", "tensors": [{"name": "weight", "shape": [1000, 64], "dtype": "fp16", "role": "embedding"}]},
        {"name": "blocks.0.fc", "tensors": [
          {"name": "weight", "shape": [256, 64], "dtype": "fp8_e4m3fn"},
          {"name": "bias", "shape": [256], "dtype": "fp16"},
          {"name": "scale_weight", "shape": [], "dtype": "fp32", "role": "scale"}]},
        {"name": "blocks.0.q", "tensors": [{"name": "weight", "shape": [64, 512], "dtype": "q4_k"}]},
        {"name": "final_norm", "cast_hook": false, "tensors": [{"name": "weight", "shape": [64], "dtype": "fp32"}]}
      ]
    }],
    "workload": {"width": 512, "height": 768, "batch": 2, "frames": 1, "cfg": 3.5, "text_tokens": 77},
    "offload_streams": 1,
    "pipeline": [{"op": "load", "model": "tiny"}, {"op": "forward", "model": "tiny"}, {"op": "unload", "model": "tiny"}]
  })");
}

Scenario load(const json& doc) {
  Catalog catalog;
  return parse_scenario_json(doc.dump(), catalog, "test.json");
}

Scenario load_text(std::string_view text) {
  Catalog catalog;
  return parse_scenario_json(text, catalog, "test.json");
}

// Loads `text`, expects an InputError whose path() is exactly `path` and whose message contains
// every one of `needles`; returns the message for further checks.
std::string expect_error_text(std::string_view text, const std::string& path,
                              std::initializer_list<std::string_view> needles) {
  try {
    (void)load_text(text);
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), path) << "message: " << e.what();
    const std::string what = e.what();
    if (!path.empty()) {
      EXPECT_EQ(what.rfind(path + ": ", 0), 0u) << "the message must start with the path: " << what;
    }
    for (std::string_view n : needles) EXPECT_NE(what.find(n), std::string::npos) << "missing \"" << n << "\" in: " << what;
    return what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected vf::InputError at " << path << ", got another exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "expected vf::InputError at " << path << ", but the scenario loaded";
  return {};
}

std::string expect_error(const json& doc, const std::string& path, std::initializer_list<std::string_view> needles) {
  return expect_error_text(doc.dump(), path, needles);
}

// ---- loading and round-tripping ---------------------------------------------------------------

TEST(Scenario, LoadsTheExample) {
  Catalog catalog;
  const Scenario s = load_scenario_file(kExample, catalog);
  EXPECT_EQ(s.device.name, "RTX 3060 12GB (sim)");
  EXPECT_EQ(s.device.total, 12 * GiB);
  EXPECT_EQ(s.device.used_by_others, 0u);
  EXPECT_EQ(s.device.context_overhead, 287047680u);
  EXPECT_EQ(s.device.available(), 12 * GiB - 287047680u);
  EXPECT_EQ(s.allocator.mode, AllocatorMode::raw);
  EXPECT_TRUE(s.allocator.options.empty());
  EXPECT_EQ(s.policy.predictor, PredictorKind::comfy);
  EXPECT_EQ(s.policy.preset, Preset::oct2025);
  EXPECT_EQ(s.policy.label(), "comfy:oct2025");
  ASSERT_EQ(s.models.size(), 1u);
  const ModelRef& te = s.models[0];
  EXPECT_EQ(te.id, "te");
  EXPECT_EQ(te.source, "catalog:flux2-text-encoder");
  EXPECT_EQ(te.storage.dtype, Dtype::fp8_e4m3fn);
  EXPECT_TRUE(te.storage.scaled);
  EXPECT_TRUE(te.storage_given);
  EXPECT_EQ(te.compute, Dtype::fp32);
  EXPECT_FALSE(te.lora);
  ASSERT_NE(te.spec, nullptr);
  EXPECT_GT(te.spec->bytes, 12 * GiB);  // the fp8 Mistral encoder does not fit a 12 GiB card
  EXPECT_EQ(s.workload.width, 1024u);
  EXPECT_EQ(s.workload.height, 1024u);
  EXPECT_EQ(s.workload.batch, 1u);
  EXPECT_EQ(s.workload.cfg, 1.0);
  ASSERT_TRUE(s.offload_streams.has_value());
  EXPECT_EQ(*s.offload_streams, 2u);
  EXPECT_EQ(s.streams(), 2u);  // the scenario's value wins over oct2025's NUM_STREAMS 0
  ASSERT_EQ(s.stages.size(), 2u);
  EXPECT_EQ(s.stages[0].op, StageOp::load);
  EXPECT_EQ(s.stages[1].op, StageOp::forward);
  EXPECT_EQ(s.stages[1].model, 0u);
}

TEST(Scenario, ExampleRoundTrips) {
  Catalog catalog;
  const Scenario s = load_scenario_file(kExample, catalog);
  const std::string text = scenario_to_json(s);
  const json written = json::parse(text);
  EXPECT_EQ(written["schema"], "vramfuzz.scenario/1");
  EXPECT_EQ(written["device"]["total"], "12GiB");
  EXPECT_EQ(written["policy"], "comfy:oct2025");
  EXPECT_EQ(written["models"][0]["storage"], "fp8_e4m3fn");
  EXPECT_EQ(written["models"][0]["scaled"], true);
  const Scenario again = parse_scenario_json(text, catalog, "roundtrip.json");
  EXPECT_EQ(scenario_to_json(again), text);
  EXPECT_EQ(again.models[0].spec->bytes, s.models[0].spec->bytes);
  // The compact form (what finding files embed) reads back to the same scenario too.
  EXPECT_EQ(scenario_to_json(parse_scenario_json(scenario_to_json(s, -1), catalog, "compact")), text);
}

TEST(Scenario, DefaultsWhenOptionalFieldsAreAbsent) {
  const Scenario s = load_text(R"({"device": {"total": 8589934592}, "models": [{"source": "catalog:clip-l"}]})");
  EXPECT_EQ(s.device.total, 8 * GiB);
  EXPECT_EQ(s.device.context_overhead, kDefaultContextOverhead);
  EXPECT_EQ(s.policy.label(), "comfy:dec2025");
  EXPECT_EQ(s.models[0].id, "clip-l");  // the catalog name
  EXPECT_FALSE(s.models[0].storage_given);
  EXPECT_EQ(s.models[0].compute, Dtype::bf16);
  ASSERT_EQ(s.stages.size(), 2u);  // load + forward of each model
  EXPECT_EQ(s.stages[0].op, StageOp::load);
  EXPECT_EQ(s.stages[1].op, StageOp::forward);
  EXPECT_FALSE(s.offload_streams.has_value());
  EXPECT_EQ(s.streams(), 2u);  // dec2025's NUM_STREAMS
}

TEST(Scenario, InlineModelRoundTripsExactly) {
  const Scenario s = load(base_inline());
  ASSERT_EQ(s.models.size(), 1u);
  const ModelRef& m = s.models[0];
  EXPECT_EQ(m.id, "tiny");
  EXPECT_EQ(m.source, "inline");
  EXPECT_EQ(m.compute, Dtype::bf16);
  const ModelSpec& spec = *m.spec;
  EXPECT_EQ(spec.kind, ModelKind::text_encoder);
  EXPECT_EQ(spec.family, Family::generic);
  EXPECT_EQ(spec.memory_usage_factor, 1.25);
  EXPECT_EQ(spec.arch.hidden, 64u);
  EXPECT_EQ(spec.arch.widest, 256u);
  EXPECT_EQ(spec.arch.text_tokens, 77u);
  EXPECT_TRUE(spec.arch.gated);
  ASSERT_EQ(spec.modules.size(), 4u);

  const Module& embed = spec.modules[0];
  EXPECT_EQ(embed.name, "embed");
  ASSERT_EQ(embed.tensors.size(), 1u);
  EXPECT_EQ(embed.tensors[0].shape, (std::vector<std::uint64_t>{1000, 64}));
  EXPECT_EQ(embed.tensors[0].dtype, Dtype::fp16);
  EXPECT_EQ(embed.tensors[0].role, TensorRole::embedding);
  EXPECT_EQ(embed.bytes, 1000u * 64 * 2);

  const Module& fc = spec.modules[1];
  EXPECT_EQ(fc.name, "blocks.0.fc");
  EXPECT_TRUE(fc.cast_hook);
  ASSERT_EQ(fc.tensors.size(), 3u);
  EXPECT_EQ(fc.tensors[0].name, "weight");
  EXPECT_EQ(fc.tensors[0].dtype, Dtype::fp8_e4m3fn);
  EXPECT_EQ(fc.tensors[0].role, TensorRole::weight);
  EXPECT_EQ(fc.tensors[0].bytes, 256u * 64);
  EXPECT_EQ(fc.tensors[1].name, "bias");
  EXPECT_EQ(fc.tensors[1].role, TensorRole::bias);  // 1-D "bias" without a role
  EXPECT_EQ(fc.tensors[1].bytes, 512u);
  EXPECT_TRUE(fc.tensors[2].shape.empty());  // a scalar
  EXPECT_EQ(fc.tensors[2].role, TensorRole::scale);
  EXPECT_EQ(fc.tensors[2].bytes, 4u);
  EXPECT_EQ(fc.bytes, 256u * 64 + 512 + 4);

  const Module& q = spec.modules[2];
  EXPECT_EQ(q.tensors[0].dtype, Dtype::q4_k);
  EXPECT_EQ(q.tensors[0].bytes, 64u * 2 * 144);  // 512 per row = 2 blocks of 256, 144 B each

  const Module& norm = spec.modules[3];
  EXPECT_FALSE(norm.cast_hook);
  EXPECT_EQ(norm.tensors[0].role, TensorRole::norm);  // 1-D non-bias without a role
  EXPECT_EQ(spec.bytes, embed.bytes + fc.bytes + q.bytes + 64 * 4);

  EXPECT_EQ(s.device.used_by_others, 512 * MiB);
  EXPECT_EQ(s.device.context_overhead, 300000000u);
  EXPECT_EQ(s.workload.width, 512u);
  EXPECT_EQ(s.workload.height, 768u);
  EXPECT_EQ(s.workload.batch, 2u);
  EXPECT_EQ(s.workload.cfg, 3.5);
  EXPECT_EQ(s.workload.text_tokens, 77u);
  EXPECT_EQ(s.streams(), 1u);
  ASSERT_EQ(s.stages.size(), 3u);
  EXPECT_EQ(s.stages[2].op, StageOp::unload);

  // Write, read, write: the same text, and the same model tensor by tensor.
  const std::string text = scenario_to_json(s);
  const json written = json::parse(text);
  const json& wt = written["models"][0]["modules"][1]["tensors"];
  EXPECT_EQ(wt[1]["role"], "bias");  // inferred roles are written out explicitly
  EXPECT_EQ(wt[2]["shape"], json::array());
  EXPECT_EQ(written["models"][0]["modules"][3]["cast_hook"], false);
  EXPECT_EQ(written["device"]["used_by_others"], "512MiB");
  EXPECT_EQ(written["device"]["context_overhead"], 300000000);
  Catalog catalog;
  const Scenario again = parse_scenario_json(text, catalog, "roundtrip.json");
  EXPECT_EQ(scenario_to_json(again), text);
  const ModelSpec& a = *again.models[0].spec;
  ASSERT_EQ(a.modules.size(), spec.modules.size());
  for (std::size_t i = 0; i < a.modules.size(); ++i) {
    EXPECT_EQ(a.modules[i].name, spec.modules[i].name);
    EXPECT_EQ(a.modules[i].cast_hook, spec.modules[i].cast_hook);
    EXPECT_EQ(a.modules[i].bytes, spec.modules[i].bytes);
    ASSERT_EQ(a.modules[i].tensors.size(), spec.modules[i].tensors.size());
    for (std::size_t t = 0; t < a.modules[i].tensors.size(); ++t) {
      const Tensor& x = a.modules[i].tensors[t];
      const Tensor& y = spec.modules[i].tensors[t];
      EXPECT_EQ(x.name, y.name);
      EXPECT_EQ(x.shape, y.shape);
      EXPECT_EQ(x.dtype, y.dtype);
      EXPECT_EQ(x.role, y.role);
      EXPECT_EQ(x.bytes, y.bytes);
    }
  }
  EXPECT_EQ(a.kind, spec.kind);
  EXPECT_EQ(a.family, spec.family);
  EXPECT_EQ(a.memory_usage_factor, spec.memory_usage_factor);
  EXPECT_EQ(a.arch.gated, spec.arch.gated);
  EXPECT_EQ(a.params, spec.params);
  EXPECT_EQ(a.bytes, spec.bytes);
}

// PyTorch's expandable_segments:True under the caching mode builds the expandable model; the
// scenario then says so, so its findings are signed caching-expandable, not caching.
TEST(Scenario, ExpandableSegmentsOptionNamesTheExpandableMode) {
  json doc = base_catalog();
  doc["allocator"] = {{"mode", "caching"}, {"options", {{"expandable_segments", "True"}}}};
  Catalog catalog;
  const Scenario s = parse_scenario_json(doc.dump(), catalog, "test.json");
  EXPECT_EQ(s.allocator.mode, AllocatorMode::caching_expandable);
  EXPECT_EQ(json::parse(scenario_to_json(s))["allocator"]["mode"], "caching-expandable");
  doc["allocator"]["options"]["expandable_segments"] = "False";
  EXPECT_EQ(parse_scenario_json(doc.dump(), catalog, "test.json").allocator.mode, AllocatorMode::caching);
}

TEST(Scenario, DocumentBuiltInCodeIsRead) {
  // scenario_from_json takes a json value; one built in code holds signed integers (an int
  // literal is number_integer), and a non-negative one is as good as one parsed from text.
  json doc = base_catalog();
  doc["workload"]["width"] = 512;
  doc["workload"]["batch"] = 2;
  doc["seed"] = 7;
  doc["device"]["total"] = static_cast<std::int64_t>(6 * GiB);
  Catalog catalog;
  const Scenario s = scenario_from_json(doc, catalog, "");
  EXPECT_EQ(s.workload.width, 512u);
  EXPECT_EQ(s.workload.batch, 2u);
  EXPECT_EQ(s.seed, 7u);
  EXPECT_EQ(s.device.total, 6 * GiB);
  doc["seed"] = -1;
  try {
    (void)scenario_from_json(doc, catalog, "");
    ADD_FAILURE() << "a negative seed loaded";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "seed");
    EXPECT_NE(std::string(e.what()).find("negative"), std::string::npos) << e.what();
  }
}

TEST(Scenario, NegativeZeroIsZero) {
  const Scenario s = load_text(R"({"seed": -0, "device": {"total": "4GiB"}, "models": [{"source": "catalog:clip-l"}]})");
  EXPECT_EQ(s.seed, 0u);
}

// ---- policies ---------------------------------------------------------------------------------

TEST(Scenario, PolicyStrings) {
  const Policy oct = parse_policy("comfy:oct2025", "policy");
  EXPECT_EQ(oct.predictor, PredictorKind::comfy);
  EXPECT_EQ(oct.preset, Preset::oct2025);
  EXPECT_EQ(oct.constants.weight_floor, 128 * MiB);
  EXPECT_EQ(oct.constants.num_streams, 0u);
  EXPECT_EQ(oct.constants.account, AccountMode::none);
  EXPECT_FALSE(oct.constants.dequant_term);
  EXPECT_EQ(oct.constants.lora_patch_dtype, Dtype::fp32);
  EXPECT_EQ(oct.constants.reserve, 400 * MiB);
  EXPECT_EQ(oct.constants.inference_floor, 858993459u);  // int(0.8 * 1024^3)
  EXPECT_TRUE(oct.overrides.empty());
  EXPECT_EQ(oct.label(), "comfy:oct2025");

  const Policy nov = parse_policy("comfy:nov2025", "policy");
  EXPECT_EQ(nov.constants.weight_floor, 0u);
  EXPECT_EQ(nov.constants.account, AccountMode::largest);
  EXPECT_EQ(nov.constants.num_streams, 2u);

  const Policy dec = parse_policy("comfy", "policy");  // the preset defaults to dec2025
  EXPECT_EQ(dec.preset, Preset::dec2025);
  EXPECT_EQ(dec.constants.account, AccountMode::lookahead);
  EXPECT_TRUE(dec.constants.dequant_term);
  EXPECT_EQ(dec.constants.lora_patch_dtype, Dtype::fp16);
  EXPECT_EQ(dec.label(), "comfy:dec2025");

  const Policy exact = parse_policy("exact:oct2025", "--policy");
  EXPECT_EQ(exact.predictor, PredictorKind::exact);
  EXPECT_EQ(exact.preset, Preset::oct2025);
  EXPECT_EQ(exact.label(), "exact:oct2025");
  EXPECT_FALSE(exact.exact_reserve.has_value());
}

TEST(Scenario, PolicyOverridesApplyAndRoundTrip) {
  json doc = base_catalog();
  doc["policy"] = json::parse(R"({"name": "comfy:oct2025", "overrides": {
      "reserve": "600MiB", "account": "lookahead", "dequant_term": true, "num_streams": 3,
      "min_weight_ratio": 0.5, "weight_floor": 0, "lora_patch_dtype": "bf16"}})");
  const Scenario s = load(doc);
  const ComfyConstants& c = s.policy.constants;
  EXPECT_EQ(s.policy.label(), "comfy:oct2025");
  EXPECT_EQ(c.reserve, 600 * MiB);
  EXPECT_EQ(c.account, AccountMode::lookahead);
  EXPECT_TRUE(c.dequant_term);
  EXPECT_EQ(c.num_streams, 3u);
  EXPECT_EQ(c.min_weight_ratio, 0.5);
  EXPECT_EQ(c.weight_floor, 0u);
  EXPECT_EQ(c.lora_patch_dtype, Dtype::bf16);
  EXPECT_EQ(c.inference_floor, 858993459u);  // untouched constants keep the preset's value
  EXPECT_EQ(s.streams(), 3u);                 // no offload_streams in the scenario: the policy's
  EXPECT_EQ(s.policy.overrides.size(), 7u);

  const std::string text = scenario_to_json(s);
  const json written = json::parse(text);
  EXPECT_EQ(written["policy"]["name"], "comfy:oct2025");
  EXPECT_EQ(written["policy"]["overrides"]["reserve"], "600MiB");
  EXPECT_EQ(written["policy"]["overrides"]["dequant_term"], true);
  EXPECT_EQ(written["policy"]["overrides"]["num_streams"], 3);
  Catalog catalog;
  const Scenario again = parse_scenario_json(text, catalog, "roundtrip.json");
  EXPECT_EQ(scenario_to_json(again), text);
  EXPECT_EQ(again.policy.constants.reserve, 600 * MiB);
  EXPECT_EQ(again.policy.constants.num_streams, 3u);
  EXPECT_EQ(again.policy.constants.account, AccountMode::lookahead);
  EXPECT_EQ(again.policy.constants.lora_patch_dtype, Dtype::bf16);
}

TEST(Scenario, OverrideOfTheSameKeyKeepsTheLatest) {
  Policy p = parse_policy("exact", "--policy");
  apply_policy_override(p, "reserve", "600MiB", "--set");
  apply_policy_override(p, "flash_attention", "off", "--set");
  apply_policy_override(p, "reserve", "1GiB", "--set");
  ASSERT_TRUE(p.exact_reserve.has_value());
  EXPECT_EQ(*p.exact_reserve, GiB);
  EXPECT_FALSE(p.constants.flash_attention);
  ASSERT_EQ(p.overrides.size(), 2u);
  EXPECT_EQ(p.overrides[0], (std::pair<std::string, std::string>{"reserve", "1GiB"}));
}

TEST(Scenario, PolicyKeyIsTheLabelPlusSortedCanonicalOverrides) {
  auto key = [](std::string_view name, std::initializer_list<std::pair<std::string_view, std::string_view>> overrides) {
    Policy p = parse_policy(name, "policy");
    for (const auto& [k, v] : overrides) apply_policy_override(p, k, v, "policy");
    return p.key();
  };
  EXPECT_EQ(key("comfy:dec2025", {}), "comfy:dec2025");
  EXPECT_EQ(key("comfy:oct2025", {}), "comfy:oct2025");
  // The origin's Dec-04 state is another predictor than stock dec2025.
  EXPECT_EQ(key("comfy:dec2025", {{"dequant_term", "false"}}), "comfy:dec2025 dequant_term=false");
  // Sorted by key, whatever the order given; values in one canonical form.
  EXPECT_EQ(key("comfy:dec2025", {{"weight_floor", "134217728"}, {"dequant_term", "0"}}), "comfy:dec2025 dequant_term=false weight_floor=128MiB");
  EXPECT_EQ(key("comfy:dec2025", {{"dequant_term", "off"}, {"inference_floor", "0.5GiB"}}),
            "comfy:dec2025 dequant_term=false inference_floor=512MiB");
  EXPECT_EQ(key("comfy:dec2025", {{"weight_floor", "1GiB"}, {"cfg_mult", "2.50"}, {"account", "largest"}}),
            "comfy:dec2025 account=largest cfg_mult=2.5 weight_floor=1GiB");
  // The reserve decides how often a gap shows, not which gap: it is not part of the key.
  EXPECT_EQ(key("comfy:dec2025", {{"reserve", "1GiB"}, {"dequant_term", "false"}}), "comfy:dec2025 dequant_term=false");
  // Restating the preset's value is no override.
  EXPECT_EQ(key("comfy:dec2025", {{"dequant_term", "true"}, {"reserve", "400MiB"}}), "comfy:dec2025");
  EXPECT_EQ(key("comfy:oct2025", {{"weight_floor", "128MiB"}}), "comfy:oct2025");
  EXPECT_EQ(key("comfy:dec2025", {{"weight_floor", "128MiB"}}), "comfy:dec2025 weight_floor=128MiB");
  EXPECT_EQ(key("exact", {{"reserve", "400MiB"}}), "exact:dec2025");
  EXPECT_EQ(key("exact:oct2025", {{"exact_reserve", "bound"}}), "exact:oct2025 exact_reserve=bound");
  // What a scenario file says round-trips to the same key.
  Catalog catalog;
  const Scenario s = parse_scenario_json(
      R"({"device": {"total": "12GiB"}, "policy": {"name": "comfy:dec2025", "overrides": {"dequant_term": false}},
          "models": [{"id": "te", "source": "catalog:clip-l"}]})",
      catalog, "test");
  EXPECT_EQ(s.policy.key(), "comfy:dec2025 dequant_term=false");
  EXPECT_EQ(parse_scenario_json(scenario_to_json(s), catalog, "again").policy.key(), s.policy.key());
}

TEST(Scenario, BadOverrideValuesNameTheConstant) {
  Policy p = parse_policy("comfy:dec2025", "policy");
  const auto check = [&](std::string_view key, std::string_view value, std::string_view needle) {
    try {
      apply_policy_override(p, key, value, "policy.overrides");
      ADD_FAILURE() << key << "=" << value << " was accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(e.path(), "policy.overrides." + std::string(key));
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  check("reserve", "-1MiB", "negative");
  check("account", "all", "unknown account mode");
  check("dequant_term", "maybe", "expected true or false");
  check("num_streams", "9", "between 0 and 8");
  check("num_streams", "1.5", "integer");
  check("min_weight_ratio", "nan", "between");
  check("lora_patch_dtype", "fp8_e4m3fn", "fp16, bf16 or fp32");
  // A rejected override changes nothing.
  EXPECT_EQ(p.constants.reserve, 400 * MiB);
  EXPECT_EQ(p.constants.num_streams, 2u);
  EXPECT_EQ(p.constants.account, AccountMode::lookahead);
  EXPECT_TRUE(p.overrides.empty());
}

// ---- malformed input: one test per case --------------------------------------------------------

TEST(ScenarioErrors, TruncatedJson) {
  const std::string full = base_catalog().dump();
  const std::string text = full.substr(0, 40);
  const std::string what = expect_error_text(text, "test.json", {"invalid JSON at byte "});
  // nlohmann reports the (1-based) byte where it stopped: one past the end of the text.
  EXPECT_NE(what.find("invalid JSON at byte " + std::to_string(text.size() + 1) + ":"), std::string::npos) << what;
}

TEST(ScenarioErrors, TrailingGarbage) {
  expect_error_text(base_catalog().dump() + " }", "test.json", {"invalid JSON at byte "});
}

TEST(ScenarioErrors, NotAnObject) {
  expect_error_text("[]", "", {"expected an object, got an array"});
}

TEST(ScenarioErrors, UnknownTopLevelField) {
  json doc = base_catalog();
  doc["modelz"] = json::array();
  expect_error(doc, "modelz", {"unknown field", "models"});
}

TEST(ScenarioErrors, UnknownNestedField) {
  json doc = base_catalog();
  doc["workload"]["widht"] = 512;
  expect_error(doc, "workload.widht", {"unknown field", "width"});
}

// A module with parameters below it (by name) is a container: its own tensors are raw, so it has
// no cast hook unless one is given, and giving one is an error.
TEST(Scenario, ContainerModulesHaveNoCastHook) {
  json doc = base_inline();
  doc["models"][0]["modules"].push_back(json::parse(
      R"({"name": "blocks.0", "tensors": [{"name": "modulation", "shape": [1, 6, 64], "dtype": "bf16", "role": "bias"}]})"));
  const Scenario s = load(doc);
  const ModelSpec& spec = *s.models[0].spec;
  std::vector<bool> containers, hooks;
  for (const Module& m : spec.modules) {
    containers.push_back(m.container);
    hooks.push_back(m.cast_hook);
  }
  EXPECT_EQ(containers, (std::vector<bool>{false, false, false, false, true}));
  EXPECT_EQ(hooks, (std::vector<bool>{true, true, true, false, false}));
  // Written out explicitly, and read back the same.
  const std::string text = scenario_to_json(s);
  EXPECT_EQ(json::parse(text)["models"][0]["modules"][4]["cast_hook"], false);
  EXPECT_EQ(scenario_to_json(load_text(text)), text);

  doc["models"][0]["modules"][4]["cast_hook"] = true;
  expect_error(doc, "models[0].modules[4].cast_hook",
               {"module \"blocks.0\" has parameters below it (\"blocks.0.fc\")", "a container has no cast hook"});
  doc["models"][0]["modules"][4]["cast_hook"] = false;
  EXPECT_FALSE(load(doc).models[0].spec->modules[4].cast_hook);
}

TEST(ScenarioErrors, UnknownFieldInInlineTensor) {
  json doc = base_inline();
  doc["models"][0]["modules"][1]["tensors"][0]["dtpye"] = "fp16";
  expect_error(doc, "models[0].modules[1].tensors[0].dtpye", {"unknown field", "dtype"});
}

TEST(ScenarioErrors, MissingRequiredField) {
  json doc = base_catalog();
  doc.erase("device");
  expect_error(doc, "device", {"required"});
}

TEST(ScenarioErrors, UnknownDtypeInInlineTensor) {
  json doc = base_inline();
  doc["models"][0]["modules"][1]["tensors"][0]["dtype"] = "fp9";
  expect_error(doc, "models[0].modules[1].tensors[0].dtype", {"unknown dtype \"fp9\"", "fp8_e4m3fn", "q4_k"});
}

TEST(ScenarioErrors, NegativeSize) {
  json doc = base_catalog();
  doc["device"]["total"] = -5;
  expect_error(doc, "device.total", {"negative", "-5"});
}

TEST(ScenarioErrors, NegativeSizeString) {
  json doc = base_catalog();
  doc["device"]["used_by_others"] = "-1GiB";
  expect_error(doc, "device.used_by_others", {"negative"});
}

TEST(ScenarioErrors, SizeStringOverflows) {
  json doc = base_catalog();
  doc["device"]["total"] = "99999999999999999999GiB";
  expect_error(doc, "device.total", {"overflows 64 bits", "99999999999999999999GiB"});
}

TEST(ScenarioErrors, SizeStringOverflowsInTheUnit) {
  json doc = base_catalog();
  doc["device"]["total"] = "17179869184GiB";  // 2^34 GiB = 2^64 bytes
  expect_error(doc, "device.total", {"overflows 64 bits"});
}

TEST(ScenarioErrors, SizeWithUnknownUnit) {
  json doc = base_catalog();
  doc["device"]["total"] = "12XB";
  expect_error(doc, "device.total", {"unknown unit \"XB\""});
}

TEST(ScenarioErrors, JsonIntegerBeyond64Bits) {
  std::string text = base_catalog().dump();
  const std::string key = "\"schema\":";
  text.insert(text.find(key), "\"seed\":18446744073709551616,");  // 2^64
  expect_error_text(text, "seed", {"overflows 64 bits"});
}

TEST(ScenarioErrors, JsonSizeBeyond64Bits) {
  std::string text = base_catalog().dump();
  const std::string total = "\"total\":\"12GiB\"";
  ASSERT_NE(text.find(total), std::string::npos);
  text.replace(text.find(total), total.size(), "\"total\":36893488147419103232");  // 2^65
  expect_error_text(text, "device.total", {"overflows 64 bits"});
}

TEST(ScenarioErrors, FractionalInteger) {
  json doc = base_catalog();
  doc["workload"]["batch"] = 1.5;
  expect_error(doc, "workload.batch", {"whole number", "1.5"});
}

TEST(ScenarioErrors, ZeroResolution) {
  json doc = base_catalog();
  doc["workload"]["width"] = 0;
  expect_error(doc, "workload.width", {"between 16 and 16384", "got 0"});
}

TEST(ScenarioErrors, WidthAboveMax) {
  json doc = base_catalog();
  doc["workload"]["width"] = 16385;
  expect_error(doc, "workload.width", {"between 16 and 16384", "got 16385"});
}

TEST(ScenarioErrors, HeightAboveMax) {
  json doc = base_catalog();
  doc["workload"]["height"] = 1u << 20;
  expect_error(doc, "workload.height", {"between 16 and 16384"});
}

TEST(ScenarioErrors, BatchZero) {
  json doc = base_catalog();
  doc["workload"]["batch"] = 0;
  expect_error(doc, "workload.batch", {"between 1 and 64", "got 0"});
}

TEST(ScenarioErrors, UnknownCatalogModel) {
  json doc = base_catalog();
  doc["models"][0]["source"] = "catalog:flux3-dev";
  const std::string what = expect_error(doc, "models[0].source", {"unknown model \"flux3-dev\""});
  for (const CatalogEntry& e : catalog_entries()) {
    EXPECT_NE(what.find(std::string(e.name)), std::string::npos) << "the message should list " << e.name << ": " << what;
  }
}

TEST(ScenarioErrors, UnknownModelSource) {
  json doc = base_catalog();
  doc["models"][0]["source"] = "hub:flux1-dev";
  expect_error(doc, "models[0].source", {"unknown source \"hub:flux1-dev\"", "catalog:NAME"});
}

TEST(ScenarioErrors, CatalogModelWithInlineFields) {
  json doc = base_catalog();
  doc["models"][0]["modules"] = json::array();
  // "modules" makes the model inline by default, but the source says catalog: a contradiction.
  expect_error(doc, "models[0].modules", {"not allowed with a catalog model"});
}

TEST(ScenarioErrors, UnknownAllocatorMode) {
  json doc = base_catalog();
  doc["allocator"]["mode"] = "slab";
  expect_error(doc, "allocator.mode", {"unknown allocator mode \"slab\"", "caching-expandable"});
}

TEST(ScenarioErrors, UnknownAllocatorModeString) {
  json doc = base_catalog();
  doc["allocator"] = "slab";
  expect_error(doc, "allocator", {"unknown allocator mode \"slab\""});
}

TEST(ScenarioErrors, AllocatorModeNamesAndPyTorchBackendNames) {
  // PyTorch's own backend names (PYTORCH_CUDA_ALLOC_CONF=backend:native | backend:cudaMallocAsync)
  // are accepted and documented; nothing else.
  json doc = base_catalog();
  doc["allocator"] = "native";
  EXPECT_EQ(load(doc).allocator.mode, AllocatorMode::caching);
  doc["allocator"] = "cudaMallocAsync";
  EXPECT_EQ(load(doc).allocator.mode, AllocatorMode::async);
  doc["allocator"] = {{"mode", "cudaMallocAsync"}, {"options", {{"pool_granularity", "32MiB"}}}};
  EXPECT_EQ(load(doc).allocator.mode, AllocatorMode::async);
  // Written back under the project's own name.
  EXPECT_NE(scenario_to_json(load(doc)).find("\"mode\": \"async\""), std::string::npos);
  for (const char* undocumented : {"expandable", "caching_expandable", "ASYNC", "Native"}) {
    SCOPED_TRACE(undocumented);
    doc["allocator"] = undocumented;
    // The message lists every accepted name, the PyTorch ones included.
    expect_error(doc, "allocator", {"unknown allocator mode", "raw, caching, caching-expandable or async", "native", "cudaMallocAsync"});
  }
}

TEST(ScenarioErrors, NullIsNotTheDefault) {
  // Each of these used to load as if the field were absent: "allocator": null ran as raw.
  const std::vector<std::pair<std::string, std::function<void(json&)>>> cases = {
      {"allocator", [](json& d) { d["allocator"] = nullptr; }},
      {"allocator.options", [](json& d) { d["allocator"] = {{"mode", "caching"}, {"options", nullptr}}; }},
      {"policy", [](json& d) { d["policy"] = nullptr; }},
      {"policy.overrides", [](json& d) { d["policy"] = {{"name", "comfy:dec2025"}, {"overrides", nullptr}}; }},
      {"seed", [](json& d) { d["seed"] = nullptr; }},
      {"name", [](json& d) { d["name"] = nullptr; }},
      {"schema", [](json& d) { d["schema"] = nullptr; }},
      {"workload", [](json& d) { d["workload"] = nullptr; }},
      {"workload.batch", [](json& d) { d["workload"]["batch"] = nullptr; }},
      {"offload_streams", [](json& d) { d["offload_streams"] = nullptr; }},
      {"pipeline", [](json& d) { d["pipeline"] = nullptr; }},
      {"device.name", [](json& d) { d["device"]["name"] = nullptr; }},
      {"device.context_overhead", [](json& d) { d["device"]["context_overhead"] = nullptr; }},
      {"models[0].id", [](json& d) { d["models"][0]["id"] = nullptr; }},
      {"models[0].storage", [](json& d) { d["models"][0]["storage"] = nullptr; }},
      {"models[0].scaled", [](json& d) { d["models"][0]["scaled"] = nullptr; }},
      {"models[0].compute", [](json& d) { d["models"][0]["compute"] = nullptr; }},
      {"models[0].lora", [](json& d) { d["models"][0]["lora"] = nullptr; }},
      {"models[0].source", [](json& d) { d["models"][0]["source"] = nullptr; }},
  };
  for (const auto& [path, edit] : cases) {
    SCOPED_TRACE(path);
    json doc = base_catalog();
    edit(doc);
    expect_error(doc, path, {"null is not allowed"});
  }
  // Inside an inline model, and where a value is required (null is the wrong type there).
  json doc = base_inline();
  doc["models"][0]["modules"][1]["tensors"][0]["role"] = nullptr;
  expect_error(doc, "models[0].modules[1].tensors[0].role", {"null is not allowed"});
  doc = base_inline();
  doc["models"][0]["arch"]["hidden"] = nullptr;
  expect_error(doc, "models[0].arch.hidden", {"null is not allowed"});
  doc = base_catalog();
  doc["device"]["total"] = nullptr;
  expect_error(doc, "device.total", {"got null"});
  doc["device"]["total"] = "12GiB";
  doc["allocator"] = {{"mode", "caching"}, {"options", {{"max_split_size_mb", nullptr}}}};
  expect_error(doc, "allocator.options.max_split_size_mb", {"got null"});
}

TEST(ScenarioErrors, DuplicateKeysAreErrors) {
  // nlohmann keeps the last value of a key given twice: {"total":"24GiB","total":"8GiB"} ran as an
  // 8 GiB device. docs/allocators.md: "a key given twice ... is an input error".
  expect_error_text(R"({"device": {"total": "24GiB", "total": "8GiB"}, "models": [{"source": "catalog:clip-l"}]})",
                    "device.total", {"key given twice", "test.json"});
  expect_error_text(R"({"device": {"total": "24GiB"}, "models": [{"source": "catalog:clip-l"}],
                        "allocator": {"mode": "async", "options": {"pool_granularity": "32MiB", "pool_granularity": "2MiB"}}})",
                    "allocator.options.pool_granularity", {"key given twice"});
  expect_error_text(R"({"device": {"total": "24GiB"}, "models": [{"source": "catalog:clip-l"}, {"id": "b", "id": "c", "source": "catalog:t5xxl"}]})",
                    "models[1].id", {"key given twice"});
  expect_error_text(R"({"device": {"total": "24GiB"}, "models": [{"source": "catalog:clip-l"}],
                        "pipeline": [{"op": "load", "model": "clip-l"}, [], {"op": "forward", "op": "unload", "model": "clip-l"}]})",
                    "pipeline[2].op", {"key given twice"});
  expect_error_text(R"({"seed": 1, "device": {"total": "24GiB"}, "seed": 2, "models": [{"source": "catalog:clip-l"}]})", "seed",
                    {"key given twice"});
  // The same key in different objects is no duplicate.
  EXPECT_NO_THROW(load_text(R"({"name": "a", "device": {"name": "a", "total": "4GiB"}, "models": [{"source": "catalog:clip-l"}]})"));
}

TEST(ScenarioErrors, ScaledIsForFp8AndInt8StorageOnly) {
  // docs/formats.md: `scaled` (fp8/int8 only). true with bf16 or a GGUF type describes no real file.
  for (const char* storage : {"bf16", "fp16", "q4_0", "q8_0"}) {
    SCOPED_TRACE(storage);
    json doc = base_catalog();
    doc["models"][0]["storage"] = storage;
    doc["models"][0]["scaled"] = true;
    expect_error(doc, "models[0].scaled", {"fp8 and int8 storage only", storage});
    doc["models"][0]["scaled"] = false;  // what such storage is anyway
    EXPECT_NO_THROW(load(doc));
  }
  // The release dtype counts when storage is not given: clip-l is fp16.
  json doc = base_catalog();
  doc["models"][0]["scaled"] = true;
  expect_error(doc, "models[0].scaled", {"fp8 and int8 storage only", "fp16"});
  for (const char* storage : {"fp8_e4m3fn", "fp8_e5m2", "int8"}) {
    SCOPED_TRACE(storage);
    doc["models"][0]["storage"] = storage;
    doc["models"][0]["scaled"] = true;
    EXPECT_TRUE(load(doc).models[0].storage.scaled);
    doc["models"][0]["scaled"] = false;
    EXPECT_FALSE(load(doc).models[0].storage.scaled);
  }
}

TEST(ScenarioErrors, UnknownPolicy) {
  json doc = base_catalog();
  doc["policy"] = "vllm:dec2025";
  expect_error(doc, "policy", {"unknown predictor \"vllm:dec2025\"", "comfy:oct2025"});
}

TEST(ScenarioErrors, UnknownPreset) {
  json doc = base_catalog();
  doc["policy"] = "comfy:jan2026";
  expect_error(doc, "policy", {"unknown preset \"jan2026\"", "oct2025"});
}

TEST(ScenarioErrors, UnknownPresetInPolicyObject) {
  json doc = base_catalog();
  doc["policy"] = {{"name", "exact:jan2026"}};
  expect_error(doc, "policy.name", {"unknown preset \"jan2026\""});
}

TEST(ScenarioErrors, UnknownPolicyConstant) {
  json doc = base_catalog();
  doc["policy"] = json::parse(R"({"name": "comfy:dec2025", "overrides": {"reserve": "600MiB", "reserv": "1GiB"}})");
  expect_error(doc, "policy.overrides.reserv", {"unknown policy constant", "reserve", "num_streams"});
}

TEST(ScenarioErrors, BadPolicyOverrideValue) {
  json doc = base_catalog();
  doc["policy"] = json::parse(R"({"name": "comfy:dec2025", "overrides": {"reserve": "lots"}})");
  expect_error(doc, "policy.overrides.reserve", {"not a size: \"lots\""});
}

TEST(ScenarioErrors, ShapeDimensionZero) {
  json doc = base_inline();
  doc["models"][0]["modules"][1]["tensors"][0]["shape"] = {256, 0};
  expect_error(doc, "models[0].modules[1].tensors[0].shape[1]", {"at least 1"});
}

TEST(ScenarioErrors, ShapeDimensionNegative) {
  json doc = base_inline();
  doc["models"][0]["modules"][0]["tensors"][0]["shape"] = {-1000, 64};
  expect_error(doc, "models[0].modules[0].tensors[0].shape[0]", {"negative"});
}

TEST(ScenarioErrors, ShapeProductOverflows) {
  json doc = base_inline();
  doc["models"][0]["modules"][1]["tensors"][0] = {
      {"name", "weight"}, {"shape", {4294967296ull, 4294967296ull, 16}}, {"dtype", "fp32"}};
  expect_error(doc, "models[0].modules[1].tensors[0].shape", {"overflows 64 bits"});
}

TEST(ScenarioErrors, ShapeBytesOverflow) {
  // 2^62 elements fit in 64 bits; 2^62 fp32 elements (2^64 bytes) do not.
  json doc = base_inline();
  doc["models"][0]["modules"][1]["tensors"][0] = {
      {"name", "weight"}, {"shape", {2147483648ull, 2147483648ull}}, {"dtype", "fp32"}};
  expect_error(doc, "models[0].modules[1].tensors[0].shape", {"overflows 64 bits"});
}

TEST(ScenarioErrors, ModelBytesOverflowWhenSummed) {
  // Each tensor is 2^63 bytes (fits); the second one takes the model's total past 2^64. The error
  // names the tensor that does it, not an internal total.
  json doc = base_inline();
  json& mods = doc["models"][0]["modules"];
  mods[0]["tensors"][0] = {{"name", "weight"}, {"shape", {2305843009213693952ull}}, {"dtype", "fp32"}, {"role", "weight"}};
  mods[2]["tensors"][0] = {{"name", "weight"}, {"shape", {2305843009213693952ull}}, {"dtype", "fp32"}};
  expect_error(doc, "models[0].modules[2].tensors[0]", {"overflows 64 bits"});
}

TEST(ScenarioErrors, ModuleBytesOverflowWhenSummed) {
  json doc = base_inline();
  json& t = doc["models"][0]["modules"][1]["tensors"];
  t[0] = {{"name", "weight"}, {"shape", {2305843009213693952ull}}, {"dtype", "fp32"}, {"role", "weight"}};
  t[1] = {{"name", "bias"}, {"shape", {2305843009213693952ull}}, {"dtype", "fp32"}};
  expect_error(doc, "models[0].modules[1].tensors[1]", {"overflows 64 bits"});
}

TEST(ScenarioErrors, ModelAboveTheSizeLimit) {
  json doc = base_inline();
  doc["models"][0]["modules"][1]["tensors"][0] = {{"name", "weight"}, {"shape", {1ull << 47, 4}}, {"dtype", "fp32"}};
  expect_error(doc, "models[0].modules", {"bytes, more than the", "limit"});
}

TEST(ScenarioErrors, EmptyModule) {
  json doc = base_inline();
  doc["models"][0]["modules"][2]["tensors"] = json::array();
  expect_error(doc, "models[0].modules[2].tensors", {"at least one tensor"});
}

TEST(ScenarioErrors, DuplicateModelIds) {
  json doc = base_catalog();
  doc["models"].push_back({{"id", "te"}, {"source", "catalog:t5xxl"}});
  expect_error(doc, "models[1].id", {"duplicate model id \"te\""});
}

TEST(ScenarioErrors, DuplicateDefaultModelIds) {
  json doc = base_catalog();
  doc["models"] = json::parse(R"([{"source": "catalog:clip-l"}, {"source": "catalog:clip-l", "storage": "fp16"}])");
  doc.erase("pipeline");
  expect_error(doc, "models[1].id", {"duplicate model id \"clip-l\"", "give each model an \"id\""});
}

TEST(ScenarioErrors, PipelineNamesUnknownModel) {
  json doc = base_catalog();
  doc["pipeline"][1]["model"] = "dit";
  expect_error(doc, "pipeline[1].model", {"no model with id \"dit\""});
}

TEST(ScenarioErrors, UnknownStageOp) {
  json doc = base_catalog();
  doc["pipeline"][1]["op"] = "sample";
  expect_error(doc, "pipeline[1].op", {"unknown stage op \"sample\""});
}

TEST(ScenarioErrors, ForwardBeforeLoad) {
  json doc = base_catalog();
  doc["pipeline"] = json::parse(R"([{"op": "forward", "model": "te"}, {"op": "load", "model": "te"}])");
  expect_error(doc, "pipeline[0]", {"forward of \"te\" before it is loaded"});
}

TEST(ScenarioErrors, ForwardAfterUnload) {
  json doc = base_catalog();
  doc["pipeline"].push_back({{"op", "unload"}, {"model", "te"}});
  doc["pipeline"].push_back({{"op", "forward"}, {"model", "te"}});
  expect_error(doc, "pipeline[3]", {"forward of \"te\" before it is loaded"});
}

TEST(ScenarioErrors, EmptyPipeline) {
  json doc = base_catalog();
  doc["pipeline"] = json::array();
  expect_error(doc, "pipeline", {"at least one stage"});
}

TEST(ScenarioErrors, OffloadStreamsNine) {
  json doc = base_catalog();
  doc["offload_streams"] = 9;
  expect_error(doc, "offload_streams", {"between 0 and 8", "got 9"});
}

TEST(ScenarioErrors, UsedByOthersAtLeastTotal) {
  json doc = base_catalog();
  doc["device"]["used_by_others"] = "12GiB";
  expect_error(doc, "device.used_by_others", {"leave nothing of the 12 GiB device"});
}

TEST(ScenarioErrors, ContextOverheadFillsTheDevice) {
  json doc = base_catalog();
  doc["device"]["used_by_others"] = "11GiB";
  doc["device"]["context_overhead"] = "1GiB";
  expect_error(doc, "device.context_overhead", {"leave nothing"});
}

TEST(ScenarioErrors, DeviceTotalZero) {
  json doc = base_catalog();
  doc["device"]["total"] = "0GiB";
  expect_error(doc, "device.total", {"greater than 0"});
}

TEST(ScenarioErrors, Fp8AsCompute) {
  json doc = base_catalog();
  doc["models"][0]["compute"] = "fp8_e4m3fn";
  expect_error(doc, "models[0].compute", {"fp8_e4m3fn is not a compute dtype", "fp32, fp16 or bf16"});
}

TEST(ScenarioErrors, WrongJsonTypeStringForNumber) {
  json doc = base_catalog();
  doc["workload"]["width"] = "1024";
  expect_error(doc, "workload.width", {"expected a non-negative integer", "string \"1024\""});
}

TEST(ScenarioErrors, WrongJsonTypeBooleanForSize) {
  json doc = base_catalog();
  doc["device"]["total"] = true;
  expect_error(doc, "device.total", {"expected a size", "a boolean"});
}

TEST(ScenarioErrors, WrongJsonTypeObjectForModels) {
  json doc = base_catalog();
  doc["models"] = {{"te", "catalog:clip-l"}};
  expect_error(doc, "models", {"expected an array, got an object"});
}

TEST(ScenarioErrors, WrongSchema) {
  json doc = base_catalog();
  doc["schema"] = "vramfuzz.scenario/2";
  expect_error(doc, "schema", {"unsupported schema \"vramfuzz.scenario/2\"", "vramfuzz.scenario/1"});
}

// A finding file embeds its scenario under "scenario": errors inside it carry that prefix,
// including the checks that only make sense once the whole scenario is read (stage order).
class ScenarioCaseFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("vf_test_scenario_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(ScenarioCaseFile, FindingFileReplaysItsScenario) {
  json finding = {{"schema", "vramfuzz.finding/1"}, {"signature", "oom:forward:upcast:raw"}, {"scenario", base_catalog()}};
  Catalog catalog;
  const Scenario s = load_case_file(write("finding.json", finding.dump()), catalog);
  EXPECT_EQ(s.name, "base");
  EXPECT_EQ(s.models[0].id, "te");
  EXPECT_EQ(scenario_to_json(s), scenario_to_json(load(base_catalog())));
}

TEST_F(ScenarioCaseFile, ErrorsInsideAFindingCarryTheScenarioPrefix) {
  Catalog catalog;
  json inner = base_catalog();
  inner["workload"]["batch"] = 0;
  json finding = {{"schema", "vramfuzz.finding/1"}, {"signature", "oom:forward:upcast:raw"}, {"scenario", inner}};
  try {
    (void)load_case_file(write("bad-batch.json", finding.dump()), catalog);
    ADD_FAILURE() << "loaded";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "scenario.workload.batch") << e.what();
  }
  inner = base_catalog();
  inner["pipeline"] = json::parse(R"([{"op": "forward", "model": "te"}])");
  finding["scenario"] = inner;
  try {
    (void)load_case_file(write("bad-order.json", finding.dump()), catalog);
    ADD_FAILURE() << "loaded";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "scenario.pipeline[0]") << e.what();
  }
}

TEST_F(ScenarioCaseFile, NullsAndDuplicateKeysInsideAFindingCarryTheScenarioPrefix) {
  Catalog catalog;
  const std::string dup = write("dup.json", R"({"schema": "vramfuzz.finding/1", "signature": "oom:load:load:raw",
      "scenario": {"device": {"total": "24GiB", "total": "8GiB"}, "models": [{"source": "catalog:clip-l"}]}})");
  try {
    (void)load_case_file(dup, catalog);
    ADD_FAILURE() << "loaded";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "scenario.device.total") << e.what();
    EXPECT_NE(std::string(e.what()).find(dup), std::string::npos) << "names the file: " << e.what();
  }
  json inner = base_catalog();
  inner["allocator"] = nullptr;
  try {
    (void)load_case_file(
        write("null.json", json{{"schema", "vramfuzz.finding/1"}, {"signature", "oom:load:load:raw"}, {"scenario", inner}}.dump()), catalog);
    ADD_FAILURE() << "loaded";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "scenario.allocator") << e.what();
  }
  try {
    (void)load_case_file(
        write("null-scenario.json", json{{"schema", "vramfuzz.repro/1"}, {"signature", "oom:load:load:raw"}, {"scenario", nullptr}}.dump()),
        catalog);
    ADD_FAILURE() << "loaded";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "scenario") << e.what();
  }
}

TEST_F(ScenarioCaseFile, MissingFileNamesIt) {
  Catalog catalog;
  const std::string path = (dir_ / "nope.json").string();
  try {
    (void)load_case_file(path, catalog);
    ADD_FAILURE() << "loaded";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), path);
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos) << e.what();
  }
}


// ---- the structural fingerprint (the shrinker's cache key) -----------------------------------

Scenario generated(std::uint64_t seed, Catalog& catalog, const char* policy) {
  PrngChoices c(seed);
  GenConfig cfg;
  cfg.policy = policy;
  return generate_scenario(c, cfg, catalog);
}

TEST(ScenarioFingerprint, EqualExactlyWhenTheCanonicalJsonIsEqual) {
  Catalog catalog;
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::string> json_of;
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> fp_of;
  FingerprintMemo memo;
  std::size_t inline_models = 0;
  for (std::uint64_t seed = 1; seed <= 400; ++seed) {
    const Scenario s = generated(seed, catalog, seed % 2 ? "comfy:sep2026" : "comfy:oct2025,comfy:dec2025");
    for (const ModelRef& m : s.models) inline_models += m.source == "inline";
    const std::string j = scenario_to_json(s, -1);
    const ScenarioFingerprint f = scenario_fingerprint(s);
    EXPECT_EQ(scenario_fingerprint(s, &memo), f) << "the memo changes nothing";
    const Scenario copy = s;  // NOLINT(performance-unnecessary-copy-initialization): the copy is the point
    EXPECT_EQ(scenario_fingerprint(copy, &memo), f);
    // Written and read back, the scenario is the same case.
    EXPECT_EQ(scenario_fingerprint(parse_scenario_json(j, catalog, "roundtrip")), f) << j.substr(0, 300);
    const auto key = std::make_pair(f.a, f.b);
    if (auto it = json_of.find(key); it != json_of.end()) {
      EXPECT_EQ(it->second, j) << "a collision: two cases, one key";
    }
    if (auto it = fp_of.find(j); it != fp_of.end()) {
      EXPECT_EQ(it->second, key);
    }
    json_of[key] = j;
    fp_of[j] = key;
  }
  EXPECT_GT(inline_models, 50u) << "the generator's synthetic (inline) models are covered";
  EXPECT_GT(json_of.size(), 390u);
}

TEST(ScenarioFingerprint, EveryFieldTheJsonWritesMovesIt) {
  Catalog catalog;
  // A dynamic case with an inline model, events and options, so that every edit below applies.
  Scenario base;
  for (std::uint64_t seed = 1; seed < 2000; ++seed) {
    base = generated(seed, catalog, "comfy:sep2026");
    const bool has_inline = std::any_of(base.models.begin(), base.models.end(), [](const ModelRef& m) {
      return m.source == "inline" && m.spec->modules.size() >= 2 && !m.spec->modules[0].tensors.empty() &&
             !m.spec->modules[0].tensors[0].shape.empty();
    });
    if (has_inline && base.stages.size() >= 2) break;
  }
  std::size_t im = 0;
  while (base.models[im].source != "inline") ++im;
  base.device.events = {OthersEvent{5000, 64 * MiB, true}};
  base.allocator.options = {{"release_threshold", "0"}};
  const auto edit_spec = [im](Scenario& s, const std::function<void(ModelSpec&)>& f) {
    auto spec = std::make_shared<ModelSpec>(*s.models[im].spec);
    f(*spec);
    s.models[im].spec = spec;
  };
  const std::vector<std::pair<std::string, std::function<void(Scenario&)>>> edits = {
      {"name", [](Scenario& s) { s.name += "x"; }},
      {"seed", [](Scenario& s) { s.seed += 1; }},
      {"device.name", [](Scenario& s) { s.device.name += "x"; }},
      {"device.total", [](Scenario& s) { s.device.total += 1; }},
      {"device.used_by_others", [](Scenario& s) { s.device.used_by_others += MiB; }},
      {"device.context_overhead", [](Scenario& s) { s.device.context_overhead += 1; }},
      {"device.h2d_gbps", [](Scenario& s) { s.device.h2d_gbps = 12.5; }},
      {"device.tflops", [](Scenario& s) { s.device.tflops = 50.0; }},
      {"device.events[0].at", [](Scenario& s) { s.device.events[0].at_us += 1000; }},
      {"device.events[0].bytes", [](Scenario& s) { s.device.events[0].bytes += MiB; }},
      {"device.events[0].take", [](Scenario& s) { s.device.events[0].take = false; }},
      {"device.events +1", [](Scenario& s) { s.device.events.push_back(OthersEvent{9000, MiB, false}); }},
      {"allocator.mode", [](Scenario& s) { s.allocator.mode = s.allocator.mode == AllocatorMode::raw ? AllocatorMode::async : AllocatorMode::raw; }},
      {"allocator.options value", [](Scenario& s) { s.allocator.options[0].second = "1"; }},
      {"allocator.options key", [](Scenario& s) { s.allocator.options[0].first = "garbage_collection_threshold"; }},
      {"policy", [](Scenario& s) { s.policy = parse_policy("comfy:feb2026", "policy"); }},
      {"policy.overrides", [](Scenario& s) {
         s.policy.overrides.emplace_back("vram_headroom", "512MiB");
         apply_policy_override(s.policy, "vram_headroom", "512MiB", "policy");
       }},
      {"models[i].id", [im](Scenario& s) { s.models[im].id += "x"; }},
      {"models[i].compute", [im](Scenario& s) { s.models[im].compute = s.models[im].compute == Dtype::fp32 ? Dtype::bf16 : Dtype::fp32; }},
      {"models[i].lora", [im](Scenario& s) { s.models[im].lora = !s.models[im].lora; }},
      {"models[i].patcher", [im](Scenario& s) { s.models[im].legacy = !s.models[im].legacy; }},
      {"models[i].prefetch", [im](Scenario& s) { s.models[im].prefetch = !s.models[im].prefetch; }},
      {"models[i].kind", [&](Scenario& s) { edit_spec(s, [](ModelSpec& m) { m.kind = m.kind == ModelKind::vae ? ModelKind::diffusion : ModelKind::vae; }); }},
      {"models[i].family", [&](Scenario& s) { edit_spec(s, [](ModelSpec& m) { m.family = m.family == Family::flux ? Family::generic : Family::flux; }); }},
      {"models[i].memory_usage_factor", [&](Scenario& s) { edit_spec(s, [](ModelSpec& m) { m.memory_usage_factor += 0.25; }); }},
      {"models[i].arch.hidden", [&](Scenario& s) { edit_spec(s, [](ModelSpec& m) { m.arch.hidden += 1; }); }},
      {"models[i].arch.kept_hidden_states", [&](Scenario& s) { edit_spec(s, [](ModelSpec& m) { m.arch.kept_hidden_states += 1; }); }},
      {"modules[0].name", [&](Scenario& s) { edit_spec(s, [](ModelSpec& m) { m.modules[0].name += "x"; }); }},
      {"modules[0].cast_hook", [&](Scenario& s) { edit_spec(s, [](ModelSpec& m) { m.modules[0].cast_hook = !m.modules[0].cast_hook; }); }},
      {"modules[0] dropped", [&](Scenario& s) { edit_spec(s, [](ModelSpec& m) { m.modules.erase(m.modules.begin()); }); }},
      {"modules swapped", [&](Scenario& s) { edit_spec(s, [](ModelSpec& m) { std::swap(m.modules[0], m.modules[1]); }); }},
      {"tensors[0].name", [&](Scenario& s) { edit_spec(s, [](ModelSpec& m) { m.modules[0].tensors[0].name += "x"; }); }},
      {"tensors[0].shape[0]", [&](Scenario& s) { edit_spec(s, [](ModelSpec& m) { m.modules[0].tensors[0].shape[0] += 1; }); }},
      {"tensors[0].shape +1 dim", [&](Scenario& s) { edit_spec(s, [](ModelSpec& m) { m.modules[0].tensors[0].shape.push_back(1); }); }},
      {"tensors[0].dtype", [&](Scenario& s) { edit_spec(s, [](ModelSpec& m) { auto& d = m.modules[0].tensors[0].dtype; d = d == Dtype::fp16 ? Dtype::bf16 : Dtype::fp16; }); }},
      {"tensors[0].role", [&](Scenario& s) { edit_spec(s, [](ModelSpec& m) { auto& r = m.modules[0].tensors[0].role; r = r == TensorRole::weight ? TensorRole::bias : TensorRole::weight; }); }},
      {"workload.width", [](Scenario& s) { s.workload.width += 64; }},
      {"workload.height", [](Scenario& s) { s.workload.height += 64; }},
      {"workload.batch", [](Scenario& s) { s.workload.batch += 1; }},
      {"workload.frames", [](Scenario& s) { s.workload.frames += 4; }},
      {"workload.cfg", [](Scenario& s) { s.workload.cfg += 1.5; }},
      {"workload.text_tokens", [](Scenario& s) { s.workload.text_tokens += 1; }},
      {"workload.steps", [](Scenario& s) { s.workload.steps += 1; }},
      {"offload_streams", [](Scenario& s) { s.offload_streams = s.offload_streams.value_or(2) + 1; }},
      {"offload_streams unset/set", [](Scenario& s) { s.offload_streams = s.offload_streams ? std::nullopt : std::optional<std::uint32_t>(s.streams()); }},
      {"pipeline order", [](Scenario& s) { std::swap(s.stages[0], s.stages[1]); }},
      {"pipeline +1", [](Scenario& s) { s.stages.push_back(s.stages.back()); }},
  };
  const ScenarioFingerprint f0 = scenario_fingerprint(base);
  const std::string j0 = scenario_to_json(base, -1);
  FingerprintMemo memo;
  for (const auto& [what, edit] : edits) {
    Scenario s = base;
    edit(s);
    ASSERT_NE(scenario_to_json(s, -1), j0) << what << ": the edit must change the case";
    EXPECT_NE(scenario_fingerprint(s), f0) << what;
    EXPECT_NE(scenario_fingerprint(s, &memo), f0) << what << " (memo)";
    EXPECT_EQ(scenario_fingerprint(s, &memo), scenario_fingerprint(s)) << what;
  }
}

// "repeat": N, the compact form of a rounding-sum repro: N copies of one module, NAME.0 ... NAME.(N-1).
TEST(ScenarioRepeat, ExpandsToNumberedCopiesAndWritesThemBack) {
  json doc = base_inline();
  doc["models"][0]["modules"].push_back(json::parse(R"({"name": "pad", "repeat": 212, "tensors": [{"name": "weight", "shape": [1025, 1024], "dtype": "fp16"}]})"));
  const Scenario s = load(doc);
  const ModelSpec& spec = *s.models[0].spec;
  ASSERT_EQ(spec.modules.size(), 4u + 212u);
  EXPECT_EQ(spec.modules[4].name, "pad.0");
  EXPECT_EQ(spec.modules[4 + 211].name, "pad.211");
  // 2 MiB + 2 KiB each: 1025 x 1024 fp16.
  EXPECT_EQ(spec.modules[100].bytes, 2u * MiB + 2048u);
  EXPECT_TRUE(spec.modules[100].cast_hook);
  EXPECT_EQ(repeat_run(spec.modules, 4), 212u);
  EXPECT_EQ(repeat_run(spec.modules, 5), 1u);  // a run starts at NAME.0
  EXPECT_EQ(repeat_run(spec.modules, 0), 1u);
  // Written back as one entry, and read back the same.
  const json out = json::parse(scenario_to_json(s));
  const json& mods = out["models"][0]["modules"];
  ASSERT_EQ(mods.size(), 5u);
  EXPECT_EQ(mods[4]["name"], "pad");
  EXPECT_EQ(mods[4]["repeat"], 212);
  EXPECT_EQ(scenario_fingerprint(load(out)), scenario_fingerprint(s));
  EXPECT_EQ(scenario_to_json(load(out)), scenario_to_json(s));
}

TEST(ScenarioRepeat, IdenticalNumberedModulesAreWrittenAsARunAndOthersAreNot) {
  json doc = base_inline();
  for (int k = 0; k < 3; ++k) {
    doc["models"][0]["modules"].push_back(
        {{"name", fmt::format("blk.{}", k)}, {"tensors", json::array({{{"name", "weight"}, {"shape", {64, 64}}, {"dtype", "bf16"}}})}});
  }
  // Two copies are listed (a run is 3 or more), and a run stops where a module differs.
  doc["models"][0]["modules"].push_back(
      {{"name", "blk.3"}, {"tensors", json::array({{{"name", "weight"}, {"shape", {64, 65}}, {"dtype", "bf16"}}})}});
  const Scenario s = load(doc);
  const json mods = json::parse(scenario_to_json(s))["models"][0]["modules"];
  ASSERT_EQ(mods.size(), 6u);
  EXPECT_EQ(mods[4]["name"], "blk");
  EXPECT_EQ(mods[4]["repeat"], 3);
  EXPECT_EQ(mods[5]["name"], "blk.3");
  EXPECT_FALSE(mods[5].contains("repeat"));
  EXPECT_EQ(scenario_to_json(load(json::parse(scenario_to_json(s)))), scenario_to_json(s));
}

// Names are shown in reports, logs and terminals: a control byte in one (a NUL cut `plan`'s output
// short) is refused, naming the field and the byte.
TEST(ScenarioNames, ControlCharactersInANameAreRefused) {
  json doc = base_inline();
  doc["models"][0]["modules"][1]["name"] = std::string("blocks.0\x00x", 10);
  expect_error(doc, "models[0].modules[1].name", {"must not contain control characters (byte 0x00 at offset 8 of the name)"});
  doc = base_inline();
  doc["models"][0]["modules"][0]["tensors"][0]["name"] = "we\x1b[2Jight";
  expect_error(doc, "models[0].modules[0].tensors[0].name", {"byte 0x1b at offset 2"});
  doc = base_inline();
  doc["models"][0]["id"] = "te\x7f";
  expect_error(doc, "models[0].id", {"byte 0x7f at offset 2"});
  // UTF-8 is not a control byte.
  doc = base_inline();
  doc["models"][0]["modules"][1]["name"] = "blöcks.0";
  EXPECT_NO_THROW((void)load(doc));
}

TEST(ScenarioRepeat, BadRepeatsNameTheField) {
  json doc = base_inline();
  doc["models"][0]["modules"].push_back(json::parse(R"({"name": "pad", "repeat": 0, "tensors": [{"name": "weight", "shape": [4], "dtype": "fp16"}]})"));
  expect_error(doc, "models[0].modules[4].repeat", {"must be between 1 and"});
  doc["models"][0]["modules"][4]["repeat"] = 2000000;
  expect_error(doc, "models[0].modules[4].repeat", {"must be between 1 and", "the model's limit of 1048576 modules"});
  doc["models"][0]["modules"][4]["repeat"] = "3";
  expect_error(doc, "models[0].modules[4].repeat", {});
  // A copy's name taken by a module given on its own.
  doc["models"][0]["modules"][4]["repeat"] = 3;
  doc["models"][0]["modules"].push_back(json::parse(R"({"name": "pad.2", "tensors": [{"name": "weight", "shape": [4], "dtype": "fp16"}]})"));
  expect_error(doc, "models[0].modules[5].name", {"duplicate module name \"pad.2\"", "models[0].modules[4] (copy 2) has it"});
  // Copies that take the model past 64 bits of bytes.
  json big = base_inline();
  big["models"][0]["modules"].push_back(
      json::parse(R"({"name": "pad", "repeat": 1048000, "tensors": [{"name": "weight", "shape": [4294967296, 4096], "dtype": "fp32"}]})"));
  expect_error(big, "models[0].modules[4].repeat", {"overflows 64 bits"});
  // A small file must not expand past a checkpoint's worth of tensors (refused before expanding).
  json many = base_inline();
  json mod = json::parse(R"({"name": "pad", "repeat": 1000000, "tensors": []})");
  for (const char* t : {"a", "b", "c", "d", "e"}) mod["tensors"].push_back({{"name", t}, {"shape", {4}}, {"dtype", "fp16"}});
  many["models"][0]["modules"].push_back(mod);
  expect_error(many, "models[0].modules[4].repeat", {"more than 4194304 tensors"});
}

TEST(ScenarioRepeat, AContainerErrorNamesTheEntryNotTheExpandedIndex) {
  // x.0 ... x.2 from one entry, and x.1.sub below x.1: copy 1 is a container, and its cast hook
  // was given in entry 4 (the expanded index would be 5).
  json doc = base_inline();
  doc["models"][0]["modules"].push_back(
      json::parse(R"({"name": "x", "repeat": 3, "cast_hook": true, "tensors": [{"name": "weight", "shape": [4, 4], "dtype": "fp16"}]})"));
  doc["models"][0]["modules"].push_back(json::parse(R"({"name": "x.1.sub", "tensors": [{"name": "weight", "shape": [4, 4], "dtype": "fp16"}]})"));
  expect_error(doc, "models[0].modules[4].cast_hook", {"module \"x.1\" has parameters below it (\"x.1.sub\")"});
}

// A catalog model with modules left out: "keep" / "drop", the shorter list written back.
TEST(ScenarioCatalogSubset, KeepAndDropNameModulesOfTheCatalogModel) {
  const json keep = json::parse(R"({"schema": "vramfuzz.scenario/1", "device": {"total": "8GiB"},
    "models": [{"source": "catalog:clip-l", "keep": ["text_model.encoder.layers.0.self_attn.out_proj", "text_model.embeddings.token_embedding"]}]})");
  const Scenario s = load(keep);
  const ModelRef& m = s.models[0];
  EXPECT_EQ(m.source, "catalog:clip-l");
  ASSERT_EQ(m.spec->modules.size(), 2u);
  ASSERT_TRUE(m.catalog_full);
  EXPECT_EQ(m.catalog_full->modules.size(), 99u);
  // In the catalog's order, whatever the list's.
  EXPECT_EQ(m.spec->modules[0].name, "text_model.embeddings.token_embedding");
  EXPECT_EQ(m.spec->modules[1].name, "text_model.encoder.layers.0.self_attn.out_proj");
  EXPECT_TRUE(is_module_subset(*m.spec, *m.catalog_full));
  const json out = json::parse(scenario_to_json(s));
  EXPECT_EQ(out["models"][0]["source"], "catalog:clip-l");
  ASSERT_TRUE(out["models"][0].contains("keep"));
  EXPECT_EQ(out["models"][0]["keep"].size(), 2u);
  EXPECT_EQ(scenario_to_json(load(out)), scenario_to_json(s));
  EXPECT_EQ(scenario_fingerprint(load(out)), scenario_fingerprint(s));
  // The whole model and the subset are different cases.
  const Scenario whole = load(json::parse(R"({"schema": "vramfuzz.scenario/1", "device": {"total": "8GiB"}, "models": [{"source": "catalog:clip-l"}]})"));
  EXPECT_FALSE(scenario_fingerprint(whole) == scenario_fingerprint(s));
  // One module dropped: written as "drop".
  json drop = keep;
  drop["models"][0].erase("keep");
  drop["models"][0]["drop"] = {"text_model.embeddings.token_embedding"};
  const Scenario d = load(drop);
  EXPECT_EQ(d.models[0].spec->modules.size(), 98u);
  const json dout = json::parse(scenario_to_json(d));
  EXPECT_FALSE(dout["models"][0].contains("keep"));
  EXPECT_EQ(dout["models"][0]["drop"], json::array({"text_model.embeddings.token_embedding"}));
}

TEST(ScenarioCatalogSubset, BadListsNameTheField) {
  json doc = json::parse(R"({"schema": "vramfuzz.scenario/1", "device": {"total": "8GiB"},
    "models": [{"source": "catalog:clip-l", "keep": ["text_model.embeddings.token_embedding", "no.such"]}]})");
  expect_error(doc, "models[0].keep[1]", {"no module \"no.such\" in clip-l", "99 modules"});
  doc["models"][0]["keep"] = {"text_model.embeddings.token_embedding", "text_model.embeddings.token_embedding"};
  expect_error(doc, "models[0].keep[1]", {"listed twice"});
  doc["models"][0]["keep"] = json::array();
  expect_error(doc, "models[0].keep", {"keeps no module"});
  doc["models"][0]["drop"] = {"text_model.embeddings.token_embedding"};
  expect_error(doc, "models[0].drop", {"not both"});
  json inl = base_inline();
  inl["models"][0]["keep"] = {"embed"};
  expect_error(inl, "models[0].keep", {"not allowed with an inline model"});
}

}  // namespace
}  // namespace vf
