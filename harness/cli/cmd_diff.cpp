// vramfuzz diff: the same generated cases under two predictors (harness/diff.h), each difference
// grouped, shrunk and written as a case file, with diff.json, diff.md and diff.html.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "harness/campaign.h"
#include "harness/cli/commands.h"
#include "harness/cli/out_dir.h"
#include "harness/cli/signals.h"
#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "harness/diff.h"
#include "harness/generate.h"
#include "harness/repro.h"
#include "reports/render.h"

namespace vf::cli {
namespace {

struct DiffFlags {
  std::string policy = "comfy:dec2025";
  std::string against;
  std::vector<std::string> against_sets;
  std::string allocator, vram, backend = "sim", tolerance = "0", time, out = "vramfuzz-diff";
  std::uint64_t seed = 1, cases = 0, shrink_execs = 200;
  bool no_shrink = false, no_verdicts = false, clean = false;
};

// "loads.resident+verdict: pass / oom" -> "loads-resident-verdict-pass-oom": a folder name.
std::string slug(const std::string& key) {
  std::string s;
  for (const char c : key) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (keep) s += c;
    else if (!s.empty() && s.back() != '-') s += '-';
  }
  while (!s.empty() && s.back() == '-') s.pop_back();
  return s.substr(0, 80);
}

// The command that draws the same cases again (the flags as given, quoted for a shell).
std::string diff_command(const DiffFlags& f, const DiffConfig& cfg) {
  const auto q = [](const std::string& s) { return shell_quote(s); };
  std::string c = fmt::format("vramfuzz diff --policy {} --against {}", q(f.policy), q(f.against));
  for (const std::string& kv : f.against_sets) c += " --against-set " + q(kv);
  c += fmt::format(" --seed {} ", cfg.seed) + (cfg.cases ? fmt::format("--cases {}", cfg.cases) : fmt::format("--time {}", q(f.time)));
  if (!f.allocator.empty()) c += " --allocator " + q(f.allocator);
  if (!f.vram.empty()) c += " --vram " + q(f.vram);
  if (f.tolerance != "0") c += " --tolerance " + q(f.tolerance);
  if (f.backend != "sim") c += " --backend " + q(f.backend);
  if (f.no_verdicts) c += " --no-verdicts";
  return c;
}

int do_diff(const DiffFlags& f) {
  if (f.against.empty()) throw InputError("--against", "required: the predictor to compare --policy with (comfy:PRESET, exact:PRESET or exec:COMMAND)");
  DiffConfig cfg;
  cfg.seed = f.seed;
  cfg.cases = f.cases;
  if (!f.time.empty()) cfg.seconds = parse_duration(f.time, "--time");
  if (cfg.cases == 0 && cfg.seconds <= 0) cfg.cases = 1000;
  for (const char* flag : {"--policy", "--against"}) {
    const std::string& text = std::string(flag) == "--policy" ? f.policy : f.against;
    if (split_policy_list(text).size() != 1) throw InputError(flag, fmt::format("one predictor, not a list: \"{}\"", text));
  }
  const Policy a = parse_policy(f.policy, "--policy");
  const Policy b = parse_policy(f.against, "--against");
  if (a.dynamic() != b.dynamic()) {
    throw InputError("--against", fmt::format("{} is {} and {} is not: a dynamic VRAM plan places weights at run time and a classic one "
                                              "up front, so their plans cannot be compared field by field",
                                              a.dynamic() ? a.label() : b.label(), "dynamic VRAM", a.dynamic() ? b.label() : a.label()));
  }
  cfg.gen.policy = a.label();
  cfg.against = b.label();
  for (const std::string& kv : f.against_sets) {
    const std::size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) throw InputError("--against-set", fmt::format("expected KEY=VALUE, got \"{}\"", kv));
    cfg.against_overrides.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
    Policy probe = b;
    apply_policy_override(probe, cfg.against_overrides.back().first, cfg.against_overrides.back().second, "--against-set");
  }
  if (!f.allocator.empty()) cfg.gen.allocator = parse_allocator_mode_field(f.allocator, "--allocator");
  if (!f.vram.empty()) cfg.gen.vram = parse_device_total(f.vram, "--vram");
  cfg.tolerance = parse_size(f.tolerance, "--tolerance");
  cfg.shrink = !f.no_shrink;
  cfg.shrink_execs = f.shrink_execs;
  cfg.verdicts = !f.no_verdicts;
  const OutDir out_dir(f.out, OutDir::Options{"--out", f.clean, true});
  namespace fs = std::filesystem;
  for (const char* stale : {"diff.json", "diff.md", "diff.html", "differences"}) {
    const fs::path p = fs::path(f.out) / stale;
    if (!fs::exists(p)) continue;
    if (!f.clean) throw InputError("--out", fmt::format("{} holds an earlier diff ({}): give another --out, or --clean", f.out, stale));
    fs::remove_all(p);
  }
  install_stop_handlers();
  cfg.should_stop = [] { return stop_requested(); };
  auto backend = make_backend(f.backend);
  Catalog catalog;
  spdlog::info("diff: {} against {}, seed {}, {} on {}", cfg.gen.policy.value_or(""), cfg.against, cfg.seed,
               cfg.cases ? fmt::format("{} cases", cfg.cases) : fmt::format("{} s", cfg.seconds), backend->name());
  const std::string command_line = diff_command(f, cfg);
  const DiffResult r = run_diff(cfg, catalog, *backend);
  std::vector<std::string> files;
  for (std::size_t i = 0; i < r.groups.size(); ++i) {
    const DiffGroup& g = r.groups[i];
    const std::string dir = fmt::format("differences/{:02}-{}", i + 1, slug(g.key));
    fs::create_directories(fs::path(f.out) / dir);
    write_file_atomic((fs::path(f.out) / dir / "case.json").string(), scenario_to_json(g.minimal));
    if (g.modules_after != g.modules_before) write_file_atomic((fs::path(f.out) / dir / "original.json").string(), scenario_to_json(g.original));
    files.push_back(dir + "/case.json");
  }
  const std::string json = diff_json(cfg, r, files, command_line);
  write_file_atomic((fs::path(f.out) / "diff.json").string(), json);
  write_file_atomic((fs::path(f.out) / "diff.md").string(), diff_markdown(cfg, r, files));
  write_file_atomic((fs::path(f.out) / "diff.html").string(), report::diff_html(report::Json::parse(json)));
  std::string text = fmt::format("diff: {} cases in {:.2f} s, {} the same; plans differ in {}, verdicts in {}, {} unplanned by one side\n", r.cases,
                                 r.seconds, r.same, r.plans_differ, r.verdicts_differ, r.errors);
  for (std::size_t i = 0; i < r.groups.size(); ++i) {
    const DiffGroup& g = r.groups[i];
    text += fmt::format("  {} case(s): {} ({} -> {} modules) {}\n", g.count, g.key, g.modules_before, g.modules_after, files[i]);
  }
  text += fmt::format("diff: {}/diff.json\nmarkdown: {}/diff.md\nhtml: {}/diff.html\n", f.out, f.out, f.out);
  std::fputs(text.c_str(), stdout);
  return r.groups.empty() ? kExitOk : kExitFindings;
}

}  // namespace

void add_diff(CLI::App& app, Action& action) {
  auto f = std::make_shared<DiffFlags>();
  auto* cmd = app.add_subcommand("diff", "run the same generated cases under two predictors and report where their plans and verdicts "
                                         "differ, each difference shrunk to a minimal case");
  cmd->add_option("--policy", f->policy, "predictor A, whose runtime the cases are drawn for (default comfy:dec2025)");
  cmd->add_option("--against", f->against, "predictor B: comfy:PRESET, exact:PRESET or exec:COMMAND")->required();
  cmd->add_option("--against-set", f->against_sets, "KEY=VALUE: a constant of B only (repeatable), e.g. reserve=600MiB");
  cmd->add_option("--seed", f->seed, "campaign seed (default 1)")->transform(kNonNegative);
  cmd->add_option("--cases", f->cases, "cases to draw (default 1000 without --time)")->transform(kNonNegative);
  cmd->add_option("--time", f->time, "draw cases for this long (30s, 5m)");
  cmd->add_option("--allocator", f->allocator, "fix the allocator mode (raw, caching, caching-expandable, async)");
  cmd->add_option("--vram", f->vram, "fix the device size (24GiB)");
  cmd->add_option("--backend", f->backend, "sim (default), cuda or auto: where the verdicts are run");
  cmd->add_option("--tolerance", f->tolerance, "byte fields differing by at most this are the same (default 0)");
  cmd->add_flag("--no-verdicts", f->no_verdicts, "compare the plans only, without running the cases");
  cmd->add_flag("--no-shrink", f->no_shrink, "keep each group's first case as drawn");
  cmd->add_option("--shrink-execs", f->shrink_execs, "candidate cases per group when shrinking (default 200)")->transform(kNonNegative);
  cmd->add_option("--out", f->out, "output directory (default vramfuzz-diff)");
  cmd->add_flag("--clean", f->clean, "replace an earlier diff in --out");
  cmd->callback([&action, f] { action = [f] { return do_diff(*f); }; });
}

}  // namespace vf::cli
