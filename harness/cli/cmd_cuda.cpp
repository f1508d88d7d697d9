// Two internal subcommands of the cuda backend, hidden from --help:
//   vramfuzz exec-case  - the child side of --isolate (harness/cuda/isolate.h): one scenario, one
//                         execution, the ExecResult written as JSON;
//   vramfuzz gpu-check  - the calibration / kernel / agreement / fuzz check ci/gpu-check.sh runs
//                         on a GPU machine (harness/cuda/gpu_check.h); --fake runs it on the
//                         simulator-backed fake runtime (CI).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "harness/cli/commands.h"
#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "harness/cuda/gpu_check.h"
#include "harness/cuda/isolate.h"
#include "harness/cuda/runtime_fake.h"
#include "harness/exec.h"
#include "harness/lower.h"
#include "harness/predict.h"

namespace vf::cli {
namespace {

struct ExecCaseFlags {
  std::string scenario;
  std::string result;
  std::string backend = "cuda";
  std::string transfer = "copy";
  std::uint64_t ops = 0;
  bool trace = false;
};

int do_exec_case(const ExecCaseFlags& f) {
  Catalog catalog;
  const Scenario s = load_scenario_file(f.scenario, catalog);
  const Plan plan = predict(s);
  const Program p = lower(s, plan);
  ExecResult r;
  if (f.ops != 0 && p.ops.size() != f.ops) {
    // predict and lower are pure: a different program means the parent and child disagree.
    r.backend = f.backend;
    r.error = fmt::format("exec-case: the child lowered {} ops, the parent {}", p.ops.size(), f.ops);
  } else {
    BackendOptions opt;
    opt.transfer = f.transfer;
    auto backend = make_backend(f.backend, opt);
    r = backend->execute(s, p, ExecOptions{f.trace});
  }
  write_file_atomic(f.result, cuda::exec_result_to_json(r));
  return kExitOk;
}

struct GpuCheckFlags {
  std::string out;
  std::vector<std::string> sections;
  std::string fake;
  bool quick = false;
  std::uint32_t cases = 50;
  std::string fuzz_time = "180s";
  std::uint64_t seed = 1;
  std::string vram = "24GiB";
  std::vector<std::string> records;
};

int do_gpu_check(const GpuCheckFlags& f) {
  cuda::GpuCheckConfig cfg;
  cfg.out_dir = f.out;
  cfg.sections = f.sections;
  if (!f.fake.empty()) {
    cfg.fake = cuda::parse_fake_spec(f.fake == "1" ? "fake" : f.fake, "--fake");
  }
  cfg.quick = f.quick;
  cfg.agreement_cases = f.cases;
  cfg.fuzz_seconds = parse_duration(f.fuzz_time, "--fuzz-time");
  cfg.seed = f.seed;
  cfg.vram = parse_device_total(f.vram, "--vram");
  for (const std::string& kv : f.records) cfg.records.push_back(split_kv(kv, "--record"));
  return cuda::run_gpu_check(cfg);
}

}  // namespace

void add_exec_case(CLI::App& app, Action& action) {
  auto f = std::make_shared<ExecCaseFlags>();
  CLI::App* cmd = app.add_subcommand("exec-case", "internal: run one scenario for --isolate and write its result");
  cmd->group("");  // hidden
  cmd->add_option("--scenario", f->scenario, "scenario file")->required();
  cmd->add_option("--result", f->result, "where the ExecResult JSON goes")->required();
  cmd->add_option("--backend", f->backend, "cuda | sim | fake[:spec]");
  cmd->add_option("--transfer", f->transfer, "copy | skip");
  cmd->add_option("--ops", f->ops, "op count the parent lowered (checked)")->transform(kNonNegative);
  cmd->add_flag("--trace", f->trace, "record the per-op trace");
  cmd->callback([f, &action] { action = [f] { return do_exec_case(*f); }; });
}

void add_gpu_check(CLI::App& app, Action& action) {
  auto f = std::make_shared<GpuCheckFlags>();
  CLI::App* cmd = app.add_subcommand("gpu-check", "internal: the GPU calibration and agreement check (ci/gpu-check.sh)");
  cmd->group("");  // hidden
  cmd->add_option("--out", f->out, "directory for gpu-check.json and gpu-check.md")->required();
  cmd->add_option("--section", f->sections,
                  "calibration | kernels | agreement | fuzz | report (repeatable; default: all four, then the report)");
  cmd->add_option("--fake", f->fake, "run on the fake runtime: 1 or a fake spec (fake:key=value,...)");
  cmd->add_flag("--quick", f->quick, "small sizes and short time boxes (the CI test of the check itself)");
  cmd->add_option("--cases", f->cases, "agreement: scenarios per allocator mode")->capture_default_str()->transform(kPositiveCount);
  cmd->add_option("--fuzz-time", f->fuzz_time, "fuzz: the campaign's time budget, shrinking included")->capture_default_str();
  cmd->add_option("--seed", f->seed, "seed of the generated scenarios")->capture_default_str()->transform(kNonNegative);
  cmd->add_option("--vram", f->vram, "emulated card for agreement and fuzz")->capture_default_str();
  cmd->add_option("--record", f->records, "KEY=VALUE stored under \"script\" in gpu-check.json (repeatable)");
  cmd->callback([f, &action] { action = [f] { return do_gpu_check(*f); }; });
}

}  // namespace vf::cli
