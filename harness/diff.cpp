#include "harness/diff.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "harness/campaign.h"
#include "harness/core/error.h"
#include "harness/oracle.h"
#include "harness/predictors/external.h"
#include "harness/repro.h"
#include "harness/shrink.h"

namespace vf {

namespace {


std::string mib_signed(std::int64_t d) {
  return fmt::format("{}{:.2f} MiB", d < 0 ? "-" : "+", static_cast<double>(d < 0 ? -d : d) / static_cast<double>(MiB));
}

// A set of modules that differs: how many, and their bytes, on each side only.
void module_set(std::vector<FieldDiff>& out, const std::string& field, const ModelSpec& spec, const std::vector<std::uint8_t>& a,
                const std::vector<std::uint8_t>& b) {
  std::size_t only_a = 0, only_b = 0;
  Bytes bytes_a = 0, bytes_b = 0;
  std::string first;
  for (std::size_t i = 0; i < spec.modules.size(); ++i) {
    const bool x = i < a.size() && a[i], y = i < b.size() && b[i];
    if (x == y) continue;
    if (first.empty()) first = spec.modules[i].name;
    if (x) {
      ++only_a;
      bytes_a += spec.modules[i].bytes;
    } else {
      ++only_b;
      bytes_b += spec.modules[i].bytes;
    }
  }
  if (only_a + only_b == 0) return;
  out.push_back({field, fmt::format("{} module(s) ({}) only here", only_a, format_mib(bytes_a)),
                 fmt::format("{} module(s) ({}) only here; the first that differs: {}", only_b, format_mib(bytes_b), first),
                 static_cast<std::int64_t>(bytes_b) - static_cast<std::int64_t>(bytes_a), true, static_cast<std::int64_t>(bytes_a),
                 static_cast<std::int64_t>(bytes_b)});
}

void bytes_field(std::vector<FieldDiff>& out, const std::string& field, std::int64_t a, std::int64_t b, Bytes tolerance) {
  const std::int64_t d = b - a;
  if (static_cast<Bytes>(d < 0 ? -d : d) <= tolerance) return;
  out.push_back({field, fmt::format("{:.2f} MiB", static_cast<double>(a) / static_cast<double>(MiB)),
                 fmt::format("{:.2f} MiB", static_cast<double>(b) / static_cast<double>(MiB)), d, true, a, b});
}

void count_field(std::vector<FieldDiff>& out, const std::string& field, std::uint64_t a, std::uint64_t b) {
  if (a != b) out.push_back({field, std::to_string(a), std::to_string(b), 0});
}

std::string verdict_text(const Verdict& v) { return v.signature.empty() ? std::string(verdict_kind_name(v.kind)) : v.signature; }

// A case's outcome under both: the fields that differ and the group key (empty key: the same).
struct Outcome {
  std::string key;
  std::vector<FieldDiff> fields;
  std::string verdict_a, verdict_b;
  std::string rests_on_a, rests_on_b;
  bool error = false;
  bool fatal = false;
  std::string fatal_message;
};

// `ahead_a` / `ahead_b`: the requests of a and b, sent to their external predictors before (the
// pipelining of run_diff); their replies are the plans.
Outcome compare_case(const Scenario& a, const Scenario& b, const DiffConfig& cfg, Backend& backend, bool need_verdicts,
                     SentAhead* ahead_a = nullptr, SentAhead* ahead_b = nullptr) {
  Outcome o;
  std::optional<Plan> pa, pb;
  std::string err_a, err_b;
  const auto plan = [&](const Scenario& s, std::optional<Plan>& p, std::string& err, SentAhead* ahead) {
    try {
      p = ahead && ahead->sent() ? predict_external(s, ahead) : predict(s);
    } catch (const PredictorError& e) {
      if (e.fatal()) {
        o.fatal = true;
        o.fatal_message = e.what();
      }
      err = e.what();
    } catch (const InputError& e) {
      err = e.what();
    }
  };
  plan(a, pa, err_a, ahead_a);
  plan(b, pb, err_b, ahead_b);
  if (o.fatal) return o;
  if (!pa || !pb) {
    o.error = true;
    o.key = !pa && !pb ? "error: both" : !pa ? "error: A" : "error: B";
    o.fields.push_back({"plan", pa ? "planned" : err_a, pb ? "planned" : err_b, 0});
    return o;
  }
  o.fields = compare_plans(a, *pa, *pb, cfg.tolerance);
  std::set<std::string> kinds;
  for (const FieldDiff& f : o.fields) kinds.insert(field_kind(f.field));
  if (need_verdicts) {
    // The plans compared above are the plans run: an external predictor is asked once per case.
    const CaseResult ra = run_planned(a, std::move(*pa), backend, false), rb = run_planned(b, std::move(*pb), backend, false);
    if (ra.exec.fatal || rb.exec.fatal) {
      o.fatal = true;
      o.fatal_message = ra.exec.fatal ? ra.verdict.message : rb.verdict.message;
      return o;
    }
    o.verdict_a = verdict_text(ra.verdict);
    o.verdict_b = verdict_text(rb.verdict);
    o.rests_on_a = ra.verdict.rests_on;
    o.rests_on_b = rb.verdict.rests_on;
    if (ra.verdict.kind != rb.verdict.kind || ra.verdict.signature != rb.verdict.signature) {
      o.fields.push_back({"verdict", o.verdict_a, o.verdict_b, rb.verdict.overshoot - ra.verdict.overshoot});
      // Grouped by the verdict kinds: the signatures under them are the group's examples.
      kinds.insert(fmt::format("verdict: {} / {}", verdict_kind_name(ra.verdict.kind), verdict_kind_name(rb.verdict.kind)));
    }
  }
  std::string key;
  for (const std::string& k : kinds) key += (key.empty() ? "" : "+") + k;
  o.key = key;
  return o;
}

std::size_t module_count(const Scenario& s) {
  std::size_t n = 0;
  for (const ModelRef& m : s.models) n += m.spec->modules.size();
  return n;
}

// s with modules [from, from + count) of model m removed (at least one left).
Scenario without_modules(const Scenario& s, std::size_t m, std::size_t from, std::size_t count) {
  Scenario c = s;
  ModelRef& r = c.models[m];
  auto spec = std::make_shared<ModelSpec>(*r.spec);
  spec->modules.erase(spec->modules.begin() + static_cast<std::ptrdiff_t>(from), spec->modules.begin() + static_cast<std::ptrdiff_t>(from + count));
  spec->source = "inline";
  finalize_model(*spec, "diff");
  r.source = "inline";
  r.catalog_full.reset();
  r.catalog_source.clear();
  r.spec = std::move(spec);
  return c;
}

// Delta debugging over each model's modules: drop halves, quarters ... single modules, keeping
// every removal after which both predictors still differ in the same fields. Most removals are
// not kept, so an external side is sent the removals that follow a rejected one while it runs
// (kCasesSentAhead of them); a kept removal abandons them. The removals tried are the same.
void shrink_group(DiffGroup& g, const DiffConfig& cfg, const Policy& b, Backend& backend) {
  Scenario best = g.original;
  const bool need_verdicts = g.key.find("verdict:") != std::string::npos;
  const bool external = best.policy.predictor == PredictorKind::external || b.predictor == PredictorKind::external;
  struct Try {
    std::size_t from;
    Scenario a, b;
    SentAhead sent_a, sent_b;
  };
  std::uint64_t execs = 0;
  bool progress = true;
  while (progress && execs < cfg.shrink_execs && !(cfg.should_stop && cfg.should_stop())) {
    progress = false;
    for (std::size_t m = 0; m < best.models.size() && execs < cfg.shrink_execs; ++m) {
      for (std::size_t chunk = best.models[m].spec->modules.size() / 2; chunk >= 1 && execs < cfg.shrink_execs; chunk /= 2) {
        std::deque<Try> tries;  // the removals that follow if each one before is rejected
        std::size_t next = 0;   // the first position not in `tries`
        const auto room = [&](std::size_t from) {
          return from + chunk <= best.models[m].spec->modules.size() && best.models[m].spec->modules.size() > chunk;
        };
        while (execs < cfg.shrink_execs) {
          // A removal the checks refuse is skipped, as it would be at its turn.
          // No more tries built (and sent) than the budget can still run.
          const std::uint64_t depth = std::min<std::uint64_t>(external ? kCasesSentAhead + 1 : 1, cfg.shrink_execs - execs);
          while (tries.size() < depth && room(next)) {
            Scenario c = without_modules(best, m, next, chunk);
            const std::size_t from = next;
            next += chunk;
            try {
              validate_scenario(c);
            } catch (const InputError&) {
              continue;
            }
            Scenario cb = under_policy(c, b, cfg.against_overrides);
            tries.push_back(Try{from, std::move(c), std::move(cb), {}, {}});
          }
          if (tries.empty()) break;
          // The front one too: sent last, it would wait behind the others' replies.
          for (std::size_t k = 0; k < tries.size() && external; ++k) {
            Try& t = tries[k];
            if (!t.sent_a.sent()) t.sent_a = send_external_ahead(t.a);
            if (!t.sent_b.sent()) t.sent_b = send_external_ahead(t.b);
          }
          Try t = std::move(tries.front());
          tries.pop_front();
          ++execs;
          const Outcome o = compare_case(t.a, t.b, cfg, backend, need_verdicts, &t.sent_a, &t.sent_b);
          if (o.fatal) {
            g.shrink_execs = execs;
            g.minimal = best;
            return;
          }
          if (o.key == g.key) {
            best = std::move(t.a);
            progress = true;
            tries.clear();  // removals from the case before: abandoned
            next = t.from;
          }
        }
        if (chunk == 1) break;
      }
    }
  }
  g.shrink_execs = execs;
  g.minimal = best;
}

}  // namespace

std::string field_kind(const std::string& field) {
  std::string k;
  bool skip = false;
  for (const char c : field) {
    if (c == '[') skip = true;
    if (!skip) k += c;
    if (c == ']') skip = false;
  }
  return k;
}

std::vector<FieldDiff> compare_plans(const Scenario& s, const Plan& a, const Plan& b, Bytes tolerance) {
  std::vector<FieldDiff> out;
  bytes_field(out, "reserve", static_cast<std::int64_t>(a.reserve), static_cast<std::int64_t>(b.reserve), tolerance);
  if (a.fits != b.fits) out.push_back({"fits", a.fits ? "fits" : "does not fit", b.fits ? "fits" : "does not fit", 0});
  for (std::size_t k = 0; k < std::min(a.loads.size(), b.loads.size()); ++k) {
    const LoadPlan& x = a.loads[k];
    const LoadPlan& y = b.loads[k];
    const ModelSpec& spec = *s.models[x.model].spec;
    const std::string at = fmt::format("loads[{}]", k);
    module_set(out, at + ".resident", spec, x.resident, y.resident);
    module_set(out, at + ".lowvram", spec, x.lowvram, y.lowvram);
    bytes_field(out, at + ".offload_buffer", static_cast<std::int64_t>(x.offload_buffer), static_cast<std::int64_t>(y.offload_buffer), tolerance);
    bytes_field(out, at + ".usable", x.usable, y.usable, tolerance);
    std::set<std::string> ex, ey;
    for (const Eviction& e : x.evictions) ex.insert(s.models[e.model].id);
    for (const Eviction& e : y.evictions) ey.insert(s.models[e.model].id);
    if (ex != ey) out.push_back({at + ".evictions", fmt::format("{} model(s) evicted", ex.size()), fmt::format("{} model(s) evicted", ey.size()), 0});
    if (x.dynamic && y.dynamic) {
      if (x.staging.order != y.staging.order) out.push_back({at + ".staging.order", "its order", "another order", 0});
      module_set(out, at + ".staging.forced_modules", spec, x.staging.forced_module, y.staging.forced_module);
      bytes_field(out, at + ".staging.vbar_request", static_cast<std::int64_t>(x.staging.vbar_request),
                  static_cast<std::int64_t>(y.staging.vbar_request), tolerance);
      bytes_field(out, at + ".staging.staged", static_cast<std::int64_t>(x.staging.staged), static_cast<std::int64_t>(y.staging.staged),
                  tolerance);
      bytes_field(out, at + ".staging.forced_bytes", static_cast<std::int64_t>(x.staging.forced_bytes),
                  static_cast<std::int64_t>(y.staging.forced_bytes), tolerance);
      // Each module's slice in the VBAR: where it starts and how long it is.
      std::size_t slices = 0;
      std::string first;
      for (std::size_t i = 0; i < spec.modules.size(); ++i) {
        const auto at_of = [](const StagingPlan& st, std::size_t mod) {
          return std::pair<Bytes, Bytes>(mod < st.slice_offset.size() ? st.slice_offset[mod] : 0,
                                         mod < st.slice_size.size() ? st.slice_size[mod] : 0);
        };
        if (at_of(x.staging, i) == at_of(y.staging, i)) continue;
        if (first.empty()) {
          first = fmt::format("{} at {} for {} B, not {} for {} B", spec.modules[i].name, at_of(y.staging, i).first, at_of(y.staging, i).second,
                              at_of(x.staging, i).first, at_of(x.staging, i).second);
        }
        ++slices;
      }
      if (slices != 0) out.push_back({at + ".staging.slices", "its slices", fmt::format("{} module(s) placed otherwise; the first: {}", slices, first), 0});
    }
  }
  count_field(out, "loads", a.loads.size(), b.loads.size());
  for (std::size_t k = 0; k < std::min(a.stages.size(), b.stages.size()); ++k) {
    const StagePlan& x = a.stages[k];
    const StagePlan& y = b.stages[k];
    const std::string at = fmt::format("stages[{}]", k);
    bytes_field(out, at + ".activation_allowance", static_cast<std::int64_t>(x.activation_allowance),
                static_cast<std::int64_t>(y.activation_allowance), tolerance);
    if (x.checked || y.checked) {
      bytes_field(out, at + ".predicted_peak", static_cast<std::int64_t>(x.predicted_peak), static_cast<std::int64_t>(y.predicted_peak), tolerance);
    }
    count_field(out, at + ".run_batch", x.run_batch, y.run_batch);
    count_field(out, at + ".passes", x.passes, y.passes);
    if (x.checked != y.checked) out.push_back({at + ".checked", x.checked ? "checked" : "not checked", y.checked ? "checked" : "not checked", 0});
  }
  return out;
}

Scenario under_policy(const Scenario& s, const Policy& b, const std::vector<std::pair<std::string, std::string>>& overrides) {
  Scenario c = s;
  c.policy = b;
  for (const auto& [k, v] : s.policy.overrides) apply_policy_override(c.policy, k, v, "policy");
  for (const auto& [k, v] : overrides) apply_policy_override(c.policy, k, v, "--against-set");
  return c;
}

DiffResult run_diff(const DiffConfig& cfg, Catalog& catalog, Backend& backend) {
  DiffResult out;
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  const Policy b = parse_policy(cfg.against, "--against", StartCommand::refuse);
  std::map<std::string, std::size_t> group_of;
  // Case i, generated before it is compared. Generation depends on the seed alone, so the next
  // cases are generated and their requests sent to the external predictor(s) while this one is
  // planned and run: each side plans ahead instead of waiting for the other. Requests not needed
  // after all (past the time budget, a stop) are abandoned. Built-in predictors send nothing.
  struct Generated {
    std::uint64_t seed = 0;
    Scenario a, against;  // the case under A, and under B
    SentAhead request_a, request_b;
  };
  const auto generate = [&](std::uint64_t i) {
    auto g = std::make_unique<Generated>();
    g->seed = case_seed(cfg.seed, i);
    PrngChoices choices(g->seed);
    g->a = generate_scenario(choices, cfg.gen, catalog);
    g->against = under_policy(g->a, b, cfg.against_overrides);
    return g;
  };
  const auto send_ahead = [](Generated& g) {
    // Not sent yet, or lost with a process that died since: (again) to the running one.
    if (g.a.policy.predictor == PredictorKind::external && !g.request_a.live()) g.request_a = send_external_ahead(g.a);
    if (g.against.policy.predictor == PredictorKind::external && !g.request_b.live()) g.request_b = send_external_ahead(g.against);
  };
  const bool external = cfg.gen.policy.value_or("").find("exec:") != std::string::npos || cfg.against.find("exec:") != std::string::npos;
  const std::size_t ahead = external ? kCasesSentAhead : 0;
  std::deque<std::unique_ptr<Generated>> queued;
  std::uint64_t next_index = 0;
  for (std::uint64_t i = 0;; ++i) {
    if (cfg.cases != 0 && i >= cfg.cases) break;
    if (cfg.cases == 0 && (cfg.seconds <= 0 || elapsed() >= cfg.seconds)) break;
    if (cfg.should_stop && cfg.should_stop()) {
      out.stopped = true;
      break;
    }
    if (queued.empty()) queued.push_back(generate(next_index++));
    const std::unique_ptr<Generated> current = std::move(queued.front());
    queued.pop_front();
    // In the order they are claimed: this case, those queued (again where a restart lost them),
    // then new ones.
    send_ahead(*current);
    for (const auto& g : queued) send_ahead(*g);
    while (queued.size() < ahead && (cfg.cases == 0 || next_index < cfg.cases)) {
      queued.push_back(generate(next_index++));
      send_ahead(*queued.back());
    }
    const std::uint64_t seed = current->seed;
    const Scenario& a = current->a;
    const Scenario& sb = current->against;
    ++out.cases;
    const Outcome o = compare_case(a, sb, cfg, backend, cfg.verdicts, &current->request_a, &current->request_b);
    if (o.fatal) throw InfraError(fmt::format("diff: case {}: {}", i, o.fatal_message));
    if (o.key.empty()) {
      ++out.same;
      continue;
    }
    if (o.error) ++out.errors;
    bool plan_fields = false, verdict_field = false;
    for (const FieldDiff& f : o.fields) (f.field == "verdict" ? verdict_field : plan_fields) = true;
    out.plans_differ += plan_fields && !o.error ? 1 : 0;
    out.verdicts_differ += verdict_field ? 1 : 0;
    auto [it, fresh] = group_of.emplace(o.key, out.groups.size());
    if (fresh) {
      DiffGroup g;
      g.key = o.key;
      g.first_index = i;
      g.first_seed = seed;
      g.original = a;
      g.minimal = a;
      g.fields = o.fields;
      g.verdict_a = o.verdict_a;
      g.verdict_b = o.verdict_b;
      g.rests_on_a = o.rests_on_a;
      g.rests_on_b = o.rests_on_b;
      out.groups.push_back(std::move(g));
      spdlog::info("diff: case {}: a new difference: {}", i, o.key);
    }
    ++out.groups[it->second].count;
  }
  std::stable_sort(out.groups.begin(), out.groups.end(), [](const DiffGroup& x, const DiffGroup& y) { return x.count > y.count; });
  for (DiffGroup& g : out.groups) {
    g.modules_before = module_count(g.original);
    if (cfg.shrink && g.key.rfind("error:", 0) != 0) shrink_group(g, cfg, b, backend);
    g.modules_after = module_count(g.minimal);
    // The minimal case's own fields and verdicts (what its file shows).
    const Outcome o = compare_case(g.minimal, under_policy(g.minimal, b, cfg.against_overrides), cfg, backend, cfg.verdicts);
    if (!o.fatal && o.key == g.key) {
      g.fields = o.fields;
      g.verdict_a = o.verdict_a;
      g.verdict_b = o.verdict_b;
      g.rests_on_a = o.rests_on_a;
      g.rests_on_b = o.rests_on_b;
    }
  }
  out.seconds = elapsed();
  return out;
}

namespace {

// The two commands that plan a group's minimal case (FILE) under A and under B.
std::pair<std::string, std::string> plan_commands(const DiffConfig& cfg, const std::string& file) {
  std::string b_sets;
  for (const auto& [k, v] : cfg.against_overrides) b_sets += " --set " + shell_quote(k + "=" + v);
  const std::string f = file.empty() ? std::string("FILE") : shell_quote(file);
  // The case file records A; an external A is named there by its hello name, which `plan` never
  // starts: its command goes on the line.
  const std::string a = cfg.gen.policy.value_or("");
  const std::string a_flag = a.rfind("exec:", 0) == 0 ? " --policy " + shell_quote(policy_list_flag(a)) : std::string();
  return {fmt::format("vramfuzz plan {}{}", f, a_flag),
          fmt::format("vramfuzz plan {} --policy {}{}", f, shell_quote(policy_list_flag(cfg.against)), b_sets)};
}

}  // namespace

std::string diff_json(const DiffConfig& cfg, const DiffResult& r, const std::vector<std::string>& files, const std::string& command_line) {
  nlohmann::ordered_json j;
  j["schema"] = "vramfuzz.diff/1";
  j["tool"] = tool_version();
  j["command_line"] = command_line;
  j["config"] = {{"policy", cfg.gen.policy.value_or("")}, {"against", cfg.against}, {"seed", cfg.seed}, {"cases", cfg.cases},
                 {"seconds", cfg.seconds}, {"tolerance", cfg.tolerance}, {"verdicts", cfg.verdicts}, {"shrink", cfg.shrink}};
  nlohmann::ordered_json ov = nlohmann::ordered_json::array();
  for (const auto& [k, v] : cfg.against_overrides) ov.push_back(k + "=" + v);
  j["config"]["against_overrides"] = std::move(ov);
  j["counts"] = {{"cases", r.cases},         {"same", r.same},   {"plans_differ", r.plans_differ},
                 {"verdicts_differ", r.verdicts_differ}, {"errors", r.errors}, {"groups", r.groups.size()}};
  j["stopped"] = r.stopped;
  j["seconds"] = r.seconds;
  nlohmann::ordered_json groups = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < r.groups.size(); ++i) {
    const DiffGroup& g = r.groups[i];
    nlohmann::ordered_json fields = nlohmann::ordered_json::array();
    for (const FieldDiff& f : g.fields) {
      nlohmann::ordered_json x = {{"field", f.field}, {"a", f.a}, {"b", f.b}, {"delta", f.delta}};
      if (f.bytes) {
        x["a_bytes"] = f.a_bytes;
        x["b_bytes"] = f.b_bytes;
      }
      fields.push_back(std::move(x));
    }
    nlohmann::ordered_json rests = {{"plans", kDiffPlanRestsOn}};
    if (cfg.verdicts) rests["verdicts"] = {{"a", g.rests_on_a}, {"b", g.rests_on_b}};
    groups.push_back({{"key", g.key},
                      {"cases", g.count},
                      {"first_case_index", g.first_index},
                      {"first_case_seed", g.first_seed},
                      {"modules", {{"before", g.modules_before}, {"after", g.modules_after}}},
                      {"shrink_execs", g.shrink_execs},
                      {"verdict_a", g.verdict_a},
                      {"verdict_b", g.verdict_b},
                      {"fields", std::move(fields)},
                      {"rests_on", std::move(rests)},
                      {"file", i < files.size() ? files[i] : ""},
                      {"plan_a", plan_commands(cfg, i < files.size() ? files[i] : "").first},
                      {"plan_b", plan_commands(cfg, i < files.size() ? files[i] : "").second}});
  }
  j["groups"] = std::move(groups);
  return j.dump(2) + "\n";
}

std::string diff_markdown(const DiffConfig& cfg, const DiffResult& r, const std::vector<std::string>& files) {
  std::string md = fmt::format("## vramfuzz diff: `{}` (A) against `{}` (B)\n\n", cfg.gen.policy.value_or(""), cfg.against);
  if (!cfg.against_overrides.empty()) {
    md += "B's overrides:";
    for (const auto& [k, v] : cfg.against_overrides) md += fmt::format(" `{}={}`", k, v);
    md += "\n\n";
  }
  md += fmt::format("{} cases (seed {}), {} the same{}; plans differ in {}, verdicts in {}, {} could not be planned by one side; "
                    "{} group(s) of differences.\n\n",
                    r.cases, cfg.seed, r.same, cfg.tolerance ? fmt::format(" within {}", cfg.tolerance < MiB ? fmt::format("{} B", cfg.tolerance) : format_size(cfg.tolerance)) : "", r.plans_differ,
                    r.verdicts_differ, r.errors, r.groups.size());
  if (r.groups.empty()) return md + "Every case planned the same under both.\n";
  md += "| what differs | cases | modules (first case → minimal) | verdict A / B | minimal case |\n|---|---:|---|---|---|\n";
  for (std::size_t i = 0; i < r.groups.size(); ++i) {
    const DiffGroup& g = r.groups[i];
    md += fmt::format("| {} | {} | {} → {} | {} / {} | `{}` |\n", g.key, g.count, g.modules_before, g.modules_after,
                      g.verdict_a.empty() ? "-" : g.verdict_a, g.verdict_b.empty() ? "-" : g.verdict_b, i < files.size() ? files[i] : "");
  }
  for (std::size_t i = 0; i < r.groups.size(); ++i) {
    const DiffGroup& g = r.groups[i];
    const auto [plan_a, plan_b] = plan_commands(cfg, i < files.size() ? files[i] : "");
    md += fmt::format("\n### {}\n\n{} case(s), the first case {} (seed {}); its minimal form, {} module(s): `{}`. Plan it under both:\n"
                      "`{}` and `{}`.\n\n| field | A | B | B − A |\n|---|---|---|---|\n",
                      g.key, g.count, g.first_index, g.first_seed, g.modules_after, i < files.size() ? files[i] : "", plan_a, plan_b);
    for (const FieldDiff& f : g.fields) {
      md += fmt::format("| {} | {} | {} | {} |\n", f.field, f.a, f.b, f.delta ? mib_signed(f.delta) : "");
    }
    md += fmt::format("\n**Rests on:** plan fields: {}.", kDiffPlanRestsOn);
    if (!g.rests_on_a.empty() && g.rests_on_a == g.rests_on_b) {
      md += fmt::format(" Verdicts (both): {}.", g.rests_on_a);
    } else {
      if (!g.rests_on_a.empty()) md += fmt::format(" Verdict A ({}): {}.", g.verdict_a, g.rests_on_a);
      if (!g.rests_on_b.empty()) md += fmt::format(" Verdict B ({}): {}.", g.verdict_b, g.rests_on_b);
    }
    md += "\n";
  }
  return md;
}

}  // namespace vf
