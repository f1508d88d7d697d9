// vramfuzz predict-serve: a built-in predictor served over the external-predictor protocol
// (`vramfuzz.predictor/1`, docs/predictor-protocol.md) on stdin / stdout. A campaign with
// `--policy exec:"vramfuzz predict-serve --policy comfy:dec2025"` gives the same cases, verdicts
// and repros as one with `--policy comfy:dec2025`: the protocol's proof that a request carries
// everything the planner reads and a reply everything lowering does. It is also the reference
// an adapter for another runtime can be checked against line by line.
#include <cstdio>
#include <iostream>
#include <string>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "harness/campaign.h"
#include "harness/cli/commands.h"
#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "harness/predict.h"
#include "harness/predictors/protocol.h"

namespace vf::cli {
namespace {

void put(const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

// One request to one reply line; what cannot be planned is an error reply naming why.
std::string answer(const std::string& line, const Policy& serve, Catalog& catalog, SpecStore& specs) {
  std::uint64_t id = 0;
  try {
    const JsonIn j(parse_json_doc(line, "request"), "request");
    if (!j.is_object()) j.fail("expected an object");
    if (const auto v = j.opt("id")) id = v->u64();
    j.expect_object({"type", "id", "view", "forget", "scenario"});
    specs.forget(j);
    if (j.at("type").str() != "predict") j.at("type").fail("expected \"predict\"");
    id = j.at("id").u64();
    Scenario s;
    {
      const SpecRefScope refs(specs.specs);
      s = read_scenario(j.at("scenario"), catalog);
    }
    // The served predictor, with the case's overrides of the runtime's constants.
    Policy p = serve;
    for (const auto& [k, v] : s.policy.overrides) apply_policy_override(p, k, v, "request.scenario.policy.overrides");
    if (s.policy.preset != serve.preset) {
      throw InputError("request.scenario.policy", fmt::format("the case is for comfy:{}; this server plans for comfy:{}",
                                                              preset_name(s.policy.preset), preset_name(serve.preset)));
    }
    s.policy = p;
    validate_scenario(s);
    // The view is the scenario's device and allocator as the runtime's accounting sees them:
    // planned from the scenario, a view that says otherwise would be answered wrongly.
    if (const auto view = j.opt("view")) check_view(*view, s);
    return plan_reply_line(s, predict(s), id, true);
  } catch (const InputError& e) {
    return error_reply_line(id, e.what());
  }
}

int do_serve(const std::string& policy_text) {
  const Policy serve = parse_policy(policy_text, "--policy");
  if (serve.predictor == PredictorKind::external) throw InputError("--policy", "predict-serve serves a built-in predictor, not exec:");
  PredictorHello hello;
  hello.name = "vramfuzz predict-serve " + serve.label();
  hello.version = tool_version();
  hello.runtime = serve.preset;
  hello.spec_refs = true;
  // Every override its policy takes is applied to each request's plan (answer() above).
  std::vector<std::string> keys;
  for (const std::string_view k : policy_override_keys(serve)) keys.emplace_back(k);
  hello.overrides = std::move(keys);
  put(hello_line(hello));
  SpecStore specs;
  Catalog catalog;
  std::ios::sync_with_stdio(false);  // getline on a C-synchronised cin reads a byte per call
  std::string line;
  std::uint64_t served = 0;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    put(answer(line, serve, catalog, specs));
    ++served;
  }
  spdlog::debug("predict-serve: {} requests, stdin closed", served);
  return kExitOk;
}

}  // namespace

void add_predict_serve(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("predict-serve",
                                 "serve a built-in predictor over the external-predictor protocol (vramfuzz.predictor/1) on stdin/stdout");
  auto policy = std::make_shared<std::string>("comfy:dec2025");
  cmd->add_option("--policy", *policy, "the predictor to serve: comfy:PRESET or exact[:PRESET] (default comfy:dec2025)");
  cmd->callback([&action, policy] { action = [policy] { return do_serve(*policy); }; });
}

}  // namespace vf::cli
