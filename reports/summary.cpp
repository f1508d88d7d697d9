#include "reports/summary.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "harness/core/error.h"
#include "harness/core/json_in.h"
#include "harness/repro.h"
#include "reports/json_util.h"
#include "reports/render.h"
#include "reports/summary_schema.h"

namespace vf::report {

namespace fs = std::filesystem;

std::string utc_timestamp() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

RunInfo run_info(std::string command, std::string command_line, std::string backend, std::string out_dir) {
  RunInfo r;
  r.command = std::move(command);
  r.command_line = std::move(command_line);
  r.backend = std::move(backend);
  r.hostname = host_name();
  r.timestamp = utc_timestamp();
  r.out_dir = std::move(out_dir);
  return r;
}

std::string relocate(const std::string& path, const std::string& recorded_out_dir, const std::string& summary_dir) {
  if (path.empty() || recorded_out_dir.empty()) return path;
  // From the recorded --out to the file: under it for a fuzz or calibrate run, `../SHARD/...` for a
  // merge (its files stay in the shard directories), so a tree moved as a whole keeps its links.
  const fs::path rest = fs::path(path).lexically_normal().lexically_relative(fs::path(recorded_out_dir).lexically_normal());
  if (rest.empty()) return path;  // one absolute, the other relative: no way from one to the other
  return (fs::path(summary_dir) / rest).lexically_normal().string();
}

// ---- case view --------------------------------------------------------------------------------

Json case_view(const Scenario& s, const CaseResult& r, const std::string& title, const std::string& replay,
               std::size_t max_rows) {
  const Verdict& v = r.verdict;
  const Program& prog = r.program;
  Json j;
  j["title"] = title;
  j["verdict"] = {{"kind", verdict_kind_name(v.kind)}, {"signature", v.signature}, {"message", v.message},
                  {"stage", v.stage},  {"op", v.op},               {"measured", v.measured},
                  {"predicted", v.predicted}, {"reserve", v.reserve}, {"overshoot", v.overshoot}};
  if (!v.cause.empty()) j["verdict"]["cause"] = v.cause;
  if (!v.explanation.empty()) j["verdict"]["explanation"] = v.explanation;
  if (!v.rests_on.empty()) j["verdict"]["rests_on"] = v.rests_on;
  if (!v.at_budget.empty()) {
    j["verdict"]["activation_dependent"] = v.activation_dependent;
    j["verdict"]["at_budget"] = v.at_budget;
  }
  j["scenario"] = {{"name", s.name},
                   {"device_total", s.device.total},
                   {"available", r.plan.available},
                   {"allocator", allocator_mode_name(s.allocator.mode)},
                   {"policy", s.policy.key()},
                   {"streams", s.streams()},
                   {"workload", fmt::format("{}x{}, batch {}, frames {}, cfg {}", s.workload.width, s.workload.height,
                                            s.workload.batch, s.workload.frames, s.workload.cfg)}};
  if (r.exec.oom) {
    j["oom"] = {{"op", r.exec.oom->op},
                {"request", r.exec.oom->request},
                {"reserved", r.exec.oom->reserved},
                {"allocated", r.exec.oom->allocated},
                {"device_free", r.exec.oom->device_free},
                {"what", r.exec.oom->op < prog.ops.size() ? describe_op(s, prog, r.exec.oom->op) : ""}};
  } else {
    j["oom"] = nullptr;
  }
  Json stages = Json::array();
  for (std::size_t i = 0; i < s.stages.size(); ++i) {
    const StagePlan* sp = nullptr;
    for (const StagePlan& c : r.plan.stages) {
      if (c.stage == i) sp = &c;
    }
    Json st = {{"stage", i},
               {"op", stage_op_name(s.stages[i].op)},
               {"model", s.models[s.stages[i].model].id},
               {"begin", i < prog.stage_begin.size() ? prog.stage_begin[i] : 0},
               {"end", i < prog.stage_begin.size() ? prog.stage_end(i) : 0},
               {"checked", sp ? sp->checked : false},
               {"predicted", sp ? sp->predicted_peak : 0},
               {"limit", sp ? sp->predicted_peak + r.plan.reserve : 0},
               {"measured", i < r.exec.stage_reserved_peak.size() ? r.exec.stage_reserved_peak[i] : 0},
               {"peak_op", i < r.exec.stage_reserved_peak_op.size() ? r.exec.stage_reserved_peak_op[i] : 0}};
    // The plan's terms the timeline draws its budget lines from (docs/attribution.md).
    if (sp && sp->checked) {
      st["budget"] = {{"weights", sp->resident_total}, {"offload", sp->offload_buffer}, {"activation", sp->activation_allowance}};
    }
    stages.push_back(std::move(st));
  }
  j["stages"] = std::move(stages);
  Json loads = Json::array();
  for (const LoadPlan& lp : r.plan.loads) {
    std::size_t resident = 0;
    for (std::uint8_t x : lp.resident) resident += x ? 1 : 0;
    loads.push_back({{"model", s.models[lp.model].id},
                     {"stage", lp.stage},
                     {"loaded", lp.loaded},
                     {"offloaded", lp.offloaded},
                     {"uncounted", lp.uncounted},
                     {"offload_buffer", lp.offload_buffer},
                     {"modules", lp.resident.size()},
                     {"resident_modules", resident},
                     {"full_load", lp.full_load},
                     {"log", lp.log_line}});
  }
  j["loads"] = std::move(loads);

  // The whole trace, downsampled past max_rows: per bucket the row with the highest reserved,
  // plus the judged op, the OOM op and each stage's first op, so the shape and the peak survive.
  const auto& rows = r.exec.trace;
  std::vector<std::size_t> keep;
  if (rows.size() <= max_rows || max_rows < 8) {
    for (std::size_t i = 0; i < rows.size(); ++i) keep.push_back(i);
  } else {
    std::set<std::size_t> k;
    const std::size_t bucket = (rows.size() + max_rows / 2 - 1) / (max_rows / 2);
    for (std::size_t b = 0; b < rows.size(); b += bucket) {
      std::size_t best = b;
      for (std::size_t i = b; i < std::min(rows.size(), b + bucket); ++i) {
        if (rows[i].reserved > rows[best].reserved) best = i;
      }
      k.insert(b);
      k.insert(best);
    }
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const std::uint32_t op = rows[i].op;
      const bool stage_start = op < prog.ops.size() && std::find(prog.stage_begin.begin(), prog.stage_begin.end(), op) != prog.stage_begin.end();
      if (op == v.op || (r.exec.oom && op == r.exec.oom->op) || stage_start) k.insert(i);
    }
    k.insert(rows.size() - 1);
    keep.assign(k.begin(), k.end());
  }
  Json trace_rows = Json::array();
  Json held = Json::array();
  bool any_held = false;
  for (std::size_t i : keep) {
    const TraceRow& row = rows[i];
    const std::uint32_t stage = row.op < prog.ops.size() ? prog.ops[row.op].stage : 0;
    trace_rows.push_back(Json::array({row.op, stage, row.live, row.allocated, row.reserved, row.device_used}));
    held.push_back(row.held);
    any_held = any_held || row.held > 0;
  }
  // What the live bytes are made of after each kept row's op (the stacked timeline): the
  // program's own buffers by kind. Classic programs only: a dynamic one's conditional ops are
  // decided at run time, and its weights live in VBAR pages.
  Json parts = Json::array();
  if (!prog.dynamic && !keep.empty()) {
    std::vector<std::uint8_t> live(prog.buffers.size(), 0);
    Bytes by[3] = {0, 0, 0};  // weights, weight transients, activations
    auto slot = [](BufferKind k) { return k == BufferKind::weight ? 0 : k == BufferKind::activation ? 2 : 1; };
    std::size_t next = 0;
    bool exact = true;
    for (std::uint32_t op = 0; op < prog.ops.size() && next < keep.size(); ++op) {
      const Op& o = prog.ops[op];
      const bool failed = r.exec.oom && op == r.exec.oom->op;
      if (o.buffer < prog.buffers.size() && !failed) {
        const Buffer& b = prog.buffers[o.buffer];
        if (o.kind == OpKind::alloc && !live[o.buffer]) {
          live[o.buffer] = 1;
          by[slot(b.kind)] += b.bytes;
        } else if (o.kind == OpKind::free && live[o.buffer]) {
          live[o.buffer] = 0;
          by[slot(b.kind)] -= b.bytes;
        }
      }
      while (next < keep.size() && rows[keep[next]].op == op) {
        exact = exact && by[0] + by[1] + by[2] == rows[keep[next]].live;
        parts.push_back(Json::array({by[0], by[1], by[2]}));
        ++next;
      }
    }
    if (!exact || parts.size() != keep.size()) parts = Json::array();
  }
  j["trace"] = {{"columns", Json::array({"op", "stage", "live", "allocated", "reserved", "device_used"})},
                {"ops", prog.ops.size()},
                {"downsampled", keep.size() < rows.size()},
                {"rows", std::move(trace_rows)}};
  // Per row, other streams' frees (of reserved - allocated): only where there were any.
  if (any_held) j["trace"]["held"] = std::move(held);
  if (!parts.empty()) {
    j["trace"]["parts_columns"] = Json::array({"weights", "weight_transients", "activations"});
    j["trace"]["parts"] = std::move(parts);
  }

  Json around = Json::array();
  const std::uint32_t center = r.exec.oom ? r.exec.oom->op : v.op;
  const std::uint32_t lo = center > 12 ? center - 12 : 0;
  for (const TraceRow& row : rows) {
    if (row.op < lo || row.op > center + 12 || row.op >= prog.ops.size()) continue;
    const Op& op = prog.ops[row.op];
    around.push_back({{"op", row.op},
                      {"kind", op_kind_name(op.kind)},
                      {"phase", phase_name(op.phase)},
                      {"stream", op.stream},
                      {"what", describe_op(s, prog, row.op)},
                      {"bytes", op.buffer != kNone ? prog.buffers[op.buffer].bytes : 0},
                      {"live", row.live},
                      {"allocated", row.allocated},
                      {"reserved", row.reserved},
                      {"device_used", row.device_used}});
  }
  j["around_peak"] = std::move(around);
  j["peaks"] = {{"reserved", r.exec.reserved_peak}, {"allocated", r.exec.allocated_peak}, {"live", r.exec.live_peak},
                {"device_used", r.exec.device_peak}};
  j["replay"] = replay;
  return j;
}

Json case_view(const ShrinkResult& sr, const std::string& replay) {
  Json j = case_view(sr.minimal, sr.result, repro_title(sr), replay);
  j["reliability"] = {{"runs", sr.confirm_runs}, {"reproduced", sr.reproduced}, {"flaky", sr.flaky}};
  j["shrink"] = {{"executions", sr.executions},
                 {"original_modules", sr.original_size.modules},
                 {"final_modules", sr.final_size.modules},
                 {"budget_exhausted", sr.budget_exhausted}};
  return j;
}

// ---- common pieces ----------------------------------------------------------------------------

namespace {

std::string kind_of(const std::string& signature) { return signature.substr(0, signature.find(':')); }

std::vector<std::string> all_policies() {
  std::vector<std::string> out;
  for (Preset p : {Preset::oct2025, Preset::nov2025, Preset::dec2025}) out.push_back("comfy:" + std::string(preset_name(p)));
  return out;
}

std::vector<std::string> all_allocators() {
  std::vector<std::string> out;
  for (AllocatorMode m : kAllAllocatorModes) out.emplace_back(allocator_mode_name(m));
  return out;
}

Json properties_json() {
  return Json::array({Json{{"id", "P1"}, {"name", "peak-within-prediction"}, {"kind", "violation"}},
                      Json{{"id", "P2"}, {"name", "no-unpredicted-oom"}, {"kind", "oom"}},
                      Json{{"id", "P3"}, {"name", "no-wasted-offload"}, {"kind", "waste"}},
                      Json{{"id", "P4"}, {"name", "no-resolution-knee"}, {"kind", "knee"}}});
}

Json cells_json(const std::map<std::pair<std::string, std::string>, CellCount>& cells) {
  Json out = Json::array();
  for (const auto& [key, c] : cells) {
    Json f = Json::array();
    for (const auto& [id, x] : c.findings) {
      f.push_back({{"signature", id.signature}, {"policy", id.policy}, {"count", x.count}, {"worst_overshoot", x.worst_overshoot},
                   {"first_case_seed", x.first_case_seed}, {"first_case_index", x.first_case_index}});
    }
    out.push_back({{"policy", key.first},
                   {"allocator", key.second},
                   {"cases", c.cases},
                   {"expected_ooms", c.expected_ooms},
                   {"errors", c.errors},
                   {"knee_pairs", c.knee_pairs},
                   {"findings", std::move(f)}});
  }
  return out;
}

Json matrix_json(std::vector<std::string> policies, std::vector<std::string> allocators, Json cells) {
  // Every combination that ran is listed, configured or not.
  for (const Json& c : cells) {
    const std::string p = c["policy"].get<std::string>(), a = c["allocator"].get<std::string>();
    if (std::find(policies.begin(), policies.end(), p) == policies.end()) policies.push_back(p);
    if (std::find(allocators.begin(), allocators.end(), a) == allocators.end()) allocators.push_back(a);
  }
  return {{"properties", properties_json()}, {"policies", policies}, {"allocators", allocators}, {"cells", std::move(cells)}};
}

Json corpus_json(const std::string& dir, const std::vector<CorpusEntry>& entries) {
  Json e = Json::array();
  std::size_t still = 0, undetermined = 0;
  for (const CorpusEntry& c : entries) {
    still += c.still_fails ? 1 : 0;
    undetermined += c.undetermined ? 1 : 0;
    Json x = {{"file", c.file}, {"signature", c.signature}, {"policy", c.policy}, {"still_fails", c.still_fails}, {"verdict", c.verdict}};
    if (c.undetermined) x["undetermined"] = true;
    e.push_back(std::move(x));
  }
  Json out = {{"dir", dir}, {"replayed", entries.size()}, {"still_fail", still}, {"no_longer_reproduce", entries.size() - still - undetermined}};
  if (undetermined) out["undetermined"] = undetermined;
  out["entries"] = std::move(e);
  return out;
}

// "key=value" per override or option, as given.
Json pairs_json(const std::vector<std::pair<std::string, std::string>>& pairs) {
  Json out = Json::array();
  for (const auto& [k, v] : pairs) out.push_back(k + "=" + v);
  return out;
}

Json run_json(const RunInfo& info, bool interrupted) {
  return {{"command", info.command}, {"timestamp", info.timestamp}, {"hostname", info.hostname}, {"interrupted", interrupted}};
}

// A finding is known when the regression corpus has a repro of its signature under its policy
// key (FindingKey). `known_by` lists those repros; `corpus_other_policies` the keys the corpus has
// the signature under otherwise, so a report can say why a finding is new although its signature
// is in the corpus. `known` stays true when an input of a merge already said so.
void annotate_corpus(Json& f, const Json& doc) {
  std::set<std::string> by, others;
  if (doc.contains("corpus")) {
    for (const Json& e : get_arr(doc["corpus"], "entries")) {
      if (get_str(e, "signature") != get_str(f, "signature")) continue;
      if (get_str(e, "policy") == get_str(f, "policy")) {
        by.insert(get_str(e, "file"));
      } else {
        others.insert(get_str(e, "policy"));
      }
    }
  }
  f["known"] = f.value("known", false) || !by.empty();
  f["known_by"] = by;
  f["corpus_other_policies"] = others;
}

}  // namespace

std::string replay_command(const std::string& repro, const std::string& file, const std::string& from_dir) {
  if (!repro.empty()) return "vramfuzz replay " + shell_quote(link_from(repro, from_dir));
  if (!file.empty()) return "vramfuzz run " + shell_quote(link_from(file, from_dir));
  return "";
}

namespace {

// A finding's replay command as summary.json records it: run from the folder summary.json is in
// (its recorded --out), so it holds wherever the tree is moved or downloaded.
std::string replay_for(const std::string& repro, const std::string& file, const Json& doc) {
  return replay_command(repro, file, doc.contains("config") ? get_str(doc["config"], "out") : "");
}


}  // namespace

// ---- fuzz --------------------------------------------------------------------------------------

Json campaign_config(const CampaignConfig& cfg, const std::string& backend) {
  return {{"seed", cfg.seed},
          {"cases", cfg.cases},
          {"seconds", cfg.seconds},
          {"backend", backend},
          {"policy", cfg.gen.policy.value_or("drawn")},
          {"overrides", pairs_json(cfg.gen.policy_overrides)},
          {"allocator", cfg.gen.allocator ? std::string(allocator_mode_name(*cfg.gen.allocator)) : "drawn"},
          {"allocator_options", pairs_json(cfg.gen.allocator_options)},
          {"vram", cfg.gen.vram ? Json(*cfg.gen.vram) : Json("drawn")},
          {"model", cfg.gen.model ? cfg.gen.model->name : ""},
          {"shard", fmt::format("{}/{}", cfg.shard_index, cfg.shard_count)},
          {"corpus", cfg.corpus_dir},
          {"min_overshoot", cfg.min_overshoot},
          {"activations", cfg.activations},
          {"knee_every", cfg.knee_every},
          {"out", cfg.out_dir}};
}

double finding_severity(std::int64_t overshoot, Bytes device_total, std::string_view kind) {
  if (device_total == 0 || overshoot <= 0) return 0.0;
  // Waste costs bandwidth, not an OOM: a tenth of its unused bytes' share of the device, so it
  // lists after every violation and OOM of a similar size.
  const double weight = kind == "waste" ? 0.1 : 1.0;
  // At most 1e6 (what the strict reader takes): an absurd request on a tiny device stays readable.
  return std::min(1e6, std::round(weight * static_cast<double>(overshoot) / static_cast<double>(device_total) * 1e6) / 1e6);
}

Json summary_from_campaign(const CampaignConfig& cfg, const CampaignResult& r, const RunInfo& info) {
  Json j;
  j["schema"] = kSummarySchema;
  j["tool"] = tool_version();
  j["command"] = cfg.command_line;
  j["config"] = campaign_config(cfg, info.backend);
  j["counts"] = {{"cases", r.cases},
                 {"findings", r.findings},
                 {"signatures", r.signatures.size()},
                 {"new_signatures", r.new_signatures()},
                 {"expected_ooms", r.expected_ooms},
                 {"errors", r.errors},
                 {"knee_pairs", r.knee_pairs},
                 {"seconds", r.seconds}};
  Json sigs = Json::array();
  const Json corpus = cfg.corpus_dir.empty() ? Json::object() : Json{{"corpus", corpus_json(cfg.corpus_dir, r.corpus)}};
  for (const auto& [key, c] : r.signatures) {
    const std::string& sig = key.signature;
    Json f = {{"signature", sig},
              {"policy", key.policy},
              {"count", c.count},
              {"worst_overshoot", c.worst_overshoot},
              {"first_case_seed", c.first_case_seed},
              {"known", c.known},
              {"repro", c.repro_file},
              {"repro_modules", c.repro_modules},
              {"repro_repeats", c.repro_repeats},
              {"shrink_executions", c.shrink_execs},
              {"flaky", c.flaky},
              {"file", c.first_file},
              {"first_case_index", c.first_case_index},
              {"campaign_seed", cfg.seed},
              {"kind", kind_of(sig)},
              {"replay", replay_command(c.repro_file, c.first_file, cfg.out_dir)}};
    // The cause a table shows: the repro's (what a reader opens), else the first case's.
    const std::string why = c.shrunk && !c.shrunk->result.verdict.cause.empty() ? c.shrunk->result.verdict.cause : c.cause;
    // Activation-dependent (the repro's mark, else the first case's): the verdict changes with the
    // activations at the predictor's estimate, and every table says so before the cause.
    const bool act = c.shrunk ? c.shrunk->result.verdict.activation_dependent : c.activation_dependent;
    if (act) f["activation_dependent"] = true;
    if (!why.empty() || act) f["why"] = act ? "activation-dependent: " + (why.empty() ? std::string("-") : why) : why;
    if (c.worst_device > 0) f["severity"] = finding_severity(c.worst_overshoot, c.worst_device, kind_of(sig));
    if (c.noise) f["noise"] = true;
    annotate_corpus(f, corpus);
    if (c.shrunk) {
      f["reliability"] = {{"runs", c.shrunk->confirm_runs}, {"reproduced", c.shrunk->reproduced}};
      f["case"] = case_view(*c.shrunk, replay_command(c.repro_file, "", cfg.out_dir));
    }
    sigs.push_back(std::move(f));
  }
  j["findings"] = std::move(sigs);
  j["seeds"] = Json::array({cfg.seed});
  j["shard"] = {{"index", cfg.shard_index}, {"count", cfg.shard_count}};
  j["environment"] = {{"backend", info.backend}, {"device", r.environment.empty() ? info.environment : r.environment}};
  j["run"] = run_json(info, r.stopped);
  j["matrix"] = matrix_json(cfg.gen.policy ? std::vector<std::string>{*cfg.gen.policy} : all_policies(),
                            cfg.gen.allocator ? std::vector<std::string>{std::string(allocator_mode_name(*cfg.gen.allocator))}
                                              : all_allocators(),
                            cells_json(r.cells));
  if (!cfg.corpus_dir.empty()) j["corpus"] = corpus_json(cfg.corpus_dir, r.corpus);
  return j;
}

// ---- calibrate ---------------------------------------------------------------------------------

namespace {

Json stats_json(const CalibStats& st) {
  return {{"cases", st.cases},         {"ooms", st.ooms},       {"expected_ooms", st.expected_ooms},
          {"errors", st.errors},       {"violations", st.violations}, {"p50", st.p50},
          {"p90", st.p90},             {"p99", st.p99},         {"max", st.max},
          {"need", st.need},           {"recommended", st.recommended}, {"reserve", st.reserve},
          {"passing", st.passing},     {"slack_median", st.slack_median}, {"slack_share", st.slack_share}};
}

const Json kSampleColumns = Json::array(
    {"case_index", "case_seed", "allocator", "workload", "delta", "oom", "pass", "reserve", "device_total", "signature", "policy"});
const Json kExcludedColumns = Json::array({"case_index", "case_seed", "allocator", "workload", "expected_oom", "error"});

// Histogram of delta for the HTML: bucket width a power of two MiB, for at most ~48 bars. The
// range starts at -(2 x recommended + 1 GiB): a 141 GiB device predicted far above what it used
// would otherwise squeeze the interesting part (around the reserve) into one bar; the cases
// further below are counted into the first bar (`clamped`).
Json histogram(const std::vector<CalibSample>& samples, Bytes recommended) {
  if (samples.empty()) return {{"bucket", 0}, {"lo", 0}, {"bins", Json::array()}, {"ooms", Json::array()}, {"clamped", 0}};
  const std::int64_t floor = -static_cast<std::int64_t>(2 * recommended + GiB);
  std::int64_t lo = samples.front().delta, hi = lo;
  std::uint64_t clamped = 0;
  for (const CalibSample& s : samples) {
    lo = std::min(lo, s.delta);
    hi = std::max(hi, s.delta);
    clamped += s.delta < floor ? 1 : 0;
  }
  lo = std::max(lo, floor);
  hi = std::max(hi, lo);
  const std::int64_t mib = static_cast<std::int64_t>(MiB);
  std::int64_t width = mib;
  for (std::int64_t w : {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192}) {
    width = w * mib;
    if ((hi - lo) / width < 48) break;
  }
  const std::int64_t first = (lo >= 0 ? lo / width : -((-lo + width - 1) / width)) * width;
  std::vector<std::uint64_t> bins(static_cast<std::size_t>((hi - first) / width + 1), 0);
  std::vector<std::uint64_t> ooms(bins.size(), 0);
  for (const CalibSample& s : samples) {
    const std::size_t b = static_cast<std::size_t>((std::max(s.delta, lo) - first) / width);
    ++bins[b];
    ooms[b] += s.oom ? 1 : 0;
  }
  return {{"bucket", width}, {"lo", first}, {"bins", bins}, {"ooms", ooms}, {"clamped", clamped}};
}

}  // namespace

Json calibrate_section(const std::vector<CalibSample>& samples, const std::vector<CalibExcluded>& excluded, Bytes margin,
                       const Json& meta, const Json& verify, const Json& worst) {
  Json j;
  j["schema"] = kCalibrateSchema;
  for (auto it = meta.begin(); it != meta.end(); ++it) j[it.key()] = it.value();
  j["margin"] = margin;
  std::vector<std::string> modes;
  for (AllocatorMode m : kAllAllocatorModes) {
    for (const CalibSample& s : samples) {
      if (s.mode == m) {
        modes.emplace_back(allocator_mode_name(m));
        break;
      }
    }
  }
  Json mode_rows = Json::array(), class_rows = Json::array();
  for (const std::string& mode : modes) {
    std::vector<CalibSample> mine;
    std::vector<CalibExcluded> mine_x;
    for (const CalibSample& s : samples) {
      if (allocator_mode_name(s.mode) == mode) mine.push_back(s);
    }
    for (const CalibExcluded& e : excluded) {
      if (allocator_mode_name(e.mode) == mode) mine_x.push_back(e);
    }
    const CalibStats st = calib_stats(mine, mine_x, margin);
    Json row = {{"allocator", mode}};
    const Json sj = stats_json(st);
    for (auto it = sj.begin(); it != sj.end(); ++it) row[it.key()] = it.value();
    // Verification: the last round of each shard that verified this mode. One shard whose last
    // round did not finish (stopped, out of time) leaves the mode not verified: the others'
    // rounds did not see its cases.
    Bytes verified = 0;
    std::uint64_t verify_ooms = 0;
    bool holds = false, any = false, unfinished = false;
    std::map<std::string, const Json*> last_by_shard;
    for (const Json& v : verify) {
      if (get_str(v, "allocator") == mode) last_by_shard[get_str(v, "shard")] = &v;
    }
    for (const auto& [shard, v] : last_by_shard) {
      if (!v->value("finished", true)) {
        unfinished = true;
        continue;
      }
      const bool ok = get_u64(*v, "violations") == 0;
      const Bytes need = ok ? get_u64(*v, "reserve") : std::max<Bytes>(get_u64(*v, "reserve"), static_cast<Bytes>(std::max<std::int64_t>(0, get_i64(*v, "max_delta"))));
      verified = std::max(verified, need);
      verify_ooms += get_u64(*v, "ooms");
      holds = any ? holds && ok : ok;
      any = true;
    }
    // Not verified: the recommendation is the sample's need plus the margin, a first estimate
    // (`verification` says so; the reports mark it).
    const Bytes need = unfinished ? st.need : std::max(st.need, verified);
    row["verified_need"] = any && !unfinished ? Json(verified) : Json(nullptr);
    row["verified"] = any && holds && !unfinished;
    row["verification"] = unfinished ? "not verified" : !any ? "off" : holds ? "held" : "not held";
    row["verify_ooms"] = unfinished ? 0 : verify_ooms;
    row["recommended"] = recommended_reserve(need, margin);
    row["histogram"] = histogram(mine, recommended_reserve(need, margin));
    if (worst.contains(mode)) row["worst"] = worst[mode];
    mode_rows.push_back(std::move(row));

    std::map<std::string, std::pair<std::vector<CalibSample>, std::vector<CalibExcluded>>> by_class;
    for (const CalibSample& s : mine) by_class[s.workload].first.push_back(s);
    for (const CalibExcluded& e : mine_x) by_class[e.workload].second.push_back(e);
    for (const auto& [cls, group] : by_class) {
      const CalibStats cs = calib_stats(group.first, group.second, margin);
      Json crow = {{"allocator", mode}, {"workload", cls}};
      const Json csj = stats_json(cs);
      for (auto it = csj.begin(); it != csj.end(); ++it) crow[it.key()] = it.value();
      class_rows.push_back(std::move(crow));
    }
  }
  j["modes"] = std::move(mode_rows);
  j["classes"] = std::move(class_rows);
  j["verify"] = verify;
  Json rows = Json::array();
  for (const CalibSample& s : samples) {
    rows.push_back(Json::array({s.case_index, s.case_seed, allocator_mode_name(s.mode), s.workload, s.delta, s.oom, s.pass,
                                s.reserve, s.device_total, s.signature, s.policy}));
  }
  j["samples"] = {{"columns", kSampleColumns}, {"rows", std::move(rows)}};
  Json xrows = Json::array();
  for (const CalibExcluded& e : excluded) {
    xrows.push_back(Json::array({e.case_index, e.case_seed, allocator_mode_name(e.mode), e.workload, e.expected_oom, e.error}));
  }
  j["excluded"] = {{"columns", kExcludedColumns}, {"rows", std::move(xrows)}};
  return j;
}

std::vector<CalibSample> samples_from_json(const Json& section) {
  std::vector<CalibSample> out;
  if (!section.contains("samples")) return out;
  std::size_t i = 0;
  for (const Json& r : section["samples"]["rows"]) {
    const std::string where = fmt::format("calibrate.samples.rows[{}]", i++);
    CalibSample s;
    s.case_index = r.at(0).get<std::uint64_t>();
    s.case_seed = r.at(1).get<std::uint64_t>();
    s.mode = parse_allocator_mode_field(r.at(2).get<std::string>(), where);
    s.workload = r.at(3).get<std::string>();
    s.delta = r.at(4).get<std::int64_t>();
    s.oom = r.at(5).get<bool>();
    s.pass = r.at(6).get<bool>();
    s.reserve = r.at(7).get<Bytes>();
    s.device_total = r.at(8).get<Bytes>();
    s.signature = r.at(9).get<std::string>();
    s.policy = r.at(10).get<std::string>();
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<CalibExcluded> excluded_from_json(const Json& section) {
  std::vector<CalibExcluded> out;
  if (!section.contains("excluded")) return out;
  std::size_t i = 0;
  for (const Json& r : section["excluded"]["rows"]) {
    const std::string where = fmt::format("calibrate.excluded.rows[{}]", i++);
    CalibExcluded e;
    e.case_index = r.at(0).get<std::uint64_t>();
    e.case_seed = r.at(1).get<std::uint64_t>();
    e.mode = parse_allocator_mode_field(r.at(2).get<std::string>(), where);
    e.workload = r.at(3).get<std::string>();
    e.expected_oom = r.at(4).get<bool>();
    e.error = r.at(5).get<bool>();
    out.push_back(std::move(e));
  }
  return out;
}

namespace {

// Findings, matrix cells and counts of a calibration: every sample over its own reserve is a
// finding, exactly as in a campaign.
void calibration_findings(const std::vector<CalibSample>& samples, const std::vector<CalibExcluded>& excluded,
                          const Json& worst, const std::map<std::string, std::string>& files, Json& doc) {
  std::map<std::string, Json> sigs;
  std::map<std::pair<std::string, std::string>, CellCount> cells;
  std::uint64_t findings = 0;
  for (const CalibSample& s : samples) {
    CellCount& cell = cells[{s.policy, std::string(allocator_mode_name(s.mode))}];
    ++cell.cases;
    if (s.signature.empty()) continue;
    ++findings;
    const std::int64_t over = s.delta - static_cast<std::int64_t>(s.reserve);
    // First: the smallest case index (a merge pools its shards' samples shard after shard).
    CellCount::Finding& cf = cell.findings[{s.signature, s.policy}];
    if (++cf.count == 1 || s.case_index < cf.first_case_index) {
      cf.first_case_seed = s.case_seed;
      cf.first_case_index = s.case_index;
    }
    if (cf.count == 1 || over > cf.worst_overshoot) cf.worst_overshoot = over;
    Json& f = sigs[s.signature];
    if (f.is_null()) {
      f = {{"signature", s.signature}, {"policy", s.policy}, {"count", 0}, {"worst_overshoot", over}, {"first_case_seed", s.case_seed},
           {"known", false}, {"repro", ""}, {"repro_modules", 0}, {"shrink_executions", 0}, {"flaky", false},
           {"file", ""}, {"first_case_index", s.case_index}, {"kind", kind_of(s.signature)}, {"replay", ""}};
    }
    if (s.case_index < get_u64(f, "first_case_index")) {
      f["first_case_seed"] = s.case_seed;
      f["first_case_index"] = s.case_index;
    }
    f["count"] = f["count"].get<std::uint64_t>() + 1;
    f["worst_overshoot"] = std::max(f["worst_overshoot"].get<std::int64_t>(), over);
  }
  for (const CalibExcluded& e : excluded) {
    CellCount& cell = cells[{doc["config"]["policy"].get<std::string>(), std::string(allocator_mode_name(e.mode))}];
    ++cell.cases;
    cell.expected_ooms += e.expected_oom ? 1 : 0;
    cell.errors += e.error ? 1 : 0;
  }
  for (auto& [sig, f] : sigs) {
    if (auto it = files.find(sig); it != files.end()) {
      f["file"] = it->second;
      f["replay"] = replay_for("", it->second, doc);
    }
  }
  // The worst case of a mode, shrunk, is the repro of its signature.
  for (auto it = worst.begin(); it != worst.end(); ++it) {
    const Json& w = it.value();
    const std::string sig = get_str(w, "signature");
    if (sig.empty() || !sigs.count(sig) || !w.contains("case")) continue;
    Json& f = sigs[sig];
    f["repro"] = get_str(w, "file");
    f["repro_modules"] = get_u64(w, "modules");
    f["replay"] = replay_for(get_str(w, "file"), "", doc);
    f["case"] = w["case"];
    if (w["case"].contains("reliability")) {
      f["reliability"] = {{"runs", w["case"]["reliability"]["runs"]}, {"reproduced", w["case"]["reliability"]["reproduced"]}};
      f["flaky"] = w["case"]["reliability"]["flaky"];
    }
  }
  Json list = Json::array();
  for (auto& [sig, f] : sigs) list.push_back(std::move(f));
  std::uint64_t expected = 0, errors = 0;
  for (const CalibExcluded& e : excluded) {
    expected += e.expected_oom ? 1 : 0;
    errors += e.error ? 1 : 0;
  }
  const double seconds = doc.contains("counts") ? doc["counts"].value("seconds", 0.0) : 0.0;
  doc["counts"] = {{"cases", samples.size() + excluded.size()},
                   {"findings", findings},
                   {"signatures", list.size()},
                   {"new_signatures", list.size()},
                   {"expected_ooms", expected},
                   {"errors", errors},
                   {"seconds", seconds}};
  doc["findings"] = std::move(list);
  std::vector<std::string> allocators;
  for (const Json& m : doc["calibrate"]["modes"]) allocators.push_back(m["allocator"].get<std::string>());
  doc["matrix"] = matrix_json({doc["config"]["policy"].get<std::string>()}, allocators, cells_json(cells));
}

}  // namespace

Json summary_from_calibration(const CalibrationConfig& cfg, const CalibrationResult& r, const RunInfo& info) {
  Json j;
  j["schema"] = kSummarySchema;
  j["tool"] = tool_version();
  j["command"] = info.command_line;
  std::string allocator;
  for (AllocatorMode m : cfg.modes) allocator += (allocator.empty() ? "" : ",") + std::string(allocator_mode_name(m));
  if (cfg.modes.size() == std::size(kAllAllocatorModes)) allocator = "all";
  std::string reserve_override;
  for (const auto& [k, v] : cfg.gen.policy_overrides) {
    if (k == "reserve") reserve_override = v;
  }
  j["config"] = {{"seed", cfg.seed},
                 {"cases", cfg.cases},
                 {"seconds", cfg.seconds},
                 {"backend", info.backend},
                 {"policy", cfg.gen.policy.value_or("comfy:dec2025")},
                 {"overrides", pairs_json(cfg.gen.policy_overrides)},
                 {"allocator", allocator},
                 {"vram", cfg.gen.vram ? Json(*cfg.gen.vram) : Json("drawn")},
                 {"reserve", reserve_override.empty() ? Json("policy") : Json(reserve_override)},
                 {"margin", cfg.margin},
                 {"activations", cfg.activations},
                 {"shard", fmt::format("{}/{}", cfg.shard_index, cfg.shard_count)},
                 {"out", cfg.out_dir}};
  j["counts"] = {{"seconds", r.seconds}};
  j["seeds"] = Json::array({cfg.seed});
  j["shard"] = {{"index", cfg.shard_index}, {"count", cfg.shard_count}};
  j["environment"] = {{"backend", info.backend}, {"device", r.environment.empty() ? info.environment : r.environment}};
  j["run"] = run_json(info, r.stopped);
  Json verify = Json::array();
  for (const CalibVerify& v : r.verify) {
    verify.push_back({{"allocator", allocator_mode_name(v.mode)}, {"shard", fmt::format("{}/{}", cfg.shard_index, cfg.shard_count)},
                      {"round", v.round}, {"reserve", v.reserve}, {"cases", v.cases}, {"violations", v.violations},
                      {"ooms", v.ooms}, {"max_delta", v.max_delta}, {"finished", v.finished}});
  }
  Json worst = Json::object();
  for (const CalibWorst& w : r.worst) {
    Json wj = {{"case_index", w.case_index}, {"case_seed", w.case_seed}, {"delta", w.delta}, {"oom", w.oom},
               {"signature", w.signature}, {"file", w.file}, {"modules", w.modules}};
    if (w.shrunk) wj["case"] = case_view(*w.shrunk, replay_command(w.file, "", cfg.out_dir));
    worst[std::string(allocator_mode_name(w.mode))] = std::move(wj);
  }
  const std::string policy = cfg.gen.policy.value_or("comfy:dec2025");
  const Json meta = {{"policy", policy},
                     {"seed", cfg.seed},
                     {"cases_drawn", r.cases},
                     {"knob", std::string(calibrated_knob(parse_policy(policy, "config.policy", StartCommand::refuse)))}};
  j["calibrate"] = calibrate_section(r.samples, r.excluded, cfg.margin, meta, verify, worst);
  calibration_findings(r.samples, r.excluded, worst, r.finding_files, j);
  return j;
}

// ---- merge --------------------------------------------------------------------------------------

namespace {

// The merged run's config: a field the inputs agree on keeps its value; allocators are the union of
// the inputs' modes, other disagreements `mixed`. `cases` adds up over campaigns (shards of one
// campaign share its count), and `shard` says the document is a merge (`shards` lists the inputs).
Json merged_config(const std::vector<Json>& docs) {
  Json config = docs.front().value("config", Json::object());
  for (const Json& d : docs) {
    const Json c = d.value("config", Json::object());
    for (auto it = c.begin(); it != c.end(); ++it) {
      if (!config.contains(it.key()) || config[it.key()] != it.value()) config[it.key()] = "mixed";
    }
  }
  std::set<std::string> modes;
  std::set<std::string> campaigns;
  std::uint64_t cases = 0;
  for (const Json& d : docs) {
    const Json c = d.value("config", Json::object());
    const std::string alloc = get_str(c, "allocator");
    for (std::size_t b = 0; b <= alloc.size();) {
      const std::size_t e = std::min(alloc.find(',', b), alloc.size());
      modes.insert(alloc.substr(b, e - b));
      b = e + 1;
    }
    const std::string campaign = c.value("seed", Json()).dump() + " " + get_str(c, "policy") + " " + alloc;
    if (campaigns.insert(campaign).second) cases += get_u64(c, "cases");
  }
  std::string allocator;
  if (modes.count("all") || modes.count("drawn")) {
    // Every mode (calibrate's `all`, a campaign's draws): more than any list could add.
    allocator = modes.count("all") ? "all" : "drawn";
  } else {
    for (AllocatorMode m : kAllAllocatorModes) {
      if (modes.count(std::string(allocator_mode_name(m)))) allocator += (allocator.empty() ? "" : ",") + std::string(allocator_mode_name(m));
    }
  }
  config["allocator"] = allocator;
  config["cases"] = cases;
  config["shard"] = "merged";
  return config;
}

// The runs a summary holds, each as what decides the cases it judged: fuzz or calibrate, its shard,
// and its config (seed, policy and overrides, allocator, vram, model, backend, ...) without what
// only bounds or places the run (cases, seconds, corpus, out). A merge lists its inputs' runs.
Json runs_of(const Json& doc) {
  if (doc.contains("runs") && doc["runs"].is_array()) return doc["runs"];
  Json config = doc.value("config", Json::object());
  for (const char* k : {"cases", "seconds", "corpus", "out", "shard", "merged_from"}) config.erase(k);
  Json shard = doc.value("shard", Json{{"index", 0}, {"count", 1}});
  return Json::array({Json{{"kind", doc.contains("calibrate") ? "calibrate" : "fuzz"}, {"shard", shard}, {"config", config}}});
}

// Shards I/N and J/M of one campaign share a case index i (i mod N = I, i mod M = J) exactly when
// I - J is a multiple of gcd(N, M): the same shard twice, or 0/2 and 0/4.
bool shards_overlap(const Json& a, const Json& b) {
  const std::uint64_t n = std::max<std::uint64_t>(1, get_u64(a, "count")), m = std::max<std::uint64_t>(1, get_u64(b, "count"));
  const std::uint64_t g = std::gcd(n, m);
  return get_u64(a, "index") % g == get_u64(b, "index") % g;
}

// Two inputs that ran the same cases (the same shard given twice, a copy of it under another
// name, or overlapping shards of one campaign) would count each of those cases twice: bad input,
// for campaigns and calibrations alike, naming both.
void refuse_overlapping_inputs(const std::vector<Json>& docs, const std::vector<std::string>& dirs) {
  std::vector<Json> runs;
  for (const Json& d : docs) runs.push_back(runs_of(d));
  for (std::size_t i = 0; i < docs.size(); ++i) {
    for (std::size_t j = i + 1; j < docs.size(); ++j) {
      for (const Json& a : runs[i]) {
        for (const Json& b : runs[j]) {
          if (a["kind"] != b["kind"] || a["config"] != b["config"] || !shards_overlap(a["shard"], b["shard"])) continue;
          const Json& c = a["config"];
          throw InputError(dirs[j], fmt::format("{} and {} ran the same cases ({} seed {}, shard {}/{} and {}/{}, the same "
                                                "configuration): merged, each would count twice; give each shard once",
                                                dirs[i], dirs[j], get_str(a, "kind"), c.contains("seed") ? c["seed"].dump() : "?",
                                                get_u64(a["shard"], "index"), get_u64(a["shard"], "count"),
                                                get_u64(b["shard"], "index"), get_u64(b["shard"], "count")));
        }
      }
    }
  }
}

}  // namespace

Json merge_summaries(const std::vector<Json>& docs, const std::vector<std::string>& dirs, const RunInfo& info) {
  if (docs.empty()) throw InputError("merge", "nothing to merge");
  // A campaign's findings are counted from its cases, a calibration's recomputed from its samples:
  // one document cannot be both, so a mixed merge is bad input rather than half of either.
  for (std::size_t i = 1; i < docs.size(); ++i) {
    if (docs[i].contains("calibrate") != docs.front().contains("calibrate")) {
      throw InputError(dirs[i], fmt::format("{} is a {} and {} a {}: merge fuzz outputs and calibrate outputs separately", dirs[i],
                                            docs[i].contains("calibrate") ? "calibration" : "campaign", dirs.front(),
                                            docs.front().contains("calibrate") ? "calibration" : "campaign"));
    }
  }
  refuse_overlapping_inputs(docs, dirs);
  Json out;
  out["schema"] = kSummarySchema;
  out["tool"] = tool_version();
  out["command"] = info.command_line;
  // Paths valid from here are written as the way from the merged --out to the file, joined to it:
  // `report` and later merges relocate them from --out, so the merged directory moved together
  // with the shard directories keeps its links. Going through absolute paths makes that way well
  // defined when --out starts with `..`.
  const fs::path out_abs = info.out_dir.empty() ? fs::path() : fs::absolute(info.out_dir).lexically_normal();
  auto via_out = [&](const std::string& here) {
    if (here.empty() || info.out_dir.empty()) return here;
    return (fs::path(info.out_dir) / fs::absolute(here).lexically_normal().lexically_relative(out_abs)).lexically_normal().string();
  };
  // The paths of doc i, valid from here.
  auto fix = [&](std::size_t i, const std::string& p) {
    return via_out(relocate(p, docs[i].contains("config") ? get_str(docs[i]["config"], "out") : "", dirs[i]));
  };

  Json config = merged_config(docs);
  Json from = Json::array();
  for (const std::string& d : dirs) from.push_back(via_out(d));
  config["merged_from"] = from;
  config["out"] = info.out_dir;
  out["config"] = config;

  std::uint64_t cases = 0, findings_n = 0, expected = 0, errors = 0, knee_pairs = 0;
  double seconds = 0;
  std::set<std::uint64_t> seeds;
  Json shards = Json::array();
  std::set<std::string> devices;
  bool interrupted = false;
  for (std::size_t i = 0; i < docs.size(); ++i) {
    const Json& d = docs[i];
    const Json c = d.value("counts", Json::object());
    cases += get_u64(c, "cases");
    findings_n += get_u64(c, "findings");
    expected += get_u64(c, "expected_ooms");
    errors += get_u64(c, "errors");
    knee_pairs += get_u64(c, "knee_pairs");
    seconds = std::max(seconds, c.value("seconds", 0.0));
    for (const Json& s : d.value("seeds", Json::array())) seeds.insert(s.get<std::uint64_t>());
    shards.push_back({{"dir", via_out(dirs[i])}, {"shard", d.contains("config") ? d["config"].value("shard", "0/1") : "0/1"}});
    if (d.contains("environment")) devices.insert(get_str(d["environment"], "device"));
    if (d.contains("run")) interrupted |= d["run"].value("interrupted", false);
  }

  // Findings by signature and policy key (FindingKey).
  std::map<std::pair<std::string, std::string>, Json> sigs;
  for (std::size_t i = 0; i < docs.size(); ++i) {
    for (const Json& f0 : docs[i].value("findings", Json::array())) {
      Json f = f0;
      for (const char* k : {"repro", "file"}) f[k] = fix(i, get_str(f, k));
      f["replay"] = replay_command(get_str(f, "repro"), get_str(f, "file"), info.out_dir);
      if (f.contains("case")) f["case"]["replay"] = replay_command(get_str(f, "repro"), "", info.out_dir);
      const std::pair<std::string, std::string> key{get_str(f, "signature"), get_str(f, "policy")};
      auto it = sigs.find(key);
      if (it == sigs.end()) {
        sigs[key] = std::move(f);
        continue;
      }
      Json& m = it->second;
      const std::uint64_t count = get_u64(m, "count") + get_u64(f, "count");
      const std::int64_t worst = std::max(get_i64(m, "worst_overshoot"), get_i64(f, "worst_overshoot"));
      const bool known = m.value("known", false) || f.value("known", false);
      // Keep the repro of the earliest case of the same campaign (what one unsharded run keeps);
      // across campaigns, the first given.
      const bool earlier =
          get_u64(f, "campaign_seed") == get_u64(m, "campaign_seed") && get_u64(f, "first_case_index") < get_u64(m, "first_case_index");
      const bool m_repro = !get_str(m, "repro").empty(), f_repro = !get_str(f, "repro").empty();
      // Both inputs' severity and cause, read before the kept one may be replaced.
      const double severity = std::max(m.value("severity", 0.0), f.value("severity", 0.0));
      const std::string why = get_str(m, "why");
      const bool act = m.value("activation_dependent", false) && f.value("activation_dependent", false);
      // Noise while the worst overshoot of both stays below the threshold: the max of the two.
      const bool noise = m.value("noise", false) && f.value("noise", false);
      if (f_repro ? !m_repro || earlier : !m_repro && earlier) m = f;
      if (!m.contains("why") && !why.empty()) m["why"] = why;
      // Activation-dependent only while both are (one input that stands at the budget settles it).
      if (!act) {
        m.erase("activation_dependent");
        const std::string w = get_str(m, "why");
        if (w.rfind("activation-dependent: ", 0) == 0) m["why"] = w.substr(22);
      }
      m["count"] = count;
      m["worst_overshoot"] = worst;
      m["known"] = known;
      if (severity > 0) m["severity"] = severity;
      if (noise) {
        m["noise"] = true;
      } else {
        m.erase("noise");
      }
    }
  }
  Json findings = Json::array();
  for (auto& [key, f] : sigs) findings.push_back(std::move(f));
  const std::size_t signature_count = findings.size();

  // The matrix: cells summed.
  std::vector<std::string> policies, allocators;
  std::map<std::pair<std::string, std::string>, Json> cells;
  // The campaign seed each kept first case came from (cell, signature and policy key): case
  // indices compare within one campaign only.
  std::map<std::tuple<std::string, std::string, std::string>, std::uint64_t> first_from;
  const auto finding_id = [](const Json& f) { return get_str(f, "signature") + "\n" + get_str(f, "policy"); };
  for (const Json& d : docs) {
    if (!d.contains("matrix")) continue;
    const std::uint64_t campaign = d.contains("config") && d["config"].contains("seed") && d["config"]["seed"].is_number_unsigned()
                                       ? d["config"]["seed"].get<std::uint64_t>()
                                       : 0;
    for (const Json& p : d["matrix"]["policies"]) {
      if (std::find(policies.begin(), policies.end(), p.get<std::string>()) == policies.end()) policies.push_back(p.get<std::string>());
    }
    for (const Json& a : d["matrix"]["allocators"]) {
      if (std::find(allocators.begin(), allocators.end(), a.get<std::string>()) == allocators.end()) allocators.push_back(a.get<std::string>());
    }
    for (const Json& c : d["matrix"]["cells"]) {
      const std::string policy = get_str(c, "policy"), alloc = get_str(c, "allocator");
      Json& m = cells[{policy, alloc}];
      if (m.is_null()) {
        m = c;
        for (const Json& f : c["findings"]) first_from[{policy, alloc, finding_id(f)}] = campaign;
        continue;
      }
      for (const char* k : {"cases", "expected_ooms", "errors"}) m[k] = get_u64(m, k) + get_u64(c, k);
      if (m.contains("knee_pairs") || c.contains("knee_pairs")) m["knee_pairs"] = get_u64(m, "knee_pairs") + get_u64(c, "knee_pairs");
      for (const Json& f : c["findings"]) {
        const std::string sig = finding_id(f);
        bool merged = false;
        for (Json& g : m["findings"]) {
          if (finding_id(g) != sig) continue;
          g["count"] = get_u64(g, "count") + get_u64(f, "count");
          g["worst_overshoot"] = std::max(get_i64(g, "worst_overshoot"), get_i64(f, "worst_overshoot"));
          // The first case is the earliest of the campaign (what one unsharded run reports next
          // to its repro); across campaigns, the first given.
          if (first_from[{policy, alloc, sig}] == campaign && f.contains("first_case_index") &&
              get_u64(f, "first_case_index") < get_u64(g, "first_case_index")) {
            g["first_case_seed"] = f["first_case_seed"];
            g["first_case_index"] = f["first_case_index"];
          }
          merged = true;
        }
        if (!merged) {
          m["findings"].push_back(f);
          first_from[{policy, alloc, sig}] = campaign;
        }
      }
    }
  }
  Json cell_list = Json::array();
  for (auto& [k, c] : cells) cell_list.push_back(std::move(c));

  out["counts"] = {{"cases", cases},
                   {"findings", findings_n},
                   {"signatures", signature_count},
                   {"new_signatures", 0},  // below, once the corpus is joined
                   {"expected_ooms", expected},
                   {"errors", errors},
                   {"knee_pairs", knee_pairs},
                   {"seconds", seconds}};
  out["findings"] = std::move(findings);
  out["seeds"] = Json(std::vector<std::uint64_t>(seeds.begin(), seeds.end()));
  out["shards"] = std::move(shards);
  Json runs = Json::array();
  for (const Json& d : docs) {
    for (const Json& r : runs_of(d)) runs.push_back(r);
  }
  out["runs"] = std::move(runs);
  std::string device;
  for (const std::string& d : devices) device += (device.empty() ? "" : "; ") + d;
  out["environment"] = {{"backend", docs.front().contains("environment") ? get_str(docs.front()["environment"], "backend") : info.backend},
                        {"device", device}};
  out["run"] = run_json(info, interrupted);
  out["matrix"] = {{"properties", properties_json()}, {"policies", policies}, {"allocators", allocators}, {"cells", std::move(cell_list)}};

  // The corpus: each repro once (every shard replays the same corpus); it still fails if it
  // failed anywhere.
  std::map<std::string, Json> corpus;
  std::string corpus_dir;
  for (const Json& d : docs) {
    if (!d.contains("corpus")) continue;
    corpus_dir = get_str(d["corpus"], "dir");
    for (const Json& e : d["corpus"]["entries"]) {
      Json& m = corpus[get_str(e, "file")];
      if (m.is_null()) {
        m = e;
      } else if (e.value("still_fails", false) && !m.value("still_fails", false)) {
        m = e;
      } else if (!e.value("still_fails", false) && !m.value("still_fails", false) && m.value("undetermined", false) &&
                 !e.value("undetermined", false)) {
        m = e;  // a shard that could replay it says more than one that could not
      }
    }
  }
  if (!corpus.empty() || !corpus_dir.empty()) {
    Json entries = Json::array();
    std::size_t still = 0, undetermined = 0;
    for (auto& [f, e] : corpus) {
      still += e.value("still_fails", false) ? 1 : 0;
      undetermined += e.value("undetermined", false) ? 1 : 0;
      entries.push_back(std::move(e));
    }
    Json k = {{"dir", corpus_dir}, {"replayed", entries.size()}, {"still_fail", still}, {"no_longer_reproduce", entries.size() - still - undetermined}};
    if (undetermined) k["undetermined"] = undetermined;
    k["entries"] = std::move(entries);
    out["corpus"] = std::move(k);
  }
  // Known-ness by the same rule as the campaign's, against the joined corpus.
  std::size_t fresh = 0;
  for (Json& f : out["findings"]) {
    annotate_corpus(f, out);
    fresh += get_bool(f, "known") || f.value("noise", false) ? 0 : 1;
  }
  out["counts"]["new_signatures"] = fresh;

  // Calibration: samples pooled (each case once), tables recomputed from them.
  std::vector<CalibSample> samples;
  std::vector<CalibExcluded> excluded;
  std::set<std::pair<std::uint64_t, int>> seen, seen_x;
  Json verify = Json::array(), worst = Json::object(), meta;
  Bytes margin = 0;
  bool any_calibrate = false;
  for (std::size_t i = 0; i < docs.size(); ++i) {
    if (!docs[i].contains("calibrate")) continue;
    const Json& c = docs[i]["calibrate"];
    if (!any_calibrate) {
      meta = {{"policy", c.value("policy", "")}, {"seed", c.value("seed", 0)}};
      margin = get_u64(c, "margin");
    }
    any_calibrate = true;
    for (CalibSample& s : samples_from_json(c)) {
      if (seen.insert({s.case_seed, static_cast<int>(s.mode)}).second) samples.push_back(std::move(s));
    }
    for (CalibExcluded& e : excluded_from_json(c)) {
      if (seen_x.insert({e.case_seed, static_cast<int>(e.mode)}).second) excluded.push_back(std::move(e));
    }
    for (const Json& v : c.value("verify", Json::array())) {
      Json vv = v;
      vv["shard"] = fmt::format("{}:{}", dirs[i], get_str(v, "shard"));
      verify.push_back(std::move(vv));
    }
    for (const Json& m : c.value("modes", Json::array())) {
      if (!m.contains("worst")) continue;
      Json w = m["worst"];
      w["file"] = fix(i, get_str(w, "file"));
      if (w.contains("case")) w["case"]["replay"] = replay_command(get_str(w, "file"), "", info.out_dir);
      const std::string mode = get_str(m, "allocator");
      if (!worst.contains(mode) || get_i64(w, "delta") > get_i64(worst[mode], "delta")) worst[mode] = std::move(w);
    }
  }
  if (any_calibrate) {
    std::uint64_t drawn = 0;
    std::set<std::uint64_t> case_seeds;
    for (const CalibSample& s : samples) case_seeds.insert(s.case_seed);
    for (const CalibExcluded& e : excluded) case_seeds.insert(e.case_seed);
    drawn = case_seeds.size();
    meta["cases_drawn"] = drawn;
    out["calibrate"] = calibrate_section(samples, excluded, margin, meta, verify, worst);
    // The findings of a calibration follow from its samples, so a merge recomputes them too
    // (keeping the first finding file each signature had in the inputs).
    std::map<std::string, std::string> files;
    for (const Json& f : out["findings"]) {
      if (!get_str(f, "file").empty()) files.emplace(get_str(f, "signature"), get_str(f, "file"));
    }
    out["findings"] = Json::array();
    calibration_findings(samples, excluded, worst, files, out);
    out["counts"]["seconds"] = seconds;
  }
  return out;
}

Json relocated(const Json& doc, const std::string& summary_dir) {
  const std::string recorded = doc.contains("config") ? get_str(doc["config"], "out") : "";
  if (recorded.empty()) return doc;
  Json out = doc;
  auto fix = [&](Json& j, const char* key) {
    if (j.contains(key) && j[key].is_string()) j[key] = relocate(j[key].get<std::string>(), recorded, summary_dir);
  };
  if (out.contains("findings")) {
    for (Json& f : out["findings"]) {
      fix(f, "repro");
      fix(f, "file");
      f["replay"] = replay_command(get_str(f, "repro"), get_str(f, "file"), summary_dir);
      if (f.contains("case")) f["case"]["replay"] = replay_command(get_str(f, "repro"), "", summary_dir);
    }
  }
  if (out.contains("calibrate") && out["calibrate"].contains("modes")) {
    for (Json& m : out["calibrate"]["modes"]) {
      if (!m.contains("worst")) continue;
      fix(m["worst"], "file");
      if (m["worst"].contains("case")) m["worst"]["case"]["replay"] = replay_command(get_str(m["worst"], "file"), "", summary_dir);
    }
  }
  if (out["config"].contains("merged_from")) {
    for (Json& d : out["config"]["merged_from"]) {
      if (d.is_string()) d = relocate(d.get<std::string>(), recorded, summary_dir);
    }
  }
  if (out.contains("shards") && out["shards"].is_array()) {
    for (Json& sh : out["shards"]) fix(sh, "dir");
  }
  out["config"]["out"] = summary_dir;
  return out;
}

// ---- files ---------------------------------------------------------------------------------------

Json load_summary(const std::string& dir) {
  const std::string path = (fs::path(dir) / "summary.json").string();
  const std::string text = read_text_file(path);
  const nlohmann::json raw = parse_json_text(text, path);  // syntax errors named with the byte offset
  check_summary(raw, path);  // the whole documented shape (reports/summary_schema.cpp)
  return Json::parse(text);  // again, keeping the order of the fields
}

std::string dump_summary(const Json& doc) { return dump_rows(doc) + "\n"; }

int summary_exit_code(const Json& doc) {
  // A calibration is a measurement: it succeeded whatever its numbers say, merged or not (its
  // findings fail their JUnit testcases; `calibrate` itself exits 0 too).
  if (doc.contains("calibrate")) return kExitOk;
  const Json c = doc.value("counts", Json::object());
  if (get_u64(c, "new_signatures") > 0) return kExitFindings;
  if (get_u64(c, "errors") > 0 && get_u64(c, "findings") == 0) return kExitInfra;
  return kExitOk;
}

}  // namespace vf::report
