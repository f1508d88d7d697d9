// Calibration: the statistics (nearest-rank percentiles, OOMs as lower bounds, slack), the
// workload classes, and the claim a developer relies on: the recommended reserve makes P1 hold on
// the calibration sample and on a fresh sample drawn with another seed, while 10% less does not.
// Merged shards give the same sample, so the same percentiles, as one run. A verification cut
// short (a stop, the end of --time) is reported as not verified, never as a result.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include "harness/calibrate.h"
#include "reports/json_util.h"
#include "reports/render.h"
#include "reports/summary.h"
#include "reports/tables.h"

namespace vf {
namespace {

CalibSample sample(std::int64_t delta_mib, bool oom, std::uint64_t seed) {
  CalibSample s;
  s.case_index = seed;
  s.case_seed = seed;
  s.delta = delta_mib * static_cast<std::int64_t>(MiB);
  s.oom = oom;
  s.reserve = 400 * MiB;
  s.pass = !oom && s.delta <= static_cast<std::int64_t>(s.reserve);
  s.device_total = 10 * GiB;
  return s;
}

TEST(Calibrate, NearestRankPercentiles) {
  const std::vector<std::int64_t> v{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(nearest_rank(v, 0.5), 5);
  EXPECT_EQ(nearest_rank(v, 0.9), 9);
  EXPECT_EQ(nearest_rank(v, 0.99), 10);
  EXPECT_EQ(nearest_rank(v, 1.0), 10);
  EXPECT_EQ(nearest_rank(std::vector<std::int64_t>{7}, 0.5), 7);
  EXPECT_EQ(nearest_rank(std::vector<std::int64_t>{}, 0.5), 0);
}

TEST(Calibrate, StatsTakeOomsAsLowerBoundsAndMeasureSlackOverPassingCases) {
  // Deltas -300 .. +200 MiB in passing cases, one violation at +500, one OOM whose lower bound is +900.
  std::vector<CalibSample> s;
  for (int d : {-300, -100, 0, 100, 200}) s.push_back(sample(d, false, s.size()));
  s.push_back(sample(500, false, 10));
  s.push_back(sample(900, true, 11));
  std::vector<CalibExcluded> x(2);
  x[0].expected_oom = true;
  x[1].error = true;
  const CalibStats st = calib_stats(s, x, 64 * MiB);
  EXPECT_EQ(st.cases, 7u);
  EXPECT_EQ(st.ooms, 1u);
  EXPECT_EQ(st.expected_ooms, 1u);
  EXPECT_EQ(st.errors, 1u);
  EXPECT_EQ(st.violations, 2u);  // +500 over a 400 MiB reserve, and the OOM
  EXPECT_EQ(st.max, 900 * static_cast<std::int64_t>(MiB)) << "the OOM's lower bound is in the distribution";
  EXPECT_EQ(st.need, 900 * MiB);
  EXPECT_EQ(st.recommended, 964 * MiB);
  EXPECT_EQ(st.p50, 100 * static_cast<std::int64_t>(MiB));  // 4th of 7 sorted
  EXPECT_EQ(st.reserve, 400 * MiB);
  // Headroom of the 5 passing cases: 700, 500, 400, 300, 200 MiB -> median 400 MiB.
  EXPECT_EQ(st.passing, 5u);
  EXPECT_EQ(st.slack_median, 400 * static_cast<std::int64_t>(MiB));
  EXPECT_NEAR(st.slack_share, 400.0 / 10240.0, 1e-9);

  // All under the prediction: nothing needed, the margin is the whole recommendation.
  const CalibStats none = calib_stats(std::vector<CalibSample>{sample(-5, false, 0)}, {}, 64 * MiB);
  EXPECT_EQ(none.need, 0u);
  EXPECT_EQ(none.recommended, 64 * MiB);
}

TEST(Calibrate, TheRecommendationIsWholeMiBThatReserveTakes) {
  // A need of 774.2 MiB and a 64 MiB margin printed "838.2 MiB", which --reserve refuses (it is
  // not a whole number of bytes): the recommendation rounds up to a whole MiB.
  const Bytes need = 774 * MiB + 200 * KiB;
  EXPECT_EQ(recommended_reserve(need, 64 * MiB), 839 * MiB);
  EXPECT_EQ(recommended_reserve(900 * MiB, 64 * MiB), 964 * MiB);  // already whole: unchanged
  EXPECT_EQ(recommended_reserve(1, 0), MiB);
  EXPECT_EQ(recommended_reserve(0, 0), 0u);
  std::vector<CalibSample> s{sample(774, false, 0)};
  s[0].delta += 200 * static_cast<std::int64_t>(KiB);
  const CalibStats st = calib_stats(s, {}, 64 * MiB);
  EXPECT_EQ(st.need, need);
  EXPECT_EQ(st.recommended, 839 * MiB);
  // Printed the way --reserve takes it, and read back to the same bytes.
  EXPECT_EQ(report::reserve_arg(st.recommended), "839MiB");
  EXPECT_EQ(parse_size(report::reserve_arg(st.recommended), "--reserve"), st.recommended);
  EXPECT_EQ(report::reserve_arg(838 * MiB + 1), "839MiB");  // an older summary's fraction rounds up too
}

TEST(Calibrate, WorkloadClassNamesDtypesPlacementAndResolutionBand) {
  Catalog catalog;
  CalibrationConfig cfg;
  cfg.gen.policy = "comfy:dec2025";
  std::map<std::string, int> bands;
  for (std::uint64_t i = 0; i < 60; ++i) {
    const Scenario s = calibration_case(cfg, catalog, i, AllocatorMode::raw);
    const Plan plan = predict(s);
    const WorkloadClass c = workload_class(s, plan);
    const std::uint64_t px = std::uint64_t{s.workload.width} * s.workload.height;
    const std::string want = px <= 512 * 512 ? "<=512x512" : px <= 1024 * 1024 ? "<=1024x1024" : ">1024x1024";
    EXPECT_EQ(c.resolution, want);
    bool off = false;
    for (const LoadPlan& lp : plan.loads) off |= lp.offloaded > 0;
    EXPECT_EQ(c.offloaded, off);
    EXPECT_NE(c.dtypes.find("->"), std::string::npos) << c.dtypes;
    EXPECT_EQ(c.key(), c.dtypes + ", " + (off ? "offloaded" : "resident") + ", " + c.resolution);
    ++bands[c.resolution];
  }
  EXPECT_EQ(bands.size(), 3u) << "60 cases reach all three bands";
}

// Counts P1 violations (and OOMs) of cases [first, first + n) of seed `seed` under `mode` with the
// reserve overridden.
struct Rejudge {
  std::uint64_t cases = 0, violations = 0, ooms = 0;
};
Rejudge rejudge(Catalog& catalog, std::uint64_t seed, std::uint64_t n, AllocatorMode mode, Bytes reserve) {
  CalibrationConfig cfg;
  cfg.seed = seed;
  cfg.gen.policy = "comfy:dec2025";
  cfg.gen.policy_overrides.emplace_back("reserve", std::to_string(reserve));
  SimBackend sim;
  Rejudge out;
  for (std::uint64_t i = 0; i < n; ++i) {
    const Scenario s = calibration_case(cfg, catalog, i, mode);
    const CaseResult r = run_case(s, sim, false);
    if (r.verdict.expected_oom || r.verdict.kind == VerdictKind::error) continue;
    ++out.cases;
    out.violations += r.verdict.kind == VerdictKind::violation ? 1 : 0;
    out.ooms += r.verdict.kind == VerdictKind::oom ? 1 : 0;
  }
  return out;
}

TEST(Calibrate, RecommendedReserveHoldsOnTheSampleAndOnAFreshSample) {
  // Calibrate on N case seeds (seed 1), every mode; then, per mode, re-run with --reserve set to
  // the recommendation (need + margin): P1 must hold on all N calibration cases, and on >= 98% of
  // N fresh cases (seed 2). A fresh case exceeds the largest of N calibration needs with chance
  // 1 / (N + 1), so about one in 250 is expected per mode; 2% allows for the tail (on these fixed
  // seeds the counts are printed: raw, caching-expandable and async 1 of 243, caching 3 of 243). Then 10% under the un-margined need must break the property that
  // set it on at least one calibration case: the need is tight, not just large.
  constexpr std::uint64_t kCases = 250;
  Catalog catalog;
  SimBackend sim;
  CalibrationConfig cfg;
  cfg.seed = 1;
  cfg.cases = kCases;
  cfg.gen.policy = "comfy:dec2025";
  const CalibrationResult r = run_calibration(cfg, catalog, sim);
  ASSERT_EQ(r.cases, kCases);
  ASSERT_EQ(r.worst.size(), 4u);
  for (AllocatorMode mode : kAllAllocatorModes) {
    SCOPED_TRACE(std::string(allocator_mode_name(mode)));
    std::vector<CalibSample> mine;
    for (const CalibSample& s : r.samples) {
      if (s.mode == mode) mine.push_back(s);
    }
    const CalibStats st = calib_stats(mine, {}, cfg.margin);
    ASSERT_GT(st.need, 0u) << "dec2025's 400 MiB is violated somewhere in every mode on this sample";
    const Bytes need = std::max(st.need, r.verified_need(mode));
    const Bytes recommended = need + cfg.margin;

    const Rejudge same = rejudge(catalog, 1, kCases, mode, recommended);
    EXPECT_EQ(same.violations, 0u) << "P1 at the recommendation " << format_mib(recommended) << " on the calibration set";
    const Rejudge fresh = rejudge(catalog, 2, kCases, mode, recommended);
    EXPECT_LE(fresh.violations * 50, fresh.cases) << "P1 on >= 98% of a fresh sample";
    std::printf("[ calibrate] %-18s need %s, recommended %s: calibration set %llu/%llu violate P1, fresh set %llu/%llu "
                "(%llu OOMs)\n",
                std::string(allocator_mode_name(mode)).c_str(), format_mib(need).c_str(), format_mib(recommended).c_str(),
                static_cast<unsigned long long>(same.violations), static_cast<unsigned long long>(same.cases),
                static_cast<unsigned long long>(fresh.violations), static_cast<unsigned long long>(fresh.cases),
                static_cast<unsigned long long>(fresh.ooms));

    const Rejudge lower = rejudge(catalog, 1, kCases, mode, need / 10 * 9);
    const CalibWorst* worst = nullptr;
    for (const CalibWorst& w : r.worst) {
      if (w.mode == mode) worst = &w;
    }
    ASSERT_NE(worst, nullptr);
    if (worst->oom) {
      // The need is an OOM's lower bound (caching on these seeds: a fragmentation OOM on a 3.75 GiB
      // device): under it that case is still a finding (P2), whatever P1 does.
      EXPECT_GE(lower.violations + lower.ooms, 1u) << "10% under the need (" << format_mib(need / 10 * 9) << ")";
    } else {
      EXPECT_GE(lower.violations, 1u) << "10% under the need (" << format_mib(need / 10 * 9) << ") some case must violate P1";
    }
  }
}

TEST(Calibrate, MergedShardsGiveTheSamePercentilesAsOneRun) {
  Catalog catalog;
  SimBackend sim;
  auto run = [&](std::uint32_t index, std::uint32_t count) {
    CalibrationConfig cfg;
    cfg.seed = 5;
    cfg.cases = 90;
    cfg.gen.policy = "comfy:dec2025";
    cfg.modes = {AllocatorMode::raw, AllocatorMode::async};
    cfg.shard_index = index;
    cfg.shard_count = count;
    cfg.verify_rounds = 0;
    return report::summary_from_calibration(cfg, run_calibration(cfg, catalog, sim),
                                            report::run_info("calibrate", "test", "sim", ""));
  };
  const report::Json all = run(0, 1);
  const report::Json s0 = run(0, 2), s1 = run(1, 2);
  EXPECT_LT(report::get_u64(s0["calibrate"], "cases_drawn"), 90u);
  const report::Json merged = report::merge_summaries({s0, s1}, {"s0", "s1"}, report::run_info("merge", "test", "sim", ""));
  ASSERT_TRUE(merged.contains("calibrate"));
  const auto& ma = all["calibrate"]["modes"];
  const auto& mm = merged["calibrate"]["modes"];
  ASSERT_EQ(ma.size(), 2u);
  ASSERT_EQ(mm.size(), 2u);
  for (std::size_t i = 0; i < ma.size(); ++i) {
    for (const char* k : {"allocator", "cases", "ooms", "p50", "p90", "p99", "max", "need", "slack_median", "histogram"}) {
      EXPECT_EQ(ma[i][k], mm[i][k]) << k << " of " << ma[i]["allocator"];
    }
  }
  EXPECT_EQ(all["calibrate"]["classes"], merged["calibrate"]["classes"]);
  EXPECT_EQ(all["counts"]["findings"], merged["counts"]["findings"]);
  // Percentiles are recomputed from the pooled samples, not averaged: the shards' own p90s differ
  // from the merged one in general, and the merged one equals the single run's.
  EXPECT_EQ(report::samples_from_json(merged["calibrate"]).size(), report::samples_from_json(all["calibrate"]).size());
}

// Every mode row of a summary says "not verified": no verified need, the recommendation is the
// sample's need plus the margin, and the tables and the verdict line say so.
void expect_not_verified(const report::Json& summary, Bytes margin) {
  ASSERT_FALSE(summary["calibrate"]["modes"].empty());
  for (const report::Json& m : summary["calibrate"]["modes"]) {
    SCOPED_TRACE(m["allocator"].get<std::string>());
    EXPECT_EQ(m["verification"], "not verified");
    EXPECT_TRUE(m["verified_need"].is_null());
    EXPECT_FALSE(m["verified"].get<bool>());
    EXPECT_EQ(m["recommended"].get<Bytes>(), recommended_reserve(m["need"].get<Bytes>(), margin));
  }
  const std::string text = report::terminal_calibrate(summary);
  EXPECT_NE(text.find("not verified"), std::string::npos) << text;
  EXPECT_NE(text.find("(unverified)"), std::string::npos) << text;
  EXPECT_NE(report::markdown_summary(summary, ".").find("(not verified)"), std::string::npos);
}

TEST(Calibrate, StopDuringVerificationLeavesEveryRemainingModeNotVerified) {
  // 10 case seeds: sampling asks should_stop 10 times; the stop comes on the 4th case of the first
  // mode's first verify round, so raw is cut mid-round and async never starts.
  Catalog catalog;
  SimBackend sim;
  CalibrationConfig cfg;
  cfg.seed = 1;
  cfg.cases = 10;
  cfg.gen.policy = "comfy:dec2025";
  cfg.modes = {AllocatorMode::raw, AllocatorMode::async};
  int asked = 0;
  cfg.should_stop = [&asked] { return ++asked > 13; };
  const CalibrationResult r = run_calibration(cfg, catalog, sim);
  EXPECT_EQ(r.cases, 10u) << "sampling finished before the stop";
  EXPECT_TRUE(r.stopped);
  std::map<AllocatorMode, std::vector<CalibVerify>> rounds;
  for (const CalibVerify& v : r.verify) rounds[v.mode].push_back(v);
  ASSERT_EQ(rounds[AllocatorMode::raw].size(), 1u);
  EXPECT_FALSE(rounds[AllocatorMode::raw][0].finished);
  EXPECT_EQ(rounds[AllocatorMode::raw][0].cases, 3u) << "3 cases re-run before the stop (none excluded on these seeds)";
  ASSERT_EQ(rounds[AllocatorMode::async].size(), 1u);
  EXPECT_FALSE(rounds[AllocatorMode::async][0].finished);
  EXPECT_EQ(rounds[AllocatorMode::async][0].cases, 0u);
  EXPECT_EQ(r.verified_need(AllocatorMode::raw), 0u);
  EXPECT_EQ(r.verified_need(AllocatorMode::async), 0u);

  const report::Json s = report::summary_from_calibration(cfg, r, report::run_info("calibrate", "test", "sim", ""));
  EXPECT_TRUE(s["run"]["interrupted"].get<bool>());
  expect_not_verified(s, cfg.margin);
  // A merge with a run that did verify stays not verified: the stopped run's cases were not. (The
  // other run is another campaign, seed 2: the same cases twice would be refused.)
  CalibrationConfig whole = cfg;
  whole.seed = 2;
  whole.should_stop = nullptr;
  const report::Json done = report::summary_from_calibration(whole, run_calibration(whole, catalog, sim),
                                                             report::run_info("calibrate", "test", "sim", ""));
  for (const report::Json& m : done["calibrate"]["modes"]) EXPECT_NE(m["verification"], "not verified");
  const report::Json merged = report::merge_summaries({done, s}, {"a", "b"}, report::run_info("merge", "test", "sim", ""));
  expect_not_verified(merged, cfg.margin);
}

TEST(Calibrate, TimeBudgetEndingBeforeVerificationLeavesModesNotVerified) {
  // A 0.2 s budget: sampling gets half, and the first case's callback sleeps past all of it, so
  // verification starts after the budget's end (deterministically, whatever the machine's speed).
  Catalog catalog;
  SimBackend sim;
  CalibrationConfig cfg;
  cfg.seed = 1;
  cfg.seconds = 0.2;
  cfg.gen.policy = "comfy:dec2025";
  cfg.on_case = [](std::uint64_t, double) { std::this_thread::sleep_for(std::chrono::milliseconds(250)); };
  const CalibrationResult r = run_calibration(cfg, catalog, sim);
  EXPECT_EQ(r.cases, 1u);
  EXPECT_FALSE(r.stopped) << "out of time is not a stop";
  ASSERT_FALSE(r.verify.empty());
  for (const CalibVerify& v : r.verify) {
    EXPECT_FALSE(v.finished) << allocator_mode_name(v.mode);
    EXPECT_EQ(v.cases, 0u);
  }
  const report::Json s = report::summary_from_calibration(cfg, r, report::run_info("calibrate", "test", "sim", ""));
  EXPECT_FALSE(s["run"]["interrupted"].get<bool>());
  expect_not_verified(s, cfg.margin);
}

}  // namespace
}  // namespace vf
