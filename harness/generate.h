// The scenario generator: every random decision is a draw from a Choices, so the same seed or
// the same recorded choice sequence gives the same scenario, whichever driver produced it.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "harness/choices.h"
#include "harness/scenario.h"

namespace vf {

struct GenConfig {
  std::optional<std::string> policy;         // "comfy:dec2025" or a list "comfy:sep2026,comfy:dec2025"; unset: drawn
  std::optional<AllocatorMode> allocator;    // unset: drawn
  std::optional<Bytes> vram;                 // device total; unset: drawn from consumer/datacenter sizes
  std::vector<std::pair<std::string, std::string>> policy_overrides;  // applied after the preset
  // `--option k=v`: allocator options of the one mode `allocator` names (options are per mode).
  std::vector<std::pair<std::string, std::string>> allocator_options;
  // `fuzz --model FILE`: an imported model (source "file:..."). When set, every case runs this one
  // model; workloads, devices, allocators, streams and dtypes are still drawn around it.
  std::shared_ptr<const ModelSpec> model;
  // A workload class: the storage -> compute dtype pair of the big models (e.g. fp8 -> fp32 for
  // the origin class); unset: drawn.
  std::optional<std::pair<Dtype, Dtype>> dtypes;
  // `--activations`: what sizes every case's activations (a profile falls back to the formula for
  // models it has no entry for, and says so). Default: the formula.
  ActivationSpec activations;
};

// The policies of a comma-separated list, as written; an `exec:COMMAND` takes the rest of the list
// (its command may hold commas), so it comes last.
std::vector<std::string> split_policy_list(std::string_view text);
// `--policy a,b,...`: each policy checked (InputError naming `what`), the list normalised to their
// labels joined by commas ("comfy:sep2026,comfy:dec2025"); `overrides` must apply to each one
// (an error names `--set`, or `--reserve` for the reserve when `reserve_flag`: it came from there).
std::string parse_policy_list(std::string_view text, std::string_view what,
                              const std::vector<std::pair<std::string, std::string>>& overrides = {}, bool reserve_flag = false);

// A parse_policy_list result as a --policy flag's value again: each exec:NAME as the exec:COMMAND
// that started it (the command a re-run needs; a case records only the name).
std::string policy_list_flag(std::string_view labels);

// Throws only on a bug (the generated scenario is validated before it is returned).
Scenario generate_scenario(Choices& c, const GenConfig& cfg, Catalog& catalog);

// Device sizes the generator draws from (GiB): consumer cards to H200.
inline constexpr std::uint32_t kDeviceSizesGiB[] = {6, 8, 12, 16, 24, 32, 48, 80, 141};

}  // namespace vf
