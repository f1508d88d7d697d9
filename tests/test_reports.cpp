// The reports: JUnit XML valid against reports/schema/junit.xsd (xmllint), with one testcase per
// property x allocator x policy and failures that say what to replay; the Markdown summary's
// verdict line; summary.json carrying everything the reports need; and the HTML report in a
// real headless Chromium: no console messages, a screenshot that is not blank and has the
// timeline's colours in it.
#include <gtest/gtest.h>

#include <png.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include <fmt/format.h>

#include "harness/campaign.h"
#include "harness/core/json_in.h"
#include "harness/diff.h"
#include "reports/json_util.h"
#include "reports/render.h"
#include "reports/summary.h"
#include "reports/tables.h"
#include "tests/run_cli.h"

namespace vf {
namespace {

namespace fs = std::filesystem;
using report::Json;

const std::string kXsd = std::string(VF_SOURCE_DIR) + "/reports/schema/junit.xsd";

using test::read_file;

std::string which(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    const std::size_t colon = dirs.find(':', start);
    const std::string dir = dirs.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    const fs::path candidate = fs::path(dir.empty() ? "." : dir) / name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return "";
}

std::size_t count(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
  return n;
}

class Reports : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmpl = (fs::temp_directory_path() / "vf_test_reports_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = new fs::path(tmpl);
    // One campaign for every test: comfy:dec2025, allocator drawn, with repros (shrunk, traced).
    Catalog catalog;
    SimBackend sim;
    CampaignConfig cfg;
    cfg.seed = 1;
    cfg.cases = 60;
    cfg.gen.policy = "comfy:dec2025";
    cfg.shrink_execs = 60;
    cfg.out_dir = (*dir_ / "out").string();
    cfg.command_line = "vramfuzz fuzz --seed 1 --cases 60 --policy comfy:dec2025 --out " + cfg.out_dir;
    const CampaignResult r = run_campaign(cfg, catalog, sim);
    doc_ = new Json(report::summary_from_campaign(cfg, r, report::run_info("fuzz", cfg.command_line, "sim", cfg.out_dir)));
    files_ = new report::ReportFiles(report::write_reports(cfg.out_dir, *doc_));
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete files_;
    delete doc_;
    delete dir_;
  }
  static const Json& doc() { return *doc_; }
  static const report::ReportFiles& files() { return *files_; }
  static const fs::path& dir() { return *dir_; }

  // xmllint --schema: exit code and output.
  static test::Proc xmllint(const fs::path& xml) {
    return test::run_process(which("xmllint"), {"--noout", "--schema", kXsd, xml.string()}, dir(), 60);
  }

 private:
  static fs::path* dir_;
  static Json* doc_;
  static report::ReportFiles* files_;
};
fs::path* Reports::dir_ = nullptr;
Json* Reports::doc_ = nullptr;
report::ReportFiles* Reports::files_ = nullptr;

TEST_F(Reports, CampaignHasFindingsWithRepros) {
  ASSERT_GE(report::get_arr(doc(), "findings").size(), 2u) << "the fixture campaign must find something";
  std::size_t with_case = 0;
  for (const Json& f : report::get_arr(doc(), "findings")) with_case += f.contains("case") ? 1 : 0;
  EXPECT_GE(with_case, 2u);
}

TEST_F(Reports, JunitIsValidAgainstTheSchemaWithATestcasePerPropertyModeAndPolicy) {
  if (which("xmllint").empty()) GTEST_SKIP() << "xmllint missing: ci/install-deps.sh installs libxml2-utils";
  const test::Proc p = xmllint(files().junit);
  EXPECT_EQ(p.exit_code, 0) << test::describe(p);
  EXPECT_NE(p.err.find("validates"), std::string::npos) << test::describe(p);

  const std::string xml = read_file(files().junit);
  // comfy:dec2025 x 4 drawn allocator modes x 4 properties.
  EXPECT_EQ(count(xml, "<testcase "), 16u) << xml;
  EXPECT_EQ(count(xml, "<testsuite "), 1u);
  for (const char* mode : {"raw", "caching", "caching-expandable", "async"}) {
    EXPECT_NE(xml.find(std::string("name=\"P1 peak-within-prediction [") + mode + "]\""), std::string::npos) << mode;
    EXPECT_NE(xml.find(std::string("name=\"P2 no-unpredicted-oom [") + mode + "]\""), std::string::npos) << mode;
    EXPECT_NE(xml.find(std::string("name=\"P3 no-wasted-offload [") + mode + "]\""), std::string::npos) << mode;
    EXPECT_NE(xml.find(std::string("name=\"P4 no-resolution-knee [") + mode + "]\""), std::string::npos) << mode;
  }
  // Every failure says, in its message, the signature, the overshoot, the seed and the replay
  // command; the body names the repro.
  const std::regex failure(R"re(<failure message="([^"]*)" type="(violation|oom|waste|knee)">([^<]*)</failure>)re");
  std::size_t failures = 0;
  for (auto it = std::sregex_iterator(xml.begin(), xml.end(), failure); it != std::sregex_iterator(); ++it) {
    ++failures;
    const std::string msg = (*it)[1], kind = (*it)[2], body = (*it)[3];
    EXPECT_NE(msg.find(kind + ":"), std::string::npos) << msg;
    EXPECT_NE(msg.find(kind == "waste" ? "unused buffer " : "overshoot "), std::string::npos) << msg;
    EXPECT_TRUE(std::regex_search(msg, std::regex("seed 0x[0-9a-f]+"))) << msg;
    EXPECT_NE(msg.find("replay from the folder of junit.xml: vramfuzz "), std::string::npos) << msg;
    EXPECT_NE(body.find("repro: "), std::string::npos) << body;
  }
  // One failing testcase per cell and property with a (new) signature of that property's kind.
  std::size_t expected = 0;
  for (const Json& c : doc()["matrix"]["cells"]) {
    bool p1 = false, p2 = false, p3 = false, p4 = false;
    for (const Json& f : c["findings"]) {
      const std::string sig = f["signature"].get<std::string>();
      p1 |= sig.rfind("violation:", 0) == 0;
      p2 |= sig.rfind("oom:", 0) == 0;
      p3 |= sig.rfind("waste:", 0) == 0;
      p4 |= sig.rfind("knee:", 0) == 0;
    }
    expected += (p1 ? 1 : 0) + (p2 ? 1 : 0) + (p3 ? 1 : 0) + (p4 ? 1 : 0);
  }
  EXPECT_EQ(failures, expected);
  EXPECT_GE(failures, 2u);
  const std::regex suites(R"re(<testsuites name="vramfuzz" tests="16" failures="([0-9]+)")re");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(xml, m, suites)) << xml.substr(0, 300);
  EXPECT_EQ(std::stoul(m[1]), failures);
}

TEST_F(Reports, EachTestcaseHasOneOutcomeEvenWithBackendErrors) {
  // A cell with both a new finding and backend errors: CI reporters read a testcase's first child
  // and compute passed = tests - failures - errors - skipped, so a testcase must carry one outcome
  // (failure first; its errors go into the failure's text) and the totals must add up.
  Json doc2 = doc();
  for (Json& c : doc2["matrix"]["cells"]) c["errors"] = 2;
  const std::string xml = report::junit_xml(doc2, (dir() / "out").string());
  const std::regex testcase(R"re(<testcase [^>]*?(/>|>([\s\S]*?)</testcase>))re");
  std::size_t n = 0, failures = 0, errors = 0, skipped = 0;
  for (auto it = std::sregex_iterator(xml.begin(), xml.end(), testcase); it != std::sregex_iterator(); ++it) {
    ++n;
    const std::string inner = (*it)[2];
    const std::size_t f = count(inner, "<failure "), e = count(inner, "<error "), k = count(inner, "<skipped ");
    EXPECT_EQ(f + e + k, 1u) << inner;  // every cell has errors now: no testcase passes
    if (f == 1) {
      EXPECT_NE(inner.find("also: 2 of "), std::string::npos) << inner;
    }
    failures += f;
    errors += e;
    skipped += k;
  }
  EXPECT_EQ(n, 16u);
  EXPECT_GE(failures, 2u);
  EXPECT_EQ(failures + errors + skipped, n);
  EXPECT_NE(xml.find(fmt::format("<testsuites name=\"vramfuzz\" tests=\"16\" failures=\"{}\" errors=\"{}\"", failures, errors)),
            std::string::npos)
      << xml.substr(0, 300);
}

// The findings table's repro column says how many of a repro's modules are repeats (a rounding
// sum written as one module and N pads reads as two rows in repro.md, not as N + 1 modules).
TEST(ReproSize, SaysHowManyModulesAreRepeats) {
  EXPECT_EQ(report::repro_size(Json{{"repro_modules", 1}}), "1 module");
  EXPECT_EQ(report::repro_size(Json{{"repro_modules", 3}, {"repro_repeats", 0}}), "3 modules");
  EXPECT_EQ(report::repro_size(Json{{"repro_modules", 370}, {"repro_repeats", 369}}), "370 modules, 369 of them repeats");
}

TEST_F(Reports, SchemaRejectsAFailureWithoutMessage) {
  // The schema has teeth: the same file with a failure's message removed does not validate.
  if (which("xmllint").empty()) GTEST_SKIP() << "xmllint missing: ci/install-deps.sh installs libxml2-utils";
  std::string xml = read_file(files().junit);
  const auto pos = xml.find("<failure message=\"");
  ASSERT_NE(pos, std::string::npos);
  const auto end = xml.find("\" type=", pos);
  xml.erase(pos + 9, end + 1 - (pos + 9));  // "<failure " + " type=..."
  const fs::path broken = dir() / "broken.xml";
  std::ofstream(broken) << xml;
  const test::Proc p = xmllint(broken);
  EXPECT_NE(p.exit_code, 0) << test::describe(p);
  EXPECT_NE(p.err.find("message"), std::string::npos) << test::describe(p);
}

TEST_F(Reports, DrawnPolicyGivesEightyTestcases) {
  Catalog catalog;
  SimBackend sim;
  CampaignConfig cfg;
  cfg.cases = 40;
  cfg.shrink = false;
  const CampaignResult r = run_campaign(cfg, catalog, sim);
  const Json d = report::summary_from_campaign(cfg, r, report::run_info("fuzz", "x", "sim", ""));
  const std::string xml = report::junit_xml(d, ".");
  EXPECT_EQ(count(xml, "<testcase "), 80u) << "5 presets x 4 modes x 4 properties";
  EXPECT_EQ(count(xml, "<testsuite "), 5u);
  // Combinations ComfyUI cannot run are skipped, saying why.
  EXPECT_NE(xml.find("ComfyUI removes expandable_segments"), std::string::npos);
  if (which("xmllint").empty()) return;
  const fs::path f = dir() / "drawn.xml";
  std::ofstream(f) << xml;
  const test::Proc p = xmllint(f);
  EXPECT_EQ(p.exit_code, 0) << test::describe(p);
}

TEST_F(Reports, MarkdownStartsWithTheVerdict) {
  const std::string md = read_file(files().markdown);
  const std::size_t fresh = report::get_u64(doc()["counts"], "new_signatures");
  ASSERT_GT(fresh, 0u);
  EXPECT_EQ(md.substr(0, md.find('\n')), "## vramfuzz fuzz: " + std::to_string(fresh) + " new signature" + (fresh == 1 ? "" : "s"));
  EXPECT_NE(md.find("| signature | why | policy | count | worst overshoot | of device | repro | reliability | corpus |"), std::string::npos)
      << md;
  // Repro links are relative to summary.md, and the files exist.
  const std::regex link(R"(\]\((findings/[^)]+/repro\.json)\))");
  std::size_t links = 0;
  for (auto it = std::sregex_iterator(md.begin(), md.end(), link); it != std::sregex_iterator(); ++it) {
    ++links;
    EXPECT_TRUE(fs::exists(dir() / "out" / (*it)[1].str())) << (*it)[1];
  }
  EXPECT_GE(links, 2u) << md;

  // The other two verdicts.
  Json known = doc();
  for (Json& f : known["findings"]) f["known"] = true;
  known["counts"]["new_signatures"] = 0;
  EXPECT_EQ(report::verdict_line(known), "all " + std::to_string(known["findings"].size()) + " signatures known");
  Json nothing = doc();
  nothing["findings"] = Json::array();
  nothing["counts"]["signatures"] = 0;
  nothing["counts"]["new_signatures"] = 0;
  nothing["counts"]["findings"] = 0;
  EXPECT_EQ(report::markdown_summary(nothing, ".").rfind("## vramfuzz fuzz: nothing found\n", 0), 0u);
}

TEST_F(Reports, FindingsAreOrderedBySeverityNewFirstAndSayWhy) {
  // Every finding of the campaign carries its cause and its severity (worst overshoot / device).
  ASSERT_GE(doc()["findings"].size(), 2u);
  for (const Json& f : doc()["findings"]) {
    EXPECT_FALSE(report::get_str(f, "why").empty()) << f.dump().substr(0, 300);
    EXPECT_GT(f.value("severity", 0.0), 0.0) << report::get_str(f, "signature");
  }
  // Three findings: a known one of the highest severity, a new one of 1%, a new one of 25%.
  Json d = doc();
  Json base = d["findings"][0];
  base.erase("case");
  Json a = base, b = base, c = base;
  a["signature"] = "violation:forward:upcast:raw";
  a["known"] = true;
  a["severity"] = 0.5;
  a["why"] = "known and worst";
  b["signature"] = "violation:forward:dequant:raw";
  b["known"] = false;
  b["severity"] = 0.01;
  b["why"] = "new and mild";
  c["signature"] = "oom:forward:upcast:raw";
  c["known"] = false;
  c["severity"] = 0.25;
  c["why"] = "new and severe";
  d["findings"] = Json::array({a, b, c});
  const std::string md = report::markdown_summary(d, ".");
  const std::size_t severe = md.find("| new and severe |"), mild = md.find("| new and mild |"), known = md.find("| known and worst |");
  ASSERT_NE(severe, std::string::npos) << md;
  ASSERT_NE(mild, std::string::npos) << md;
  ASSERT_NE(known, std::string::npos) << md;
  EXPECT_LT(severe, mild);
  EXPECT_LT(mild, known);
  EXPECT_NE(md.find("| 25.00% |"), std::string::npos) << md;
  const std::string html = report::html_report(d, ".");
  EXPECT_LT(html.find("new and severe"), html.find("new and mild"));
  EXPECT_LT(html.find("new and mild"), html.find("known and worst"));
}

TEST_F(Reports, TheTimelineSaysWhatTheLiveBytesAreMadeOf) {
  // Each classic repro's trace carries, per row, the live bytes by kind (weights, weight
  // transients, activations) summing to the row's live column, and each checked stage the plan's
  // budget terms summing to its prediction; the HTML draws them as bands with budget lines.
  std::size_t cases = 0;
  for (const Json& f : doc()["findings"]) {
    if (!f.contains("case")) continue;
    const Json& t = f["case"]["trace"];
    ASSERT_TRUE(t.contains("parts")) << report::get_str(f, "signature");
    ASSERT_EQ(t["parts"].size(), t["rows"].size());
    for (std::size_t i = 0; i < t["rows"].size(); ++i) {
      const Json& p = t["parts"][i];
      EXPECT_EQ(p[0].get<std::uint64_t>() + p[1].get<std::uint64_t>() + p[2].get<std::uint64_t>(), t["rows"][i][2].get<std::uint64_t>());
    }
    for (const Json& st : f["case"]["stages"]) {
      if (!st["checked"].get<bool>()) continue;
      ASSERT_TRUE(st.contains("budget"));
      EXPECT_EQ(st["budget"]["weights"].get<std::uint64_t>() + st["budget"]["offload"].get<std::uint64_t>() +
                    st["budget"]["activation"].get<std::uint64_t>(),
                st["predicted"].get<std::uint64_t>());
    }
    ++cases;
  }
  EXPECT_GE(cases, 2u);
  const std::string html = read_file(files().html);
  EXPECT_GE(count(html, "class=\"part a-weights\""), cases);
  EXPECT_GE(count(html, "class=\"budget b-weights\""), cases);
}

// Other streams' frees in the timeline: a 640 MiB and ten 320 MiB fp16 weights, four of the
// 320 MiB ones offloaded and copied on two offload streams under `caching`, then a small fp8
// weight (10 MiB) upcast on the compute stream, on a card where they pass. A copy is freed on
// its offload stream, so its block stays cached in that stream's pool (op 29 reuses one on its
// own stream); when the last module's 20 MiB fp16 copy is allocated on the compute stream (op
// 49), three such 320 MiB blocks, 960 MiB, could each have held it but may not: the pool grows by
// 20 MiB. The trace carries the held bytes per row (never more than reserved - allocated), and the
// timeline draws them as their own band above allocated instead of inside the slack.
TEST_F(Reports, TheTimelineDrawsOtherStreamsFreesAsTheirOwnBand) {
  const std::string json = R"({"schema": "vramfuzz.scenario/1", "name": "held",
    "device": {"total": "4GiB", "context_overhead": 287047680}, "allocator": {"mode": "caching"},
    "policy": "comfy:oct2025", "offload_streams": 2,
    "workload": {"width": 256, "height": 256, "batch": 1, "cfg": 1.0},
    "models": [{"id": "te", "kind": "text_encoder", "family": "mistral", "compute": "fp16",
                "modules": [{"name": "up_proj", "tensors": [{"name": "weight", "shape": [5120, 65536], "dtype": "fp16"}]},
                            {"name": "down_proj", "repeat": 10,
                             "tensors": [{"name": "weight", "shape": [5120, 32768], "dtype": "fp16"}]},
                            {"name": "lm_head", "tensors": [{"name": "weight", "shape": [5120, 2048], "dtype": "fp8_e4m3fn"}]}]}],
    "pipeline": [{"op": "load", "model": "te"}, {"op": "forward", "model": "te"}]})";
  Catalog catalog;
  SimBackend sim;
  const Scenario s = parse_scenario_json(json, catalog, "held.json");
  const CaseResult r = run_case(s, sim, true);
  const Json cv = report::case_view(s, r, "held", "vramfuzz run held.json");
  const Json& t = cv["trace"];
  ASSERT_TRUE(t.contains("held")) << r.verdict.message;
  ASSERT_EQ(t["held"].size(), t["rows"].size());
  std::uint64_t most = 0;
  for (std::size_t i = 0; i < t["rows"].size(); ++i) {
    const std::uint64_t h = t["held"][i].get<std::uint64_t>();
    EXPECT_LE(h, t["rows"][i][4].get<std::uint64_t>() - t["rows"][i][3].get<std::uint64_t>()) << "row " << i;
    most = std::max(most, h);
  }
  EXPECT_EQ(most, 960 * MiB);
  // Before op 49 no allocation could have used another stream's block (each copy reuses its own
  // stream's): the band is 0 there even after the copies were freed (op 42: 960 MiB cached, held
  // from nothing yet); from the upcast on, all three blocks.
  std::map<std::uint64_t, std::uint64_t> held_at;
  for (std::size_t i = 0; i < t["rows"].size(); ++i) held_at[t["rows"][i][0].get<std::uint64_t>()] = t["held"][i].get<std::uint64_t>();
  ASSERT_TRUE(held_at.count(42) && held_at.count(49)) << t["rows"].dump();
  EXPECT_EQ(held_at[42], 0u);
  EXPECT_EQ(held_at[49], 960 * MiB);
  Json d = doc();
  d["findings"][0]["case"] = cv;
  const std::string html = report::html_report(d, ".");
  EXPECT_EQ(count(html, "class=\"part a-held\""), 1u);
  EXPECT_NE(html.find("rounding / other streams' frees (slack above)"), std::string::npos);
}

TEST_F(Reports, AMergeKeepsTheHigherSeverityAndTheCauseWhicheverReproItKeeps) {
  // Two shards with one finding: the first without a repro but the higher severity and a cause,
  // the second with the repro (which the merge keeps) and neither.
  Json a = doc(), b = doc();
  a["shard"] = {{"index", 0}, {"count", 2}};
  b["shard"] = {{"index", 1}, {"count", 2}};
  Json fa = doc()["findings"][0], fb = doc()["findings"][0];
  ASSERT_FALSE(report::get_str(fb, "repro").empty());
  fa["repro"] = "";
  fa.erase("case");
  fa.erase("reliability");
  fa["severity"] = 0.5;
  fa["why"] = "the first shard's cause";
  fb["severity"] = 0.1;
  fb.erase("why");
  a["findings"] = Json::array({fa});
  b["findings"] = Json::array({fb});
  const Json m = report::merge_summaries({a, b}, {(dir() / "out").string(), (dir() / "out").string()},
                                         report::run_info("merge", "vramfuzz merge a b", "sim", (dir() / "out").string()));
  ASSERT_EQ(m["findings"].size(), 1u);
  const Json& f = m["findings"][0];
  EXPECT_FALSE(report::get_str(f, "repro").empty()) << "the repro is kept";
  EXPECT_EQ(f.value("severity", 0.0), 0.5);
  EXPECT_EQ(report::get_str(f, "why"), "the first shard's cause");
}

TEST_F(Reports, ViolationsBelowMinOvershootAreNoiseNotNew) {
  // The fixture's campaign again with every violation below the threshold (1 TiB): each violation
  // signature is labelled noise, listed as such and not counted as new; OOMs stay new.
  Catalog catalog;
  SimBackend sim;
  CampaignConfig cfg;
  cfg.seed = 1;
  cfg.cases = 60;
  cfg.gen.policy = "comfy:dec2025";
  cfg.shrink = false;
  cfg.min_overshoot = 1024 * GiB;
  const CampaignResult r = run_campaign(cfg, catalog, sim);
  std::size_t violations = 0, ooms = 0;
  for (const auto& [key, c] : r.signatures) {
    const bool violation = key.signature.rfind("violation:", 0) == 0;
    EXPECT_EQ(c.noise, violation) << key.signature;
    violations += violation;
    ooms += !violation;
  }
  ASSERT_GT(violations, 0u);
  EXPECT_EQ(r.new_signatures(), ooms);
  const Json d = report::summary_from_campaign(cfg, r, report::run_info("fuzz", "vramfuzz fuzz --min-overshoot 1TiB", "sim", ""));
  EXPECT_EQ(d["config"]["min_overshoot"], 1024 * GiB);
  EXPECT_EQ(report::get_u64(d["counts"], "new_signatures"), ooms);
  for (const Json& f : d["findings"]) EXPECT_EQ(f.value("noise", false), report::get_str(f, "kind") == "violation");
  const std::string md = report::markdown_summary(d, ".");
  EXPECT_NE(md.find("| noise: below --min-overshoot 1048576.00 MiB |"), std::string::npos) << md;
  // JUnit: no violation fails a testcase; they are listed as skipped, within the noise.
  const std::string junit = report::junit_xml(d, ".");
  EXPECT_EQ(junit.find("<failure message=\"violation:"), std::string::npos) << junit;
  EXPECT_NE(junit.find("rounding noise (below --min-overshoot)"), std::string::npos) << junit;
  // The same campaign at 0 counts every signature as new.
  cfg.min_overshoot = 0;
  EXPECT_EQ(run_campaign(cfg, catalog, sim).new_signatures(), violations + ooms);
}

TEST_F(Reports, SummaryCarriesTheTraceOfEachRepro) {
  for (const Json& f : report::get_arr(doc(), "findings")) {
    if (!f.contains("case")) continue;
    const Json& c = f["case"];
    SCOPED_TRACE(f["signature"].get<std::string>());
    ASSERT_FALSE(c["trace"]["rows"].empty());
    EXPECT_EQ(c["trace"]["columns"], Json::parse(R"(["op","stage","live","allocated","reserved","device_used"])"));
    EXPECT_FALSE(c["stages"].empty());
    for (const Json& st : c["stages"]) {
      if (st["checked"].get<bool>()) {
        EXPECT_EQ(st["limit"].get<Bytes>(), st["predicted"].get<Bytes>() + c["verdict"]["reserve"].get<Bytes>());
      }
    }
    EXPECT_FALSE(c["loads"].empty());
    for (const Json& l : c["loads"]) EXPECT_TRUE(l["uncounted"].is_number_unsigned()) << l.dump();
    EXPECT_FALSE(c["around_peak"].empty());
    if (c["verdict"]["kind"] == "oom") {
      EXPECT_TRUE(c["oom"].is_object());
    }
  }
}

TEST_F(Reports, ReportRerendersTheSameFilesFromSummaryJsonAlone) {
  // Only summary.json, in a new place: `report` must produce the same bytes (links move with it).
  const fs::path copy = dir() / "copy" / "out";
  fs::create_directories(copy);
  fs::copy_file(files().summary, copy / "summary.json");
  const Json loaded = report::relocated(report::load_summary(copy.string()), copy.string());
  const Json again = report::relocated(report::load_summary((dir() / "out").string()), (dir() / "out").string());
  EXPECT_EQ(report::junit_xml(again, (dir() / "out").string()), read_file(files().junit));
  EXPECT_EQ(report::markdown_summary(again, (dir() / "out").string()), read_file(files().markdown));
  EXPECT_EQ(report::html_report(again, (dir() / "out").string()), read_file(files().html));
  EXPECT_EQ(report::dump_summary(again), read_file(files().summary));
  // Moved: the links are the same relative links, the replay commands follow the move.
  EXPECT_EQ(report::markdown_summary(loaded, copy.string()).substr(0, 200), read_file(files().markdown).substr(0, 200));
  for (const Json& f : loaded["findings"]) {
    if (!f["repro"].get<std::string>().empty()) {
      EXPECT_EQ(f["repro"].get<std::string>().rfind(copy.string(), 0), 0u) << f["repro"];
    }
  }
}

TEST_F(Reports, HtmlIsSelfContained) {
  const std::string html = read_file(files().html);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
  EXPECT_EQ(html.find("url("), std::string::npos);
  EXPECT_EQ(html.find("<script src"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  // The only URL is the SVG namespace.
  std::string stripped = html;
  for (std::size_t pos; (pos = stripped.find("http://www.w3.org/2000/svg")) != std::string::npos;) stripped.erase(pos, 26);
  EXPECT_EQ(stripped.find("http://"), std::string::npos);
  EXPECT_EQ(stripped.find("https://"), std::string::npos);
  // A timeline per finding with a repro, with its step lines and the predicted + reserve line.
  std::size_t with_case = 0;
  for (const Json& f : report::get_arr(doc(), "findings")) with_case += f.contains("case") ? 1 : 0;
  EXPECT_EQ(count(html, "aria-label=\"memory timeline\""), with_case);
  EXPECT_GE(count(html, "class=\"s-limit\""), with_case);
  EXPECT_GE(count(html, "class=\"s-reserved\""), with_case);
}

// ---- a real browser ------------------------------------------------------------------------------

struct Rgb {
  std::vector<unsigned char> px;
  unsigned width = 0, height = 0;
};

// libpng's simplified API: the whole image as 8-bit RGB.
Rgb read_png(const std::string& path) {
  Rgb out;
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&img, path.c_str())) return out;
  img.format = PNG_FORMAT_RGB;
  out.px.resize(PNG_IMAGE_SIZE(img));
  if (!png_image_finish_read(&img, nullptr, out.px.data(), 0, nullptr)) {
    out.px.clear();
    return out;
  }
  out.width = img.width;
  out.height = img.height;
  return out;
}

class Browser : public Reports {
 protected:
  void SetUp() override {
    chromium_ = which("chromium");
    if (chromium_.empty()) chromium_ = which("chromium-browser");
    if (chromium_.empty()) GTEST_SKIP() << "chromium missing: `make test` installs it (ci/install-deps.sh chromium)";
  }
  test::Proc run_chromium(const std::vector<std::string>& extra, const std::string& url) {
    std::vector<std::string> args{"--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars", "--enable-logging=stderr",
                                  "--v=0", "--user-data-dir=" + (dir() / "chromium-profile").string()};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back(url);
    return test::run_process(chromium_, args, dir(), 90);
  }
  static std::vector<std::string> console_lines(const std::string& err) {
    std::vector<std::string> out;
    std::istringstream in(err);
    for (std::string line; std::getline(in, line);) {
      if (line.find(":CONSOLE") != std::string::npos || line.find("CONSOLE(") != std::string::npos) out.push_back(line);
    }
    return out;
  }
  std::string chromium_;
};

TEST_F(Browser, ConsoleMessagesAreDetected) {
  // The detector itself: a page that logs an error and throws is caught.
  const fs::path page = dir() / "bad.html";
  std::ofstream(page) << "<!DOCTYPE html><html><body><script>console.error('boom'); missingFunction();</script></body></html>";
  const test::Proc p = run_chromium({"--dump-dom"}, "file://" + page.string());
  EXPECT_GE(console_lines(p.err).size(), 2u) << test::describe(p);
}

TEST_F(Browser, HtmlRendersWithoutConsoleMessages) {
  const std::string url = "file://" + fs::absolute(files().html).string();
  const test::Proc p = run_chromium({"--dump-dom"}, url);
  ASSERT_FALSE(p.timed_out) << test::describe(p);
  EXPECT_EQ(p.exit_code, 0) << test::describe(p);
  const std::vector<std::string> console = console_lines(p.err);
  EXPECT_TRUE(console.empty()) << "console: " << (console.empty() ? "" : console.front());
  // The DOM after scripts ran: the timelines and every signature are there.
  EXPECT_NE(p.out.find("<svg"), std::string::npos);
  for (const Json& f : report::get_arr(doc(), "findings")) EXPECT_NE(p.out.find(f["signature"].get<std::string>()), std::string::npos);
}

TEST_F(Browser, ScreenshotIsNotBlankAndShowsTheTimeline) {
  const fs::path png = dir() / "shot.png";
  const std::string url = "file://" + fs::absolute(files().html).string();
  const test::Proc p = run_chromium({"--screenshot=" + png.string(), "--window-size=1400,2000"}, url);
  ASSERT_TRUE(fs::exists(png)) << test::describe(p);
  EXPECT_TRUE(console_lines(p.err).empty()) << test::describe(p);
  const Rgb img = read_png(png.string());
  ASSERT_EQ(img.width, 1400u);
  ASSERT_EQ(img.height, 2000u);
  std::size_t not_background = 0, fill = 0, blue = 0, orange = 0, weights = 0, bands = 0;
  for (std::size_t i = 0; i + 2 < img.px.size(); i += 3) {
    const int r = img.px[i], g = img.px[i + 1], b = img.px[i + 2];
    if (r < 245 || g < 245 || b < 245) ++not_background;
    // The reserved area: #2563eb at 10% over white = (233, 239, 253), only inside the SVG.
    if (std::abs(r - 233) <= 3 && std::abs(g - 239) <= 3 && std::abs(b - 253) <= 3) ++fill;
    // The stacked bands: weights #cbd5e1, weight transients #fde68a, activations #bbf7d0.
    auto near = [&](int R, int G, int B) { return std::abs(r - R) <= 3 && std::abs(g - G) <= 3 && std::abs(b - B) <= 3; };
    if (near(203, 213, 225)) ++weights;
    if (near(253, 230, 138) || near(187, 247, 208)) ++bands;
    // The reserved line (#2563eb) and the predicted + reserve line (#ea580c).
    if (r < 70 && g > 80 && g < 120 && b > 215) ++blue;
    if (r > 215 && g > 70 && g < 110 && b < 40) ++orange;
  }
  const double total = static_cast<double>(img.width) * img.height;
  EXPECT_GT(not_background / total, 0.05) << not_background << " of " << total << " pixels differ from white";
  EXPECT_GT(fill + weights + bands, 5000u) << "the area under allocator reserved";
  EXPECT_GT(weights, 2000u) << "the resident weights' band";
  EXPECT_GT(bands, 2000u) << "the weight transients' and activations' bands";
  EXPECT_GT(blue, 300u) << "the reserved line";
  EXPECT_GT(orange, 100u) << "the predicted + reserve line";
}

// diff.html in a browser: it renders without console messages, and the A / B bars are drawn
// (blue #2563eb and orange #ea580c, solid).
TEST_F(Browser, DiffHtmlRendersAndDrawsEachFieldsBars) {
  Catalog catalog;
  SimBackend sim;
  DiffConfig cfg;
  cfg.seed = 1;
  cfg.cases = 60;
  cfg.gen.policy = "comfy:dec2025";
  cfg.against = "comfy:nov2025";
  cfg.shrink_execs = 20;
  const DiffResult r = run_diff(cfg, catalog, sim);
  ASSERT_FALSE(r.groups.empty());
  const fs::path page = dir() / "diff.html";
  std::ofstream(page) << report::diff_html(Json::parse(diff_json(cfg, r, {}, "vramfuzz diff --against comfy:nov2025")));
  const test::Proc dom = run_chromium({"--dump-dom"}, "file://" + page.string());
  ASSERT_EQ(dom.exit_code, 0) << test::describe(dom);
  EXPECT_TRUE(console_lines(dom.err).empty()) << test::describe(dom);
  EXPECT_NE(dom.out.find("diffbars"), std::string::npos);
  const fs::path png = dir() / "diff.png";
  const test::Proc shot = run_chromium({"--screenshot=" + png.string(), "--window-size=1200,1600"}, "file://" + page.string());
  ASSERT_TRUE(fs::exists(png)) << test::describe(shot);
  const Rgb img = read_png(png.string());
  ASSERT_EQ(img.width, 1200u);
  std::size_t blue = 0, orange = 0;
  for (std::size_t i = 0; i + 2 < img.px.size(); i += 3) {
    const int R = img.px[i], G = img.px[i + 1], B = img.px[i + 2];
    if (std::abs(R - 0x25) <= 4 && std::abs(G - 0x63) <= 4 && std::abs(B - 0xeb) <= 4) ++blue;
    if (std::abs(R - 0xea) <= 4 && std::abs(G - 0x58) <= 4 && std::abs(B - 0x0c) <= 4) ++orange;
  }
  EXPECT_GT(blue, 500u) << "A's bars";
  EXPECT_GT(orange, 500u) << "B's bars";
}

}  // namespace
}  // namespace vf
