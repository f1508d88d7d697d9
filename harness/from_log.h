// From a ComfyUI console log to a scenario (`vramfuzz from-log`), and back: the comparison of a
// run of that scenario with what the log says happened (`vramfuzz run` on a scenario with a
// `from_log` record). docs/from-log.md.
//
// The reconstruction maps what the log shows to vramfuzz's terms and says how sure it is of each:
// the device total ("Total VRAM"), the allocator (the "Device:" line's backend, else the OOM
// message's form), the preset (the ComfyUI version against the release table, and the plan
// lines' own form), each "Requested to load CLASS" to a catalog model whose size at some storage
// dtype matches the plan line's (or to a --model file), the compute dtype from the loader's
// lines, the memory other processes held, back-solved from the first classic plan line's
// "usable" figure by running the predictor, and the pipeline up to the OOM, placed by its
// traceback. What it cannot determine is listed with the flag that supplies it; the device total
// and an unmapped model class are errors naming the flag.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "harness/comfy_log.h"
#include "harness/scenario.h"

namespace vf {

struct CaseResult;  // harness/campaign.h

struct FromLogOptions {
  std::string file = "-";                 // the log's name, recorded in the scenario
  std::optional<Bytes> vram;              // --vram: the device total
  std::optional<Bytes> others;            // --others: memory other processes hold at the start
  std::optional<Bytes> context;           // --context: the CUDA context
  std::string allocator;                  // --allocator
  std::string policy;                     // --policy
  // --reserve / --set: policy constants (applied over what the log says, before the back-solve).
  std::vector<std::pair<std::string, std::string>> overrides;
  // --model [CLASS=]FILE: CLASS's model (a safetensors / index.json / GGUF file, or the inline
  // model JSON `models import --out` writes); without CLASS, the first class the catalog cannot
  // stand for, in log order.
  std::vector<std::pair<std::string, std::string>> models;
  std::optional<std::uint32_t> width, height, batch, frames, steps;  // --width ... --steps
  std::optional<double> cfg;                                         // --cfg
  // --leave-out CLASS: loads of these classes (a ControlNet, a CLIP vision model, an upscaler
  // vramfuzz has no stand-in for) are left out of the scenario, each said in the notes.
  std::vector<std::string> leave_out;
  // --lora CLASS: a LoRA patches that class's model (the log shows it only as patch counts of
  // offloaded or staged weights).
  std::vector<std::string> lora;
  std::optional<std::string> os;          // --os windows|linux (the reserve differs)
};

// How a reconstructed value is known.
enum class Sureness : std::uint8_t {
  read,      // printed in the log as is
  derived,   // computed from what the log printed (back-solved, matched by size)
  guessed,   // the most likely value, from indirect evidence (a version, a default)
  given,     // from a flag
  assumed,   // not in the log: a default, with the flag that sets it
};
std::string_view sureness_name(Sureness s);

struct LogFact {
  std::string what;     // "device total"
  std::string value;    // "12288 MiB"
  Sureness sure = Sureness::read;
  std::string source;   // "line 3: Total VRAM 12288 MB, total RAM 32607 MB"
  std::string flag;     // the flag that sets it ("--vram")
};

struct Reconstruction {
  Scenario scenario;
  std::vector<LogFact> facts;
  std::vector<std::string> notes;   // what was left out and why
};

// Throws InputError naming the flag when the device total is unknown or a model class has no
// catalog model and no --model.
Reconstruction reconstruct_from_log(const ComfyLog& log, const FromLogOptions& options, Catalog& catalog);

// The facts as an aligned table for people ("device total  12288 MiB  read  line 3: ...").
std::string format_facts(const Reconstruction& r);

// A run of a reconstructed scenario against its log.
struct LogComparison {
  enum class Status : std::uint8_t {
    reproduced,        // the plan lines match and the run OOMs where the log did
    plan_matches,      // the log has no OOM and the plan lines match
    no_oom,            // the plan lines match, the log OOMs, the run does not
    oom_elsewhere,     // the plan lines match, the run OOMs, not where the log did
    plan_differs,      // some plan figure is outside the tolerance
  };
  Status status = Status::plan_matches;
  std::vector<std::string> lines;   // one per plan line and one for the OOM
  std::string summary;              // one line: the status and its reason
};
std::string_view comparison_status_name(LogComparison::Status s);
// For people: each line indented by two spaces, then "against the log: SUMMARY".
std::string format_comparison(const LogComparison& c);

// Compares `r` (a run of `s`) with s.from_log. Tolerances: the plan's MB figures to the log's
// two printed decimals (0.005 MiB) plus `tolerance`; staged MB to the whole MiB. The OOM: the
// same stage (when the traceback placed it), a matching activity, and the requested size within
// the printed precision.
LogComparison compare_with_log(const Scenario& s, const CaseResult& r, Bytes tolerance = 0);

// The ComfyUI releases a preset stands for ("ComfyUI 0.3.76 (PR #10733 and #10953, before #11096)"): the release-tag table of
// docs/from-log.md.
std::string_view preset_releases(Preset p);

// Markdown: how to run `s` in ComfyUI on a GPU: the release, the flags its policy, allocator and
// offload streams need, the models and workload, and how to make a larger card behave like its
// device (what to occupy first). repro.md's "Reproduce in ComfyUI" section.
std::string comfyui_reproduction(const Scenario& s, Bytes reserve);

}  // namespace vf
