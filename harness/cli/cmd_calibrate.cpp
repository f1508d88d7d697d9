// vramfuzz calibrate: the overshoot distribution per allocator mode and workload class, the
// smallest reserve that holds, and what the current reserve wastes (docs/calibrate.md).
#include <cstdio>
#include <optional>
#include <tuple>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "harness/calibrate.h"
#include "harness/predictors/external.h"
#include "harness/cli/commands.h"
#include "harness/cli/out_dir.h"
#include "harness/cli/progress.h"
#include "harness/cli/signals.h"
#include "harness/cli/workers.h"
#include "harness/core/error.h"
#include "harness/repro.h"
#include "reports/render.h"

namespace vf::cli {
namespace {

struct CalibrateFlags {
  std::string policy = "comfy:dec2025";
  std::string reserve;
  std::vector<std::string> sets;
  std::string allocator = "all";
  std::uint64_t cases = 0;
  std::string time;
  std::string vram;
  std::string activations;  // --activations model | estimate | capped | profile:FILE
  std::uint64_t seed = 1;
  std::string out;
  std::string margin = "64MiB";
  std::string backend = "auto";
  std::string shard;
  std::uint32_t verify_rounds = 3;
  bool no_shrink = false;
  std::uint64_t shrink_execs = 400;
  std::string shrink_time = "60s";
  std::string progress = "auto";
  bool clean = false;
};

int do_calibrate(const CalibrateFlags& f) {
  CalibrationConfig cfg;
  cfg.seed = f.seed;
  cfg.cases = f.cases;
  if (!f.time.empty()) cfg.seconds = parse_duration(f.time, "--time");
  if (cfg.cases == 0 && cfg.seconds <= 0) cfg.cases = 500;
  cfg.gen.policy = parse_policy(f.policy, "--policy").label();
  {
    PolicyFlags flags;  // the same rules as run's --reserve / --set: each constant once
    flags.reserve = f.reserve;
    flags.sets = f.sets;
    cfg.gen.policy_overrides = flags.overrides();
  }
  {
    Policy probe = parse_policy(*cfg.gen.policy, "--policy", StartCommand::refuse);
    for (const auto& [k, v] : cfg.gen.policy_overrides) apply_policy_override(probe, k, v, k == "reserve" && !f.reserve.empty() ? "--reserve" : "--set");
    // Calibration raises one constant until nothing violates; a predictor that does not apply it
    // would be measured at its own reserve every round. Refused now, before any case runs.
    if (probe.predictor == PredictorKind::external) {
      const std::string knob(calibrated_knob(probe));
      if (const PredictorHello* h = find_external(probe.external_name); h && !h->honours(knob)) {
        throw InputError("--policy", fmt::format("calibrate raises `{}` until no case violates; {}", knob, unhonoured_override_message(*h, knob)));
      }
    }
  }
  const Policy policy = parse_policy(*cfg.gen.policy, "--policy", StartCommand::refuse);
  // The modes ComfyUI can run the policy with: dynamic VRAM has no expandable segments, and
  // comfy:feb2026 is modelled with cudaMallocAsync only.
  auto runs = [&](AllocatorMode m) {
    if (!policy.dynamic()) return true;
    return m != AllocatorMode::caching_expandable && (policy.preset != Preset::feb2026 || m == AllocatorMode::async);
  };
  if (f.allocator != "all") {
    const auto m = parse_allocator_mode(f.allocator);
    if (!m) throw InputError("--allocator", fmt::format("unknown allocator mode \"{}\" (use all, {})", f.allocator, allocator_mode_choices()));
    if (!runs(*m)) {
      throw InputError("--allocator", fmt::format("{} cannot run with {} (dynamic VRAM: no expandable segments; comfy:feb2026: async only)",
                                                  policy.label(), allocator_mode_name(*m)));
    }
    cfg.modes = {*m};
  } else {
    std::erase_if(cfg.modes, [&](AllocatorMode m) { return !runs(m); });
  }
  if (!f.vram.empty()) {
    cfg.gen.vram = parse_device_total(f.vram, "--vram");
    if (*cfg.gen.vram < GiB) throw InputError("--vram", "a device needs at least 1 GiB here");
  }
  cfg.margin = parse_size(f.margin, "--margin");
  if (cfg.margin > kMaxDeviceBytes) {
    throw InputError("--margin", fmt::format("{} is more than the {} a device can have here", f.margin, format_size(kMaxDeviceBytes)));
  }
  if (!f.shard.empty()) std::tie(cfg.shard_index, cfg.shard_count) = parse_shard(f.shard, "--shard");
  cfg.verify_rounds = f.verify_rounds;
  cfg.out_dir = f.out;
  cfg.shrink = !f.no_shrink;
  cfg.shrink_execs = f.shrink_execs;
  cfg.shrink_seconds = parse_duration(f.shrink_time, "--shrink-time");
  const ProgressMode progress_mode = parse_progress_mode(f.progress);

  install_stop_handlers();
  cfg.should_stop = [] { return stop_requested(); };
  auto backend = make_backend(f.backend);
  // Every option that shapes the cases or their verdicts, so the command re-runs the calibration
  // and each repro's `found_by` regenerates its case.
  std::string sets;
  for (const std::string& kv : f.sets) sets += option_text("--set", kv);
  if (!f.activations.empty()) cfg.gen.activations = parse_activation_flag(f.activations, "--activations");
  if (!f.activations.empty()) cfg.activations = f.activations;
  sets += option_text("--activations", f.activations);
  cfg.case_options = fmt::format("{}{}{}{}{}", option_text("--policy", policy_list_flag(*cfg.gen.policy)), option_text("--reserve", f.reserve), sets,
                                 option_text("--vram", f.vram), option_text("--backend", std::string(backend->name())));
  const CalibrateFlags defaults;
  const std::string command_line = fmt::format(
      "vramfuzz calibrate{} --allocator {} {} --seed {} --margin {}{}{}{}{}{}{}{}", option_text("--policy", policy_list_flag(*cfg.gen.policy)),
      shell_quote(f.allocator), cfg.cases ? fmt::format("--cases {}", cfg.cases) : fmt::format("--time {}s", cfg.seconds), cfg.seed,
      shell_quote(f.margin), option_text("--reserve", f.reserve), sets, option_text("--vram", f.vram),
      option_text("--backend", std::string(backend->name())),
      cfg.shard_count > 1 ? fmt::format(" --shard {}/{}", cfg.shard_index, cfg.shard_count) : "",
      f.verify_rounds != defaults.verify_rounds ? fmt::format(" --verify-rounds {}", f.verify_rounds) : "",
      f.no_shrink ? " --no-shrink" : "", option_text("--out", f.out));
  // OUT is taken before the first case: a writable directory, this run's alone, no earlier run's
  // results in it (out_dir.h).
  std::optional<OutDir> out_dir;
  if (!f.out.empty()) out_dir.emplace(f.out, OutDir::Options{"--out", f.clean, true});
  Catalog catalog;
  spdlog::info("calibrate: {} on {}, {} mode(s), {}, seed {}", *cfg.gen.policy, backend->name(), cfg.modes.size(),
               cfg.cases ? fmt::format("{} cases per mode", cfg.cases) : fmt::format("{:.0f} s", cfg.seconds), cfg.seed);
  Progress progress(progress_mode, "calibrate", cfg.cases, cfg.seconds);
  cfg.on_case = [&progress](std::uint64_t done, double elapsed) { progress.update({done, 0, 0, 0, elapsed}); };
  const CalibrationResult r = run_calibration(cfg, catalog, *backend);
  progress.finish();
  if (r.stopped) spdlog::warn("calibrate: stopped by signal {} after {} cases; reporting what was sampled", stop_signal(), r.cases);

  const report::Json summary =
      report::summary_from_calibration(cfg, r, report::run_info("calibrate", command_line, std::string(backend->name()), cfg.out_dir));
  std::fputs(report::terminal_calibrate(summary).c_str(), stdout);
  if (!cfg.out_dir.empty()) {
    const report::ReportFiles files = report::write_reports(cfg.out_dir, summary);
    std::fputs(fmt::format("summary: {}\njunit: {}\nmarkdown: {}\nreport: {}\n", files.summary, files.junit, files.markdown, files.html)
                   .c_str(),
               stdout);
  }
  // A measurement: it succeeded whatever the numbers say (violations are in the tables and JUnit).
  return kExitOk;
}

}  // namespace

void add_calibrate(CLI::App& app, Action& action) {
  auto f = std::make_shared<CalibrateFlags>();
  CLI::App* cmd = app.add_subcommand("calibrate", "measure how far each allocator mode overshoots the prediction; recommend a reserve");
  cmd->add_option("--policy", f->policy, "predictor: comfy:oct2025 | comfy:nov2025 | comfy:dec2025 | exact[:PRESET]")->capture_default_str();
  cmd->add_option("--reserve", f->reserve, "the current reserve to judge (default: the policy's)");
  cmd->add_option("--set", f->sets, "override a policy constant: key=value (repeatable, each key once)");
  cmd->add_option("--allocator", f->allocator, "raw | caching | caching-expandable | async | all")->capture_default_str();
  cmd->add_option("--cases", f->cases, "case seeds, each run under every mode (default 500 when --time is not given)")
      ->transform(kPositiveCount);
  cmd->add_option("--time", f->time, "time budget: 60s, 5m, 1h (half samples, half re-checks the recommendation)");
  cmd->add_option("--vram", f->vram, "device total (e.g. 24GiB); default: drawn per case");
  cmd->add_option("--activations", f->activations,
                  "what sizes the activations: model (the formula) | estimate (the predictor's budget: calibrates the reserve "
                  "for weights, transients and the allocator alone) | capped | profile:FILE (docs/activations.md)");
  cmd->add_option("--seed", f->seed, "seed (case seeds derive from it as in fuzz)")->capture_default_str()->transform(kNonNegative);
  cmd->add_option("--out", f->out, "write summary.json, report.html, junit.xml, summary.md and the worst cases here");
  cmd->add_option("--margin", f->margin, "added to the need for the recommendation")->capture_default_str();
  cmd->add_option("--backend", f->backend, "sim | cuda | auto")->capture_default_str();
  cmd->add_option("--shard", f->shard, "I/N: only the case seeds i with i mod N == I (merge shards with `vramfuzz merge`)");
  cmd->add_option("--verify-rounds", f->verify_rounds, "re-runs of the sample at the recommended reserve (0: none)")
      ->capture_default_str()
      ->transform(kNonNegative);
  cmd->add_flag("--no-shrink", f->no_shrink, "write the worst cases without shrinking them");
  cmd->add_flag("--clean", f->clean, "remove an earlier run's results from --out first (else such an --out is refused)");
  cmd->add_option("--shrink-execs", f->shrink_execs, "execution budget per shrink")->capture_default_str()->transform(kPositiveCount);
  cmd->add_option("--shrink-time", f->shrink_time, "time budget per shrink")->capture_default_str();
  cmd->add_option("--progress", f->progress, "auto | tty | plain | off")->capture_default_str();
  cmd->callback([f, &action] { action = [f] { return do_calibrate(*f); }; });
}

}  // namespace vf::cli
