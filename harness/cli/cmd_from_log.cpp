// vramfuzz from-log: a ComfyUI console log (and the OOM in it) to a scenario, run at once and
// compared with the log (docs/from-log.md).
#include <cstdio>
#include <iostream>
#include <iterator>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "harness/campaign.h"
#include "harness/cli/commands.h"
#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "harness/from_log.h"

namespace vf::cli {
namespace {

struct FromLogFlags {
  std::string file;
  std::vector<std::string> models;  // [CLASS=]FILE
  std::vector<std::string> leave_out;
  std::vector<std::string> lora;
  std::string out;
  std::string vram, others, context, os, tolerance = "0";
  std::optional<std::uint32_t> width, height, batch, frames, steps;
  std::optional<double> cfg;
  bool no_run = false;
  PolicyFlags policy;
};

std::string read_log(const std::string& file) {
  if (file != "-") return read_text_file(file);
  std::ostringstream ss;
  ss << std::cin.rdbuf();
  if (std::cin.bad()) throw InfraError("cannot read the log from stdin");
  return ss.str();
}

std::optional<Bytes> size_flag(const std::string& v, const char* flag) {
  if (v.empty()) return std::nullopt;
  return parse_size(v, flag);
}

int do_from_log(const FromLogFlags& f) {
  const Bytes tolerance = parse_size(f.tolerance, "--tolerance");  // before anything is written
  const std::string text = read_log(f.file);
  const ComfyLog log = read_comfy_log(text, f.file == "-" ? "stdin" : f.file);
  FromLogOptions o;
  o.file = f.file;
  if (!f.vram.empty()) o.vram = parse_device_total(f.vram, "--vram");
  o.others = size_flag(f.others, "--others");
  o.context = size_flag(f.context, "--context");
  o.allocator = f.policy.allocator;
  o.policy = f.policy.policy;
  o.overrides = f.policy.overrides();
  if (!f.os.empty()) {
    if (f.os != "windows" && f.os != "linux") throw InputError("--os", fmt::format("\"{}\": windows or linux", f.os));
    o.os = f.os;
  }
  for (const std::string& m : f.models) {
    const std::size_t eq = m.find('=');
    // "CLASS=FILE" names the class; a path may hold '=' too, so only a class-like prefix counts.
    const bool named = eq != std::string::npos && eq > 0 &&
                       m.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_") == eq;
    o.models.emplace_back(named ? m.substr(0, eq) : "", named ? m.substr(eq + 1) : m);
    if (o.models.back().second.empty()) throw InputError("--model " + m, "no file after the class name (--model CLASS=FILE)");
  }
  auto dim = [](std::optional<std::uint32_t> v, const char* flag, std::uint32_t lo, std::uint32_t hi) -> std::optional<std::uint32_t> {
    if (v && (*v < lo || *v > hi)) throw InputError(flag, fmt::format("{} is outside {} .. {}", *v, lo, hi));
    return v;
  };
  o.leave_out = f.leave_out;
  o.lora = f.lora;
  o.width = dim(f.width, "--width", kMinImageSide, kMaxImageSide);
  o.height = dim(f.height, "--height", kMinImageSide, kMaxImageSide);
  o.batch = dim(f.batch, "--batch", 1, kMaxBatch);
  o.frames = dim(f.frames, "--frames", 1, kMaxFrames);
  o.steps = dim(f.steps, "--steps", 1, kMaxSteps);
  if (f.cfg) {
    if (!(*f.cfg >= 1.0 && *f.cfg <= 100.0)) throw InputError("--cfg", fmt::format("{} is outside 1 .. 100", *f.cfg));
    o.cfg = f.cfg;
  }
  if (o.others && o.vram && *o.others >= *o.vram) {
    throw InputError("--others", fmt::format("{} is the whole card (--vram) or more", format_mib(*o.others)));
  }
  Catalog catalog;
  Reconstruction r = reconstruct_from_log(log, o, catalog);
  // --option and --activations: what the log cannot say (allocator options, activation sizes).
  if (!f.policy.options.empty() || !f.policy.activations.empty()) {
    PolicyFlags rest;
    rest.options = f.policy.options;
    rest.activations = f.policy.activations;
    rest.apply(r.scenario);
    validate_scenario(r.scenario);
  }
  FILE* report = f.out.empty() ? stderr : stdout;
  std::fputs(fmt::format("{}: {} lines, {} load(s), {} OOM message(s); reconstructed:\n", f.file, log.lines, log.loads.size(), log.ooms.size()).c_str(),
             report);
  std::fputs(format_facts(r).c_str(), report);
  const std::string json = scenario_to_json(r.scenario) + "\n";
  if (f.out.empty()) {
    std::fputs(json.c_str(), stdout);
  } else {
    write_file_atomic(f.out, json);
    std::fputs(fmt::format("wrote {}\n", f.out).c_str(), report);
  }
  if (f.no_run) return kExitOk;
  auto backend = make_backend("sim", BackendOptions{});
  const CaseResult res = run_case(r.scenario, *backend, false);
  for (const LoadPlan& lp : res.plan.loads) {
    std::fputs(fmt::format("[stage {}] load {}: {}\n", lp.stage, r.scenario.models[lp.model].id, lp.log_line).c_str(), report);
  }
  const Verdict& v = res.verdict;
  std::fputs(fmt::format("verdict on sim: {}{}{}\n", verdict_kind_name(v.kind), v.signature.empty() ? "" : " " + v.signature,
                         v.message.empty() ? "" : " - " + v.message)
                 .c_str(),
             report);
  const LogComparison c = compare_with_log(r.scenario, res, tolerance);
  std::fputs(format_comparison(c).c_str(), report);
  if (!f.out.empty() && v.finding()) {
    std::fputs(fmt::format("next: vramfuzz run {0} (the same comparison), vramfuzz run {0} --json finding.json && vramfuzz shrink "
                           "finding.json --out repro/\n",
                           f.out)
                   .c_str(),
               report);
  }
  return kExitOk;
}

}  // namespace

void add_from_log(CLI::App& app, Action& action) {
  auto f = std::make_shared<FromLogFlags>();
  CLI::App* cmd = app.add_subcommand("from-log", "reconstruct a scenario from a ComfyUI console log (and its OOM), run it and compare");
  cmd->add_option("log", f->file, "ComfyUI console log (- for stdin)")->required();
  cmd->add_option("--model", f->models, "[CLASS=]FILE: the model of a class the catalog cannot stand for (safetensors, index.json, GGUF, or "
                                        "a models import JSON); without CLASS= the first such class");
  cmd->add_option("--leave-out", f->leave_out, "CLASS: leave this model class's loads out (a ControlNet, a CLIP vision model, ...)");
  cmd->add_option("--lora", f->lora, "CLASS: a LoRA patches this model class (the log shows it only as patch counts of offloaded weights)");
  cmd->add_option("--out", f->out, "write the scenario here (default: to stdout, the report to stderr)");
  cmd->add_option("--vram", f->vram, "the card's memory, when the log has no \"Total VRAM\" line");
  cmd->add_option("--others", f->others, "memory other processes held at the start (default: back-solved from the plan line)");
  cmd->add_option("--context", f->context, fmt::format("the CUDA context (default: {}, a PyTorch process's, or back-solved)", format_mib(kPyTorchContextOverhead)));
  cmd->add_option("--os", f->os, "windows | linux: ComfyUI's reserve differs (default: from the log's paths)");
  cmd->add_option("--width", f->width, "workload width (ComfyUI does not log it)")->transform(kNonNegative);
  cmd->add_option("--height", f->height, "workload height")->transform(kNonNegative);
  cmd->add_option("--batch", f->batch, "workload batch")->transform(kNonNegative);
  cmd->add_option("--frames", f->frames, "video frames")->transform(kNonNegative);
  cmd->add_option("--steps", f->steps, "sampling steps (default: the progress bar's)")->transform(kNonNegative);
  cmd->add_option("--cfg", f->cfg, "the CFG scale (ComfyUI does not log it; above 1 the classic estimate doubles the batch)");
  cmd->add_option("--tolerance", f->tolerance, "plan figures match within the log's 2 decimals plus this (e.g. 1MiB)")->capture_default_str();
  cmd->add_flag("--no-run", f->no_run, "only write the scenario");
  f->policy.add_to(*cmd, true);
  cmd->callback([f, &action] { action = [f] { return do_from_log(*f); }; });
}

}  // namespace vf::cli
