// The external-predictor protocol, `vramfuzz.predictor/1` (docs/predictor-protocol.md): JSON
// lines on a predictor process's stdin and stdout. This file is the wire format only, shared by
// the client (external.cpp, `--policy exec:COMMAND`) and by `vramfuzz predict-serve`, which
// serves a built-in predictor over it: a request carries the scenario with every model inline
// (modules, tensors, dtypes, roles), a reply carries the plan, modules named by their names.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "harness/predict.h"
#include "harness/scenario.h"

namespace vf {

class JsonIn;

inline constexpr std::string_view kPredictorSchema = "vramfuzz.predictor/1";

// What a predictor says of itself in its first line.
struct PredictorHello {
  std::string name;     // "comfyui", "vramfuzz predict-serve comfy:dec2025"
  std::string version;  // its own version ("0.38.2", a commit)
  // The runtime whose behaviour around the plan vramfuzz models (casts, streams, the aimdo
  // layer): a comfy preset ("comfy:dec2025", "comfy:sep2026"). Its constants are the defaults
  // the request's policy overrides.
  Preset runtime = Preset::dec2025;
};

// The hello line a predictor writes; parse_hello reads one (InputError naming the field, the
// path prefixed with `origin`).
std::string hello_line(const PredictorHello& h);
PredictorHello parse_hello(const nlohmann::json& j, const std::string& origin);

// The request for one case: {"type":"predict","id":ID,"view":{...},"scenario":{...}}. The
// scenario is `s` with every model written inline and only what a runtime's planner sees:
// no name, no activation source, no knee or log provenance; its policy is the runtime preset
// with the case's overrides.
std::string request_line(const Scenario& s, std::uint64_t id);

// The plan as the reply carries it (the "plan" member): every field of `p`, modules and models
// by name. plan_from_json reads one back for `s`, the case it was made for: what the harness
// owns (policy, available, streams, the stages' op and model, activation sizing, the overall peak
// and fits) is recomputed from `s`, so a reply cannot contradict the case. Fields a predictor may
// leave out have the defaults docs/predictor-protocol.md gives; an unknown module or model, a
// module both resident and offloaded, a missing stage: InputError with the reply's field path.
nlohmann::ordered_json plan_json(const Scenario& s, const Plan& p);
Plan plan_from_json(const JsonIn& j, const Scenario& s);

// The reply lines.
std::string plan_reply_line(const Scenario& s, const Plan& p, std::uint64_t id);
std::string error_reply_line(std::uint64_t id, std::string_view message);

}  // namespace vf
