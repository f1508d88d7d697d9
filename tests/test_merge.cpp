// Running vramfuzz for real, as a process: shards and `merge` (the union of shards is one run),
// `--devices` worker processes, SIGTERM mid-campaign (reports complete, findings on disk), the
// `--time` budget with shrinking (the corpus replay inside it), the progress line, and `report`
// re-rendering from summary.json, also after the merged tree moved.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tests/run_cli.h"

#ifndef VF_CLI
#error "VF_CLI must name the vramfuzz executable (tests/CMakeLists.txt)"
#endif

namespace vf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::describe;
using test::expect_clean;
using test::Proc;

using test::read_file;

class Merge : public test::TempDirTest {
 protected:
  Proc run(const std::vector<std::string>& args, int timeout_s = 60) { return test::run_process(VF_CLI, args, dir_, timeout_s); }
  json summary(const std::string& out) { return json::parse(read_file(dir_ / out / "summary.json")); }
  // signature -> (count, worst overshoot)
  static std::map<std::string, std::pair<std::uint64_t, std::int64_t>> findings(const json& s) {
    std::map<std::string, std::pair<std::uint64_t, std::int64_t>> out;
    for (const json& f : s["findings"]) out[f["signature"]] = {f["count"].get<std::uint64_t>(), f["worst_overshoot"].get<std::int64_t>()};
    return out;
  }
};

const std::vector<std::string> kCampaign{"fuzz", "--cases", "120", "--seed", "3", "--policy", "comfy:dec2025", "--shrink-execs", "40"};

std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

TEST_F(Merge, MergeOfShardsEqualsOneRunOverTheUnion) {
  const Proc all = run(with(kCampaign, {"--out", "all"}));
  const Proc s0 = run(with(kCampaign, {"--shard", "0/2", "--out", "s0"}));
  const Proc s1 = run(with(kCampaign, {"--shard", "1/2", "--out", "s1"}));
  for (const Proc* p : {&all, &s0, &s1}) {
    expect_clean(*p);
    ASSERT_TRUE(p->exit_code == 0 || p->exit_code == 1) << describe(*p);
  }
  const json a = summary("all"), j0 = summary("s0"), j1 = summary("s1");
  EXPECT_EQ(j0["counts"]["cases"].get<int>() + j1["counts"]["cases"].get<int>(), 120);
  EXPECT_EQ(j0["shard"]["index"], 0);
  EXPECT_EQ(j1["shard"]["count"], 2);
  ASSERT_FALSE(findings(a).empty()) << "the campaign must find something for the comparison to mean anything";

  const Proc m = run({"merge", "s0", "s1", "--out", "merged"});
  expect_clean(m);
  EXPECT_EQ(m.exit_code, all.exit_code) << describe(m);
  const json merged = summary("merged");
  EXPECT_EQ(findings(merged), findings(a)) << "same signatures, counts and worst overshoots";
  for (const char* k : {"cases", "findings", "signatures", "new_signatures", "expected_ooms", "errors"}) {
    EXPECT_EQ(merged["counts"][k], a["counts"][k]) << k;
  }
  EXPECT_EQ(merged["matrix"]["cells"], a["matrix"]["cells"]);
  // The repro kept is the one of the earliest case, as in the single run.
  std::map<std::string, std::uint64_t> first_a, first_m;
  for (const json& f : a["findings"]) first_a[f["signature"]] = f["first_case_seed"];
  for (const json& f : merged["findings"]) {
    first_m[f["signature"]] = f["first_case_seed"];
    EXPECT_TRUE(fs::exists(dir_ / f["repro"].get<std::string>())) << f["repro"];
  }
  EXPECT_EQ(first_m, first_a);
  for (const char* f : {"report.html", "junit.xml", "summary.md"}) EXPECT_TRUE(fs::exists(dir_ / "merged" / f)) << f;
  // The merged config is the campaign's, not its first shard's.
  EXPECT_EQ(merged["config"]["shard"], "merged");
  EXPECT_EQ(merged["config"]["cases"], 120) << "two shards of one 120-case campaign";
  EXPECT_EQ(merged["config"]["policy"], "comfy:dec2025");
  EXPECT_NE(read_file(dir_ / "merged" / "junit.xml").find("<property name=\"shard\" value=\"merged\"/>"), std::string::npos);
}

// signature x count: overshoot, seed: each JUnit failure or skip line without its replay path.
std::multiset<std::string> junit_seeds(const std::string& xml) {
  static const std::regex line(R"(([a-z]+:[^ ;"]+) x(\d+): overshoot ([^,]+), seed (0x[0-9a-f]+))");
  std::multiset<std::string> out;
  for (auto it = std::sregex_iterator(xml.begin(), xml.end(), line); it != std::sregex_iterator(); ++it) out.insert(it->str());
  return out;
}

TEST_F(Merge, ADamagedSummaryIsBadInputNamingTheField) {
  // A summary.json whose findings are not a list would render as "nothing found": refused instead,
  // exit 2, naming the field; report and merge alike.
  const Proc ok = run({"fuzz", "--cases", "20", "--seed", "3", "--no-shrink", "--out", "ok"});
  ASSERT_TRUE(ok.exit_code == 0 || ok.exit_code == 1) << describe(ok);
  json doc = summary("ok");
  doc["findings"] = "x";
  fs::create_directories(dir_ / "dmg");
  std::ofstream(dir_ / "dmg" / "summary.json") << doc.dump();
  const Proc rep = run({"report", "dmg"});
  EXPECT_EQ(rep.exit_code, 2) << describe(rep);
  EXPECT_NE(rep.err.find("dmg/summary.json.findings: expected an array"), std::string::npos) << describe(rep);
  const Proc mer = run({"merge", "ok", "dmg", "--out", "m"});
  EXPECT_EQ(mer.exit_code, 2) << describe(mer);
  EXPECT_NE(mer.err.find("findings: expected an array"), std::string::npos) << describe(mer);
  doc = summary("ok");
  doc["findings"] = json::array({json{{"count", 1}}});
  std::ofstream(dir_ / "dmg" / "summary.json") << doc.dump();
  const Proc sig = run({"report", "dmg"});
  EXPECT_EQ(sig.exit_code, 2) << describe(sig);
  EXPECT_NE(sig.err.find("findings[0].signature: required field is missing"), std::string::npos) << describe(sig);
}

TEST_F(Merge, NullAndDuplicateKeysInASummaryAreBadInput) {
  // counts.new_signatures: null read as 0: `report` exited 0 ("nothing new") for a run that found
  // something. null means something only at a case's `oom` and a mode's `verified_need`.
  const Proc ok = run({"fuzz", "--cases", "20", "--seed", "3", "--no-shrink", "--out", "ok"});
  ASSERT_TRUE(ok.exit_code == 0 || ok.exit_code == 1) << describe(ok);
  fs::create_directories(dir_ / "dmg");
  json doc = summary("ok");
  doc["counts"]["new_signatures"] = nullptr;
  std::ofstream(dir_ / "dmg" / "summary.json") << doc.dump();
  const Proc rep = run({"report", "dmg"});
  EXPECT_EQ(rep.exit_code, 2) << describe(rep);
  EXPECT_NE(rep.err.find("dmg/summary.json.counts.new_signatures: null is not allowed"), std::string::npos) << describe(rep);
  const Proc mer = run({"merge", "ok", "dmg", "--out", "m"});
  EXPECT_EQ(mer.exit_code, 2) << describe(mer);
  // A key given twice: the last one would win.
  std::string text = read_file(dir_ / "ok" / "summary.json");
  const auto at = text.find("\"counts\": {");
  ASSERT_NE(at, std::string::npos) << text.substr(0, 400);
  text.insert(at + 11, "\"new_signatures\": 0, ");
  std::ofstream(dir_ / "dmg" / "summary.json") << text;
  const Proc dup = run({"report", "dmg"});
  EXPECT_EQ(dup.exit_code, 2) << describe(dup);
  EXPECT_NE(dup.err.find("counts.new_signatures: key given twice"), std::string::npos) << describe(dup);
  // The two documented nulls load (a case without an OOM is written with "oom": null).
  EXPECT_EQ(run({"report", "ok"}).exit_code, summary("ok")["counts"]["new_signatures"].get<std::uint64_t>() > 0 ? 1 : 0);
}

TEST_F(Merge, MergedJunitShowsTheSeedOfTheEarliestCaseWhateverTheShardOrder) {
  const Proc all = run(with(kCampaign, {"--out", "all"}));
  const Proc s0 = run(with(kCampaign, {"--shard", "0/2", "--out", "s0"}));
  const Proc s1 = run(with(kCampaign, {"--shard", "1/2", "--out", "s1"}));
  for (const Proc* p : {&all, &s0, &s1}) ASSERT_TRUE(p->exit_code == 0 || p->exit_code == 1) << describe(*p);
  // Shard 1 first: the first shard given must not decide.
  const Proc m = run({"merge", "s1", "s0", "--out", "merged"});
  ASSERT_TRUE(m.exit_code == 0 || m.exit_code == 1) << describe(m);
  const std::multiset<std::string> a = junit_seeds(read_file(dir_ / "all" / "junit.xml"));
  ASSERT_FALSE(a.empty()) << "the campaign must find something";
  EXPECT_EQ(junit_seeds(read_file(dir_ / "merged" / "junit.xml")), a);
  // Next to each seed, the repro of that same case.
  for (const json& f : summary("merged")["findings"]) {
    if (f["repro"].get<std::string>().empty()) continue;
    const json repro = json::parse(read_file(dir_ / f["repro"].get<std::string>()));
    EXPECT_NE(repro.dump().find(std::to_string(f["first_case_seed"].get<std::uint64_t>())), std::string::npos) << f["repro"];
  }
}

// The finding of `sig` in a summary (null when it has none).
json finding_of(const json& s, const std::string& sig) {
  for (const json& f : s["findings"]) {
    if (f["signature"] == sig) return f;
  }
  return nullptr;
}

const std::string kCorpus = (fs::path(VF_SOURCE_DIR) / "fuzz" / "corpus" / "regressions").string();

TEST_F(Merge, TheCorpusKnowsAFindingOnlyUnderThePolicyOfItsRepro) {
  // The nightly's configuration: comfy:dec2025 with the regression corpus. The corpus has
  // oom:forward:upcast:raw twice, under comfy:oct2025 (origin-oct2025) and under comfy:dec2025
  // with dequant_term=false (origin-dec04-no-dequant-term); neither says anything about stock
  // comfy:dec2025, so its own upcast OOM (seed 3, case 360) is new: shrunk, failing, exit 1.
  const Proc dec = run({"fuzz", "--seed", "3", "--cases", "361", "--policy", "comfy:dec2025", "--allocator", "raw", "--corpus", kCorpus,
                        "--shrink-execs", "40", "--out", "dec"});
  expect_clean(dec);
  EXPECT_EQ(dec.exit_code, 1) << describe(dec);
  const json f = finding_of(summary("dec"), "oom:forward:upcast:raw");
  ASSERT_TRUE(f.is_object()) << summary("dec")["findings"];
  EXPECT_EQ(f["policy"], "comfy:dec2025");
  EXPECT_FALSE(f["known"].get<bool>());
  EXPECT_TRUE(f["known_by"].empty());
  EXPECT_EQ(f["corpus_other_policies"], json::array({"comfy:dec2025 dequant_term=false", "comfy:oct2025"}));
  EXPECT_FALSE(f["repro"].get<std::string>().empty()) << "a new finding is shrunk";
  EXPECT_EQ(f["repro"], "dec/findings/comfy-dec2025/oom-forward-upcast-raw/repro.json");
  const std::string junit = read_file(dir_ / "dec" / "junit.xml");
  const std::regex p2(R"re(<testcase classname="vramfuzz.comfy:dec2025.raw" name="P2 no-unpredicted-oom \[raw\]" [^>]*>\s*<failure message="([^"]*)")re");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(junit, m, p2)) << junit;
  EXPECT_NE(m[1].str().find("oom:forward:upcast:raw x1"), std::string::npos) << m[1];
  EXPECT_NE(m[1].str().find("; why: weight transients "), std::string::npos) << m[1];
  EXPECT_NE(m[1].str().find("policy comfy:dec2025 (new under this policy; the corpus has it under comfy:dec2025 dequant_term=false; "
                            "comfy:oct2025)"),
            std::string::npos)
      << m[1];
  const std::string md = read_file(dir_ / "dec" / "summary.md");
  const std::size_t row = md.find("| oom:forward:upcast:raw | weight transients ");
  ASSERT_NE(row, std::string::npos) << md;
  EXPECT_NE(md.substr(row, md.find('\n', row) - row).find("| comfy:dec2025 | 1 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| new; the corpus has it under comfy:dec2025 dequant_term=false; comfy:oct2025 |"), std::string::npos) << md;

  // Under the policies of the corpus repros, the same signature is known (seed 4, case 28): by the
  // repro of that policy, named; the overrides compare in canonical form (0 = false).
  const std::vector<std::string> known_runs[] = {{"--policy", "comfy:oct2025", "--out", "oct"},
                                                 {"--policy", "comfy:dec2025", "--set", "dequant_term=0", "--out", "dec04"}};
  for (const auto& extra : known_runs) {
    const Proc p = run(with({"fuzz", "--seed", "4", "--cases", "40", "--allocator", "raw", "--corpus", kCorpus, "--shrink-execs", "40"}, extra));
    expect_clean(p);
    EXPECT_EQ(p.exit_code, 0) << describe(p);
  }
  const json oct = finding_of(summary("oct"), "oom:forward:upcast:raw"), dec04 = finding_of(summary("dec04"), "oom:forward:upcast:raw");
  ASSERT_TRUE(oct.is_object() && dec04.is_object());
  EXPECT_TRUE(oct["known"].get<bool>());
  EXPECT_EQ(oct["known_by"], json::array({kCorpus + "/origin-oct2025/repro.json"}));
  EXPECT_EQ(oct["repro"], "") << "known: not shrunk";
  EXPECT_EQ(dec04["policy"], "comfy:dec2025 dequant_term=false");
  EXPECT_TRUE(dec04["known"].get<bool>());
  EXPECT_EQ(dec04["known_by"], json::array({kCorpus + "/origin-dec04-no-dequant-term/repro.json"}));
  EXPECT_NE(read_file(dir_ / "oct" / "summary.md").find("| known (origin-oct2025/repro.json) |"), std::string::npos);
  EXPECT_NE(read_file(dir_ / "oct" / "junit.xml").find("<skipped message=\"known (in the regression corpus under the same policy): "
                                                        "oom:forward:upcast:raw x"),
            std::string::npos);

  // A merge decides by the same key: the stock dec2025 finding stays new next to the known ones.
  const Proc merged = run({"merge", "dec", "oct", "dec04", "--out", "merged"});
  expect_clean(merged);
  EXPECT_EQ(merged.exit_code, 1) << describe(merged);
  const json ms = summary("merged");
  std::map<std::string, bool> known;
  for (const json& g : ms["findings"]) {
    if (g["signature"] == "oom:forward:upcast:raw") known[g["policy"]] = g["known"];
  }
  EXPECT_EQ(known, (std::map<std::string, bool>{{"comfy:dec2025", false}, {"comfy:dec2025 dequant_term=false", true}, {"comfy:oct2025", true}}));
}

TEST_F(Merge, RecordedCommandsRegenerateTheRunAndEachCase) {
  // summary.json's command and each repro's "Found by" carry every option that decides the cases
  // and their verdicts, the corpus and the shard included: re-run from elsewhere, the summary's
  // gives the same findings and exit code; a repro's gives its case.
  const Proc all_known = run({"fuzz", "--seed", "4", "--cases", "40", "--shard", "0/2", "--policy", "comfy:oct2025", "--allocator", "raw",
                              "--corpus", kCorpus, "--no-shrink", "--out", "a"});
  EXPECT_EQ(all_known.exit_code, 0) << "only the known upcast OOM\n" << describe(all_known);
  const Proc found = run({"fuzz", "--seed", "4", "--cases", "50", "--shard", "0/2", "--policy", "comfy:oct2025", "--allocator", "raw",
                          "--corpus", kCorpus, "--shrink-execs", "40", "--out", "b"});
  EXPECT_EQ(found.exit_code, 1) << "case 46 is a new violation\n" << describe(found);
  const fs::path bin = dir_ / "bin";
  for (const auto& [out, code] : std::vector<std::pair<std::string, int>>{{"a", 0}, {"b", 1}}) {
    SCOPED_TRACE(out);
    const std::string command = summary(out)["command"];
    EXPECT_NE(command.find(" --corpus " + kCorpus), std::string::npos) << command;
    fs::create_directories(dir_ / "again");
    const Proc again = test::run_pasted(VF_CLI, command, dir_ / "again", bin);
    expect_clean(again);
    EXPECT_EQ(again.exit_code, code) << command << "\n" << describe(again);
    json s = summary(out), t = json::parse(read_file(dir_ / "again" / out / "summary.json"));
    EXPECT_EQ(t["command"], s["command"]);
    s["counts"].erase("seconds");
    t["counts"].erase("seconds");
    EXPECT_EQ(t["counts"], s["counts"]);
    for (const json& f : s["findings"]) {
      const json g = finding_of(t, f["signature"]);
      ASSERT_TRUE(g.is_object()) << f["signature"];
      for (const char* k : {"policy", "count", "first_case_seed", "known"}) EXPECT_EQ(g[k], f[k]) << k;
    }
  }
  // The new finding's repro says which command's last case it is.
  const json f = finding_of(summary("b"), "violation:forward:upcast:raw");
  ASSERT_TRUE(f.is_object() && !f["repro"].get<std::string>().empty()) << summary("b")["findings"];
  const json repro = json::parse(read_file(dir_ / f["repro"].get<std::string>()));
  const std::string found_by = repro["origin"]["found_by"];
  EXPECT_EQ(found_by, "vramfuzz fuzz --seed 4 --cases 47 --policy comfy:oct2025 --allocator raw --backend sim --corpus " + kCorpus +
                          " --shard 0/2");
  const std::string md = read_file(dir_ / fs::path(f["repro"].get<std::string>()).parent_path() / "repro.md");
  EXPECT_NE(md.find("Found by `" + found_by + "`: its last case, case 46"), std::string::npos) << md;
  const Proc regen = test::run_pasted(VF_CLI, found_by + " --no-shrink --out regen", dir_ / "again", bin);
  EXPECT_EQ(regen.exit_code, 1) << describe(regen);
  const fs::path case_file = fs::path("findings") / "comfy-oct2025" / "violation-forward-upcast-raw" /
                             fmt::format("case-{:016x}.json", repro["origin"]["case_seed"].get<std::uint64_t>());
  ASSERT_TRUE(fs::exists(dir_ / "again" / "regen" / case_file)) << case_file;
  const json original = json::parse(read_file(dir_ / "b" / case_file));
  const json regenerated = json::parse(read_file(dir_ / "again" / "regen" / case_file));
  EXPECT_EQ(regenerated["scenario"], original["scenario"]);
  EXPECT_EQ(regenerated["verdict"], original["verdict"]);
}

TEST_F(Merge, InputsThatRanTheSameCasesAreRefusedNamingBoth) {
  // The same shard twice, a copy of it under another name, overlapping shards of one campaign, or a
  // merge together with one of its own shards: each case would count twice. Bad input (exit 2),
  // naming both inputs, nothing written; fuzz and calibrate outputs alike.
  const std::vector<std::string> base{"fuzz", "--cases", "40", "--seed", "5", "--no-shrink"};
  for (const auto& [shard, out] : std::vector<std::pair<std::string, std::string>>{{"0/2", "s0"}, {"1/2", "s1"}, {"0/4", "q0"}}) {
    const Proc p = run(with(base, {"--shard", shard, "--out", out}));
    ASSERT_TRUE(p.exit_code == 0 || p.exit_code == 1) << describe(p);
  }
  fs::copy(dir_ / "s0", dir_ / "s0copy", fs::copy_options::recursive);
  const Proc ok = run({"merge", "s0", "s1", "--out", "m"});
  ASSERT_TRUE(ok.exit_code == 0 || ok.exit_code == 1) << describe(ok);
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{{"s0", "s0"}, {"s0", "s0copy"}, {"q0", "s0"}, {"m", "s1"}}) {
    SCOPED_TRACE(a + " + " + b);
    const Proc p = run({"merge", a, b, "--out", "bad"});
    EXPECT_EQ(p.exit_code, 2) << describe(p);
    EXPECT_NE(p.err.find(a + " and " + b + " ran the same cases"), std::string::npos) << describe(p);
    EXPECT_FALSE(fs::exists(dir_ / "bad" / "summary.json"));
  }
  // Another seed is another campaign: its shard 0/2 merges with this one's.
  const Proc other = run({"fuzz", "--cases", "40", "--seed", "6", "--no-shrink", "--shard", "0/2", "--out", "t0"});
  ASSERT_TRUE(other.exit_code == 0 || other.exit_code == 1) << describe(other);
  const Proc two = run({"merge", "s0", "t0", "--out", "two"});
  EXPECT_TRUE(two.exit_code == 0 || two.exit_code == 1) << describe(two);
  EXPECT_EQ(summary("two")["counts"]["cases"], summary("s0")["counts"]["cases"].get<int>() + summary("t0")["counts"]["cases"].get<int>());

  const std::vector<std::string> calib{"calibrate", "--cases", "10", "--allocator", "raw", "--seed", "4", "--no-shrink",
                                       "--verify-rounds", "0", "--shard", "0/2", "--out", "c0"};
  ASSERT_EQ(run(calib).exit_code, 0);
  const Proc cc = run({"merge", "c0", "c0", "--out", "cc"});
  EXPECT_EQ(cc.exit_code, 2) << describe(cc);
  EXPECT_NE(cc.err.find("c0 and c0 ran the same cases (calibrate seed 4, shard 0/2 and 0/2"), std::string::npos) << describe(cc);
}

TEST_F(Merge, MergedConfigNamesEveryAllocatorAndSumsCampaigns) {
  for (const char* mode : {"raw", "async"}) {
    const Proc p = run({"fuzz", "--cases", "20", "--no-shrink", "--allocator", mode, "--policy", "comfy:dec2025", "--out", mode});
    ASSERT_TRUE(p.exit_code == 0 || p.exit_code == 1) << describe(p);
  }
  const Proc m = run({"merge", "raw", "async", "--out", "m"});
  ASSERT_TRUE(m.exit_code == 0 || m.exit_code == 1) << describe(m);
  const json c = summary("m")["config"];
  EXPECT_EQ(c["allocator"], "raw,async");
  EXPECT_EQ(c["cases"], 40) << "two campaigns of 20";
  EXPECT_EQ(c["shard"], "merged");
  EXPECT_NE(read_file(dir_ / "m" / "summary.md").find("allocator raw,async"), std::string::npos);
  EXPECT_NE(read_file(dir_ / "m" / "report.html").find("allocator raw,async"), std::string::npos);
}

// Every href of an HTML file that names a file (not an anchor or a data: URI).
std::vector<std::string> file_links(const std::string& html) {
  static const std::regex href(R"re(href="([^"#][^"]*)")re");
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), href); it != std::sregex_iterator(); ++it) {
    const std::string h = (*it)[1].str();
    if (h.rfind("data:", 0) != 0 && h.find("://") == std::string::npos) out.push_back(h);
  }
  return out;
}

TEST_F(Merge, ReportOfAMovedMergedTreeLinksToExistingFiles) {
  // A nightly's layout: shard directories and the merged one side by side, then the whole tree
  // downloaded somewhere else (here: renamed) and re-rendered with `report`.
  fs::create_directories(dir_ / "night");
  for (const char* shard : {"0/2", "1/2"}) {
    const std::string out = std::string("night/s") + shard[0];
    const Proc p = run(with(kCampaign, {"--shard", shard, "--out", out}));
    ASSERT_TRUE(p.exit_code == 0 || p.exit_code == 1) << describe(p);
  }
  // Seed 3: 2 of these 40 raw cases violate P1, so the calibration has findings and a repro.
  const std::vector<std::string> calib{"calibrate", "--cases", "40", "--allocator", "raw", "--seed", "3", "--shrink-execs", "20"};
  ASSERT_EQ(run(with(calib, {"--shard", "0/2", "--out", "night/c0"})).exit_code, 0);
  ASSERT_EQ(run(with(calib, {"--shard", "1/2", "--out", "night/c1"})).exit_code, 0);
  const Proc m = run({"merge", "night/s0", "night/s1", "--out", "night/merged"});
  ASSERT_TRUE(m.exit_code == 0 || m.exit_code == 1) << describe(m);
  const Proc cm = run({"merge", "night/c0", "night/c1", "--out", "night/cmerged"});
  EXPECT_EQ(cm.exit_code, 0) << "calibrations with findings still merge to exit 0, as calibrate exits\n" << describe(cm);
  EXPECT_EQ(summary("night/cmerged")["counts"]["findings"], 2);
  fs::rename(dir_ / "night", dir_ / "downloaded");

  for (const char* merged : {"merged", "cmerged"}) {
    SCOPED_TRACE(merged);
    const fs::path here = dir_ / "downloaded" / merged;
    const Proc r = run({"report", (fs::path("downloaded") / merged).string()});
    expect_clean(r);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    std::size_t files = 0;
    for (const char* page : {"report.html", "summary.md"}) {
      const std::string text = read_file(here / page);
      std::vector<std::string> links = file_links(text);
      if (std::string(page) == "summary.md") {
        static const std::regex md(R"(\]\(([^)#][^)]*)\))");
        links.clear();
        for (auto it = std::sregex_iterator(text.begin(), text.end(), md); it != std::sregex_iterator(); ++it) links.push_back((*it)[1]);
      }
      for (const std::string& l : links) {
        EXPECT_TRUE(fs::exists(here / l)) << page << ": " << l;
        ++files;
      }
    }
    EXPECT_GT(files, 0u) << "the reports link to the repros";
    // JUnit names repros and finding files from its own folder, as its replay commands say.
    const std::string junit = read_file(here / "junit.xml");
    static const std::regex named(R"((?:repro|finding|junit\.xml\)?): (?:vramfuzz (?:replay|run) )?([^ \n;<"(]+\.json))");
    std::size_t named_files = 0;
    for (auto it = std::sregex_iterator(junit.begin(), junit.end(), named); it != std::sregex_iterator(); ++it) {
      EXPECT_TRUE(fs::exists(here / (*it)[1].str())) << "junit.xml: " << (*it)[1];
      ++named_files;
    }
    EXPECT_GT(named_files, 0u);
    // summary.json keeps the paths as merge wrote them: from its recorded --out they reach the files.
    const json s = summary((fs::path("downloaded") / merged).string());
    const fs::path recorded = s["config"]["out"].get<std::string>();
    std::size_t paths = 0;
    auto check = [&](const std::string& p) {
      if (p.empty()) return;
      EXPECT_TRUE(fs::exists(here / fs::path(p).lexically_relative(recorded))) << "summary.json: " << p;
      ++paths;
    };
    for (const json& f : s["findings"]) {
      check(f["repro"]);
      check(f["file"]);
    }
    if (s.contains("calibrate")) {
      for (const json& mode : s["calibrate"]["modes"]) {
        if (mode.contains("worst")) check(mode["worst"]["file"]);
      }
    }
    for (const json& d : s["config"]["merged_from"]) check(d);
    EXPECT_GT(paths, 2u);
  }
}

TEST_F(Merge, CorpusReplayCountsAgainstTheTimeBudget) {
  // A budget far shorter than replaying the regression corpus: the replay runs (it is the point
  // of --corpus), and no case of the campaign does.
  const fs::path corpus = fs::path(VF_SOURCE_DIR) / "fuzz" / "corpus" / "regressions";
  const Proc p = run({"fuzz", "--time", "0.000001s", "--corpus", corpus.string(), "--no-shrink", "--out", "out"});
  expect_clean(p);
  ASSERT_TRUE(p.exit_code == 0 || p.exit_code == 1) << describe(p);
  const json s = summary("out");
  EXPECT_GT(s["corpus"]["replayed"].get<int>(), 0);
  EXPECT_EQ(s["counts"]["cases"], 0);
}

TEST_F(Merge, DevicesRunsOneWorkerPerDeviceAndMerges) {
  const Proc single = run(with(kCampaign, {"--out", "single"}));
  const Proc p = run(with(kCampaign, {"--devices", "0,1", "--out", "dev"}));
  expect_clean(p);
  EXPECT_EQ(p.exit_code, single.exit_code) << describe(p);
  for (const char* shard : {"shard-0", "shard-1"}) {
    EXPECT_TRUE(fs::exists(dir_ / "dev" / shard / "summary.json")) << shard;
    EXPECT_TRUE(fs::exists(dir_ / "dev" / shard / "stdout.log")) << shard;
  }
  const json d = summary("dev"), s = summary("single");
  EXPECT_EQ(d["counts"]["cases"], 120);
  EXPECT_EQ(findings(d), findings(s));
  EXPECT_EQ(summary("dev/shard-1")["shard"]["index"], 1);
  EXPECT_NE(p.err.find("[shard 1/2]"), std::string::npos) << "worker logs are prefixed\n" << describe(p);
  const std::string out = p.out;
  EXPECT_NE(out.rfind("report: dev/report.html\n"), std::string::npos) << out;

  // Bad combinations are bad input.
  EXPECT_EQ(run({"fuzz", "--cases", "5", "--devices", "0,1"}).exit_code, 2);
  EXPECT_EQ(run({"fuzz", "--cases", "5", "--devices", "0,0", "--out", "x"}).exit_code, 2);
  EXPECT_EQ(run({"fuzz", "--cases", "5", "--shard", "2/2"}).exit_code, 2);
  EXPECT_EQ(run({"fuzz", "--cases", "5", "--shard", "abc"}).exit_code, 2);
}

TEST_F(Merge, SigtermMidCampaignLeavesCompleteReportsAndEveryFinding) {
  // The real binary with a long budget; SIGTERM once its first finding is on disk.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::chdir(dir_.c_str()) != 0) ::_exit(126);
    const int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, STDOUT_FILENO);
    ::dup2(devnull, STDERR_FILENO);
    ::execl(VF_CLI, VF_CLI, "fuzz", "--time", "120s", "--policy", "comfy:dec2025", "--out", "out", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto start = std::chrono::steady_clock::now();
  auto first_finding = [&] {
    std::error_code ec;
    if (!fs::exists(dir_ / "out" / "findings", ec)) return false;
    for (const auto& e : fs::recursive_directory_iterator(dir_ / "out" / "findings", ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("case-", 0) == 0 && e.path().extension() == ".json") return true;
    }
    return false;
  };
  while (!first_finding() && std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(first_finding()) << "no finding within 30 s";
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  const auto sent = std::chrono::steady_clock::now();
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  const double stop_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  ASSERT_TRUE(WIFEXITED(status)) << "it must exit, not die of the signal";
  EXPECT_TRUE(WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 1) << WEXITSTATUS(status);
  EXPECT_LT(stop_seconds, 15.0) << "a stop finishes the current case (or shrink), not the budget";

  const json s = summary("out");  // parses
  EXPECT_GT(s["counts"]["cases"].get<int>(), 0);
  EXPECT_TRUE(s["run"]["interrupted"].get<bool>());
  EXPECT_EQ(WEXITSTATUS(status), s["counts"]["new_signatures"].get<int>() > 0 ? 1 : 0);
  for (const char* f : {"report.html", "junit.xml", "summary.md"}) EXPECT_TRUE(fs::exists(dir_ / "out" / f)) << f;
  // Every finding the summary names is on disk, and every file on disk is complete JSON.
  ASSERT_FALSE(s["findings"].empty());
  for (const json& f : s["findings"]) EXPECT_TRUE(fs::exists(dir_ / f["file"].get<std::string>())) << f["file"];
  for (const auto& e : fs::recursive_directory_iterator(dir_ / "out" / "findings")) {
    if (!e.is_regular_file()) continue;
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << "no half-written file: " << e.path();
    if (e.path().extension() == ".json") {
      EXPECT_TRUE(json::accept(read_file(e.path()))) << e.path();
    }
  }
}

TEST_F(Merge, TimeBudgetIsHonouredEvenWhileShrinking) {
  const auto start = std::chrono::steady_clock::now();
  const Proc p = run({"fuzz", "--time", "2s", "--policy", "comfy:dec2025", "--shrink-time", "120s", "--shrink-execs", "100000", "--out", "out"});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  expect_clean(p);
  EXPECT_LT(seconds, 4.5) << "2 s budget, shrinking capped by what is left of it\n" << describe(p);
  EXPECT_GT(summary("out")["counts"]["cases"].get<int>(), 0);
}

TEST_F(Merge, ProgressIsOneUpdatingLineOnATerminalAndPlainElsewhere) {
  const Proc tty = run({"fuzz", "--cases", "300", "--no-shrink", "--progress", "tty"});
  expect_clean(tty);
  EXPECT_NE(tty.err.find("\r\033[Kfuzz: "), std::string::npos) << describe(tty);
  EXPECT_NE(tty.err.find(" cases ("), std::string::npos);
  EXPECT_NE(tty.err.find("new | "), std::string::npos);
  // Log lines print around it: each starts at the beginning of a cleared line.
  EXPECT_EQ(tty.err.find("\n[info]"), std::string::npos) << "the line is cleared before a log line, not left behind";
  const Proc plain = run({"fuzz", "--cases", "300", "--no-shrink"});  // a pipe: auto is plain
  expect_clean(plain);
  EXPECT_EQ(plain.err.find('\r'), std::string::npos) << describe(plain);
}

TEST_F(Merge, ReportRerendersFromSummaryAlone) {
  const Proc f = run({"fuzz", "--cases", "60", "--policy", "comfy:dec2025", "--shrink-execs", "40", "--out", "out"});
  ASSERT_TRUE(f.exit_code == 0 || f.exit_code == 1) << describe(f);
  const std::string html = read_file(dir_ / "out" / "report.html");
  const std::string md = read_file(dir_ / "out" / "summary.md");
  fs::remove(dir_ / "out" / "report.html");
  fs::remove(dir_ / "out" / "summary.md");
  fs::remove(dir_ / "out" / "junit.xml");
  fs::remove_all(dir_ / "out" / "findings");
  const Proc r = run({"report", "out"});
  expect_clean(r);
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(read_file(dir_ / "out" / "report.html"), html);
  EXPECT_EQ(read_file(dir_ / "out" / "summary.md"), md);
  EXPECT_TRUE(fs::exists(dir_ / "out" / "junit.xml"));
  const Proc only = run({"report", "out", "--html", "elsewhere/r.html"});
  EXPECT_EQ(only.exit_code, 0) << describe(only);
  EXPECT_TRUE(fs::exists(dir_ / "elsewhere" / "r.html"));
  EXPECT_NE(read_file(dir_ / "elsewhere" / "r.html").find("href=\"../out/findings/"), std::string::npos)
      << "links are relative to where the report is";
  EXPECT_EQ(run({"report", "nosuch"}).exit_code, 2);
}

TEST_F(Merge, CalibrateWritesTablesAndMergesShards) {
  const std::vector<std::string> base{"calibrate", "--cases", "40", "--allocator", "raw", "--seed", "4", "--no-shrink"};
  const Proc all = run(with(base, {"--out", "c"}));
  expect_clean(all);
  ASSERT_EQ(all.exit_code, 0) << describe(all);
  EXPECT_NE(all.out.find("allocator  cases  OOMs"), std::string::npos) << all.out;
  const json c = summary("c");
  ASSERT_TRUE(c.contains("calibrate"));
  EXPECT_EQ(c["calibrate"]["schema"], "vramfuzz.calibrate/1");
  EXPECT_EQ(c["calibrate"]["modes"].size(), 1u);
  EXPECT_TRUE(fs::exists(dir_ / "c" / "calibrate" / "raw"));
  const Proc a = run(with(base, {"--shard", "0/2", "--out", "c0"}));
  const Proc b = run(with(base, {"--shard", "1/2", "--out", "c1"}));
  ASSERT_EQ(a.exit_code, 0) << describe(a);
  ASSERT_EQ(b.exit_code, 0) << describe(b);
  const Proc m = run({"merge", "c0", "c1", "--out", "cm"});
  expect_clean(m);
  EXPECT_EQ(m.exit_code, 0) << "a calibration is a measurement, merged or not\n" << describe(m);
  const json merged = summary("cm");
  EXPECT_EQ(merged["config"]["cases"], 40) << "two shards of one 40-case calibration";
  // A campaign and a calibration do not merge: bad input, nothing written.
  const Proc f = run({"fuzz", "--cases", "10", "--no-shrink", "--out", "f"});
  ASSERT_TRUE(f.exit_code == 0 || f.exit_code == 1) << describe(f);
  const Proc mixed = run({"merge", "c0", "f", "--out", "mixed"});
  EXPECT_EQ(mixed.exit_code, 2) << describe(mixed);
  EXPECT_NE(mixed.err.find("merge fuzz outputs and calibrate outputs separately"), std::string::npos) << mixed.err;
  EXPECT_FALSE(fs::exists(dir_ / "mixed" / "summary.json"));
  for (const char* k : {"cases", "p50", "p90", "p99", "max", "need"}) {
    EXPECT_EQ(merged["calibrate"]["modes"][0][k], c["calibrate"]["modes"][0][k]) << k;
  }
  EXPECT_EQ(run({"calibrate", "--allocator", "nosuch"}).exit_code, 2);
  EXPECT_EQ(run({"calibrate", "--margin", "abc"}).exit_code, 2);
}

}  // namespace
}  // namespace vf
