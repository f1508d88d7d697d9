#include "harness/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "harness/core/json_in.h"
#include "harness/repro.h"
#include "harness/shrink.h"

namespace vf {

std::string WorkloadClass::key() const {
  return fmt::format("{}, {}, {}", dtypes, dynamic ? "dynamic" : offloaded ? "offloaded" : "resident", resolution);
}

std::string_view calibrated_knob(const Policy& policy) { return policy.dynamic() ? "vram_headroom" : "reserve"; }

WorkloadClass workload_class(const Scenario& s, const Plan& plan) {
  WorkloadClass c;
  // The biggest model decides the dtype pair; its storage dtype is the one most of its weight
  // bytes are in (catalog, inline and imported models alike).
  const ModelRef* big = nullptr;
  for (const ModelRef& m : s.models) {
    if (!big || m.spec->bytes > big->spec->bytes) big = &m;
  }
  if (big) {
    const Dtype storage = dominant_storage(*big);
    c.dtypes = fmt::format("{}->{}", dtype_name(storage), dtype_name(big->compute));
  }
  for (const LoadPlan& lp : plan.loads) c.offloaded |= lp.offloaded > 0;
  c.dynamic = plan.dynamic;
  const std::uint64_t pixels = std::uint64_t{s.workload.width} * s.workload.height;
  c.resolution = pixels <= 512ull * 512 ? "<=512x512" : pixels <= 1024ull * 1024 ? "<=1024x1024" : ">1024x1024";
  return c;
}

std::int64_t nearest_rank(std::span<const std::int64_t> sorted, double q) {
  if (sorted.empty()) return 0;
  const double rank = std::ceil(q * static_cast<double>(sorted.size()));
  const std::size_t i = rank < 1 ? 0 : std::min(sorted.size(), static_cast<std::size_t>(rank)) - 1;
  return sorted[i];
}

Bytes recommended_reserve(Bytes need, Bytes margin) {
  return checked_round_up(checked_add(need, margin, "need + margin"), MiB, "need + margin");
}

CalibStats calib_stats(std::span<const CalibSample> samples, std::span<const CalibExcluded> excluded, Bytes margin) {
  CalibStats st;
  std::vector<std::int64_t> deltas, slack;
  std::vector<double> share;
  std::vector<Bytes> reserves;
  for (const CalibSample& s : samples) {
    ++st.cases;
    st.ooms += s.oom ? 1 : 0;
    st.violations += s.pass ? 0 : 1;
    deltas.push_back(s.delta);
    reserves.push_back(s.reserve);
    if (s.pass) {
      const std::int64_t headroom = static_cast<std::int64_t>(s.reserve) - s.delta;
      slack.push_back(headroom);
      share.push_back(s.device_total ? static_cast<double>(headroom) / static_cast<double>(s.device_total) : 0.0);
    }
  }
  for (const CalibExcluded& e : excluded) {
    st.expected_ooms += e.expected_oom ? 1 : 0;
    st.errors += e.error ? 1 : 0;
  }
  std::sort(deltas.begin(), deltas.end());
  std::sort(slack.begin(), slack.end());
  std::sort(share.begin(), share.end());
  std::sort(reserves.begin(), reserves.end());
  st.p50 = nearest_rank(deltas, 0.50);
  st.p90 = nearest_rank(deltas, 0.90);
  st.p99 = nearest_rank(deltas, 0.99);
  st.max = deltas.empty() ? 0 : deltas.back();
  st.need = st.max > 0 ? static_cast<Bytes>(st.max) : 0;
  st.recommended = recommended_reserve(st.need, margin);
  st.reserve = reserves.empty() ? 0 : reserves[(reserves.size() - 1) / 2];
  st.passing = slack.size();
  st.slack_median = slack.empty() ? 0 : slack[(slack.size() - 1) / 2];
  st.slack_share = share.empty() ? 0 : share[(share.size() - 1) / 2];
  return st;
}

Bytes CalibrationResult::verified_need(AllocatorMode m) const {
  const CalibVerify* last = nullptr;
  for (const CalibVerify& v : verify) {
    if (v.mode == m) last = &v;
  }
  if (!last || !last->finished) return 0;
  // The last round's reserve when it held; else what its worst case needed at that reserve.
  return last->violations == 0 ? last->reserve
                               : std::max(last->reserve, static_cast<Bytes>(std::max<std::int64_t>(0, last->max_delta)));
}

Scenario calibration_case(const CalibrationConfig& cfg, Catalog& catalog, std::uint64_t index, AllocatorMode mode) {
  GenConfig gen = cfg.gen;
  gen.allocator = mode;
  PrngChoices choices(case_seed(cfg.seed, index));
  return generate_scenario(choices, gen, catalog);
}

std::int64_t p1_delta(const CaseResult& r) {
  const Verdict& v = r.verdict;
  if (v.kind != VerdictKind::waste) return v.overshoot + static_cast<std::int64_t>(v.reserve);
  // P1 held (waste is judged only then), and a waste verdict's overshoot is the unused buffer:
  // the worst checked stage's measured - predicted, as a pass's is.
  std::int64_t delta = 0;
  bool any = false;
  for (const StagePlan& sp : r.plan.stages) {
    if (!sp.checked || sp.stage >= r.exec.stage_reserved_peak.size()) continue;
    const std::int64_t d = static_cast<std::int64_t>(r.exec.stage_reserved_peak[sp.stage]) - static_cast<std::int64_t>(sp.predicted_peak);
    if (!any || d > delta) delta = d;
    any = true;
  }
  return delta;
}

bool calib_sample(const Scenario& s, const CaseResult& r, std::uint64_t index, std::uint64_t seed, CalibSample* sample,
                  CalibExcluded* excluded) {
  const Verdict& v = r.verdict;
  if (v.expected_oom || v.kind == VerdictKind::error) {
    excluded->case_index = index;
    excluded->case_seed = seed;
    excluded->mode = s.allocator.mode;
    excluded->workload = workload_class(s, r.plan).key();
    excluded->expected_oom = v.expected_oom;
    excluded->error = v.kind == VerdictKind::error;
    return false;
  }
  sample->case_index = index;
  sample->case_seed = seed;
  sample->mode = s.allocator.mode;
  sample->workload = workload_class(s, r.plan).key();
  // The verdict's overshoot is measured - (predicted + reserve) at the worst checked stage (at the
  // failing op for an OOM), with one reserve for every stage: adding it back gives measured -
  // predicted at that same stage.
  sample->delta = p1_delta(r);
  sample->oom = v.kind == VerdictKind::oom;
  sample->pass = v.kind == VerdictKind::pass || v.kind == VerdictKind::waste;
  sample->reserve = v.reserve;
  sample->device_total = s.device.total;
  sample->signature = v.signature;
  sample->policy = s.policy.label();
  return true;
}

namespace {

// The campaign command whose last case is case `index` under `mode` (calibration_case draws as
// `fuzz` does with the allocator fixed).
std::string calibration_found_by(const CalibrationConfig& cfg, std::uint64_t index, AllocatorMode mode) {
  return fmt::format("vramfuzz fuzz --seed {} --cases {} --allocator {}{}", cfg.seed, index + 1, allocator_mode_name(mode),
                     cfg.case_options);
}

// A dynamic case judged at a --vram-headroom of `h` (the scenario's other overrides kept).
CaseResult run_at_headroom(const Scenario& s, Backend& backend, Bytes h) {
  Scenario c = s;
  apply_policy_override(c.policy, "vram_headroom", fmt::format("{}", h), "calibrate");
  return run_case(c, backend, false);
}

// The dynamic sample's delta: the smallest rung of the ladder, from the case's own headroom up,
// under which it has no avoidable OOM; nullopt when none does.
std::optional<Bytes> needed_headroom(const Scenario& s, const CaseResult& r, Backend& backend) {
  // A legacy model's P1 violation is the classic reserve's business (--reserve-vram), not aimdo's
  // headroom: it counts as a violation, not toward the headroom needed.
  if (r.verdict.kind != VerdictKind::oom) return s.policy.constants.dynamic.vram_headroom;
  for (const Bytes h : kHeadroomLadder) {
    if (h <= s.policy.constants.dynamic.vram_headroom || h >= s.device.total / 2) continue;
    if (run_at_headroom(s, backend, h).verdict.kind != VerdictKind::oom) return h;
  }
  return std::nullopt;
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Re-runs the mode's sampled cases with the reserve overridden, raising it until none violates
// or the rounds run out. `cut` says the run must end now (a stop or the end of the time budget):
// the round in progress is recorded unfinished, so the reports say the mode was not verified
// instead of showing a partial round as the answer.
void verify_mode(const CalibrationConfig& cfg, Catalog& catalog, Backend& backend, AllocatorMode mode,
                 const std::vector<std::uint64_t>& indices, Bytes need, const std::function<bool()>& cut,
                 CalibrationResult& out) {
  Bytes reserve = need;
  const std::string knob(calibrated_knob(parse_policy(cfg.gen.policy.value_or("comfy:dec2025"), "--policy", StartCommand::refuse)));
  const bool dynamic = knob != "reserve";
  for (std::uint32_t round = 1; round <= cfg.verify_rounds; ++round) {
    CalibrationConfig at = cfg;
    at.gen.policy_overrides.emplace_back(knob, fmt::format("{}", reserve));
    CalibVerify v;
    v.mode = mode;
    v.round = round;
    v.reserve = reserve;
    for (std::uint64_t i : indices) {
      if (cut()) {
        v.finished = false;
        out.verify.push_back(v);
        spdlog::warn("calibrate: {} verify round {} cut short after {} of {} cases: {} not verified", allocator_mode_name(mode),
                     round, v.cases, indices.size(), allocator_mode_name(mode));
        return;
      }
      const Scenario s = calibration_case(at, catalog, i, mode);
      const CaseResult r = run_case(s, backend, false);
      if (r.verdict.expected_oom || r.verdict.kind == VerdictKind::error) continue;
      ++v.cases;
      if (dynamic) {
        // An avoidable OOM at this headroom is what the headroom failed to prevent.
        v.violations += r.verdict.kind == VerdictKind::oom ? 1 : 0;
        continue;
      }
      if (r.verdict.kind == VerdictKind::oom) {
        ++v.ooms;
        continue;
      }
      v.violations += r.verdict.kind == VerdictKind::violation ? 1 : 0;
      const std::int64_t delta = p1_delta(r);
      v.max_delta = v.cases - v.ooms == 1 ? delta : std::max(v.max_delta, delta);
    }
    out.verify.push_back(v);
    if (dynamic) {
      spdlog::info("calibrate: {} verify round {}: --vram-headroom {}: {} of {} cases have an avoidable OOM", allocator_mode_name(mode),
                   round, format_mib(reserve), v.violations, v.cases);
    } else {
      spdlog::info("calibrate: {} verify round {}: reserve {}: {} of {} cases violate P1, {} OOM (largest measured - predicted {})",
                   allocator_mode_name(mode), round, format_mib(reserve), v.violations, v.cases, v.ooms, format_signed_mib(v.max_delta));
    }
    if (v.violations == 0) return;
    if (dynamic) {
      // The next rung of the ladder.
      const Bytes* next = std::upper_bound(std::begin(kHeadroomLadder), std::end(kHeadroomLadder), reserve);
      if (next == std::end(kHeadroomLadder)) return;
      reserve = *next;
      continue;
    }
    // Whole MiB above what the worst case needed at this reserve.
    reserve = std::max(reserve + MiB, round_up(static_cast<Bytes>(std::max<std::int64_t>(0, v.max_delta)) + 1, MiB));
  }
}

}  // namespace

CalibrationResult run_calibration(const CalibrationConfig& cfg, Catalog& catalog, Backend& backend) {
  CalibrationResult out;
  const auto t0 = std::chrono::steady_clock::now();
  // With verification on, sampling takes half of a time budget; verifying the same cases costs
  // about as much again.
  const double sample_seconds = cfg.seconds > 0 && cfg.verify_rounds > 0 ? cfg.seconds / 2 : cfg.seconds;
  const std::uint64_t stride = std::max<std::uint32_t>(1, cfg.shard_count);
  std::map<AllocatorMode, std::vector<std::uint64_t>> indices;
  for (std::uint64_t i = cfg.shard_index;; i += stride) {
    if (cfg.cases != 0 && i >= cfg.cases) break;
    if (cfg.cases == 0 && cfg.seconds <= 0) break;
    if (sample_seconds > 0 && since(t0) >= sample_seconds) break;
    if (cfg.should_stop && cfg.should_stop()) {
      out.stopped = true;
      break;
    }
    const std::uint64_t seed = case_seed(cfg.seed, i);
    for (AllocatorMode mode : cfg.modes) {
      const std::string found_by = calibration_found_by(cfg, i, mode);
      const Scenario s = calibration_case(cfg, catalog, i, mode);
      const CaseResult r = run_case(s, backend, false);
      if (out.environment.empty()) out.environment = r.exec.environment;
      CalibSample sample;
      CalibExcluded excluded;
      if (r.verdict.finding() && !cfg.out_dir.empty() && !out.finding_files.count(r.verdict.signature)) {
        CaseResult traced = run_case(s, backend, true);
        check_activation_dependence(s, traced.plan, backend, traced.verdict);  // as a campaign's finding files
        const std::string file = fmt::format("{}/calibrate/findings/{}/case-{:016x}.json", cfg.out_dir,
                                             signature_dir(r.verdict.signature), seed);
        write_file_atomic(file, case_json(s, traced, cfg.seed, i, seed, file, {}, found_by));
        out.finding_files[r.verdict.signature] = file;
      }
      if (calib_sample(s, r, i, seed, &sample, &excluded)) {
        if (s.policy.dynamic()) {
          const std::optional<Bytes> need = needed_headroom(s, r, backend);
          const Bytes top = kHeadroomLadder[std::size(kHeadroomLadder) - 1];
          sample.delta = static_cast<std::int64_t>(need.value_or(std::min(top, s.device.total / 2)));
          sample.oom = !need.has_value();
          sample.reserve = s.policy.constants.dynamic.vram_headroom;
        }
        out.samples.push_back(std::move(sample));
        indices[mode].push_back(i);
      } else {
        out.excluded.push_back(std::move(excluded));
      }
    }
    ++out.cases;
    if (cfg.on_case) cfg.on_case(out.cases, since(t0));
  }

  // Verification ends with the budget, and a stop (here or while sampling) ends it for every mode
  // still to come: each then gets an unfinished round, never a claim it did not check.
  const auto cut = [&] {
    if (!out.stopped && cfg.should_stop && cfg.should_stop()) out.stopped = true;
    return out.stopped || (cfg.seconds > 0 && since(t0) >= cfg.seconds);
  };
  for (AllocatorMode mode : cfg.modes) {
    std::vector<CalibSample> mine;
    for (const CalibSample& s : out.samples) {
      if (s.mode == mode) mine.push_back(s);
    }
    if (mine.empty()) continue;
    const CalibStats st = calib_stats(mine, {}, cfg.margin);
    if (cfg.verify_rounds > 0) verify_mode(cfg, catalog, backend, mode, indices[mode], st.need, cut, out);

    // The worst case: the largest delta (the first such case on ties).
    const CalibSample* worst = &mine.front();
    for (const CalibSample& s : mine) {
      if (s.delta > worst->delta) worst = &s;
    }
    CalibWorst w;
    w.mode = mode;
    w.case_index = worst->case_index;
    w.case_seed = worst->case_seed;
    w.delta = worst->delta;
    w.oom = worst->oom;
    if (!cfg.out_dir.empty()) {
      const Scenario s = calibration_case(cfg, catalog, worst->case_index, mode);
      CaseResult r = run_case(s, backend, true);
      check_activation_dependence(s, r.plan, backend, r.verdict);  // a worst case written as it ran says it too
      const std::string dir = fmt::format("{}/calibrate/{}", cfg.out_dir, allocator_mode_name(mode));
      w.signature = r.verdict.signature;
      if (r.verdict.finding() && cfg.shrink) {
        ShrinkOptions opt;
        opt.max_execs = cfg.shrink_execs;
        opt.max_seconds = cfg.shrink_seconds;
        if (cfg.seconds > 0) opt.max_seconds = std::max(0.0, std::min(opt.max_seconds, cfg.seconds - since(t0)));
        opt.should_stop = cfg.should_stop;
        const ShrinkResult sr = shrink(s, backend, opt);
        ReproOrigin origin;
        origin.campaign_seed = cfg.seed;
        origin.case_index = worst->case_index;
        origin.case_seed = worst->case_seed;
        origin.found_by = calibration_found_by(cfg, worst->case_index, mode);
        w.file = write_repro(dir, sr, origin);
        w.modules = sr.final_size.modules;
        w.shrunk = std::make_shared<const ShrinkResult>(sr);
      } else {
        // A pass at the current reserve has no signature for the shrinker to keep: the case is
        // written as it ran.
        w.file = dir + "/worst-case.json";
        write_file_atomic(w.file, case_json(s, r, cfg.seed, worst->case_index, worst->case_seed, w.file, {},
                                            calibration_found_by(cfg, worst->case_index, mode)));
        w.modules = case_size(s).modules;
      }
      spdlog::info("calibrate: {} worst case {} (measured - predicted {}{}): {}", allocator_mode_name(mode),
                   worst->case_index, format_signed_mib(worst->delta), worst->oom ? " at least: it OOMed" : "", w.file);
    }
    out.worst.push_back(std::move(w));
  }
  out.seconds = since(t0);
  return out;
}

}  // namespace vf
