// vramfuzz fuzz-import CRASH [--out DIR]: a crash (or any input) of fuzz target 5 (fuzz_pipeline)
// replayed through the same FuzzedDataProvider driver (fuzz/fdp_choices.h), so the scenario and
// its recorded choices are exactly what the target saw; run with the same setup (exact predictor,
// the allocator mode's overhead bound as the reserve); when it fails, shrunk by the project's
// shrinker (which keeps the signature, and keeps the scenario on `exact_reserve=bound`) into
// vramfuzz.repro/1 (repro.json + repro.md). A program check_program refuses or an exception (the
// target traps on those too) has no verdict to shrink: the case is written as scenario.json. Exit 1
// either way; an input that does not fail (or that the target skips) is said so, exit 0.
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "harness/cli/commands.h"
#include "harness/cli/out_dir.h"
#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "harness/overhead.h"
#include "harness/repro.h"

// The header comes with clang (harness/cli/CMakeLists.txt copies it for any compiler).
#if __has_include(<fuzzer/FuzzedDataProvider.h>)
#define VF_HAVE_FDP 1
#include "fuzz/fdp_choices.h"
#endif

namespace vf::cli {
namespace {

struct FuzzImportFlags {
  std::string file;
  std::string out;
  std::uint64_t execs = ShrinkOptions{}.max_execs;
  std::string time;
  std::string reserve;  // hidden, for tests: replay with this reserve instead of the bound
  bool force = false;   // --force: replace a repro already in the output directory
};

#ifndef VF_HAVE_FDP
int do_fuzz_import(const FuzzImportFlags&) {
  throw InfraError("fuzz-import: this build has no fuzzer/FuzzedDataProvider.h (install clang and reconfigure)");
}
#else
int do_fuzz_import(const FuzzImportFlags& f) {
  const std::string bytes = read_text_file(f.file);
  Catalog catalog;
  FuzzedDataProvider fdp(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  ReproOrigin origin;
  origin.source_file = f.file;
  Scenario s;
  try {
    s = pipeline_case(fdp, catalog, &origin.choices);
  } catch (const InputError& e) {
    std::fputs(fmt::format("{}: does not fail: the target skips it (its draws make no valid scenario: {})\n", f.file,
                           e.what())
                   .c_str(),
               stdout);
    return kExitOk;
  }
  if (!f.reserve.empty()) {
    parse_size(f.reserve, "--reserve");  // a bad value is named by its flag
    apply_policy_override(s.policy, "exact_reserve", f.reserve, "--reserve");
  }

  const std::string dir = f.out.empty() ? f.file + ".repro" : f.out;
  refuse_repro_overwrite(dir, f.out.empty() ? "fuzz-import" : "--out", f.force);
  // What the target ran, step by step: deterministic, so the crash reproduces here.
  const PipelineRun run = run_pipeline_case(s);
  if (!run.broken.empty()) {
    // Not a verdict the shrinker can keep: the case itself is the repro.
    std::filesystem::create_directories(dir);
    const std::string path = (std::filesystem::path(dir) / "scenario.json").string();
    write_file_atomic(path, scenario_to_json(s) + "\n");
    std::fputs(fmt::format("{}: {}\nthe case (not shrunk: no verdict to keep): {}\nreplay: vramfuzz run {}\n", f.file,
                           run.broken, path, path)
                   .c_str(),
               stdout);
    return kExitFindings;
  }
  if (!run.rejected.empty()) {
    std::fputs(fmt::format("{}: does not fail: the target skips it ({})\n", f.file, run.rejected).c_str(), stdout);
    return kExitOk;
  }
  const CaseResult& r = run.result;
  const std::string bound = overhead_breakdown(s, r.program).summary();
  if (r.verdict.kind == VerdictKind::error) throw InfraError(fmt::format("{}: error verdict: {}", f.file, r.verdict.message));
  if (!r.verdict.finding()) {
    std::fputs(fmt::format("{}: does not fail ({} bytes, {} choices; {} {} with {}: {})\n{}\n", f.file, bytes.size(),
                           origin.choices.size(), s.name, allocator_mode_name(s.allocator.mode), s.policy.label(),
                           r.verdict.message, bound)
                   .c_str(),
               stdout);
    return kExitOk;
  }

  SimBackend backend;
  ShrinkOptions opt;
  opt.max_execs = f.execs;
  if (!f.time.empty()) opt.max_seconds = parse_duration(f.time, "--shrink-time");
  const ShrinkResult sr = shrink(s, backend, opt);
  const std::string path = write_repro(dir, sr, origin);
  std::fputs(fmt::format("{}: {} ({})\n{}\n{}\nshrunk {} models / {} modules / {} -> {} / {} / {} in {} executions; "
                         "overshoot {}\nrepro: {}\nreplay: vramfuzz replay {}\n",
                         f.file, r.verdict.signature, r.verdict.message, bound, repro_title(sr), sr.original_size.models,
                         sr.original_size.modules, format_mib(sr.original_size.bytes), sr.final_size.models,
                         sr.final_size.modules, format_mib(sr.final_size.bytes), sr.executions,
                         format_signed_mib(sr.result.verdict.overshoot), path, path)
                 .c_str(),
             stdout);
  return kExitFindings;
}
#endif

}  // namespace

void add_fuzz_import(CLI::App& app, Action& action) {
  auto f = std::make_shared<FuzzImportFlags>();
  CLI::App* cmd = app.add_subcommand(
      "fuzz-import", "turn an input of the fuzz_pipeline libFuzzer target into a shrunk repro (repro.json + repro.md)");
  cmd->add_option("crash", f->file, "a crash file (or any input) of fuzz_pipeline")->required();
  cmd->add_option("--out", f->out, "directory for repro.json and repro.md (default: CRASH.repro)");
  cmd->add_flag("--force", f->force, "replace a repro.json / repro.md already in that directory (else refused)");
  cmd->add_option("--shrink-execs", f->execs, "execution budget")->capture_default_str()->transform(kPositiveCount);
  cmd->add_option("--shrink-time", f->time, "time budget (e.g. 60s, 5m)");
  // Hidden, for tests: replay with a fixed reserve (e.g. 0) instead of the overhead bound.
  cmd->add_option("--reserve", f->reserve, "")->group("");
  cmd->callback([f, &action] { action = [f] { return do_fuzz_import(*f); }; });
}

}  // namespace vf::cli
