// Where a case's activation working set comes from (docs/activations.md). The weights, the
// transients and the allocator are exact bytes or modelled allocators; the activations of a
// forward pass are not measured on `sim` (nor sized by a real network on `cuda`): the scenario
// says which of four sources sizes them, and every verdict names it.
//  * model:    vramfuzz's structural formula (models/activation.cpp), the default;
//  * estimate: the predictor's own activation budget for the forward (ComfyUI's memory_required
//              for the batch it runs, or the inference floor where that is larger: the term its
//              prediction holds for activations), so only weights, transients and the allocator
//              can decide a verdict;
//  * bytes:    given per model (the live bytes of one forward pass as the plan runs it);
//  * profile:  measured peaks per model and workload (`vramfuzz.activation-profile/1`), scaled
//              linearly in positions x batch from the nearest measured entry.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "harness/core/bytes.h"
#include "harness/core/dtype.h"
#include "harness/core/workload.h"

namespace vf {

class JsonIn;
struct ModelSpec;

enum class ActivationSource : std::uint8_t { model, estimate, bytes, profile };
std::string_view activation_source_name(ActivationSource s);

inline constexpr std::string_view kActivationProfileSchema = "vramfuzz.activation-profile/1";

// One measured forward pass: the activation bytes live at its peak (the allocated peak during
// the forward minus the weights and weight transients then live) for `model` at a workload.
struct ActivationProfileEntry {
  std::string model;        // a scenario model id or a catalog / inline model name
  bool compute_given = false;
  Dtype compute = Dtype::bf16;  // when given, only models computing in this dtype match
  Workload workload;        // width, height, frames, text_tokens; `batch` is the rows of the pass
  Bytes peak = 0;
  bool operator==(const ActivationProfileEntry&) const = default;
};

struct ActivationSpec {
  ActivationSource source = ActivationSource::model;
  std::vector<std::pair<std::string, Bytes>> bytes;  // source bytes: model id -> bytes per forward
  std::vector<ActivationProfileEntry> profile;       // source profile: the entries, kept in the scenario
  std::string profile_origin;                        // where they were read from (for people)
  // Source profile: a model no entry matches falls back to the formula (true; the verdict says
  // so) or is refused at load (false, the default for a scenario file).
  bool fallback_to_model = false;
  // `"cap": "budget"` (the string source "capped" is the formula with it): no forward holds more
  // than the predictor's activation budget for it, min(source, budget). What the activation-
  // dependence check runs (check_activation_dependence, harness/campaign.h).
  bool cap_at_budget = false;
  bool operator==(const ActivationSpec&) const = default;
};

// Whether a profile entry is for model `spec` (scenario id `id`) computing in `compute`: its
// `model` names the id or the model, and its `compute`, when given, is that dtype.
bool profile_entry_matches(const ActivationProfileEntry& e, const ModelSpec& spec, const std::string& id, Dtype compute);

// How one forward's activations were sized, for rests_on texts and the trace.
struct ActivationSizing {
  Bytes bytes = 0;
  ActivationSource source = ActivationSource::model;  // what actually sized it (a fallback says model)
  bool fallback = false;      // profile without a matching entry: the formula
  bool scaled = false;        // profile: scaled from an entry at another workload
  bool capped = false;        // cap_at_budget lowered it to the budget
};

// The live activation bytes of model `spec` (scenario id `id`, computing in `compute`) for one
// forward of `rows` rows at workload `w`: `estimate` is the predictor's activation budget for
// them (the `estimate` source's answer), `formula` the working set (the `model` source's).
ActivationSizing size_activation(const ActivationSpec& a, const ModelSpec& spec, const std::string& id, Dtype compute,
                                 const Workload& w, std::uint32_t rows, Bytes estimate, Bytes formula);

// The scenario's "activations" member: "model" | "estimate" | "capped" | {"source": "bytes",
// "bytes": {...}} | {"source": "profile", "file": PATH | "entries": [...], "fallback": "model" |
// "error"}; an object may add "cap": "budget".
// A relative profile path is found in `base_dir`; its entries are copied into the scenario, so a
// repro written from it replays without the file.
ActivationSpec parse_activation_spec(const JsonIn& j, const std::string& base_dir);
// An activation profile file on its own (`--activations profile:FILE`).
ActivationSpec load_activation_profile(const std::string& path);
// `--activations model|estimate|capped|profile:FILE`; InputError(what) otherwise.
ActivationSpec parse_activation_flag(std::string_view text, std::string_view what);
// The member as scenario_to_json writes it (null for the default source, which is omitted).
nlohmann::json activation_spec_json(const ActivationSpec& a);
// One line for rests_on texts: "activations from vramfuzz's formula (models/activation.cpp)".
std::string activation_rests_on(const ActivationSpec& a);

}  // namespace vf
