// The vramfuzz subcommands. Each `add_*` registers its CLI11 subcommand and a callback that
// returns the process exit code (0 nothing found, 1 findings, 2 bad input, 3 fault).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "harness/scenario.h"

namespace vf::cli {

using Action = std::function<int()>;

// Options shared by commands that take a scenario or generate one.
struct PolicyFlags {
  std::string policy;                  // --policy comfy:dec2025
  std::string reserve;                 // --reserve 600MiB
  std::vector<std::string> sets;       // --set key=value (policy constants)
  std::string allocator;               // --allocator caching
  std::vector<std::string> options;    // --option key=value (allocator options)
  std::string activations;             // --activations model | estimate | profile:FILE
  void add_to(CLI::App& app, bool with_allocator);
  // --reserve and --set as (constant, value) pairs; InputError when a constant is given twice.
  std::vector<std::pair<std::string, std::string>> overrides() const;
  // Applies them to a loaded scenario (flags win over the file).
  void apply(Scenario& s) const;
};

// Validators for unsigned options (common.cpp): decimal digits that fit in 64 bits (kNonNegative);
// and at least 1 (kPositiveCount). CLI11 alone would clamp, wrap or read octal / hex. Attach them
// with ->transform(): they rewrite "010" to "10".
extern const CLI::Validator kNonNegative;
extern const CLI::Validator kPositiveCount;

void add_run(CLI::App& app, Action& action);
void add_plan(CLI::App& app, Action& action);
// `from-log`: a ComfyUI console log to a scenario, run and compared with the log (cmd_from_log.cpp).
void add_from_log(CLI::App& app, Action& action);
void add_fuzz(CLI::App& app, Action& action);
void add_models(CLI::App& app, Action& action);
void add_shrink(CLI::App& app, Action& action);
void add_replay(CLI::App& app, Action& action);
void add_render_repro(CLI::App& app, Action& action);
void add_alloc_replay(CLI::App& app, Action& action);
void add_calibrate(CLI::App& app, Action& action);
void add_report(CLI::App& app, Action& action);
void add_merge(CLI::App& app, Action& action);
// Turns a fuzz_pipeline (libFuzzer target 5) input into a shrunk repro (cmd_fuzz_import.cpp).
void add_fuzz_import(CLI::App& app, Action& action);
// Internal, hidden from --help (cmd_cuda.cpp): the --isolate child and the GPU check.
void add_exec_case(CLI::App& app, Action& action);
void add_gpu_check(CLI::App& app, Action& action);
// `predict-serve`: a built-in predictor over the external-predictor protocol (cmd_predict_serve.cpp).
void add_predict_serve(CLI::App& app, Action& action);
// `diff`: the same cases under two predictors, where plans and verdicts differ (cmd_diff.cpp).
void add_diff(CLI::App& app, Action& action);
// `models import`, registered under the `models` subcommand (cmd_import.cpp).
void add_import(CLI::App& models, Action& action);

// What `models show` and `models import` say about the modules without a cast hook (empty when
// every module has one), and the tag `--modules` puts on each (common.cpp; docs/models.md).
std::string cast_hook_summary(const ModelSpec& m);
std::string_view module_tag(const Module& m);
// Every option and argument given on the command line of `app` and its chosen subcommands with
// an empty value (`--vram ""`, `--out ""`, `run ""`) is an InputError naming it: an empty value
// would otherwise read as the option left out, and `--out ""` as "write nothing" or "write here".
void reject_empty_values(const CLI::App& app);

// " --name value" for each non-empty value, values shell-quoted: the pieces of recorded commands.
std::string option_text(std::string_view name, const std::string& value);

// "60s", "5m", "1h", "90" (seconds), "1.5m".
double parse_duration(const std::string& text, const std::string& flag);
// Splits "key=value"; InputError(flag) when there is no '='.
std::pair<std::string, std::string> split_kv(const std::string& kv, const std::string& flag);

}  // namespace vf::cli
