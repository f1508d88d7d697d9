#include "harness/repro.h"

#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "harness/case_file.h"
#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "harness/from_log.h"
#include "harness/predictors/external.h"

namespace vf {
namespace {

nlohmann::ordered_json size_json(const CaseSize& z) {
  return {{"models", z.models}, {"modules", z.modules}, {"repeats", z.repeats}, {"tensors", z.tensors}, {"bytes", z.bytes}};
}

// The rows around the judged op, in the origin discussion's DEBUG-line style.
std::string debug_lines(const Scenario& s, const CaseResult& r, std::uint32_t around, std::uint32_t radius) {
  const std::uint32_t lo = around > radius ? around - radius : 0;
  return format_trace(s, r.program, r.exec, lo, around + radius);
}

std::string describe_models(const Scenario& s) {
  std::string out;
  for (const ModelRef& m : s.models) {
    const bool inline_model = m.source == "inline";
    // A catalog model with modules left out says how many of the catalog's it keeps.
    const std::string modules = m.catalog_full && !inline_model && m.catalog_full->modules.size() != m.spec->modules.size()
                                    ? fmt::format("{} of its {} modules", m.spec->modules.size(), m.catalog_full->modules.size())
                                    : fmt::format("{} modules", m.spec->modules.size());
    out += fmt::format("{}{} ({}{}, {}, {}, compute {}{})", out.empty() ? "" : "; ", m.id,
                       inline_model ? "inline " + std::string(family_name(m.spec->family)) : m.source,
                       ", stored " + storage_label(m), modules,
                       format_mib(m.spec->bytes), dtype_name(m.compute), m.lora ? ", LoRA" : "");
  }
  return out;
}

// The replay command of a file, run from the folder the file is in (repro.md sits next to it):
// it works wherever the folder is moved, from wherever it is opened.
std::string replay_here(const std::string& path) {
  return "vramfuzz replay " + shell_quote(std::filesystem::path(path).filename().string());
}

}  // namespace

std::string repro_title(const ShrinkResult& r) {
  const Scenario& s = r.minimal;
  const Verdict& v = r.result.verdict;
  const Stage& st = s.stages[v.stage];
  const ModelRef& m = s.models[st.model];
  std::string dtypes;
  for (const Module& mod : m.spec->modules) {
    for (const Tensor& t : mod.tensors) {
      if (t.role == TensorRole::weight && needs_conversion(t.dtype, m.compute)) {
        dtypes = fmt::format(" converting {} -> {}", dtype_name(t.dtype), dtype_name(m.compute));
        break;
      }
    }
    if (!dtypes.empty()) break;
  }
  const std::string what = v.kind == VerdictKind::oom     ? "OOMs"
                           : v.kind == VerdictKind::waste ? "is offloaded with room to spare"
                           : v.kind == VerdictKind::knee && s.knee_of
                               ? fmt::format("fails at {} but passes at {}", workload_label(s.workload), workload_label(*s.knee_of))
                               : "exceeds predicted + reserve";
  return fmt::format("{}: {} {} in {}{} ({} device, {}, {})", r.signature, m.id, what, stage_op_name(st.op), dtypes,
                     format_size(s.device.total), allocator_mode_name(s.allocator.mode), s.policy.key());
}

std::string repro_json(const ShrinkResult& r, const ReproOrigin& origin, const std::string& path) {
  const Scenario& s = r.minimal;
  const CaseResult& c = r.result;
  const Verdict& v = c.verdict;
  nlohmann::ordered_json j;
  j["schema"] = kReproSchema;
  j["title"] = repro_title(r);
  j["tool"] = tool_version();
  j["signature"] = r.signature;
  j["verdict"] = {{"kind", verdict_kind_name(v.kind)}, {"message", v.message}, {"stage", v.stage}, {"op", v.op}};
  j["bytes"] = {{"predicted", v.predicted},
                {"reserve", v.reserve},
                {"measured", v.measured},
                {"overshoot", v.overshoot},
                {"original_overshoot", r.original_overshoot},
                {"largest_overshoot_seen", r.largest_overshoot},
                {"shrink_margin", r.margin}};
  nlohmann::ordered_json loads = nlohmann::json::array();
  for (const LoadPlan& lp : c.plan.loads) loads.push_back(fmt::format("{}: {}", s.models[lp.model].id, lp.log_line));
  j["plan"] = {{"policy", c.plan.policy}, {"predicted_peak", c.plan.predicted_peak}, {"available", c.plan.available},
               {"loads", loads}};
  j["peaks"] = {{"reserved", c.exec.reserved_peak}, {"allocated", c.exec.allocated_peak}, {"live", c.exec.live_peak},
                {"device_used", c.exec.device_peak}};
  j["trace_around_peak"] = debug_lines(s, c, v.op, 10);
  if (!v.cause.empty()) j["cause"] = v.cause;
  if (!v.explanation.empty()) j["explanation"] = v.explanation;
  if (!v.rests_on.empty()) j["rests_on"] = v.rests_on;
  if (!v.at_budget.empty()) {
    j["activation_dependent"] = v.activation_dependent;
    j["at_budget"] = v.at_budget;
  }
  if (v.kind == VerdictKind::knee) j["knee"] = {{"small", v.knee_small}, {"large", v.knee_large}};
  if (c.exec.dynamic) {
    const DynamicReport& d = *c.exec.dynamic;
    nlohmann::ordered_json dj = {{"faults", d.faults},         {"resident_hits", d.resident_hits}, {"copies", d.copies},
                                 {"refused", d.refused},       {"pages_evicted", d.pages_evicted}, {"polls", d.polls},
                                 {"elapsed_us", d.elapsed_us}, {"vbar_peak", d.vbar_peak},         {"cast_peak", d.cast_peak}};
    if (d.oom) {
      const DynamicOom& o = *d.oom;
      dj["at_oom"] = {{"what", o.what},           {"request", o.request},         {"free", o.free},
                      {"context", o.context},     {"others", o.others},           {"headroom", o.headroom},
                      {"needed_tensors", o.needed_tensors}, {"needed_pages", o.needed_pages}, {"needed_cast", o.needed_cast},
                      {"torch_cache", o.torch_cache}, {"cast_slack", o.cast_slack}, {"prefetch_pins", o.prefetch_pins},
                      {"other_weights", o.other_weights}, {"resident_pages", o.resident_pages}, {"rounding", o.rounding},
                      {"necessary", o.necessary()}, {"total", o.total}};
    }
    j["dynamic"] = std::move(dj);
  }
  j["reliability"] = {{"runs", r.confirm_runs},
                      {"reproduced", r.reproduced},
                      {"rate", r.confirm_runs ? static_cast<double>(r.reproduced) / r.confirm_runs : 0.0},
                      {"flaky", r.flaky}};
  nlohmann::ordered_json o = nlohmann::json::object();
  if (origin.campaign_seed) o["campaign_seed"] = *origin.campaign_seed;
  if (origin.case_index) o["case_index"] = *origin.case_index;
  if (origin.case_seed) o["case_seed"] = *origin.case_seed;
  if (!origin.choices.empty()) o["choices"] = origin.choices;
  if (!origin.source_file.empty()) o["finding"] = origin.source_file;
  if (!origin.found_by.empty()) o["found_by"] = origin.found_by;
  j["origin"] = o;
  // No wall time here: a repro is byte-identical wherever the same shrink ran.
  j["shrink"] = {{"executions", r.executions}, {"cache_hits", r.cache_hits}, {"accepted", r.accepted},
                 {"budget_exhausted", r.budget_exhausted},
                 {"original", size_json(r.original_size)}, {"final", size_json(r.final_size)}, {"steps", r.log}};
  if (!r.original_repeats_known) j["shrink"]["original"].erase("repeats");
  j["environment"] = {{"backend", c.exec.backend}, {"device", c.exec.environment}};
  j["replay"] = replay_here(path);  // from this file's folder
  j["scenario"] = nlohmann::ordered_json::parse(scenario_to_json(s, -1));
  return j.dump(2) + "\n";
}

std::string repro_markdown(const ShrinkResult& r, const ReproOrigin& origin, const std::string& path) {
  const Scenario& s = r.minimal;
  const CaseResult& c = r.result;
  const Verdict& v = c.verdict;
  std::string md = fmt::format("# [vramfuzz] {}\n\n", repro_title(r));
  // The diagnosis first: what a developer reads to decide whether to file it.
  if (!v.cause.empty()) md += fmt::format("**Cause:** {}\n\n", v.cause);
  if (!v.explanation.empty()) md += fmt::format("**Why:** {}\n\n", v.explanation);
  if (v.activation_dependent) md += "**Activation-dependent:** " + activation_dependence_text(v) + "\n\n";
  md += fmt::format("**Verdict:** {}\n\n", v.message);
  if (!v.rests_on.empty()) md += fmt::format("**Rests on:** {}\n\n", v.rests_on);
  md += fmt::format("**Environment:** {} ({}); vramfuzz {}\n\n", c.exec.backend, c.exec.environment, tool_version());
  md += fmt::format("**Reliability:** reproduced {} of {} runs{}\n\n", r.reproduced, r.confirm_runs,
                    r.flaky ? " (**flaky**: below the reliability threshold)" : "");
  if (s.from_log) {
    const FromLog& fl = *s.from_log;
    std::string first = fl.oom ? fl.oom->text.substr(0, fl.oom->text.find('\n')) : "";
    if (first.size() > 160) first = first.substr(0, 157) + "...";
    md += fmt::format("**From log:** `{}` (fnv1a64:{:016x}), reconstructed by `vramfuzz from-log`{}\n\n", fl.file, fl.digest,
                      fl.oom ? fmt::format("; its OOM at line {}: \"{}\"", fl.oom->line, first) : "");
  }
  md += "## Minimal scenario\n\n| | |\n|---|---|\n";
  md += fmt::format("| device | {} ({} used by others, {} CUDA context) |\n", format_size(s.device.total),
                    format_mib(s.device.used_by_others), format_mib(s.device.context_overhead));
  if (!s.device.events.empty()) {
    std::string ev;
    for (const OthersEvent& e : s.device.events) {
      ev += fmt::format("{}{} {} at {:.3f} s", ev.empty() ? "" : "; ", e.take ? "takes" : "frees", format_mib(e.bytes),
                        static_cast<double>(e.at_us) / 1e6);
    }
    md += fmt::format("| other processes | {} |\n", ev);
  }
  std::string opts;
  for (const auto& [k, val] : s.allocator.options) opts += fmt::format(" {}={}", k, val);
  md += fmt::format("| allocator | {}{} |\n", allocator_mode_name(s.allocator.mode), opts);
  md += fmt::format("| policy | {} (reserve {}) |\n", s.policy.key(), format_mib(c.plan.reserve));
  md += fmt::format("| offload streams | {} |\n", s.streams());
  md += fmt::format("| workload | {}x{}, batch {}, frames {}, cfg {}{} |\n", s.workload.width, s.workload.height,
                    s.workload.batch, s.workload.frames, s.workload.cfg,
                    s.workload.steps != 1 ? fmt::format(", {} steps", s.workload.steps) : std::string());
  if (s.knee_of) md += fmt::format("| knee_of | {} (the larger workload of the pair, everything else equal) |\n", workload_label(*s.knee_of));
  md += fmt::format("| models | {} |\n", describe_models(s));
  std::string stages;
  for (const Stage& st : s.stages) stages += fmt::format("{}{} {}", stages.empty() ? "" : " -> ", stage_op_name(st.op), s.models[st.model].id);
  md += fmt::format("| pipeline | {} |\n\n", stages);
  for (const ModelRef& m : s.models) {
    // A run of identical modules (the "repeat" entries of a rounding-sum repro) is one row.
    const std::vector<Module>& mods = m.spec->modules;
    std::vector<std::pair<std::size_t, std::size_t>> rows;  // first module, run length
    for (std::size_t i = 0; i < mods.size() && rows.size() <= 12; i += rows.back().second) rows.emplace_back(i, repeat_run(mods, i));
    if (rows.size() > 12) continue;
    md += fmt::format("Modules of `{}` (forward order):\n\n| module | tensors | bytes |\n|---|---|---:|\n", m.id);
    for (const auto& [i, run] : rows) {
      const Module& mod = mods[i];
      std::string ts;
      for (const Tensor& t : mod.tensors) {
        std::string shape;
        for (std::uint64_t d : t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
        ts += fmt::format("{}{} [{}] {} ({} B)", ts.empty() ? "" : "; ", t.name, shape, dtype_name(t.dtype), t.bytes);
      }
      if (run > 1) {
        md += fmt::format("| {} x `{}` … `{}` | {} | {} each, {} in all |\n", run, mod.name, mods[i + run - 1].name, ts, format_mib(mod.bytes),
                          format_mib(mod.bytes * run));
      } else {
        md += fmt::format("| `{}` | {} | {} |\n", mod.name, ts, format_mib(mod.bytes));
      }
    }
    md += "\n";
    bool pads = false, copies = false;
    for (const auto& [i, run] : rows) {
      if (run < 2) continue;
      (mods[i].name.rfind("pad.", 0) == 0 ? pads : copies) = true;
    }
    if (pads || copies) {
      md += fmt::format("A row of N x is a run of identical modules (`\"repeat\": N` in the scenario).{}{} The finding files "
                        "beside this repro keep the model as the campaign drew it.\n\n",
                        pads ? " The `pad.K` modules are synthetic: one weight each, sized just past an allocator rounding "
                               "boundary, standing in for the rounding the original model's hundreds of tensors summed to."
                             : "",
                        copies ? " Copies of a real module (`NAME.K`) stand for the modules the finding needs at once, e.g. the "
                                 "offloaded modules whose transfer copies are in flight together."
                               : "");
    }
  }
  md += "## What the predictor said (ComfyUI log lines)\n\n```\n";
  for (const LoadPlan& lp : c.plan.loads) md += fmt::format("{}: {}\n", s.models[lp.model].id, lp.log_line);
  md += "```\n\n";
  if (s.knee_of) {
    // The pair's other half: the same case at the larger workload, which passes.
    Scenario large = s;
    large.workload = *s.knee_of;
    large.knee_of.reset();
    md += fmt::format("At the larger {} (which passes) it said:\n\n```\n", workload_label(*s.knee_of));
    try {
      for (const LoadPlan& lp : predict(large).loads) md += fmt::format("{}: {}\n", s.models[lp.model].id, lp.log_line);
    } catch (const PredictorError& e) {
      md += fmt::format("(the external predictor did not answer for it: {})\n", e.what());
    }
    md += "```\n\n";
  }
  if (c.exec.dynamic && c.exec.dynamic->oom) {
    // Dynamic VRAM predicts no peak: what filled the card at the failure, after aimdo's eviction.
    const DynamicOom& o = *c.exec.dynamic->oom;
    md += fmt::format("## The card at the failure ({} of {}, {} free)\n\n| needed by the failing op | bytes | | slack | bytes |\n"
                      "|---|---:|---|---|---:|\n",
                      o.what, format_mib(o.request), format_mib(o.free));
    const std::pair<std::string_view, Bytes> need[] = {{"CUDA context", o.context},          {"other processes", o.others},
                                                       {"aimdo headroom", o.headroom},       {"running model's tensors", o.needed_tensors},
                                                       {"module's VBAR pages", o.needed_pages}, {"its cast-buffer extent", o.needed_cast},
                                                       {"the request", o.request}};
    const std::pair<std::string_view, Bytes> slack[] = {{"torch cache", o.torch_cache},     {"cast-buffer slack", o.cast_slack},
                                                        {"prefetch pins", o.prefetch_pins}, {"other models' weights", o.other_weights},
                                                        {"unreached pages", o.resident_pages}, {"rounding", o.rounding},
                                                        {"free", o.free}};
    for (std::size_t i = 0; i < std::size(need); ++i) {
      md += fmt::format("| {} | {} | | {} | {} |\n", need[i].first, format_mib(need[i].second), slack[i].first, format_mib(slack[i].second));
    }
    md += fmt::format("| **necessary** | **{}** | | of the card | {} |\n\n", format_mib(o.necessary()), format_mib(o.total));
  }
  md += "## Predicted vs measured\n\n| stage | predicted | + reserve | measured (allocator reserved peak) | overshoot |\n|---|---:|---:|---:|---:|\n";
  for (const StagePlan& sp : c.plan.stages) {
    if (sp.stage >= c.exec.stage_reserved_peak.size()) continue;
    // A stage the run never reached (it stopped at an OOM before the stage's first op) has no
    // measured peak: its row says so rather than 0.00 MiB. A run that ran every op reached all.
    const bool reached = c.exec.ops_executed >= c.program.ops.size() ||
                         (sp.stage < c.program.stage_begin.size() && c.program.stage_begin[sp.stage] < c.exec.ops_executed);
    const std::string measured = reached ? format_mib(c.exec.stage_reserved_peak[sp.stage]) : "not reached";
    if (!sp.checked) {
      // Every stage has its row, as in the HTML report: a table of only checked stages was empty
      // for a scenario under dynamic VRAM, whose stages have no predicted peak.
      const std::string_view why = sp.op == StageOp::unload ? "none (an unload only shrinks)"
                                   : sp.dynamic             ? "none (dynamic VRAM: placed at run time)"
                                                            : "none (not checked by the predictor)";
      md += fmt::format("| {} {} {} | {} | | {} | |\n", sp.stage, stage_op_name(sp.op), s.models[sp.model].id, why, measured);
      continue;
    }
    const std::int64_t over = static_cast<std::int64_t>(c.exec.stage_reserved_peak[sp.stage]) -
                              static_cast<std::int64_t>(sp.predicted_peak + c.plan.reserve);
    md += fmt::format("| {} {} {} | {} | {} | {} | {} |\n", sp.stage, stage_op_name(sp.op), s.models[sp.model].id,
                      format_mib(sp.predicted_peak), format_mib(sp.predicted_peak + c.plan.reserve), measured,
                      reached ? format_signed_mib(over) : "");
  }
  // A dynamic VRAM OOM has no predicted peak to overshoot: its figure is the failed request's
  // shortfall, the bytes it asked for beyond what was free (oracle.cpp).
  const bool shortfall = c.plan.dynamic && v.kind == VerdictKind::oom;
  md += fmt::format("\nLargest {} seen while shrinking: {} (original case: {}).\n\n",
                    shortfall ? "shortfall (the failed request beyond the free memory)" : "overshoot",
                    format_signed_mib(r.largest_overshoot), format_signed_mib(r.original_overshoot));
  md += "## Trace around the peak\n\n```\n" + debug_lines(s, c, v.op, 10) + "```\n\n";
  md += comfyui_reproduction(s, c.plan.reserve);
  md += fmt::format("## Replay\n\nFrom the folder this file is in:\n\n```\n{}\n```\n\n"
                    "(`vramfuzz` not on the PATH: a vramfuzz checkout built as its README says has it at `build/vramfuzz`.)\n\n",
                    replay_here(path));
  md += fmt::format("Shrunk from {} models / {} modules / {} to {} / {} / {} in {} executions{}.\n",
                    r.original_size.models, r.original_size.modules, format_mib(r.original_size.bytes), r.final_size.models,
                    r.final_size.modules, format_mib(r.final_size.bytes), r.executions,
                    r.budget_exhausted ? ", budget exhausted: best so far" : "");
  if (!origin.found_by.empty()) {
    md += fmt::format("Found by `{}`: its last case{}{}.\n", origin.found_by,
                      origin.case_index ? fmt::format(", case {}", *origin.case_index) : "",
                      origin.case_seed ? fmt::format(" (case seed {:#x})", *origin.case_seed) : "");
  } else if (origin.case_seed) {
    // An older finding file: its campaign's other options (policy, allocator, ...) were not recorded.
    md += fmt::format("Found by a campaign with seed {} (case {}, case seed {:#x}); the finding does not record the campaign's "
                      "other options.\n",
                      origin.campaign_seed.value_or(0), origin.case_index.value_or(0), *origin.case_seed);
  }
  return md;
}

std::string write_repro(const std::string& dir, const ShrinkResult& r, const ReproOrigin& origin) {
  const std::string json_path = dir + "/repro.json";
  write_file_atomic(json_path, repro_json(r, origin, json_path));
  write_file_atomic(dir + "/repro.md", repro_markdown(r, origin, json_path));
  return json_path;
}

std::string shell_quote(std::string_view word) {
  const bool safe = !word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:=,@%+") ==
                                         std::string_view::npos;
  if (safe) return std::string(word);
  std::string out = "'";
  for (char ch : word) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

ReproOrigin read_origin(const std::string& path) {
  ReproOrigin o;
  o.source_file = path;
  const nlohmann::json doc = parse_json_text(read_text_file(path), path);
  // A finding or repro is checked whole (case_file.h): every origin field present is the type it
  // must be (null, a string, a negative number are a damaged file, not an unknown origin).
  const CaseDocKind kind = check_case_document(doc);
  if (kind == CaseDocKind::scenario) return o;
  const nlohmann::json& src = kind == CaseDocKind::repro ? (doc.contains("origin") ? doc["origin"] : nlohmann::json::object()) : doc;
  auto u64 = [&](const char* key) -> std::optional<std::uint64_t> {
    if (!src.contains(key)) return std::nullopt;
    return src[key].get<std::uint64_t>();
  };
  o.campaign_seed = u64("campaign_seed");
  o.case_index = u64("case_index");
  o.case_seed = u64("case_seed");
  if (src.contains("found_by")) o.found_by = src["found_by"].get<std::string>();
  if (src.contains("choices")) o.choices = src["choices"].get<std::vector<std::uint64_t>>();
  return o;
}

ShrinkResult read_repro_lineage(const std::string& path) {
  const nlohmann::json doc = parse_json_text(read_text_file(path), path);
  // Checked whole first (case_file.h): every field present has its type.
  if (check_case_document(doc) != CaseDocKind::repro) {
    throw InputError("schema", fmt::format("{} is not a repro ({}): shrink it into one first", path, kReproSchema));
  }
  // A field the render needs: a repro written without it (by hand, or cut down) has no lineage to keep.
  auto need = [&](const char* section, const char* key) -> const nlohmann::json& {
    const std::string name = fmt::format("{}.{}", section, key);
    if (!doc.contains(section) || !doc[section].contains(key)) {
      throw InputError(name, "missing: the repro does not record its shrink's lineage, so it cannot be rendered again (shrink the finding instead)");
    }
    return doc[section][key];
  };
  // The original case's size (the final one is the scenario's: case_size). `repeats` came later
  // than the rest: a repro without it keeps not saying it.
  const nlohmann::json& z = need("shrink", "original");
  for (const char* field : {"models", "modules", "tensors", "bytes"}) {
    if (!z.contains(field)) throw InputError(fmt::format("shrink.original.{}", field), "missing");
  }
  ShrinkResult r;
  r.signature = recorded_signature(doc);
  r.original_overshoot = need("bytes", "original_overshoot").get<std::int64_t>();
  r.largest_overshoot = need("bytes", "largest_overshoot_seen").get<std::int64_t>();
  r.margin = need("bytes", "shrink_margin").get<std::int64_t>();
  auto count32 = [&](const char* section, const char* key) {
    const auto v = need(section, key).get<std::uint64_t>();
    if (v > 0xffffffffu) throw InputError(fmt::format("{}.{}", section, key), fmt::format("{} is out of range (at most 4294967295)", v));
    return static_cast<std::uint32_t>(v);
  };
  r.confirm_runs = count32("reliability", "runs");
  r.reproduced = count32("reliability", "reproduced");
  r.flaky = need("reliability", "flaky").get<bool>();
  r.executions = need("shrink", "executions").get<std::uint64_t>();
  r.cache_hits = need("shrink", "cache_hits").get<std::uint64_t>();
  r.accepted = need("shrink", "accepted").get<std::uint64_t>();
  r.budget_exhausted = need("shrink", "budget_exhausted").get<bool>();
  r.original_size.models = z["models"].get<std::size_t>();
  r.original_size.modules = z["modules"].get<std::size_t>();
  r.original_size.tensors = z["tensors"].get<std::size_t>();
  r.original_size.bytes = z["bytes"].get<Bytes>();
  r.original_repeats_known = z.contains("repeats");
  if (r.original_repeats_known) r.original_size.repeats = z["repeats"].get<std::size_t>();
  r.log = need("shrink", "steps").get<std::vector<std::string>>();
  return r;
}

std::string recorded_signature(const nlohmann::json& doc, const std::string& prefix) {
  if (!doc.is_object() || !doc.contains("signature")) return "";
  // A finding / repro / result is checked whole; a signature in a plain scenario is an unknown
  // field its reader refuses. Here: it is a string, and a signature (or "" for a result).
  const nlohmann::json& v = doc["signature"];
  if (!v.is_string()) throw InputError(prefix + "signature", fmt::format("expected a string, got {}", json_excerpt(v)));
  const std::string& sig = v.get_ref<const std::string&>();
  if (!sig.empty() && !is_signature(sig, true)) {
    throw InputError(prefix + "signature", fmt::format("expected a signature KIND:PHASE:ACTIVITY:ALLOCATOR, got {}", json_excerpt(v)));
  }
  return sig;
}

}  // namespace vf
