// `vramfuzz diff`: the same generated cases planned (and run) under two predictors, A and B, and
// every place their plans or verdicts differ, grouped by what differs and each group's first case
// shrunk to the fewest modules that still differ the same way. Two uses: an emulation against the
// real planner (`--policy comfy:dec2025 --against exec:...comfyui adapter...`), and a patch to a
// runtime's accounting (`--against comfy:dec2025 --against-set reserve=600MiB`: what the change
// does across 10,000 random loads, and which of them now OOM).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "harness/exec.h"
#include "harness/generate.h"
#include "harness/predict.h"
#include "harness/scenario.h"

namespace vf {

struct DiffConfig {
  std::uint64_t seed = 1;
  std::uint64_t cases = 0;  // 0: until `seconds`
  double seconds = 0;
  GenConfig gen;            // the cases, drawn under A (gen.policy: A's label)
  std::string against;      // B: a policy label (started already, for exec:)
  std::vector<std::pair<std::string, std::string>> against_overrides;  // applied to B after the case's own
  Bytes tolerance = 0;      // byte fields differing by at most this are the same
  bool verdicts = true;     // also run each case under both and compare the verdicts
  bool shrink = true;
  std::uint64_t shrink_execs = 200;  // candidate cases per group (each is planned under both)
  std::function<bool()> should_stop;
};

// One field that differs: where ("loads[0].resident", "stages[1].predicted_peak", "verdict"),
// A's value and B's, in words, and B - A for byte fields.
struct FieldDiff {
  std::string field;
  std::string a, b;
  std::int64_t delta = 0;
  // Byte fields: A's and B's bytes (for a module set: the bytes of the modules on that side only).
  bool bytes = false;
  std::int64_t a_bytes = 0, b_bytes = 0;
};

// A group of cases whose plans differ in the same fields (or whose verdicts differ the same way).
struct DiffGroup {
  std::string key;                   // "loads.resident+loads.offload_buffer", "verdict: pass / oom"
  std::uint64_t count = 0;           // cases in the group
  std::uint64_t first_index = 0;     // the campaign's case index and seed of the first
  std::uint64_t first_seed = 0;
  Scenario original;                 // the first case, under A
  Scenario minimal;                  // shrunk, under A (== original without shrinking)
  std::vector<FieldDiff> fields;     // of the minimal case
  std::string verdict_a, verdict_b;  // of the minimal case ("pass", or the signature)
  // What each verdict rests on (the oracle's words: exact bytes, a modelled allocator, a
  // modelled activation); empty without verdicts.
  std::string rests_on_a, rests_on_b;
  std::size_t modules_before = 0, modules_after = 0;
  std::uint64_t shrink_execs = 0;
};

struct DiffResult {
  std::uint64_t cases = 0;
  std::uint64_t same = 0;        // plans (and verdicts) equal within the tolerance
  std::uint64_t plans_differ = 0;
  std::uint64_t verdicts_differ = 0;
  std::uint64_t errors = 0;      // cases one side could not plan (counted in a group too)
  std::vector<DiffGroup> groups; // most cases first
  bool stopped = false;
  double seconds = 0;
};

// The fields where b differs from a for the case s (both plans of s), byte fields within
// `tolerance` equal. Empty: the same plan.
std::vector<FieldDiff> compare_plans(const Scenario& s, const Plan& a, const Plan& b, Bytes tolerance);

// What a group is keyed by: a field without its indices ("loads[3].resident" -> "loads.resident").
std::string field_kind(const std::string& field);

// The case under B: its policy replaced by B with the case's overrides, then B's own.
Scenario under_policy(const Scenario& s, const Policy& b, const std::vector<std::pair<std::string, std::string>>& overrides);

DiffResult run_diff(const DiffConfig& cfg, Catalog& catalog, Backend& backend);

// diff.json (`vramfuzz.diff/1`) and diff.md; `files[i]` is where group i's minimal case was written.
std::string diff_json(const DiffConfig& cfg, const DiffResult& r, const std::vector<std::string>& files, const std::string& command_line);
std::string diff_markdown(const DiffConfig& cfg, const DiffResult& r, const std::vector<std::string>& files);

// What a difference in plan fields rests on: both predictors' own numbers for the same case.
inline constexpr std::string_view kDiffPlanRestsOn =
    "exact: each plan field is the predictor's own number for the same case (nothing is executed to compare plans)";

}  // namespace vf
