// vramfuzz fuzz: a campaign of generated scenarios.
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "harness/campaign.h"
#include "harness/cli/commands.h"
#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "models/import.h"

namespace vf::cli {
namespace {

// CLI11 (2.1) reads "-5" into an unsigned option as 2^64 - 5: refuse a sign before it converts.
const CLI::Validator kNonNegative(
    [](std::string& v) {
      const auto first = v.find_first_not_of(" \t");
      return first != std::string::npos && v[first] == '-' ? std::string("must not be negative, got " + v) : std::string();
    },
    "NONNEGATIVE");

struct FuzzFlags {
  std::uint64_t seed = 1;
  std::uint64_t cases = 0;
  std::string time;
  std::string vram;
  std::string out;
  std::string backend = "auto";
  std::string model;  // --model FILE: fuzz around one imported model
  std::uint32_t keep = 3;
  bool no_shrink = false;
  std::uint64_t shrink_execs = 400;
  std::string shrink_time = "120s";
  std::uint32_t runs = 0;
  std::string corpus;
  PolicyFlags policy;
};

std::string summary_json(const CampaignConfig& cfg, const CampaignResult& r, const std::string& backend) {
  nlohmann::ordered_json j;
  j["schema"] = "vramfuzz.summary/1";
  j["tool"] = tool_version();
  j["command"] = cfg.command_line;
  j["config"] = {{"seed", cfg.seed},
                 {"cases", cfg.cases},
                 {"seconds", cfg.seconds},
                 {"backend", backend},
                 {"policy", cfg.gen.policy.value_or("drawn")},
                 {"allocator", cfg.gen.allocator ? std::string(allocator_mode_name(*cfg.gen.allocator)) : "drawn"},
                 {"vram", cfg.gen.vram ? nlohmann::json(*cfg.gen.vram) : nlohmann::json("drawn")}};
  j["counts"] = {{"cases", r.cases},
                 {"findings", r.findings},
                 {"signatures", r.signatures.size()},
                 {"new_signatures", r.new_signatures()},
                 {"expected_ooms", r.expected_ooms},
                 {"errors", r.errors},
                 {"seconds", r.seconds}};
  nlohmann::ordered_json sigs = nlohmann::json::array();
  for (const auto& [sig, c] : r.signatures) {
    sigs.push_back({{"signature", sig},
                    {"count", c.count},
                    {"worst_overshoot", c.worst_overshoot},
                    {"first_case_seed", c.first_case_seed},
                    {"known", c.known},
                    {"repro", c.repro_file},
                    {"repro_modules", c.repro_modules},
                    {"shrink_executions", c.shrink_execs},
                    {"flaky", c.flaky},
                    {"file", c.first_file}});
  }
  j["findings"] = std::move(sigs);
  return j.dump(2) + "\n";
}

int do_fuzz(const FuzzFlags& f) {
  CampaignConfig cfg;
  cfg.seed = f.seed;
  cfg.cases = f.cases;
  if (!f.time.empty()) cfg.seconds = parse_duration(f.time, "--time");
  if (cfg.cases == 0 && cfg.seconds <= 0) cfg.cases = 1000;
  if (!f.policy.policy.empty()) cfg.gen.policy = parse_policy(f.policy.policy, "--policy").label();
  if (!f.policy.reserve.empty()) {
    (void)parse_size(f.policy.reserve, "--reserve");  // reported as the flag, not as "--set.reserve"
    cfg.gen.policy_overrides.emplace_back("reserve", f.policy.reserve);
  }
  for (const std::string& kv : f.policy.sets) cfg.gen.policy_overrides.push_back(split_kv(kv, "--set"));
  if (!f.policy.allocator.empty()) {
    const auto m = parse_allocator_mode(f.policy.allocator);
    if (!m) throw InputError("--allocator", fmt::format("unknown allocator mode \"{}\"", f.policy.allocator));
    cfg.gen.allocator = *m;
  }
  if (!f.vram.empty()) {
    cfg.gen.vram = parse_size(f.vram, "--vram");
    if (*cfg.gen.vram < GiB) throw InputError("--vram", "a device needs at least 1 GiB here");
  }
  // Validate overrides once up front so a typo is exit 2 before any case runs.
  {
    Policy probe = parse_policy(cfg.gen.policy.value_or("comfy:dec2025"), "--policy");
    for (const auto& [k, v] : cfg.gen.policy_overrides) apply_policy_override(probe, k, v, "--set");
  }
  if (!f.model.empty()) {
    ImportedModel imported = import_model_file(f.model, {});
    for (const std::string& w : imported.warnings) spdlog::warn("{}: {}", f.model, w);
    spdlog::info("fuzz: model {} ({}, family {}, {} modules, {})", imported.model.name, imported.format,
                 family_name(imported.model.family), imported.model.modules.size(), format_mib(imported.model.bytes));
    cfg.gen.model = std::make_shared<const ModelSpec>(std::move(imported.model));
  }
  cfg.out_dir = f.out;
  cfg.keep_per_signature = f.keep;
  cfg.shrink = !f.no_shrink;
  cfg.shrink_execs = f.shrink_execs;
  cfg.shrink_seconds = parse_duration(f.shrink_time, "--shrink-time");
  cfg.corpus_dir = f.corpus;
  cfg.command_line = fmt::format("vramfuzz fuzz --seed {} {}{}{}{}{}{}", cfg.seed,
                                 cfg.cases ? fmt::format("--cases {}", cfg.cases) : fmt::format("--time {}s", cfg.seconds),
                                 cfg.gen.policy ? " --policy " + *cfg.gen.policy : "",
                                 cfg.gen.allocator ? fmt::format(" --allocator {}", allocator_mode_name(*cfg.gen.allocator)) : "",
                                 f.vram.empty() ? "" : " --vram " + f.vram, f.model.empty() ? "" : " --model " + f.model,
                                 f.out.empty() ? "" : " --out " + f.out);
  auto backend = make_backend(f.backend);
  cfg.confirm_runs = f.runs ? f.runs : (backend->name() == "cuda" ? 5 : 1);
  Catalog catalog;
  spdlog::info("fuzz: seed {}, {} on {}, policy {}, allocator {}, device {}", cfg.seed,
               cfg.cases ? fmt::format("{} cases", cfg.cases) : fmt::format("{:.0f} s", cfg.seconds), backend->name(),
               cfg.gen.policy.value_or("drawn"), cfg.gen.allocator ? allocator_mode_name(*cfg.gen.allocator) : "drawn",
               cfg.gen.vram ? format_size(*cfg.gen.vram) : "drawn");
  const CampaignResult r = run_campaign(cfg, catalog, *backend);

  std::fputs(fmt::format("fuzz: {} cases in {:.2f} s ({:.0f} cases/s) on {}, seed {}\n", r.cases, r.seconds,
                         r.seconds > 0 ? static_cast<double>(r.cases) / r.seconds : 0.0, backend->name(), cfg.seed)
                 .c_str(),
             stdout);
  std::fputs(fmt::format("findings: {} in {} signature(s); expected OOMs (plan did not fit): {}; errors: {}\n", r.findings,
                         r.signatures.size(), r.expected_ooms, r.errors)
                 .c_str(),
             stdout);
  if (!r.corpus.empty()) {
    std::size_t still = 0;
    for (const CorpusEntry& c : r.corpus) still += c.still_fails ? 1 : 0;
    std::fputs(fmt::format("regression corpus: {} repros replayed, {} still fail, {} no longer reproduce\n", r.corpus.size(),
                           still, r.corpus.size() - still)
                   .c_str(),
               stdout);
    for (const CorpusEntry& c : r.corpus) {
      if (!c.still_fails) std::fputs(fmt::format("  no longer reproduces: {} ({} -> {})\n", c.file, c.signature, c.verdict).c_str(), stdout);
    }
  }
  if (!r.signatures.empty()) {
    std::fputs(fmt::format("{:<44} {:>7} {:>16} {:>8}  {}\n", "signature", "count", "worst overshoot", "repro", "file").c_str(), stdout);
    for (const auto& [sig, c] : r.signatures) {
      const std::string repro = c.known ? "known" : c.repro_file.empty() ? "-" : fmt::format("{} mod", c.repro_modules);
      const std::string file = !c.repro_file.empty() ? c.repro_file
                               : c.first_file.empty() ? fmt::format("seed {:#x}", c.first_case_seed)
                                                      : c.first_file;
      std::fputs(fmt::format("{:<44} {:>7} {:>16} {:>8}  {}{}\n", sig, c.count, format_signed_mib(c.worst_overshoot), repro,
                             file, c.flaky ? "  (flaky)" : "")
                     .c_str(),
                 stdout);
    }
  }
  if (!cfg.out_dir.empty()) {
    const std::string path = cfg.out_dir + "/summary.json";
    write_file_atomic(path, summary_json(cfg, r, std::string(backend->name())));
    std::fputs(fmt::format("summary: {}\n", path).c_str(), stdout);
  }
  if (r.errors > 0 && r.findings == 0) return kExitInfra;
  // Only new signatures fail a run: a regression corpus marks the known ones.
  return r.new_signatures() > 0 ? kExitFindings : kExitOk;
}

}  // namespace

void add_fuzz(CLI::App& app, Action& action) {
  auto f = std::make_shared<FuzzFlags>();
  CLI::App* cmd = app.add_subcommand("fuzz", "run a campaign of random scenarios and write every finding");
  cmd->add_option("--seed", f->seed, "campaign seed (each case's seed derives from it)")->capture_default_str()->check(kNonNegative);
  cmd->add_option("--cases", f->cases, "number of cases (default 1000 when --time is not given)")->check(kNonNegative);
  cmd->add_option("--time", f->time, "time budget: 60s, 5m, 1h");
  cmd->add_option("--vram", f->vram, "device total (e.g. 24GiB); default: drawn per case");
  cmd->add_option("--out", f->out, "output directory for findings and summary.json");
  cmd->add_option("--model", f->model, "fuzz around this model file (safetensors, index.json or GGUF) instead of catalog pipelines");
  cmd->add_option("--backend", f->backend, "sim | cuda | auto (cuda when a GPU is usable)")->capture_default_str();
  cmd->add_option("--keep", f->keep, "finding files kept per signature")->capture_default_str()->check(kNonNegative);
  cmd->add_flag("--no-shrink", f->no_shrink, "write findings without shrinking them into repros");
  cmd->add_option("--shrink-execs", f->shrink_execs, "execution budget per shrink")->capture_default_str()->check(kNonNegative);
  cmd->add_option("--shrink-time", f->shrink_time, "time budget per shrink")->capture_default_str();
  cmd->add_option("--runs", f->runs, "re-runs of each repro for its reliability (default 1 on sim, 5 on cuda)")->check(kNonNegative);
  cmd->add_option("--corpus", f->corpus, "replay every repro under DIR first; their signatures count as known");
  f->policy.add_to(*cmd, true);
  cmd->callback([f, &action] { action = [f] { return do_fuzz(*f); }; });
}

}  // namespace vf::cli
