// vramfuzz fuzz: a campaign of generated scenarios.
#include <cstdio>
#include <filesystem>
#include <optional>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "harness/campaign.h"
#include "harness/cli/commands.h"
#include "harness/cli/out_dir.h"
#include "harness/cli/progress.h"
#include "harness/cli/signals.h"
#include "harness/cli/workers.h"
#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "harness/predictors/external.h"
#include "harness/sim/allocator.h"
#include "models/import.h"
#include "reports/recover.h"
#include "reports/render.h"

namespace vf::cli {
namespace {


struct FuzzFlags {
  std::uint64_t seed = 1;
  std::uint64_t cases = 0;
  std::string time;
  std::string vram;
  std::string out;
  std::string backend = "auto";
  std::string model;   // --model FILE: fuzz around one imported model
  std::string family;  // --family F: its family, when the tensor names cannot tell
  std::uint32_t keep = 3;
  bool no_shrink = false;
  std::uint64_t shrink_execs = 400;
  std::string shrink_time = "120s";
  std::uint32_t runs = 0;
  std::string corpus;
  std::string shard;     // --shard I/N
  std::string devices;   // --devices 0,1,...: one worker process per device
  std::string progress = "auto";
  std::string transfer = "copy";  // --transfer copy | skip (cuda)
  bool isolate = false;           // --isolate: each case in a child process
  bool clean = false;             // --clean: remove an earlier run's results from --out first
  std::string min_overshoot = "2MiB";  // --min-overshoot: violations below it are noise, not new
  std::uint32_t knee_every = 4;        // --knee-every: P4's paired check on every K-th passing case (0: off)
  PolicyFlags policy;
};

// What decides which cases the campaign generates and how they are judged, besides --seed and the
// count: every such option with its value (the backend as it resolved, defaults left out where a
// default cannot change). The summary's command and each finding's `found_by` carry it, so either
// re-run gives the same cases and verdicts (the corpus decides which are known, the exit code).
std::string case_options(const FuzzFlags& f, const CampaignConfig& cfg, std::string_view backend) {
  std::string out = option_text("--policy", policy_list_flag(cfg.gen.policy.value_or("")));
  out += option_text("--reserve", f.policy.reserve);
  for (const std::string& kv : f.policy.sets) out += option_text("--set", kv);
  out += option_text("--allocator", cfg.gen.allocator ? std::string(allocator_mode_name(*cfg.gen.allocator)) : "");
  for (const std::string& kv : f.policy.options) out += option_text("--option", kv);
  out += option_text("--activations", f.policy.activations);
  out += option_text("--vram", f.vram);
  out += option_text("--model", f.model);
  out += option_text("--family", f.family);
  out += option_text("--backend", std::string(backend));
  if (f.transfer != "copy") out += option_text("--transfer", f.transfer);
  out += option_text("--corpus", f.corpus);
  if (f.knee_every != FuzzFlags{}.knee_every) out += fmt::format(" --knee-every {}", f.knee_every);
  if (cfg.shard_count > 1) out += fmt::format(" --shard {}/{}", cfg.shard_index, cfg.shard_count);
  return out;
}

// The whole run: the count or budget, case_options, what shapes the repros, and --out.
std::string fuzz_command(const FuzzFlags& f, const CampaignConfig& cfg) {
  const FuzzFlags defaults;
  std::string out = fmt::format("vramfuzz fuzz --seed {} {}{}", cfg.seed,
                                cfg.cases ? fmt::format("--cases {}", cfg.cases) : fmt::format("--time {}s", cfg.seconds),
                                cfg.case_options);
  if (f.no_shrink) out += " --no-shrink";
  if (f.shrink_execs != defaults.shrink_execs) out += fmt::format(" --shrink-execs {}", f.shrink_execs);
  if (f.shrink_time != defaults.shrink_time) out += option_text("--shrink-time", f.shrink_time);
  if (f.runs != 0) out += fmt::format(" --runs {}", f.runs);
  if (f.keep != defaults.keep) out += fmt::format(" --keep {}", f.keep);
  if (f.min_overshoot != defaults.min_overshoot) out += option_text("--min-overshoot", f.min_overshoot);
  return out + option_text("--out", f.out);
}

// The files a run wrote; the HTML report last, so a terminal ends with it.
void print_report_files(const report::ReportFiles& files) {
  std::fputs(fmt::format("summary: {}\njunit: {}\nmarkdown: {}\nreport: {}\n", files.summary, files.junit, files.markdown, files.html)
                 .c_str(),
             stdout);
}

// `--devices`: the workers run this command as shards; their summaries are merged into OUT.
int run_device_workers(const std::vector<std::string>& devices, const std::string& out, const std::string& command_line) {
  const WorkerRun run = run_workers(devices, out);
  std::vector<report::Json> docs;
  std::vector<std::string> dirs;
  int worst = kExitOk;
  std::vector<std::size_t> failed;  // workers that exited 3 (or died) or left no summary
  for (std::size_t k = 0; k < run.dirs.size(); ++k) {
    if (run.exit_codes[k] == kExitBadInput) return kExitBadInput;  // every worker had the same flags
    if (run.exit_codes[k] > kExitFindings) {
      worst = kExitInfra;
      failed.push_back(k);
    }
    try {
      docs.push_back(report::load_summary(run.dirs[k]));
      dirs.push_back(run.dirs[k]);
    } catch (const InputError& e) {
      spdlog::error("devices: worker {} left no summary (exit {}): {}", k, run.exit_codes[k], e.what());
      worst = kExitInfra;
      if (failed.empty() || failed.back() != k) failed.push_back(k);
    }
  }
  if (docs.empty()) return kExitInfra;
  const std::string cmd = fmt::format("{} --devices {}", command_line, fmt::join(devices, ","));
  const report::Json merged = report::merge_summaries(docs, dirs, report::run_info("fuzz", cmd, "", out));
  std::fputs(report::terminal_findings(merged).c_str(), stdout);
  const report::ReportFiles files = report::write_reports(out, merged);
  print_report_files(files);
  const int found = report::summary_exit_code(merged);
  // One exit code cannot say both: 3 wins (a shard's cases went unchecked), and the log says what
  // the other workers found.
  if (worst != kExitOk && found != kExitOk) {
    spdlog::error("devices: exit {}: worker(s) {} failed (exit 3), and the workers found {} new signature(s) (exit {}): see {}",
                  worst, fmt::join(failed, ","), merged["counts"].value("new_signatures", std::uint64_t{0}), found, files.html);
  }
  return worst != kExitOk ? worst : found;
}

// `--model FILE`: a safetensors file, a sharded checkpoint's index.json or a GGUF file (imported,
// headers only), or the inline model `models import --out` writes (JSON with "modules"), which
// names its family itself.
std::shared_ptr<const ModelSpec> load_fuzz_model(const std::string& path, const std::string& family) {
  const std::string flag = "--model " + path;
  const bool json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  if (json) {
    const nlohmann::json doc = parse_json_text(read_text_file(path), path);
    if (doc.is_object() && !doc.contains("weight_map")) {
      if (!family.empty()) throw InputError("--family", fmt::format("{} is a model file that names its family itself; set \"family\" there", path));
      Catalog catalog;
      ModelRef ref;
      try {
        ref = model_from_json(doc, catalog, "", std::filesystem::path(path).parent_path().string());
      } catch (const InputError& e) {
        throw InputError(flag, e.what());
      }
      auto spec = std::make_shared<ModelSpec>(*ref.spec);
      spec->name = ref.id;
      spdlog::info("fuzz: model {} ({}, family {}, {} modules, {})", spec->name, ref.source, family_name(spec->family),
                   spec->modules.size(), format_mib(spec->bytes));
      return spec;
    }
  }
  ImportOptions opts;
  if (!family.empty()) {
    const auto fam = parse_family(family);
    if (!fam) throw InputError("--family", fmt::format("unknown family \"{}\" (one of: {})", family, family_names()));
    opts.family = *fam;
  }
  ImportedModel imported = import_model_file(path, opts);
  for (const std::string& w : imported.warnings) spdlog::warn("{}: {}", path, w);
  spdlog::info("fuzz: model {} ({}, family {}, {} modules, {})", imported.model.name, imported.format,
               family_name(imported.model.family), imported.model.modules.size(), format_mib(imported.model.bytes));
  return std::make_shared<const ModelSpec>(std::move(imported.model));
}

int do_fuzz(const FuzzFlags& f) {
  CampaignConfig cfg;
  cfg.seed = f.seed;
  cfg.cases = f.cases;
  if (!f.time.empty()) cfg.seconds = parse_duration(f.time, "--time");
  if (cfg.cases == 0 && cfg.seconds <= 0) cfg.cases = 1000;
  cfg.gen.policy_overrides = f.policy.overrides();
  if (f.isolate) {
    // Checked before any predictor starts: a case's child process could not reach the predictor
    // process its parent talks to (an external predictor is a process of its own already).
    for (const std::string& one : split_policy_list(f.policy.policy)) {
      if (one.starts_with("exec:")) {
        throw InputError("--isolate", "cannot be combined with an external predictor (--policy exec:...): it already runs "
                                      "in a process of its own, and a case's child process cannot reach it");
      }
    }
  }
  if (!f.policy.policy.empty()) cfg.gen.policy = parse_policy_list(f.policy.policy, "--policy", cfg.gen.policy_overrides, !f.policy.reserve.empty());
  if (!f.policy.allocator.empty()) cfg.gen.allocator = parse_allocator_mode_field(f.policy.allocator, "--allocator");
  if (!f.policy.options.empty()) {
    // Options are per mode (max_split_size_mb means nothing to raw): they need the mode fixed.
    if (!cfg.gen.allocator) throw InputError("--option", "needs --allocator: allocator options belong to one mode");
    AllocatorConfig probe{*cfg.gen.allocator, {}};
    for (const std::string& kv : f.policy.options) probe.options.push_back(split_kv(kv, "--option"));
    // caching with expandable_segments=True runs (and is signed) as caching-expandable.
    sim::normalize_allocator_config(probe, [](std::string_view key) { return fmt::format("--option {}", key); });
    cfg.gen.allocator = probe.mode;
    cfg.gen.allocator_options = probe.options;
  }
  if (!f.vram.empty()) {
    cfg.gen.vram = parse_device_total(f.vram, "--vram");
    if (*cfg.gen.vram < GiB) throw InputError("--vram", "a device needs at least 1 GiB here");
  }
  // Validate overrides once up front so a typo is exit 2 before any case runs (a list was
  // checked policy by policy above).
  if (!cfg.gen.policy) {
    Policy probe = parse_policy("comfy:dec2025", "--policy");
    for (const auto& [k, v] : cfg.gen.policy_overrides) apply_policy_override(probe, k, v, "--set");
  }
  // A fixed allocator must leave a policy ComfyUI can run it with.
  if (cfg.gen.policy && cfg.gen.allocator) {
    bool any = false;
    for (std::string_view one : split_policy_list(*cfg.gen.policy)) {
      const Policy p = parse_policy(one, "--policy");
      const bool runs = !p.dynamic() || (*cfg.gen.allocator != AllocatorMode::caching_expandable &&
                                         (p.preset != Preset::feb2026 || *cfg.gen.allocator == AllocatorMode::async));
      if (runs) any = true;
      else spdlog::warn("--policy {} cannot run with --allocator {}: its cases are not drawn", one, allocator_mode_name(*cfg.gen.allocator));
    }
    if (!any) {
      throw InputError("--allocator", fmt::format("no policy of --policy {} runs with {} (dynamic VRAM: no expandable segments; "
                                                  "comfy:feb2026: async only)", *cfg.gen.policy, allocator_mode_name(*cfg.gen.allocator)));
    }
  }
  if (!f.policy.activations.empty()) cfg.gen.activations = parse_activation_flag(f.policy.activations, "--activations");
  if (!f.family.empty() && f.model.empty()) throw InputError("--family", "applies to --model only (the family of a model file)");
  if (!f.model.empty()) cfg.gen.model = load_fuzz_model(f.model, f.family);
  cfg.out_dir = f.out;
  cfg.keep_per_signature = f.keep;
  cfg.min_overshoot = parse_size(f.min_overshoot, "--min-overshoot");
  cfg.knee_every = f.knee_every;
  cfg.activations = f.policy.activations.empty() ? "model" : f.policy.activations;
  cfg.shrink = !f.no_shrink;
  cfg.shrink_execs = f.shrink_execs;
  cfg.shrink_seconds = parse_duration(f.shrink_time, "--shrink-time");
  cfg.corpus_dir = f.corpus;
  if (!f.shard.empty()) std::tie(cfg.shard_index, cfg.shard_count) = parse_shard(f.shard, "--shard");
  const ProgressMode progress_mode = parse_progress_mode(f.progress);
  install_stop_handlers();
  if (!f.devices.empty()) {
    if (f.out.empty()) throw InputError("--devices", "needs --out: each worker writes OUT/shard-K, then they are merged into OUT");
    if (!f.shard.empty()) throw InputError("--devices", "cannot be combined with --shard (the workers are the shards)");
    const std::vector<std::string> devices = parse_device_list(f.devices, "--devices");
    // OUT is this run's before any worker starts (each worker takes its OUT/shard-K the same way).
    const OutDir out_dir(f.out, OutDir::Options{"--out", f.clean, true});
    // The workers resolve the backend themselves; the merged command names it as given.
    cfg.case_options = case_options(f, cfg, f.backend);
    const std::string command = fuzz_command(f, cfg);
    // Each worker starts its own external predictor; the one started here (its hello checked the
    // command) is not needed while they run.
    stop_external_predictors();
    return run_device_workers(devices, f.out, command);
  }
  if (cfg.shard_count > 1) {
    spdlog::default_logger()->set_pattern(fmt::format("%^[%l]%$ [shard {}/{}] %v", cfg.shard_index, cfg.shard_count));
  }
  BackendOptions backend_options;
  backend_options.transfer = f.transfer;
  backend_options.isolate = f.isolate;
  auto backend = make_backend(f.backend, backend_options);
  cfg.confirm_runs = f.runs ? f.runs : (backend->name() == "cuda" ? 5 : 1);
  cfg.case_options = case_options(f, cfg, backend->name());
  cfg.command_line = fuzz_command(f, cfg);
  // OUT is taken before the corpus and the first case: a writable directory, this run's alone, no
  // earlier run's results in it (out_dir.h); run.json records the run for `report` to rebuild its
  // summary from the finding files if the process is killed.
  std::optional<OutDir> out_dir;
  if (!cfg.out_dir.empty()) {
    out_dir.emplace(cfg.out_dir, OutDir::Options{"--out", f.clean, true});
    write_file_atomic((std::filesystem::path(cfg.out_dir) / "run.json").string(),
                      report::run_marker_json(cfg, report::run_info("fuzz", cfg.command_line, std::string(backend->name()), cfg.out_dir)));
  }
  Catalog catalog;
  spdlog::info("fuzz: seed {}, {} on {}, policy {}, allocator {}, device {}", cfg.seed,
               cfg.cases ? fmt::format("{} cases", cfg.cases) : fmt::format("{:.0f} s", cfg.seconds), backend->name(),
               cfg.gen.policy.value_or("drawn"), cfg.gen.allocator ? allocator_mode_name(*cfg.gen.allocator) : "drawn",
               cfg.gen.vram ? format_size(*cfg.gen.vram) : "drawn");
  cfg.should_stop = [] { return stop_requested(); };
  Progress progress(progress_mode, "fuzz", cfg.cases, cfg.seconds);
  cfg.on_case = [&progress](const CampaignResult& so_far, double elapsed) {
    progress.update({so_far.cases, so_far.findings, so_far.signatures.size(), so_far.new_signatures(), elapsed});
  };
  const CampaignResult r = run_campaign(cfg, catalog, *backend);
  progress.finish();
  if (r.stopped) spdlog::warn("fuzz: stopped by signal {} after {} cases; writing the reports", stop_signal(), r.cases);

  std::fputs(fmt::format("fuzz: {} cases in {:.2f} s ({:.0f} cases/s) on {}, seed {}\n", r.cases, r.seconds,
                         r.seconds > 0 ? static_cast<double>(r.cases) / r.seconds : 0.0, backend->name(), cfg.seed)
                 .c_str(),
             stdout);
  const report::Json summary =
      report::summary_from_campaign(cfg, r, report::run_info("fuzz", cfg.command_line, std::string(backend->name()), cfg.out_dir));
  std::fputs(report::terminal_findings(summary).c_str(), stdout);
  if (!cfg.out_dir.empty()) {
    const report::ReportFiles files = report::write_reports(cfg.out_dir, summary);
    print_report_files(files);
  }
  if (!r.fatal_error.empty()) return kExitInfra;  // the campaign could not finish (sticky CUDA error)
  if (r.errors > 0 && r.findings == 0) return kExitInfra;
  // Only new signatures fail a run: a regression corpus marks the known ones.
  return r.new_signatures() > 0 ? kExitFindings : kExitOk;
}

}  // namespace

void add_fuzz(CLI::App& app, Action& action) {
  auto f = std::make_shared<FuzzFlags>();
  CLI::App* cmd = app.add_subcommand("fuzz", "run a campaign of random scenarios; write the first --keep finding files of each signature, count every finding");
  cmd->add_option("--seed", f->seed, "campaign seed (each case's seed derives from it)")->capture_default_str()->transform(kNonNegative);
  cmd->add_option("--cases", f->cases, "number of cases (default 1000 when --time is not given)")->transform(kPositiveCount);
  cmd->add_option("--time", f->time, "time budget: 60s, 5m, 1h");
  cmd->add_option("--vram", f->vram, "device total (e.g. 24GiB); default: drawn per case");
  cmd->add_option("--out", f->out, "output directory for findings and summary.json");
  cmd->add_option("--model", f->model,
                  "fuzz around this model file (safetensors, index.json, GGUF, or the JSON `models import --out` writes) instead of "
                  "catalog pipelines");
  cmd->add_option("--family", f->family, "--model's family when its tensor names cannot tell it (flux, sdxl, t5, generic, ...)");
  cmd->add_option("--backend", f->backend, "sim | cuda | auto (cuda when a GPU is usable)")->capture_default_str();
  cmd->add_option("--transfer", f->transfer, "cuda: copy (H2D from pinned memory) | skip (memset; allocator-only runs)")
      ->capture_default_str();
  cmd->add_flag("--isolate", f->isolate, "run each case in a child process (a crash is that case's error, not the campaign's)");
  cmd->add_flag("--clean", f->clean, "remove an earlier run's results (summary, reports, findings/) from --out first (else refused)");
  cmd->add_option("--keep", f->keep, "finding files written per signature and policy (every finding is counted)")->capture_default_str()->transform(kNonNegative);
  cmd->add_flag("--no-shrink", f->no_shrink, "write findings without shrinking them into repros");
  cmd->add_option("--min-overshoot", f->min_overshoot,
                  "a violation (or a knee of violations) whose worst overshoot stays below this is allocator noise: listed and labelled, "
                  "not new (0: count all)")
      ->capture_default_str();
  cmd->add_option("--knee-every", f->knee_every,
                  "P4 (class G): run every K-th case that passes again a step smaller; failing there is a knee finding (0: off)")
      ->capture_default_str();
  cmd->add_option("--shrink-execs", f->shrink_execs, "execution budget per shrink")->capture_default_str()->transform(kPositiveCount);
  cmd->add_option("--shrink-time", f->shrink_time, "time budget per shrink")->capture_default_str();
  cmd->add_option("--runs", f->runs, "re-runs of each repro for its reliability (default 1 on sim, 5 on cuda)")->transform(kPositiveCount);
  cmd->add_option("--corpus", f->corpus, "replay every repro under DIR first; a finding whose signature one has under the same policy counts as known");
  cmd->add_option("--shard", f->shard, "I/N: run only the cases i with i mod N == I (seeds unchanged; shards merge with `vramfuzz merge`)");
  cmd->add_option("--devices", f->devices, "0,1,...: one worker process per device (CUDA_VISIBLE_DEVICES), merged into --out");
  cmd->add_option("--progress", f->progress, "auto | tty | plain | off (auto: a live line on a terminal, a log line every 10 s otherwise)")
      ->capture_default_str();
  f->policy.add_to(*cmd, true);  // --option needs --allocator here (do_fuzz)
  cmd->callback([f, &action] { action = [f] { return do_fuzz(*f); }; });
}

}  // namespace vf::cli
