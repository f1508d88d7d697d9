#include "harness/campaign.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <filesystem>
#include <functional>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "harness/case_file.h"
#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "harness/predictors/external.h"
#include "harness/repro.h"
#include "harness/shrink.h"

#ifndef VF_VERSION
#define VF_VERSION "0.0.0"
#endif

namespace vf {

const char* git_hash();  // generated at build time (cmake/git_hash.cmake)

std::string tool_version() { return fmt::format("{} (git {})", VF_VERSION, git_hash()); }

std::string workload_label(const Workload& w) {
  std::string out = fmt::format("{}x{}", w.width, w.height);
  if (w.batch > 1) out += fmt::format(" batch {}", w.batch);
  if (w.frames > 1) out += fmt::format(" {} frames", w.frames);
  return out;
}

std::optional<Workload> knee_smaller(const Workload& w, std::uint64_t seed) {
  // One dimension a step smaller: the sides by a quarter (to a multiple of 64, the generator's
  // grid), the batch or the frames by one step. Resolution is drawn twice as often: it is the
  // knee of the origin discussion.
  std::vector<Workload> options;
  Workload r = w;
  // A side of 64 or less stays (never larger than it was).
  if (w.width > 64) r.width = std::max<std::uint32_t>(64, w.width * 3 / 4 / 64 * 64);
  if (w.height > 64) r.height = std::max<std::uint32_t>(64, w.height * 3 / 4 / 64 * 64);
  if (!(r == w)) {
    options.push_back(r);
    options.push_back(r);
  }
  if (w.batch > 1) {
    Workload b = w;
    b.batch = w.batch - 1;
    options.push_back(b);
  }
  if (w.frames > 1) {
    Workload f = w;
    f.frames = w.frames > 4 ? w.frames - 4 : 1;  // Wan's frame counts are 4k + 1
    options.push_back(f);
  }
  if (options.empty()) return std::nullopt;
  return options[splitmix64(seed ^ 0x6b6e6565ull) % options.size()];
}

namespace {

std::string lower_first(std::string text) {
  if (!text.empty() && text[0] >= 'A' && text[0] <= 'Z') text[0] = static_cast<char>(text[0] - 'A' + 'a');
  return text;
}

// Class G: a violation or OOM (expected or not) of the smaller workload of a pair, where the same
// case at the larger workload passes, becomes a knee finding naming both.
void judge_knee(const Scenario& s, CaseResult& r, Backend& backend) {
  Verdict& v = r.verdict;
  // Dynamic VRAM: an OOM aimdo could not have avoided is the card's, not a knee; and the other
  // processes' events meet a run at times, which a larger workload moves: not the workload's.
  if (r.plan.dynamic && (v.expected_oom || !s.device.events.empty())) return;
  const bool fails = v.kind == VerdictKind::violation || v.kind == VerdictKind::oom || v.expected_oom;
  if (!fails) return;
  Scenario large = s;
  large.workload = *s.knee_of;
  large.knee_of.reset();
  const CaseResult big = run_case(large, backend, false);
  if (big.verdict.kind == VerdictKind::error) {
    // The pair cannot be judged: the larger half's error is the case's (a sticky one ends the run).
    v = big.verdict;
    v.message = fmt::format("the pair's larger half at {} failed: {}", workload_label(*s.knee_of), big.verdict.message);
    r.exec.fatal = r.exec.fatal || big.exec.fatal;
    return;
  }
  const bool holds = !big.verdict.expected_oom && (big.verdict.kind == VerdictKind::pass || big.verdict.kind == VerdictKind::waste);
  if (!holds) return;
  // A violation is a knee only where the smaller workload really held more than the larger: a
  // larger case that peaks higher and passes only because its larger activation budget hides the
  // same unbudgeted bytes is the smaller case's own P1 finding.
  if (v.kind == VerdictKind::violation && v.stage < big.exec.stage_reserved_peak.size() &&
      v.measured <= big.exec.stage_reserved_peak[v.stage]) {
    return;
  }
  // The signature keeps the smaller case's phase and activity (an expected OOM's: its failing op).
  std::string where;
  if (!v.signature.empty()) {
    where = v.signature.substr(v.signature.find(':') + 1);
  } else if (r.exec.oom) {
    const Op& op = r.program.ops[r.exec.oom->op];
    where = fmt::format("{}:{}:{}", phase_name(op.phase), op_activity(s, r.program, r.exec.oom->op), allocator_mode_name(s.allocator.mode));
  } else {
    return;  // an expected OOM is an OOM: unreachable
  }
  const std::string small_label = workload_label(s.workload);
  const std::string large_label = workload_label(*s.knee_of);
  v.knee_small = v.expected_oom ? "expected OOM" : v.signature;
  v.knee_large = big.verdict.kind == VerdictKind::pass ? std::string("pass") : big.verdict.signature;
  const std::string small_what = r.plan.dynamic                 ? "OOMs"
                                 : v.expected_oom               ? "OOMs where its own plan says it does not fit"
                                 : v.kind == VerdictKind::oom   ? "OOMs although its plan says it fits"
                                                                : "exceeds its prediction";
  const std::string large_what = !big.plan.dynamic && !big.plan.fits
                                     ? fmt::format(" (its plan does not fit, {} + reserve {} > {} available, yet it runs without an OOM)",
                                                   format_mib(big.plan.predicted_peak), format_mib(big.plan.reserve),
                                                   format_mib(big.plan.available))
                                     : "";
  v.kind = VerdictKind::knee;
  v.expected_oom = false;
  v.signature = "knee:" + where;
  // What the predictor did differently at the stage that failed: the larger workload's larger
  // activation budget is what moves weights off the device in the classic path.
  const StagePlan& ss = r.plan.stages[v.stage];
  const StagePlan& ls = big.plan.stages[v.stage];
  std::string contrast;
  if (!r.plan.dynamic) {
    contrast = fmt::format(
        ": at {} the plan budgets {} for activations and keeps {} of weights resident ({} offload buffer); at {} it budgets {} "
        "and keeps {} resident ({} buffer)",
        large_label, format_mib(ls.activation_allowance), format_mib(ls.resident_total), format_mib(ls.offload_buffer), small_label,
        format_mib(ss.activation_allowance), format_mib(ss.resident_total), format_mib(ss.offload_buffer));
    if (ls.resident_total < ss.resident_total) {
      contrast += fmt::format(". The larger workload made the predictor keep {} fewer weights on the device, and the room that "
                              "left absorbed what the smaller case's budget leaves out",
                              format_mib(ss.resident_total - ls.resident_total));
    } else if (v.stage < big.exec.stage_reserved_peak.size() && v.stage < r.exec.stage_reserved_peak.size()) {
      // Not the weight budget: say what was measured, and let the numbers speak.
      contrast += fmt::format(". The same weights stay resident at both; the stage's reserved peak was {} at {} and {} at {}{}",
                              format_mib(big.exec.stage_reserved_peak[v.stage]), large_label,
                              format_mib(r.exec.stage_reserved_peak[v.stage]), small_label,
                              r.exec.oom ? fmt::format(" when its {} request failed", format_mib(r.exec.oom->request)) : std::string());
    }
  }
  const std::string small_message = v.message;
  v.message = fmt::format("knee: the case {} at {}, but passes at the larger {}{}; at {}: {}", small_what, small_label, large_label,
                          large_what, small_label, small_message);
  v.cause = fmt::format("{} fails, {} passes{}", small_label, large_label, v.cause.empty() ? "" : ": " + v.cause);
  v.explanation = fmt::format("A smaller workload fails where a larger one passes{} (class G, the resolution knee){}.{}", large_what,
                              contrast, v.explanation.empty() ? "" : " At " + small_label + ", " + lower_first(v.explanation));
}

}  // namespace

CaseResult run_case(const Scenario& s, Backend& backend, bool record_trace, SentAhead* ahead) {
  CaseResult r;
  try {
    r.plan = ahead && ahead->sent() ? predict_external(s, ahead) : predict(s);
  } catch (const PredictorError& e) {
    // An external predictor gave no plan: the case's error (a campaign goes on, the predictor is
    // restarted), or the end of the campaign once it has been given up.
    r.verdict.kind = VerdictKind::error;
    r.verdict.message = e.what();
    r.exec.fatal = e.fatal();
    return r;
  }
  return run_planned(s, std::move(r.plan), backend, record_trace);
}

CaseResult run_planned(const Scenario& s, Plan plan, Backend& backend, bool record_trace) {
  CaseResult r;
  r.plan = std::move(plan);
  r.program = lower(s, r.plan);
  r.exec = backend.execute(s, r.program, ExecOptions{record_trace});
  r.verdict = judge(s, r.plan, r.program, r.exec);
  if (s.knee_of) judge_knee(s, r, backend);
  return r;
}

void check_activation_dependence(const Scenario& s, const Plan& plan, Backend& backend, Verdict& v) {
  // Waste already judges the room its activations leave at the budget (oracle.cpp judge_waste).
  if (!v.finding() || v.kind == VerdictKind::waste || s.activations.source == ActivationSource::estimate) return;
  const bool over = std::any_of(plan.stages.begin(), plan.stages.end(), [](const StagePlan& sp) {
    return sp.op == StageOp::forward && sp.activation_bytes > sp.activation_allowance;
  });
  if (!over || s.activations.cap_at_budget) {
    v.at_budget = "within budget";
    v.activation_dependent = false;
    return;
  }
  Scenario at = s;
  at.activations.cap_at_budget = true;
  const CaseResult r = run_case(at, backend, false);
  const bool holds = r.verdict.kind == VerdictKind::pass || r.verdict.kind == VerdictKind::waste;
  v.at_budget = r.verdict.expected_oom                   ? std::string("expected OOM")
                : r.verdict.kind == VerdictKind::error   ? "error: " + r.verdict.message
                : r.verdict.kind == VerdictKind::pass    ? std::string("pass")
                                                         : r.verdict.signature;
  // Dependent only where P1 and P2 hold at the budget (a pass, or a waste finding) or the case
  // cannot fit: still a violation or OOM (the same, or another: activations at the budget can
  // turn a violation into an OOM), the weights, transients and the allocator overshoot on their
  // own; a backend error settles nothing.
  v.activation_dependent = holds || r.verdict.expected_oom;
}

std::uint64_t case_seed(std::uint64_t campaign_seed, std::uint64_t index) {
  return splitmix64(splitmix64(campaign_seed) ^ index);
}

bool is_noise(std::string_view signature, std::int64_t worst_overshoot, Bytes min_overshoot, bool knee_of_oom) {
  const bool of_violations = signature.rfind("violation:", 0) == 0 || (signature.rfind("knee:", 0) == 0 && !knee_of_oom);
  return of_violations && worst_overshoot < static_cast<std::int64_t>(std::min<Bytes>(min_overshoot, kMaxDeviceBytes));
}

std::string signature_dir(std::string_view signature) {
  std::string d(signature);
  for (char& ch : d) {
    if (ch == ':' || ch == '/' || ch == ' ') ch = '-';
  }
  return d;
}

std::string policy_dir(std::string_view policy_key) {
  std::string d(policy_key);
  for (char& ch : d) {
    if (ch == ':' || ch == '/') ch = '-';
    if (ch == ' ') ch = '_';
  }
  return d;
}

std::string finding_dir(const std::string& out_dir, const FindingKey& key) {
  return fmt::format("{}/findings/{}/{}", out_dir, policy_dir(key.policy), signature_dir(key.signature));
}

namespace {

nlohmann::ordered_json trace_excerpt(const Scenario& s, const CaseResult& r, std::uint32_t around, std::uint32_t radius) {
  nlohmann::ordered_json rows = nlohmann::json::array();
  const std::uint32_t lo = around > radius ? around - radius : 0;
  const std::uint32_t hi = around + radius;
  for (const TraceRow& row : r.exec.trace) {
    if (row.op < lo || row.op > hi) continue;
    const Op& op = r.program.ops[row.op];
    rows.push_back({{"op", row.op},
                    {"kind", op_kind_name(op.kind)},
                    {"phase", phase_name(op.phase)},
                    {"stream", op.stream},
                    {"what", describe_op(s, r.program, row.op)},
                    {"bytes", op.buffer != kNone ? r.program.buffers[op.buffer].bytes : 0},
                    {"live", row.live},
                    {"allocated", row.allocated},
                    {"reserved", row.reserved},
                    {"device_used", row.device_used}});
    if (r.program.dynamic) {
      // Dynamic VRAM: aimdo's resident VBAR pages and cast buffers, and the modelled time.
      rows.back()["vbar"] = row.vbar;
      rows.back()["cast"] = row.cast;
      rows.back()["t_us"] = row.time_us;
    }
  }
  return rows;
}

}  // namespace

std::string case_json(const Scenario& s, const CaseResult& r, std::uint64_t campaign_seed, std::uint64_t case_index,
                      std::uint64_t seed, const std::string& path, const std::vector<std::uint64_t>& choices,
                      const std::string& found_by) {
  nlohmann::ordered_json j;
  j["schema"] = r.verdict.finding() ? "vramfuzz.finding/1" : "vramfuzz.result/1";
  j["tool"] = tool_version();
  j["signature"] = r.verdict.signature;
  j["verdict"] = {{"kind", verdict_kind_name(r.verdict.kind)},
                  {"message", r.verdict.message},
                  {"stage", r.verdict.stage},
                  {"op", r.verdict.op},
                  {"measured", r.verdict.measured},
                  {"predicted", r.verdict.predicted},
                  {"reserve", r.verdict.reserve},
                  {"overshoot", r.verdict.overshoot}};
  if (!r.verdict.cause.empty()) j["verdict"]["cause"] = r.verdict.cause;
  if (!r.verdict.explanation.empty()) j["verdict"]["explanation"] = r.verdict.explanation;
  if (!r.verdict.rests_on.empty()) j["verdict"]["rests_on"] = r.verdict.rests_on;
  if (!r.verdict.at_budget.empty()) {
    j["verdict"]["activation_dependent"] = r.verdict.activation_dependent;
    j["verdict"]["at_budget"] = r.verdict.at_budget;
  }
  if (r.verdict.kind == VerdictKind::knee) {
    j["verdict"]["knee_small"] = r.verdict.knee_small;
    j["verdict"]["knee_large"] = r.verdict.knee_large;
  }
  j["campaign_seed"] = campaign_seed;
  j["case_index"] = case_index;
  j["case_seed"] = seed;
  if (!choices.empty()) j["choices"] = choices;
  if (!found_by.empty()) j["found_by"] = found_by;
  j["environment"] = {{"backend", r.exec.backend}, {"device", r.exec.environment}};
  nlohmann::ordered_json loads = nlohmann::json::array();
  for (const LoadPlan& lp : r.plan.loads) loads.push_back(fmt::format("{}: {}", s.models[lp.model].id, lp.log_line));
  j["plan"] = {{"policy", r.plan.policy},
               {"predicted_peak", r.plan.predicted_peak},
               {"reserve", r.plan.reserve},
               {"available", r.plan.available},
               {"loads", loads}};
  j["peaks"] = {{"reserved", r.exec.reserved_peak}, {"allocated", r.exec.allocated_peak}, {"live", r.exec.live_peak},
                {"device_used", r.exec.device_peak}};
  j["trace_around_peak"] = trace_excerpt(s, r, r.verdict.op, 12);
  // Run from the file's folder: the command holds wherever the file is moved.
  j["replay"] = fmt::format("vramfuzz run {}", path.empty() ? "FILE" : shell_quote(std::filesystem::path(path).filename().string()));
  j["scenario"] = nlohmann::ordered_json::parse(scenario_to_json(s, -1));
  return j.dump(2) + "\n";
}

std::vector<CorpusEntry> replay_corpus(const std::string& dir, Catalog& catalog, Backend& backend) {
  namespace fs = std::filesystem;
  std::vector<CorpusEntry> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError("--corpus", fmt::format("not a directory: {}", dir));
  std::vector<std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  for (const std::string& f : files) {
    const nlohmann::json doc = parse_json_text(read_text_file(f), f);
    // Repros and findings are the corpus; anything else in the tree (a scenario, a result, a
    // summary.json of the run that made the corpus) is not a repro. A repro or finding that is
    // damaged, or of an unknown version, is bad input naming the file: skipping it would make
    // every finding it covers count as new, and a damaged signature as "no longer reproduces".
    const bool repro_like = doc.is_object() && doc.contains("schema") && doc["schema"].is_string() &&
                            (doc["schema"].get_ref<const std::string&>().rfind("vramfuzz.repro/", 0) == 0 ||
                             doc["schema"].get_ref<const std::string&>().rfind("vramfuzz.finding/", 0) == 0);
    if (!repro_like) continue;
    CorpusEntry c;
    c.file = f;
    Scenario s;
    try {
      (void)check_case_document(doc);
      c.signature = doc["signature"].get<std::string>();
      s = load_case_file(f, catalog);
    } catch (const InputError& e) {
      throw InputError(f, e.what());
    }
    c.policy = s.policy.key();
    const CaseResult r = run_case(s, backend, false);
    // A predictor given up cannot replay the rest either: nothing is found yet, stop here.
    if (r.exec.fatal) throw InfraError(fmt::format("corpus: {}: {}", f, r.verdict.message));
    c.still_fails = r.verdict.signature == c.signature;
    // An error says nothing about the repro (its predictor did not answer, the device failed):
    // it is not fixed, and its signature stays known.
    c.undetermined = !c.still_fails && r.verdict.kind == VerdictKind::error;
    c.verdict = c.undetermined ? "error: " + r.verdict.message
                : r.verdict.signature.empty() ? std::string(verdict_kind_name(r.verdict.kind))
                                              : r.verdict.signature;
    out.push_back(std::move(c));
  }
  return out;
}

CampaignResult run_campaign(const CampaignConfig& cfg, Catalog& catalog, Backend& backend) {
  CampaignResult out;
  std::set<FindingKey> known;
  // The clock starts before the corpus replay: a --time budget covers the whole run, replay
  // included (a corpus that alone outlasts it leaves no time for new cases).
  const auto start = std::chrono::steady_clock::now();
  if (!cfg.corpus_dir.empty()) {
    out.corpus = replay_corpus(cfg.corpus_dir, catalog, backend);
    for (const CorpusEntry& c : out.corpus) {
      known.insert({c.signature, c.policy});
      if (c.undetermined) spdlog::warn("corpus: UNDETERMINED {} under {}: {}", c.file, c.policy, c.verdict);
      else spdlog::info("corpus: {} {} ({} under {})", c.still_fails ? "still fails" : "FIXED", c.file, c.verdict, c.policy);
    }
  }
  const std::function<double()> elapsed = [start] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const std::uint64_t stride = std::max<std::uint32_t>(1, cfg.shard_count);
  // Case i, generated before it runs. Generation depends on the seed alone, never on a result, so
  // the next cases (and their class G pairs, which run only if their case passes) are generated
  // and their requests sent to an external predictor before case i is lowered and executed: the
  // predictor plans the next cases while this one executes. A request not needed after all (the pair of a case that
  // failed, a case past the time budget) is abandoned. Built-in predictors send nothing.
  struct Generated {
    std::uint64_t seed = 0;
    std::optional<PrngChoices> choices;
    Scenario s;
    SentAhead request;
    std::optional<Scenario> pair;  // made here only to be sent ahead; else where it runs
    SentAhead pair_request;
  };
  // Class G's pair of case i: s a step smaller, where i is a pair's index and s can shrink.
  const auto knee_pair = [&cfg](const Scenario& s, std::uint64_t i, std::uint64_t seed) -> std::optional<Scenario> {
    if (cfg.knee_every == 0 || i % cfg.knee_every != 0) return std::nullopt;
    const std::optional<Workload> smaller = knee_smaller(s.workload, seed);
    if (!smaller) return std::nullopt;
    Scenario pair = s;
    pair.knee_of = s.workload;
    pair.workload = *smaller;
    return pair;
  };
  const auto generate = [&](std::uint64_t i) {
    auto g = std::make_unique<Generated>();
    g->seed = case_seed(cfg.seed, i);
    g->s = generate_scenario(g->choices.emplace(g->seed), cfg.gen, catalog);
    if (g->s.policy.predictor == PredictorKind::external) g->pair = knee_pair(g->s, i, g->seed);
    return g;
  };
  const auto send_ahead = [](Generated& g) {
    if (g.s.policy.predictor != PredictorKind::external) return;
    // Not sent yet, or lost with a process that died since: (again) to the running one.
    if (!g.request.live()) g.request = send_external_ahead(g.s);
    if (g.pair && !g.pair_request.live()) g.pair_request = send_external_ahead(*g.pair);
  };
  // How many cases ahead of the one executing are generated and sent: enough that neither side
  // waits on the other's slower cases. Only for a campaign with an external predictor.
  const std::size_t ahead = cfg.gen.policy && cfg.gen.policy->find("exec:") != std::string::npos ? kCasesSentAhead : 0;
  std::deque<std::unique_ptr<Generated>> queued;  // generated, not yet run: cases next_index - k*stride
  std::uint64_t next_index = cfg.shard_index;     // the next case to generate
  for (std::uint64_t i = cfg.shard_index;; i += stride) {
    if (cfg.cases != 0 && i >= cfg.cases) break;
    if (cfg.seconds > 0 && elapsed() >= cfg.seconds) break;
    if (cfg.cases == 0 && cfg.seconds <= 0) break;
    if (cfg.should_stop && cfg.should_stop()) {
      out.stopped = true;
      break;
    }
    if (queued.empty()) {
      queued.push_back(generate(next_index));
      next_index += stride;
    }
    const std::unique_ptr<Generated> current = std::move(queued.front());
    queued.pop_front();
    // In the order they run: this case, those queued (again where a restart lost them), then new ones.
    send_ahead(*current);
    for (const auto& g : queued) send_ahead(*g);
    while (queued.size() < ahead && (cfg.cases == 0 || next_index < cfg.cases)) {
      queued.push_back(generate(next_index));
      send_ahead(*queued.back());
      next_index += stride;
    }
    const std::uint64_t seed = current->seed;
    PrngChoices& choices = *current->choices;
    const Scenario& s = current->s;
    CaseResult r = run_case(s, backend, false, &current->request);
    ++out.cases;
    if (out.environment.empty()) out.environment = r.exec.environment;
    for (const std::string& w : r.exec.warnings) spdlog::warn("case {} (seed {}): {}", i, seed, w);
    out.warnings += r.exec.warnings.size();
    CellCount& cell = out.cells[{s.policy.label(), std::string(allocator_mode_name(s.allocator.mode))}];
    ++cell.cases;
    // Reported after the case is fully handled (finding written, repro shrunk).
    struct Notify {
      const CampaignConfig& cfg;
      const CampaignResult& out;
      const std::function<double()>& elapsed;
      ~Notify() {
        if (cfg.on_case) cfg.on_case(out, elapsed());
      }
    } notify{cfg, out, elapsed};
    if (r.verdict.expected_oom) {
      ++out.expected_ooms;
      ++cell.expected_ooms;
    }
    if (r.verdict.kind == VerdictKind::error) {
      ++out.errors;
      ++cell.errors;
      spdlog::warn("case {} (seed {}): error: {}", i, seed, r.verdict.message);
      if (r.exec.fatal) {
        // A sticky CUDA error: this process can run no more cases (--isolate avoids it).
        out.fatal_error = r.verdict.message;
        spdlog::error("campaign stopped after case {}: {} cannot go on", i, s.policy.predictor == PredictorKind::external ? "the external predictor" : "the backend");
        break;
      }
      continue;
    }
    // Written and shrunk before the campaign moves on (the finding of the case, then its pair's).
    const auto record = [&](const Scenario& cs, CaseResult& cr) {
      ++out.findings;
      const FindingKey key{cr.verdict.signature, cs.policy.key()};
      CellCount::Finding& cf = cell.findings[key];
      if (++cf.count == 1) {
        cf.first_case_seed = seed;
        cf.first_case_index = i;
      }
      if (cf.count == 1 || cr.verdict.overshoot > cf.worst_overshoot) cf.worst_overshoot = cr.verdict.overshoot;
      SignatureCount& sc = out.signatures[key];
      ++sc.count;
      if (sc.count == 1 || cr.verdict.overshoot > sc.worst_overshoot) {
        sc.worst_overshoot = cr.verdict.overshoot;
        sc.worst_device = cs.device.total;
      }
      // A knee's overshoot is its smaller half's: below the threshold only counts for violations.
      if (cr.verdict.kind == VerdictKind::knee && cr.verdict.knee_small.rfind("violation:", 0) != 0) sc.knee_of_oom = true;
      sc.noise = is_noise(key.signature, sc.worst_overshoot, cfg.min_overshoot, sc.knee_of_oom);
      if (sc.count == 1) {
        sc.cause = cr.verdict.cause;
        sc.first_case_seed = seed;
        sc.first_case_index = i;
        sc.known = known.count(key) > 0;
        spdlog::info("case {}: {} finding {} under {} ({})", i, sc.known ? "known" : sc.noise ? "noise-level" : "new", key.signature,
                     key.policy, cr.verdict.message);
      }
      if (cfg.out_dir.empty() || sc.count > cfg.keep_per_signature) return;
      // Re-run with the trace for the file: the same scenario gives the same trace on sim.
      cr = run_case(cs, backend, true);
      check_activation_dependence(cs, cr.plan, backend, cr.verdict);
      if (sc.count == 1) sc.activation_dependent = cr.verdict.activation_dependent;
      const std::string dir = finding_dir(cfg.out_dir, key);
      const std::string file = fmt::format("{}/case-{:016x}.json", dir, seed);
      const std::string found_by = fmt::format("vramfuzz fuzz --seed {} --cases {}{}", cfg.seed, i + 1, cfg.case_options);
      write_file_atomic(file, case_json(cs, cr, cfg.seed, i, seed, file, choices.recorded(), found_by));
      if (!sc.first_file.empty()) return;
      sc.first_file = file;
      if (!cfg.shrink || sc.known) return;
      ShrinkOptions opt;
      opt.max_execs = cfg.shrink_execs;
      opt.max_seconds = cfg.shrink_seconds;
      // A --time budget is honoured within a second: the shrink gets what is left of it at most.
      if (cfg.seconds > 0) opt.max_seconds = std::max(0.0, std::min(opt.max_seconds, cfg.seconds - elapsed()));
      opt.confirm_runs = cfg.confirm_runs;
      opt.should_stop = cfg.should_stop;
      const ShrinkResult sr = shrink(cs, backend, opt);
      ReproOrigin origin;
      origin.campaign_seed = cfg.seed;
      origin.case_index = i;
      origin.case_seed = seed;
      origin.choices = choices.recorded();
      origin.found_by = found_by;
      origin.source_file = file;
      sc.repro_file = write_repro(dir, sr, origin);
      sc.repro_modules = sr.final_size.modules;
      sc.repro_repeats = sr.final_size.repeats;
      sc.shrink_execs = sr.executions;
      sc.flaky = sr.flaky;
      sc.shrunk = std::make_shared<const ShrinkResult>(sr);
      spdlog::info("  shrunk to {} module(s){} in {} executions: {}", sr.final_size.modules,
                   sr.final_size.repeats > 0 ? fmt::format(", {} of them repeats", sr.final_size.repeats) : std::string(),
                   sr.executions, sc.repro_file);
    };
    const bool passed = !r.verdict.expected_oom && (r.verdict.kind == VerdictKind::pass || r.verdict.kind == VerdictKind::waste);
    if (r.verdict.finding()) record(s, r);
    // Class G: every knee_every-th case that passes is run again a step smaller (by its index, so
    // shards pair the same cases as the whole campaign); that one failing is a knee finding.
    if (!passed || cfg.knee_every == 0 || i % cfg.knee_every != 0 || (cfg.should_stop && cfg.should_stop())) continue;
    if (cfg.seconds > 0 && elapsed() >= cfg.seconds) continue;
    if (!current->pair) current->pair = knee_pair(s, i, seed);
    if (!current->pair) continue;
    const Scenario& pair = *current->pair;
    ++out.knee_pairs;
    ++cell.knee_pairs;
    CaseResult pr = run_case(pair, backend, false, &current->pair_request);
    if (pr.verdict.kind == VerdictKind::error) {
      // The pair's own error (or its larger half's) is counted like a case's.
      ++out.errors;
      ++cell.errors;
      spdlog::warn("case {} (seed {}), its pair at {}: error: {}", i, seed, workload_label(pair.workload), pr.verdict.message);
      if (pr.exec.fatal) {
        out.fatal_error = pr.verdict.message;
        spdlog::error("campaign stopped after case {}: {} cannot go on", i, s.policy.predictor == PredictorKind::external ? "the external predictor" : "the backend");
        break;
      }
      continue;
    }
    if (pr.verdict.kind == VerdictKind::knee) record(pair, pr);
  }
  out.seconds = elapsed();
  return out;
}

}  // namespace vf
