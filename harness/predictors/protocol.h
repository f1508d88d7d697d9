// The external-predictor protocol, `vramfuzz.predictor/1` (docs/predictor-protocol.md): JSON
// lines on a predictor process's stdin and stdout. This file is the wire format only, shared by
// the client (external.cpp, `--policy exec:COMMAND`) and by `vramfuzz predict-serve`, which
// serves a built-in predictor over it: a request carries the scenario with every model inline
// (modules, tensors, dtypes, roles), a reply carries the plan, modules named by their names.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

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
  // supports.spec_refs: it keeps the models it was sent, so a request names a model it has
  // already seen by its spec_ref instead of carrying its modules again (SpecRefs below).
  bool spec_refs = false;
  // supports.overrides: the policy overrides (docs/formats.md `policy.overrides`) it applies to
  // its plans. Absent: it did not say, and every override is sent as before. Present: an override
  // it does not list is refused where a flag gives it (exit 2), and a case from a file that sets
  // one is that case's error (it cannot be planned as written), never silently planned without.
  std::optional<std::vector<std::string>> overrides;
  bool honours(std::string_view key) const;
  // The first of `p`'s overrides it does not apply, or nullptr.
  const std::string* unapplied(const Policy& p) const;
};

// The hello line a predictor writes; parse_hello reads one (InputError naming the field, the
// path prefixed with `origin`).
std::string hello_line(const PredictorHello& h);
// Why a case with the override `key` cannot go to predictor `h` (it does not list it in
// supports.overrides): names the predictor, the key and what it does honour.
std::string unhonoured_override_message(const PredictorHello& h, std::string_view key);
PredictorHello parse_hello(const nlohmann::json& j, const std::string& origin);

// The request for one case: {"type":"predict","id":ID,"view":{...},"scenario":{...}}. The
// scenario is `s` with every model written inline and only what a runtime's planner sees:
// no name, no activation source, no knee or log provenance; its policy is the runtime preset
// with the case's overrides.
std::string request_line(const Scenario& s, std::uint64_t id);
// A request's `view` against its scenario, as a server planning from the scenario reads it: an
// object of exactly the keys request_line writes, each of its type, and saying what the scenario
// says (total, free, a fresh process's empty allocator, the allocator's backend). A server that
// planned from the scenario while the view said otherwise would answer another case than the
// one asked; what disagrees is an InputError naming the field (`request.view.free`).
void check_view(const JsonIn& view, const Scenario& s);

// The client's side of supports.spec_refs: which model specs (kind, family, memory usage factor,
// arch, modules) this predictor process holds, by number. The first request with a spec writes
// it whole with "spec_ref": N; later ones write {"id", "source": "inline", "spec_ref": N, and the
// per-case fields (compute, lora, patcher, prefetch)}. At most `capacity` are held: a request
// lists in "forget" those the predictor may drop (least recently used). A restarted process
// holds none: reset().
class SpecRefs {
 public:
  explicit SpecRefs(std::size_t capacity = 256) : capacity_(capacity) {}
  void reset();
  std::size_t held() const { return by_fp_.size(); }

 private:
  friend std::string request_line(const Scenario& s, std::uint64_t id, SpecRefs& refs);
  struct Held {
    std::uint64_t ref;
    std::list<ScenarioFingerprint>::iterator lru;
  };
  std::size_t capacity_;
  std::uint64_t next_ = 1;
  FingerprintMemo memo_;
  std::unordered_map<ScenarioFingerprint, Held, ScenarioFingerprintHash> by_fp_;
  std::list<ScenarioFingerprint> lru_;  // most recent first
};
std::string request_line(const Scenario& s, std::uint64_t id, SpecRefs& refs);

// The predictor's side (predict-serve): the specs sent so far, by spec_ref. forget() drops those
// the request's "forget" lists; the scenario is then read inside a SpecRefScope over `specs`,
// which defines and resolves the references (InputError naming the field for one never sent).
struct SpecStore {
  void forget(const JsonIn& request);
  std::unordered_map<std::uint64_t, std::shared_ptr<const ModelSpec>> specs;
};

// The plan as the reply carries it (the "plan" member): every field of `p`, modules and models
// by name. plan_from_json reads one back for `s`, the case it was made for: what the harness
// owns (policy, available, streams, the stages' op and model, activation sizing, the overall peak
// and fits) is recomputed from `s`, so a reply cannot contradict the case. Fields a predictor may
// leave out have the defaults docs/predictor-protocol.md gives; an unknown module or model, a
// module both resident and offloaded, a missing stage: InputError with the reply's field path.
// `by_index`: modules as their index in the model's module list (with repeats expanded), which
// a reply may use anywhere it names a module: shorter to write and to read than the names.
nlohmann::ordered_json plan_json(const Scenario& s, const Plan& p, bool by_index = false);
Plan plan_from_json(const JsonIn& j, const Scenario& s);

// The reply lines.
std::string plan_reply_line(const Scenario& s, const Plan& p, std::uint64_t id, bool by_index = false);
std::string error_reply_line(std::uint64_t id, std::string_view message);

}  // namespace vf
