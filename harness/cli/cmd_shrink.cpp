// vramfuzz shrink / replay: turn a finding into a filed-ready repro, and replay repros.
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "harness/cli/commands.h"
#include "harness/cli/out_dir.h"
#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "harness/predictors/external.h"
#include "harness/repro.h"

namespace vf::cli {
namespace {

// --predictor COMMAND: starts the external predictor a file names (files never start commands);
// it must say hello under the name the file recorded.
void start_file_predictor(const Scenario& s, const std::string& command) {
  if (command.empty()) return;
  if (s.policy.predictor != PredictorKind::external) {
    throw InputError("--predictor", fmt::format("the case's policy is {}, not an external predictor", s.policy.label()));
  }
  const PredictorHello& h = start_external(command);
  if (h.name != s.policy.external_name) {
    throw InputError("--predictor", fmt::format("`{}` says hello as \"{}\"; the case was made with \"{}\"", command, h.name,
                                                s.policy.external_name));
  }
  require_overrides_applied(s);
}

struct ShrinkFlags {
  std::string file;
  std::string out;
  std::string backend = "sim";
  std::uint64_t execs = ShrinkOptions{}.max_execs;
  std::string time;
  std::uint32_t runs = 0;  // 0: 1 on sim, 5 on cuda
  bool force = false;      // --force: replace a repro.json / repro.md already there
  std::string predictor;   // --predictor: the command of the file's external predictor
};

std::uint32_t default_runs(std::string_view backend) { return backend == "cuda" ? 5 : 1; }

int do_shrink(const ShrinkFlags& f) {
  Catalog catalog;
  const Scenario s = load_case_file(f.file, catalog);
  start_file_predictor(s, f.predictor);
  // Next to the finding is where its campaign wrote the repro of its signature: never replaced
  // without --force (a repro written elsewhere neither).
  const std::string dir = f.out.empty() ? std::filesystem::path(f.file).parent_path().string() : f.out;
  refuse_repro_overwrite(dir.empty() ? "." : dir, f.out.empty() ? "shrink" : "--out", f.force);
  auto backend = make_backend(f.backend);
  ShrinkOptions opt;
  opt.max_execs = f.execs;
  if (!f.time.empty()) opt.max_seconds = parse_duration(f.time, "--shrink-time");
  opt.confirm_runs = f.runs ? f.runs : default_runs(backend->name());
  const ShrinkResult r = shrink(s, *backend, opt);
  const std::string path = write_repro(dir.empty() ? "." : dir, r, read_origin(f.file));
  std::fputs(fmt::format("{}\nshrunk {} models / {} modules / {} -> {} / {} / {} in {} executions ({} cached, {:.2f} s){}\n"
                         "overshoot {} (original {}, largest seen {}); reproduced {}/{}{}\nrepro: {}\n",
                         repro_title(r), r.original_size.models, r.original_size.modules, format_mib(r.original_size.bytes),
                         r.final_size.models, r.final_size.modules, format_mib(r.final_size.bytes), r.executions,
                         r.cache_hits, r.seconds, r.budget_exhausted ? " [budget exhausted]" : "",
                         format_signed_mib(r.result.verdict.overshoot), format_signed_mib(r.original_overshoot),
                         format_signed_mib(r.largest_overshoot), r.reproduced, r.confirm_runs, r.flaky ? " FLAKY" : "", path)
                 .c_str(),
             stdout);
  return kExitFindings;
}

struct ReplayFlags {
  std::string file;
  std::string backend = "sim";
  std::uint32_t runs = 0;
  std::string predictor;
};

int do_replay(const ReplayFlags& f) {
  Catalog catalog;
  const Scenario s = load_case_file(f.file, catalog);
  start_file_predictor(s, f.predictor);
  std::string expected;
  {
    const auto doc = parse_json_text(read_text_file(f.file), f.file);
    expected = recorded_signature(doc);
  }
  auto backend = make_backend(f.backend);
  const std::uint32_t runs = f.runs ? f.runs : default_runs(backend->name());
  std::uint32_t reproduced = 0;
  std::string last;
  for (std::uint32_t i = 0; i < runs; ++i) {
    Scenario c = s;
    if (i > 0) c.seed = splitmix64(s.seed + i);
    const CaseResult r = run_case(c, *backend, false);
    if (r.verdict.kind == VerdictKind::error) throw InfraError(fmt::format("run {}: {}", i + 1, r.verdict.message));
    const bool hit = expected.empty() ? r.verdict.finding() : r.verdict.signature == expected;
    reproduced += hit ? 1 : 0;
    last = fmt::format("{}{}{}", verdict_kind_name(r.verdict.kind), r.verdict.signature.empty() ? "" : " " + r.verdict.signature,
                       r.verdict.message.empty() ? "" : " - " + r.verdict.message);
    std::fputs(fmt::format("run {}/{}: {}\n", i + 1, runs, last).c_str(), stdout);
  }
  std::fputs(fmt::format("{}: reproduced {}/{} on {}{}\n", f.file, reproduced, runs, backend->name(),
                         expected.empty() ? "" : " (signature " + expected + ")")
                 .c_str(),
             stdout);
  return reproduced > 0 ? kExitFindings : kExitOk;
}

struct RenderFlags {
  std::string file;
  std::string backend = "sim";
  std::string predictor;
};

// Rewrites a repro in place with this version's rendering: the scenario is run again for the
// figures, the shrink's lineage is kept from the file (read_repro_lineage).
int do_render_repro(const RenderFlags& f) {
  const std::filesystem::path file(f.file);
  if (file.filename() != "repro.json") {
    throw InputError("repro", fmt::format("{}: render-repro rewrites a repro in place (a folder's repro.json and repro.md); give its repro.json", f.file));
  }
  ShrinkResult r = read_repro_lineage(f.file);
  Catalog catalog;
  r.minimal = load_case_file(f.file, catalog);
  r.final_size = case_size(r.minimal);
  start_file_predictor(r.minimal, f.predictor);
  auto backend = make_backend(f.backend);
  r.result = run_case(r.minimal, *backend, true);
  const Verdict& v = r.result.verdict;
  if (v.kind == VerdictKind::error) throw InfraError(fmt::format("{}: error verdict: {}", f.file, v.message));
  if (v.signature != r.signature) {
    // Rendered, the file would describe a finding its scenario no longer gives.
    throw InputError("signature", fmt::format("{}: the scenario gives {} here, not the recorded {}: nothing rewritten (shrink the "
                                              "finding it came from again, or replay it to see the change)",
                                              f.file, v.signature.empty() ? std::string(verdict_kind_name(v.kind)) : v.signature,
                                              r.signature));
  }
  const std::string dir = file.parent_path().empty() ? "." : file.parent_path().string();
  // The origin as the file records it, the finding it was shrunk from included (read_origin
  // names the file it reads instead: here, the repro itself).
  ReproOrigin origin = read_origin(f.file);
  origin.source_file.clear();
  if (const auto doc = parse_json_text(read_text_file(f.file), f.file); doc.contains("origin") && doc["origin"].contains("finding")) {
    origin.source_file = doc["origin"]["finding"].get<std::string>();
  }
  const std::string path = write_repro(dir, r, origin);
  std::fputs(fmt::format("{}\nrendered again (lineage kept: {} executions, original overshoot {}); overshoot {}\nrepro: {}\n",
                         repro_title(r), r.executions, format_signed_mib(r.original_overshoot), format_signed_mib(v.overshoot), path)
                 .c_str(),
             stdout);
  return kExitOk;
}

}  // namespace

void add_render_repro(CLI::App& app, Action& action) {
  auto f = std::make_shared<RenderFlags>();
  CLI::App* cmd = app.add_subcommand(
      "render-repro", "rewrite a repro's repro.json and repro.md with this version, keeping its shrink's lineage (not shrunk again)");
  cmd->add_option("repro", f->file, "the repro.json to render again (its folder's repro.md is rewritten too)")->required();
  cmd->add_option("--backend", f->backend, "sim | cuda | auto: where the scenario runs for the figures")->capture_default_str();
  cmd->add_option("--predictor", f->predictor, "the command of the external predictor the file names (exec:NAME): never taken from the file");
  cmd->callback([f, &action] { action = [f] { return do_render_repro(*f); }; });
}

void add_shrink(CLI::App& app, Action& action) {
  auto f = std::make_shared<ShrinkFlags>();
  CLI::App* cmd = app.add_subcommand("shrink", "shrink a finding into a minimal repro (repro.json + repro.md)");
  cmd->add_option("finding", f->file, "a finding file (vramfuzz.finding/1), a repro, or a scenario that fails")->required();
  cmd->add_option("--out", f->out, "directory for repro.json and repro.md (default: next to the finding)");
  cmd->add_flag("--force", f->force, "replace a repro.json / repro.md already in that directory (else refused)");
  cmd->add_option("--backend", f->backend, "sim | cuda | auto")->capture_default_str();
  cmd->add_option("--shrink-execs", f->execs, "execution budget")->capture_default_str()->transform(kPositiveCount);
  cmd->add_option("--shrink-time", f->time, "time budget (e.g. 60s, 5m)");
  cmd->add_option("--runs", f->runs, "re-runs of the final case for the reliability figure (default 1 on sim, 5 on cuda)")
      ->transform(kPositiveCount);
  cmd->add_option("--predictor", f->predictor, "the command of the external predictor the file names (exec:NAME): never taken from the file");
  cmd->callback([f, &action] { action = [f] { return do_shrink(*f); }; });
}

void add_replay(CLI::App& app, Action& action) {
  auto f = std::make_shared<ReplayFlags>();
  CLI::App* cmd = app.add_subcommand("replay", "replay a repro (or finding); exit 1 when it reproduces");
  cmd->add_option("repro", f->file, "repro / finding / scenario file")->required();
  cmd->add_option("--backend", f->backend, "sim | cuda | auto")->capture_default_str();
  cmd->add_option("--runs", f->runs, "how many times to run it (default 1 on sim, 5 on cuda)")->transform(kPositiveCount);
  cmd->add_option("--predictor", f->predictor, "the command of the external predictor the file names (exec:NAME): never taken from the file");
  cmd->callback([f, &action] { action = [f] { return do_replay(*f); }; });
}

}  // namespace vf::cli
