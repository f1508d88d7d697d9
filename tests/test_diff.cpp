// vramfuzz diff (harness/diff.h): plans compared field by field, cases grouped by what differs,
// each group shrunk while it differs the same way.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include <fmt/format.h>

#include "harness/campaign.h"
#include "harness/diff.h"
#include "harness/generate.h"
#include "harness/predict.h"
#include "reports/render.h"

namespace vf {
namespace {

Scenario generated(std::uint64_t seed, Catalog& catalog, const char* policy) {
  PrngChoices c(seed);
  GenConfig cfg;
  cfg.policy = policy;
  return generate_scenario(c, cfg, catalog);
}

// The look-ahead buffer's arrival (nov2025 -> dec2025): many cases' plans differ.
DiffConfig dec2025_against_nov2025(std::uint64_t cases) {
  DiffConfig cfg;
  cfg.seed = 1;
  cfg.cases = cases;
  cfg.gen.policy = "comfy:dec2025";
  cfg.against = "comfy:nov2025";
  return cfg;
}

TEST(Diff, TheSamePlanHasNoDifferences) {
  Catalog catalog;
  for (std::uint64_t seed = 1; seed <= 20; ++seed) {
    const Scenario s = generated(seed, catalog, "comfy:dec2025");
    EXPECT_TRUE(compare_plans(s, predict(s), predict(s), 0).empty()) << seed;
  }
}

TEST(Diff, AReserveChangeIsNamedWithItsBytesAndATolerancePassesIt) {
  Catalog catalog;
  const Scenario s = generated(4, catalog, "comfy:dec2025");
  const Scenario b = under_policy(s, s.policy, {{"reserve", "600MiB"}});
  const auto fields = compare_plans(s, predict(s), predict(b), 0);
  ASSERT_FALSE(fields.empty());
  EXPECT_EQ(fields[0].field, "reserve");
  EXPECT_EQ(fields[0].a, "400.00 MiB");
  EXPECT_EQ(fields[0].b, "600.00 MiB");
  EXPECT_EQ(fields[0].delta, 200 * static_cast<std::int64_t>(MiB));
  EXPECT_TRUE(fields[0].bytes);
  EXPECT_EQ(fields[0].a_bytes, 400 * static_cast<std::int64_t>(MiB));
  EXPECT_EQ(fields[0].b_bytes, 600 * static_cast<std::int64_t>(MiB));
  for (const FieldDiff& f : compare_plans(s, predict(s), predict(b), 200 * MiB)) EXPECT_NE(f.field, "reserve");
}

TEST(Diff, ModulesOnTheDeviceUnderOneSideOnlyAreCountedWithTheirBytes) {
  Catalog catalog;
  // The first case that loads partially under dec2025: moving its first resident module to
  // lowvram in B's plan is one resident and one lowvram difference of that module's bytes.
  for (std::uint64_t seed = 1; seed < 200; ++seed) {
    const Scenario s = generated(seed, catalog, "comfy:dec2025");
    const Plan a = predict(s);
    if (a.loads.empty() || a.loads[0].full_load) continue;
    Plan b = a;
    std::size_t i = 0;
    while (i < b.loads[0].resident.size() && !b.loads[0].resident[i]) ++i;
    if (i == b.loads[0].resident.size()) continue;
    b.loads[0].resident[i] = 0;
    b.loads[0].lowvram[i] = 1;
    const ModelSpec& spec = *s.models[a.loads[0].model].spec;
    const auto fields = compare_plans(s, a, b, 0);
    ASSERT_EQ(fields.size(), 2u);
    EXPECT_EQ(fields[0].field, "loads[0].resident");
    EXPECT_EQ(fields[0].a, fmt::format("1 module(s) ({}) only here", format_mib(spec.modules[i].bytes)));
    EXPECT_EQ(fields[0].delta, -static_cast<std::int64_t>(spec.modules[i].bytes));
    EXPECT_EQ(fields[1].field, "loads[0].lowvram");
    EXPECT_NE(fields[1].b.find(spec.modules[i].name), std::string::npos) << fields[1].b;
    return;
  }
  FAIL() << "no partial load in 200 seeds";
}

// Under dynamic VRAM the staging is compared: the order, the force-loaded set, the bytes staged
// and force-loaded, and where each module's slice lies in the VBAR.
TEST(Diff, AStagingSliceMovedOrResizedIsNamedWithItsModule) {
  Catalog catalog;
  for (std::uint64_t seed = 1; seed < 100; ++seed) {
    const Scenario s = generated(seed, catalog, "comfy:sep2026");
    const Plan a = predict(s);
    if (a.loads.empty() || !a.loads[0].dynamic) continue;
    const StagingPlan& st = a.loads[0].staging;
    std::size_t i = 0;
    while (i < st.slice_size.size() && st.slice_size[i] == 0) ++i;
    if (i == st.slice_size.size()) continue;
    EXPECT_TRUE(compare_plans(s, a, a, 0).empty());
    Plan b = a;
    b.loads[0].staging.slice_offset[i] += 512;
    b.loads[0].staging.staged += 1024;
    const auto fields = compare_plans(s, a, b, 0);
    ASSERT_EQ(fields.size(), 2u);
    EXPECT_EQ(fields[0].field, "loads[0].staging.staged");
    EXPECT_EQ(fields[0].delta, 1024);
    EXPECT_EQ(fields[1].field, "loads[0].staging.slices");
    const ModelSpec& spec = *s.models[a.loads[0].model].spec;
    EXPECT_EQ(fields[1].b, fmt::format("1 module(s) placed otherwise; the first: {} at {} for {} B, not {} for {} B", spec.modules[i].name,
                                       st.slice_offset[i] + 512, st.slice_size[i], st.slice_offset[i], st.slice_size[i]));
    EXPECT_TRUE(compare_plans(s, a, b, 1024).size() == 1u);  // the byte field is within the tolerance, the slice is not
    return;
  }
  FAIL() << "no dynamic load with a slice in 100 seeds";
}

TEST(Diff, AGroupIsShrunkAndItsMinimalCaseStillDiffersTheSameWay) {
  Catalog catalog;
  const DiffConfig cfg = dec2025_against_nov2025(120);
  auto backend = make_backend("sim");
  const DiffResult r = run_diff(cfg, catalog, *backend);
  EXPECT_EQ(r.cases, 120u);
  ASSERT_FALSE(r.groups.empty());
  std::uint64_t in_groups = 0;
  bool shrank = false;
  const Policy nov = parse_policy("comfy:nov2025", "--against");
  EXPECT_EQ(field_kind("loads[3].staging.forced_modules"), "loads.staging.forced_modules");
  for (const DiffGroup& g : r.groups) {
    in_groups += g.count;
    EXPECT_LE(g.modules_after, g.modules_before) << g.key;
    shrank |= g.modules_after < g.modules_before;
    // The minimal case differs in the fields the key names.
    const Plan a = predict(g.minimal), b = predict(under_policy(g.minimal, nov, {}));
    std::set<std::string> kinds;
    for (const FieldDiff& f : compare_plans(g.minimal, a, b, 0)) kinds.insert(field_kind(f.field));
    for (const std::string& k : kinds) EXPECT_NE(g.key.find(k), std::string::npos) << k << " not in " << g.key;
  }
  EXPECT_EQ(in_groups + r.same, r.cases);
  EXPECT_TRUE(shrank);
  // Groups come most cases first.
  for (std::size_t i = 1; i < r.groups.size(); ++i) EXPECT_GE(r.groups[i - 1].count, r.groups[i].count);
}

// diff.json, diff.md and diff.html say per group what its plan fields and verdicts rest on; the
// HTML draws each byte field's A and B and renders from diff.json alone.
TEST(Diff, EveryReportSaysWhatAGroupRestsOnAndTheHtmlDrawsItsBytes) {
  Catalog catalog;
  DiffConfig cfg = dec2025_against_nov2025(120);
  cfg.shrink_execs = 40;
  auto backend = make_backend("sim");
  const DiffResult r = run_diff(cfg, catalog, *backend);
  ASSERT_FALSE(r.groups.empty());
  std::vector<std::string> files;
  bool verdict_group = false;
  for (std::size_t i = 0; i < r.groups.size(); ++i) {
    files.push_back(fmt::format("differences/{:02}-g/case.json", i + 1));
    const DiffGroup& g = r.groups[i];
    // Every case ran under both (verdicts on): a side that failed says what its verdict rests on.
    if (g.verdict_a != "pass") {
      EXPECT_FALSE(g.rests_on_a.empty()) << g.key << " " << g.verdict_a;
    }
    if (g.verdict_b != "pass") {
      EXPECT_FALSE(g.rests_on_b.empty()) << g.key << " " << g.verdict_b;
    }
    verdict_group |= g.key.find("verdict:") != std::string::npos;
  }
  const report::Json j = report::Json::parse(diff_json(cfg, r, files, "vramfuzz diff --against comfy:nov2025"));
  std::size_t byte_fields = 0;
  for (const auto& g : j["groups"]) {
    EXPECT_EQ(g["rests_on"]["plans"], std::string(kDiffPlanRestsOn));
    EXPECT_EQ(g["plan_b"].get<std::string>().rfind("vramfuzz plan differences/", 0), 0u) << g["plan_b"];
    EXPECT_NE(g["plan_b"].get<std::string>().find("--policy comfy:nov2025"), std::string::npos) << g["plan_b"];
    for (const auto& f : g["fields"]) {
      if (!f.contains("a_bytes")) continue;
      ++byte_fields;
      EXPECT_EQ(f["b_bytes"].get<std::int64_t>() - f["a_bytes"].get<std::int64_t>(), f["delta"].get<std::int64_t>()) << f.dump();
    }
  }
  EXPECT_GT(byte_fields, 0u);
  const std::string md = diff_markdown(cfg, r, files);
  std::size_t rests = 0;
  for (std::size_t at = md.find("**Rests on:** plan fields: exact:"); at != std::string::npos; at = md.find("**Rests on:**", at + 1)) ++rests;
  EXPECT_EQ(rests, r.groups.size());
  if (verdict_group) {
    EXPECT_NE(md.find("Verdict"), std::string::npos);
  }
  const std::string html = report::diff_html(j);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("vramfuzz diff: <code>comfy:dec2025</code> (A) against <code>comfy:nov2025</code> (B)"), std::string::npos);
  EXPECT_NE(html.find("<svg class=\"diffbars\""), std::string::npos);
  for (const auto& g : j["groups"]) {
    EXPECT_NE(html.find(report::xml_escape(g["key"].get<std::string>())), std::string::npos) << g["key"];
    EXPECT_NE(html.find(report::xml_escape(g["plan_a"].get<std::string>())), std::string::npos);
  }
  EXPECT_EQ(html.find("<script"), std::string::npos);
  // No difference: the page says so.
  report::Json none = j;
  none["groups"] = report::Json::array();
  none["counts"]["groups"] = 0;
  EXPECT_NE(report::diff_html(none).find("Every case planned the same under both."), std::string::npos);
}

}  // namespace
}  // namespace vf
