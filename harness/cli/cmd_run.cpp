// vramfuzz run / plan: one scenario through the pipeline.
#include <cstdio>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "harness/campaign.h"
#include "harness/cli/commands.h"
#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "harness/cuda/backend.h"
#include "harness/from_log.h"

namespace vf::cli {
namespace {

struct RunFlags {
  std::string file;
  std::string backend = "sim";
  bool trace = false;
  std::string json_out;
  std::string vram;               // --vram: the emulated card's total (overrides device.total)
  std::string transfer = "copy";  // --transfer copy | skip (cuda)
  bool isolate = false;           // --isolate: the case runs in a child process
  std::string tolerance = "0";    // --tolerance: plan figures against a from-log scenario's log
  PolicyFlags policy;
};

std::string header(const Scenario& s) {
  std::string models;
  for (const ModelRef& m : s.models) {
    models += fmt::format("{}{} [{} -> {}{}]", models.empty() ? "" : ", ", m.id, storage_label(m),
                          dtype_name(m.compute), m.lora ? ", lora" : "");
  }
  return fmt::format("scenario {}: {} device ({} used by others, {} context), allocator {}, policy {}, offload streams {}\n"
                     "models: {}\nworkload: {}x{} batch {} frames {} cfg {}\n",
                     s.name.empty() ? "(unnamed)" : s.name, format_size(s.device.total), format_mib(s.device.used_by_others),
                     format_mib(s.device.context_overhead), allocator_mode_name(s.allocator.mode), s.policy.key(),
                     s.streams(), models, s.workload.width, s.workload.height, s.workload.batch, s.workload.frames,
                     s.workload.cfg);
}

int do_run(const RunFlags& f) {
  Catalog catalog;
  Scenario s = load_case_file(f.file, catalog);
  f.policy.apply(s);
  if (!f.vram.empty()) {
    // The scenario's own limits (> 0, <= 1 PiB), and a device the scenario's others and context
    // leave something of: errors name the flag.
    s.device.total = parse_device_total(f.vram, "--vram");
    if (s.device.available() == 0) {
      throw InputError("--vram", fmt::format("{}: the scenario's memory used by others ({}) plus its context ({}) leave nothing of it",
                                             f.vram, format_mib(s.device.used_by_others), format_mib(s.device.context_overhead)));
    }
  }
  validate_scenario(s);
  BackendOptions backend_options;
  backend_options.transfer = f.transfer;
  backend_options.isolate = f.isolate;
  auto backend = make_backend(f.backend, backend_options);
  const bool need_trace = f.trace || !f.json_out.empty();
  const CaseResult r = run_case(s, *backend, need_trace);
  std::fputs(header(s).c_str(), stdout);
  std::fputs(format_plan(s, r.plan).c_str(), stdout);
  if (f.trace) std::fputs(format_trace(s, r.program, r.exec).c_str(), stdout);
  std::fputs(fmt::format("measured on {}: reserved peak {} (op {}), allocated peak {}, live peak {}, device used peak {}\n",
                         r.exec.backend, format_mib(r.exec.reserved_peak), r.exec.reserved_peak_op,
                         format_mib(r.exec.allocated_peak), format_mib(r.exec.live_peak), format_mib(r.exec.device_peak))
                 .c_str(),
             stdout);
  if (r.exec.device) std::fputs((cuda::format_device_report(*r.exec.device) + "\n").c_str(), stdout);
  for (const std::string& w : r.exec.warnings) spdlog::warn("{}", w);
  const Verdict& v = r.verdict;
  std::fputs(fmt::format("verdict: {}{}{}\n", verdict_kind_name(v.kind), v.signature.empty() ? "" : " " + v.signature,
                         v.message.empty() ? "" : " - " + v.message)
                 .c_str(),
             stdout);
  if (s.from_log) {
    // A scenario from-log reconstructed: what the log says happened against what the run did.
    const FromLog& fl = *s.from_log;
    if (fl.plans.empty() && (!fl.oom || !fl.oom->stage)) {
      std::fputs(fmt::format("from log {} (fnv1a64:{:016x}){}: shrunk or edited since, nothing to compare\n", fl.file, fl.digest,
                             fl.oom ? fmt::format(", OOM at its line {}", fl.oom->line) : "")
                     .c_str(),
                 stdout);
    } else {
      const LogComparison c = compare_with_log(s, r, parse_size(f.tolerance, "--tolerance"));
      std::fputs(fmt::format("against the log {}:\n", fl.file).c_str(), stdout);
      std::fputs(format_comparison(c).c_str(), stdout);
    }
  }
  if (!f.json_out.empty()) {
    // The file embeds the scenario with every flag applied, so it is its own replay: naming the
    // input file instead would drop flags like --policy / --reserve from the repro.
    write_file_atomic(f.json_out, case_json(s, r, 0, 0, s.seed, f.json_out));
  }
  if (v.kind == VerdictKind::error) return kExitInfra;
  return v.finding() ? kExitFindings : kExitOk;
}

int do_plan(const RunFlags& f) {
  Catalog catalog;
  Scenario s = load_case_file(f.file, catalog);
  f.policy.apply(s);
  validate_scenario(s);
  const Plan p = predict(s);
  std::fputs(header(s).c_str(), stdout);
  std::fputs(format_plan(s, p).c_str(), stdout);
  return kExitOk;
}

}  // namespace

void add_run(CLI::App& app, Action& action) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* cmd = app.add_subcommand("run", "run one scenario (or a finding / repro file) and judge it");
  cmd->add_option("scenario", f->file, "scenario JSON (vramfuzz.scenario/1) or a finding / repro file")->required();
  cmd->add_option("--backend", f->backend, "sim | cuda | auto")->capture_default_str();
  cmd->add_option("--vram", f->vram, "device total to emulate (e.g. 24GiB); default: the scenario's device.total");
  cmd->add_option("--transfer", f->transfer, "cuda: copy (H2D from pinned memory) | skip (memset; allocator-only runs)")
      ->capture_default_str();
  cmd->add_flag("--isolate", f->isolate, "run the case in a child process (a crash is an error verdict)");
  cmd->add_flag("--trace", f->trace, "print the per-op trace (DEBUG-line style)");
  cmd->add_option("--json", f->json_out, "write the result (scenario, plan, peaks, verdict, trace excerpt) as JSON");
  cmd->add_option("--tolerance", f->tolerance, "a scenario from from-log: its plan figures match the log's within 2 decimals plus this")
      ->capture_default_str();
  f->policy.add_to(*cmd, true);
  cmd->callback([f, &action] { action = [f] { return do_run(*f); }; });
}

void add_plan(CLI::App& app, Action& action) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* cmd = app.add_subcommand("plan", "print the predictor's plan for a scenario (no execution)");
  cmd->add_option("scenario", f->file, "scenario JSON or a finding / repro file")->required();
  f->policy.add_to(*cmd, true);
  cmd->callback([f, &action] { action = [f] { return do_plan(*f); }; });
}

}  // namespace vf::cli
