// The vramfuzz command line, run as a real process: exit codes (0 nothing found, 1 findings,
// 2 bad input, 3 infrastructure fault), error messages that name the field or flag, finding files
// that replay, and campaigns that are deterministic.
#include <gtest/gtest.h>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "harness/campaign.h"
#include "harness/scenario.h"
#include "models/catalog.h"
#include "tests/run_cli.h"

#ifndef VF_CLI
#error "VF_CLI must name the vramfuzz executable (tests/CMakeLists.txt)"
#endif

namespace vf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kExample = std::string(VF_SOURCE_DIR) + "/docs/examples/flux2-te-fp8-fp32-12gib.json";

using test::describe;
using test::expect_clean;
using test::Proc;

// Runs vramfuzz with `args` in `cwd` (tests/run_cli.h).
Proc run_cli(const std::vector<std::string>& args, const fs::path& cwd, int timeout_s = 30) {
  return test::run_process(VF_CLI, args, cwd, timeout_s);
}

using test::read_file;

// The "verdict: ..." line of `run`.
std::string verdict_line(const std::string& out) {
  const auto pos = out.find("\nverdict: ");
  if (pos == std::string::npos) return {};
  const auto end = out.find('\n', pos + 1);
  return out.substr(pos + 1, end == std::string::npos ? std::string::npos : end - pos - 1);
}

// The signature in "verdict: KIND SIGNATURE - message" (empty for pass).
std::string verdict_signature(const std::string& line) {
  std::istringstream in(line);
  std::string word, kind, sig;
  in >> word >> kind >> sig;
  return sig == "-" ? std::string() : sig;
}

std::size_t count_lines(const std::string& s) {
  std::size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

class Cli : public test::TempDirTest {
 protected:
  Proc run(const std::vector<std::string>& args, int timeout_s = 30) { return run_cli(args, dir_, timeout_s); }
  fs::path write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  // A bad-input run: exit 2, no crash, nothing on stdout, the `needle` on stderr.
  Proc expect_bad_input(const std::vector<std::string>& args, const std::string& needle) {
    const Proc p = run(args);
    std::string cmd;
    for (const std::string& a : args) cmd += " " + a;
    SCOPED_TRACE("vramfuzz" + cmd);
    expect_clean(p);
    EXPECT_EQ(p.exit_code, 2) << describe(p);
    EXPECT_NE(p.err.find(needle), std::string::npos) << "stderr should name \"" << needle << "\"\n" << describe(p);
    EXPECT_EQ(p.out, "") << describe(p);
    return p;
  }
};

// ---- external predictors on the command line ----------------------------------------------------

// --isolate runs each case in a child process, which cannot reach the predictor process: refused
// before the predictor's command runs.
TEST_F(Cli, IsolateWithAnExternalPredictorIsRefusedBeforeItStarts) {
  const fs::path marker = dir_ / "started";
  const Proc p = expect_bad_input({"fuzz", "--isolate", "--cases", "3", "--policy", "exec:touch " + marker.string()},
                                  "--isolate: cannot be combined with an external predictor");
  EXPECT_FALSE(fs::exists(marker));
}

// `report` rebuilds a lost summary from run.json and the finding files; the campaign's policy
// there is exec:NAME, and a name read from a file never starts anything (here the name is a
// command that would leave a marker).
TEST_F(Cli, ReportRecoversAnExternalPredictorsCampaignWithoutStartingIt) {
  const fs::path script = write("pred.sh", fmt::format("#!/bin/sh\ntouch {}\nexec python3 {}/adapters/minimal/minimal_predictor.py\n",
                                                       (dir_ / "started").string(), VF_SOURCE_DIR));
  fs::permissions(script, fs::perms::owner_all);
  const Proc f = run({"fuzz", "--backend", "sim", "--cases", "40", "--seed", "3", "--no-shrink", "--policy", "exec:" + script.string(),
                      "--out", "o"},
                     120);
  ASSERT_TRUE(f.exit_code == 0 || f.exit_code == 1) << describe(f);
  ASSERT_TRUE(fs::exists(dir_ / "started"));
  const nlohmann::json before = nlohmann::json::parse(read_file(dir_ / "o" / "summary.json"));
  fs::remove(dir_ / "started");
  fs::remove(dir_ / "o" / "summary.json");
  // The predictor's name as a command in the working directory: run if anything started it.
  const fs::path impostor = write("minimal-python", fmt::format("#!/bin/sh\ntouch {}\n", (dir_ / "started").string()));
  fs::permissions(impostor, fs::perms::owner_all);
  const std::string path = std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin";
  ::setenv("PATH", (dir_.string() + ":" + path).c_str(), 1);
  const Proc r = run({"report", "o"}, 120);
  ::setenv("PATH", path.c_str(), 1);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_FALSE(fs::exists(dir_ / "started"));
  const nlohmann::json after = nlohmann::json::parse(read_file(dir_ / "o" / "summary.json"));
  EXPECT_EQ(after["config"]["policy"], "exec:minimal-python");
  EXPECT_EQ(after["config"]["policy"], before["config"]["policy"]);
  EXPECT_EQ(after["findings"].size(), before["findings"].size());
}

// A corpus replayed with a predictor that cannot answer: its repros are undetermined, never
// FIXED, and their signatures stay known.
TEST_F(Cli, ACorpusReplayWhosePredictorFailsIsUndeterminedNotFixed) {
  const Proc f = run({"fuzz", "--backend", "sim", "--cases", "40", "--seed", "3", "--no-shrink", "--policy",
                      fmt::format("exec:python3 {}/adapters/minimal/minimal_predictor.py", VF_SOURCE_DIR), "--out", "o"},
                     120);
  ASSERT_EQ(f.exit_code, 1) << describe(f);
  const std::size_t found = nlohmann::json::parse(read_file(dir_ / "o" / "summary.json"))["findings"].size();
  ASSERT_GT(found, 0u);
  write("down.py",
        "import json, sys\n"
        "print(json.dumps({'schema': 'vramfuzz.predictor/1', 'type': 'hello', 'name': 'minimal-python', 'version': '1',"
        " 'runtime': 'comfy:dec2025'}), flush=True)\n"
        "for line in sys.stdin:\n"
        "    print(json.dumps({'type': 'error', 'id': json.loads(line)['id'], 'message': 'down for maintenance'}), flush=True)\n");
  const Proc g = run({"fuzz", "--backend", "sim", "--cases", "1", "--no-shrink", "--policy", "exec:python3 down.py", "--corpus", "o",
                      "--out", "o2"},
                     120);
  ASSERT_EQ(g.exit_code, 3) << describe(g);  // its one new case is an error too
  EXPECT_NE(g.err.find("corpus: UNDETERMINED"), std::string::npos) << describe(g);
  EXPECT_EQ(g.err.find("FIXED"), std::string::npos) << describe(g);
  const nlohmann::json k = nlohmann::json::parse(read_file(dir_ / "o2" / "summary.json"))["corpus"];
  EXPECT_GT(k["replayed"].get<std::size_t>(), 0u);
  EXPECT_EQ(k["undetermined"], k["replayed"]);
  EXPECT_EQ(k["no_longer_reproduce"], 0);
  EXPECT_EQ(k["still_fail"], 0);
  for (const auto& e : k["entries"]) {
    EXPECT_TRUE(e["undetermined"].get<bool>());
    EXPECT_NE(e["verdict"].get<std::string>().find("down for maintenance"), std::string::npos) << e.dump();
  }
  const std::string md = read_file(dir_ / "o2" / "summary.md");
  EXPECT_NE(md.find("undetermined (the replay was an error, so neither fixed nor failing)"), std::string::npos);
}

// The minimal predictor applies no override (its hello: "supports": {"overrides": []}): a
// reserve or constant asked of it on the command line is refused before any case runs, for
// fuzz, run and calibrate alike, instead of judging plans that ignored it.
TEST_F(Cli, AnOverrideTheExternalPredictorDoesNotApplyIsRefused) {
  const std::string minimal = fmt::format("exec:python3 {}/adapters/minimal/minimal_predictor.py", VF_SOURCE_DIR);
  expect_bad_input({"fuzz", "--backend", "sim", "--cases", "3", "--no-shrink", "--policy", minimal, "--reserve", "600MiB", "--out", "o"},
                   "--reserve reserve: the external predictor \"minimal-python\" does not apply the override `reserve` (its hello's "
                   "supports.overrides: none)");
  EXPECT_FALSE(fs::exists(dir_ / "o" / "summary.json"));
  expect_bad_input({"fuzz", "--backend", "sim", "--cases", "3", "--policy", minimal, "--set", "cfg_mult=2", "--out", "o"},
                   "--set cfg_mult: the external predictor \"minimal-python\" does not apply the override `cfg_mult`");
  expect_bad_input({"calibrate", "--backend", "sim", "--cases", "3", "--policy", minimal, "--out", "c"},
                   "--policy: calibrate raises `reserve` until no case violates; the external predictor \"minimal-python\" does not "
                   "apply the override `reserve`");
  // Without overrides it runs.
  const Proc ok = run({"fuzz", "--backend", "sim", "--cases", "3", "--no-shrink", "--policy", minimal, "--out", "o"}, 120);
  EXPECT_TRUE(ok.exit_code == 0 || ok.exit_code == 1) << describe(ok);
  // One case file that sets one (run/plan under --policy exec:, replay/shrink with --predictor):
  // bad input naming the file's field, before the case runs.
  nlohmann::json c = nlohmann::json::parse(read_file(fs::path(VF_SOURCE_DIR) / "adapters/comfyui/flux2-te-12gib.json"));
  c["policy"] = {{"name", "comfy:dec2025"}, {"overrides", {{"reserve", "600MiB"}}}};
  write("c.json", c.dump());
  for (const char* cmd : {"run", "plan"}) {
    expect_bad_input({cmd, "c.json", "--policy", minimal},
                     "policy.overrides.reserve: the external predictor \"minimal-python\" does not apply the override `reserve`");
  }
  c["policy"] = {{"name", "exec:minimal-python"}, {"version", "1"}, {"runtime", "comfy:dec2025"}, {"overrides", {{"reserve", "600MiB"}}}};
  write("x.json", c.dump());
  expect_bad_input({"replay", "x.json", "--predictor", minimal.substr(5)},
                   "policy.overrides.reserve: the external predictor \"minimal-python\" does not apply the override `reserve`");
}

// ---- diff ----------------------------------------------------------------------------------------

// The protocol's proof through diff: the built-in predictor against itself served over the
// protocol differs nowhere (plans and verdicts), classic and dynamic. The external side is asked
// once per case (its plan is the plan run for the verdict), each request sent ahead of its claim.
TEST_F(Cli, DiffOfAPredictorAgainstItselfOverTheProtocolFindsNothing) {
  for (const std::string p : {"comfy:dec2025", "comfy:sep2026"}) {
    const Proc d = run({"diff", "--policy", p, "--against", fmt::format("exec:{} predict-serve --policy {}", VF_CLI, p), "--cases",
                        "120", "--out", "d-" + p.substr(6)},
                       120);
    ASSERT_EQ(d.exit_code, 0) << describe(d);
    const nlohmann::json j = nlohmann::json::parse(read_file(dir_ / ("d-" + p.substr(6)) / "diff.json"));
    EXPECT_EQ(j["schema"], "vramfuzz.diff/1");
    EXPECT_EQ(j["counts"]["cases"], 120);
    EXPECT_EQ(j["counts"]["same"], 120) << j.dump(2);
    EXPECT_TRUE(j["groups"].empty());
    EXPECT_NE((d.out + d.err).find(": 120 requests, 120 of them sent ahead of their claim;"), std::string::npos) << describe(d);
  }
}

// diff's shrink through the protocol: the removals that follow a rejected one are sent ahead to
// the external side, and the groups, their shrinks and their minimal cases are those of the same
// diff with both sides built in.
TEST_F(Cli, DiffShrinksThroughTheProtocolAsItDoesBuiltInWithItsRemovalsSentAhead) {
  const Proc builtin = run({"diff", "--against", "comfy:dec2025", "--against-set", "reserve=600MiB", "--cases", "60", "--out", "db"}, 120);
  ASSERT_EQ(builtin.exit_code, 1) << describe(builtin);
  const Proc served = run({"diff", "--against", fmt::format("exec:{} predict-serve --policy comfy:dec2025", VF_CLI), "--against-set",
                           "reserve=600MiB", "--cases", "60", "--out", "ds"},
                          120);
  ASSERT_EQ(served.exit_code, 1) << describe(served);
  const nlohmann::json jb = nlohmann::json::parse(read_file(dir_ / "db" / "diff.json"));
  const nlohmann::json js = nlohmann::json::parse(read_file(dir_ / "ds" / "diff.json"));
  EXPECT_EQ(js["counts"], jb["counts"]);
  ASSERT_EQ(js["groups"].size(), jb["groups"].size());
  std::uint64_t shrink_execs = 0;
  for (std::size_t i = 0; i < jb["groups"].size(); ++i) {
    EXPECT_EQ(js["groups"][i]["key"], jb["groups"][i]["key"]);
    EXPECT_EQ(js["groups"][i]["shrink_execs"], jb["groups"][i]["shrink_execs"]);
    EXPECT_EQ(js["groups"][i]["modules"], jb["groups"][i]["modules"]);  // before and after the shrink
    EXPECT_EQ(js["groups"][i]["fields"], jb["groups"][i]["fields"]);
    shrink_execs += jb["groups"][i]["shrink_execs"].get<std::uint64_t>();
  }
  ASSERT_GT(shrink_execs, 10u);
  // 60 cases and the shrinks' removals, each asked once of the external side; more of them
  // claimed from requests sent ahead than the 60 cases alone.
  const std::regex line(R"(: (\d+) requests, (\d+) of them sent ahead of their claim)");
  std::smatch m;
  const std::string out = served.out + served.err;
  ASSERT_TRUE(std::regex_search(out, m, line)) << describe(served);
  EXPECT_GT(std::stoull(m[2].str()), 60u + shrink_execs / 4) << m[0].str();
}

// A patch to a constant (what a ComfyUI developer reviewing a reserve change runs): every
// difference names the reserve, and each group's minimal case plans under both as described.
TEST_F(Cli, DiffOfAReserveChangeGroupsShrinksAndWritesReplayableCases) {
  const Proc d = run({"diff", "--against", "comfy:dec2025", "--against-set", "reserve=600MiB", "--cases", "150", "--out", "d"}, 120);
  ASSERT_EQ(d.exit_code, 1) << describe(d);
  const nlohmann::json j = nlohmann::json::parse(read_file(dir_ / "d" / "diff.json"));
  ASSERT_FALSE(j["groups"].empty());
  EXPECT_EQ(j["counts"]["same"], 0);  // every plan's reserve differs
  bool shrank = false;
  for (const auto& g : j["groups"]) {
    EXPECT_NE(g["key"].get<std::string>().find("reserve"), std::string::npos) << g["key"];
    EXPECT_EQ(g["fields"][0]["field"], "reserve");
    EXPECT_EQ(g["fields"][0]["a"], "400.00 MiB");
    EXPECT_EQ(g["fields"][0]["b"], "600.00 MiB");
    shrank |= g["modules"]["after"].get<std::size_t>() < g["modules"]["before"].get<std::size_t>();
    const Proc a = run({"plan", (dir_ / "d" / g["file"].get<std::string>()).string()});
    EXPECT_EQ(a.exit_code, 0) << describe(a);
    const Proc b = run({"plan", (dir_ / "d" / g["file"].get<std::string>()).string(), "--set", "reserve=600MiB"});
    EXPECT_EQ(b.exit_code, 0) << describe(b);
    EXPECT_NE(a.out, b.out);
  }
  EXPECT_TRUE(shrank);
  const std::string md = read_file(dir_ / "d" / "diff.md");
  EXPECT_NE(md.find("against `comfy:dec2025` (B)"), std::string::npos);
  EXPECT_NE(md.find("**Rests on:** plan fields: exact:"), std::string::npos);
  const std::string html = read_file(dir_ / "d" / "diff.html");
  EXPECT_NE(html.find("<svg class=\"diffbars\""), std::string::npos);
  // The minimal cases are linked relative to the page, which lives in the diff's folder.
  EXPECT_NE(html.find(fmt::format("<a href=\"{}\">", j["groups"][0]["file"].get<std::string>())), std::string::npos);
  EXPECT_TRUE(fs::exists(dir_ / "d" / j["groups"][0]["file"].get<std::string>()));
  EXPECT_NE(html.find("B's overrides: reserve=600MiB"), std::string::npos) << html.substr(0, 2000);
  EXPECT_NE(d.out.find("html: d/diff.html"), std::string::npos) << d.out;
  EXPECT_NE(md.find("`reserve=600MiB`"), std::string::npos);
  // The same --out again is refused; --clean replaces it.
  expect_bad_input({"diff", "--against", "comfy:dec2025", "--cases", "5", "--out", "d"}, "holds an earlier diff (diff.json)");
  EXPECT_EQ(run({"diff", "--against", "comfy:dec2025", "--cases", "5", "--out", "d", "--clean"}).exit_code, 0);
}

TEST_F(Cli, DiffRefusesWhatItCannotCompare) {
  expect_bad_input({"diff", "--policy", "comfy:dec2025", "--against", "comfy:sep2026", "--cases", "5"},
                   "--against: comfy:sep2026 is dynamic VRAM and comfy:dec2025 is not");
  expect_bad_input({"diff", "--against", "comfy:dec2025", "--against-set", "no_such_constant=1", "--cases", "5"}, "--against-set");
  expect_bad_input({"diff", "--against", "comfy:dec2025", "--against-set", "reserve", "--cases", "5"}, "--against-set: expected KEY=VALUE");
  expect_bad_input({"diff", "--against", "comfy:dec2025,comfy:nov2025", "--cases", "5"}, "--against: one predictor, not a list");
  expect_bad_input({"diff", "--against", "comfy:dec2025", "--tolerance", "lots", "--cases", "5"}, "--tolerance");
}

// ---- run / plan on the example ----------------------------------------------------------------

// A summary rebuilt from the finding files (`report` after a campaign lost its summary) labels a
// knee of violations below --min-overshoot noise as the campaign did, and a knee of an OOM not
// (tests/test_knee.cpp has the campaign's side: seed 2 of comfy:nov2025 on caching).
TEST_F(Cli, ARecoveredSummaryLabelsKneesOfViolationsNoiseAsTheCampaignDid) {
  const Proc f = run({"fuzz", "--backend", "sim", "--policy", "comfy:nov2025", "--allocator", "caching", "--cases", "600", "--seed",
                      "2", "--no-shrink", "--min-overshoot", "1TiB", "--out", "o"},
                     120);
  ASSERT_EQ(f.exit_code, 1) << describe(f);
  auto noise_of = [&](const std::string& sig) {
    const nlohmann::json d = nlohmann::json::parse(read_file(dir_ / "o" / "summary.json"));
    for (const auto& x : d["findings"]) {
      if (x["signature"] == sig) return x.value("noise", false);
    }
    ADD_FAILURE() << sig << " not in the summary";
    return false;
  };
  EXPECT_TRUE(noise_of("knee:forward:upcast:caching"));
  EXPECT_FALSE(noise_of("knee:patch:lora:caching"));
  fs::remove(dir_ / "o" / "summary.json");
  const Proc r = run({"report", "o"}, 120);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(noise_of("knee:forward:upcast:caching"));
  EXPECT_FALSE(noise_of("knee:patch:lora:caching"));
}

TEST_F(Cli, RunExampleFindsTheOriginBugUnderOct2025) {
  const Proc p = run({"run", kExample});
  expect_clean(p);
  EXPECT_EQ(p.exit_code, 1) << describe(p);
  EXPECT_NE(p.out.find("policy comfy:oct2025"), std::string::npos) << describe(p);
  const std::string v = verdict_line(p.out);
  EXPECT_TRUE(v.rfind("verdict: oom oom:forward:", 0) == 0 || v.rfind("verdict: violation violation:forward:", 0) == 0)
      << "an OOM or violation in the forward pass, got: " << v;
  EXPECT_NE(v.find(":raw"), std::string::npos) << v;
}

TEST_F(Cli, RunExamplePassesUnderDec2025) {
  const Proc p = run({"run", kExample, "--policy", "comfy:dec2025"});
  expect_clean(p);
  EXPECT_EQ(p.exit_code, 0) << describe(p);
  EXPECT_NE(p.out.find("policy comfy:dec2025"), std::string::npos) << describe(p);
  EXPECT_EQ(verdict_line(p.out).rfind("verdict: pass", 0), 0u) << describe(p);
}

TEST_F(Cli, RunJsonWritesAFindingThatReplays) {
  const Proc p = run({"run", kExample, "--json", "out.json"});
  expect_clean(p);
  ASSERT_EQ(p.exit_code, 1) << describe(p);
  ASSERT_TRUE(fs::exists(dir_ / "out.json"));
  const json j = json::parse(read_file(dir_ / "out.json"));
  EXPECT_EQ(j["schema"], "vramfuzz.finding/1");
  const std::string line = verdict_line(p.out);
  EXPECT_EQ(j["signature"], verdict_signature(line));
  EXPECT_FALSE(j["signature"].get<std::string>().empty());
  EXPECT_EQ(j["replay"], "vramfuzz run out.json");
  ASSERT_TRUE(j.contains("scenario"));
  EXPECT_EQ(j["scenario"]["schema"], "vramfuzz.scenario/1");
  EXPECT_EQ(j["scenario"]["policy"], "comfy:oct2025");
  EXPECT_GT(j["peaks"]["reserved"].get<std::uint64_t>(), 0u);

  const Proc again = run({"run", "out.json"});
  expect_clean(again);
  EXPECT_EQ(again.exit_code, 1) << describe(again);
  EXPECT_EQ(verdict_line(again.out), line);
  EXPECT_FALSE(line.empty());
}

TEST_F(Cli, RunJsonReplayKeepsTheFlags) {
  // The example OOMs under its own comfy:oct2025; with --policy comfy:dec2025 it passes. The
  // result file must replay the case that ran (flags applied), not the input file.
  const Proc p = run({"run", kExample, "--policy", "comfy:dec2025", "--json", "pass.json"});
  expect_clean(p);
  ASSERT_EQ(p.exit_code, 0) << describe(p);
  const json j = json::parse(read_file(dir_ / "pass.json"));
  EXPECT_EQ(j["schema"], "vramfuzz.result/1");
  EXPECT_EQ(j["signature"], "");
  EXPECT_EQ(j["scenario"]["policy"], "comfy:dec2025");
  const std::string replay = j["replay"].get<std::string>();
  ASSERT_EQ(replay.rfind("vramfuzz run ", 0), 0u) << replay;
  const Proc again = run({"run", replay.substr(std::string("vramfuzz run ").size())});
  expect_clean(again);
  EXPECT_EQ(again.exit_code, 0) << "the replay command must reproduce the pass\n" << describe(again);
  EXPECT_EQ(verdict_line(again.out), verdict_line(p.out));
}

TEST_F(Cli, PlanPrintsTheComfyLoadLine) {
  const Proc p = run({"plan", kExample});
  expect_clean(p);
  EXPECT_EQ(p.exit_code, 0) << describe(p);
  const std::regex comfy(
      R"(loaded partially; [0-9]+\.[0-9]{2} MB usable, [0-9]+\.[0-9]{2} MB loaded, [0-9]+\.[0-9]{2} MB offloaded, )"
      R"([0-9]+\.[0-9]{2} MB buffer reserved)");
  EXPECT_TRUE(std::regex_search(p.out, comfy)) << describe(p);
  // oct2025 has no offload accounting: the buffer is 0.
  EXPECT_NE(p.out.find("MB offloaded, 0.00 MB buffer reserved"), std::string::npos) << describe(p);
  EXPECT_EQ(p.out.find("verdict:"), std::string::npos) << "plan must not execute";

  const Proc dec = run({"plan", kExample, "--policy", "comfy:dec2025"});
  EXPECT_EQ(dec.exit_code, 0) << describe(dec);
  EXPECT_TRUE(std::regex_search(dec.out, comfy)) << describe(dec);
  EXPECT_EQ(dec.out.find("MB offloaded, 0.00 MB buffer reserved"), std::string::npos) << "dec2025 reserves a buffer";
}

// ---- bad input -------------------------------------------------------------------------------

TEST_F(Cli, MalformedFilesExit2WithTheFieldPath) {
  const json base = json::parse(read_file(kExample));
  struct Case {
    std::string name;
    std::string text;
    std::string path;
  };
  std::vector<Case> cases;
  cases.push_back({"truncated", base.dump().substr(0, 60), "truncated.json: invalid JSON at byte 61"});
  {
    json d = base;
    d["workload"]["widht"] = 512;
    cases.push_back({"typo", d.dump(), "workload.widht: unknown field"});
  }
  {
    json d = base;
    d["device"]["total"] = -5;
    cases.push_back({"negative", d.dump(), "device.total: must not be negative"});
  }
  {
    json d = base;
    d["device"]["total"] = "99999999999999999999GiB";
    cases.push_back({"overflow", d.dump(), "device.total: size overflows 64 bits"});
  }
  {
    json d = base;
    d["models"][0]["source"] = "catalog:nosuch";
    cases.push_back({"catalog", d.dump(), "models[0].source: unknown model \"nosuch\""});
  }
  {
    json d = base;
    d["models"][0]["compute"] = "fp8_e4m3fn";
    cases.push_back({"compute", d.dump(), "models[0].compute: fp8_e4m3fn is not a compute dtype"});
  }
  {
    json d = base;
    d["pipeline"] = json::parse(R"([{"op": "forward", "model": "te"}])");
    cases.push_back({"order", d.dump(), "pipeline[0]: forward of \"te\" before it is loaded"});
  }
  {
    json d = base;
    d["offload_streams"] = 9;
    cases.push_back({"streams", d.dump(), "offload_streams: must be between 0 and 8"});
  }
  {
    json d = base;
    d["models"][0] = json::parse(R"({"id": "x", "modules": [{"name": "m", "tensors": [
        {"name": "weight", "shape": [4294967296, 4294967296, 16], "dtype": "fp32"}]}]})");
    d["pipeline"] = json::parse(R"([{"op": "load", "model": "x"}])");
    cases.push_back({"shape", d.dump(), "models[0].modules[0].tensors[0].shape: size overflows 64 bits"});
  }
  {
    json d = base;
    d["workload"]["width"] = "1024";
    cases.push_back({"type", d.dump(), "workload.width: expected a non-negative integer"});
  }
  {
    // The same error inside a finding file carries the "scenario." prefix.
    json d = base;
    d["workload"]["batch"] = 0;
    cases.push_back({"finding", json{{"schema", "vramfuzz.finding/1"}, {"signature", "oom:forward:upcast:raw"}, {"scenario", d}}.dump(),
                     "scenario.workload.batch: must be between 1 and 64"});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    write(c.name + ".json", c.text);
    const Proc p = expect_bad_input({"run", c.name + ".json"}, c.path);
    EXPECT_EQ(count_lines(p.err), 1u) << "one error line\n" << describe(p);
    expect_bad_input({"plan", c.name + ".json"}, c.path);
  }
}

TEST_F(Cli, MissingFileExit2AndNamesIt) {
  expect_bad_input({"run", "no-such-scenario.json"}, "no-such-scenario.json: cannot open file");
  expect_bad_input({"plan", "no-such-scenario.json"}, "no-such-scenario.json");
}

TEST_F(Cli, BadFlagsExit2) {
  expect_bad_input({"run", kExample, "--reserve", "abc"}, "--reserve: not a size: \"abc\"");
  expect_bad_input({"run", kExample, "--set", "nosuch=1"}, "unknown policy constant");
  expect_bad_input({"run", kExample, "--set", "nosuch=1"}, "nosuch");
  expect_bad_input({"run", kExample, "--set", "reserve"}, "--set: expected key=value");
  expect_bad_input({"run", kExample, "--allocator", "nosuch"}, "--allocator: unknown allocator mode \"nosuch\"");
  expect_bad_input({"run", kExample, "--backend", "nosuch"}, "--backend: unknown backend \"nosuch\"");
  expect_bad_input({"run", kExample, "--policy", "comfy:jan2026"}, "--policy: unknown preset \"jan2026\"");
  expect_bad_input({"plan", kExample, "--reserve", "-1GiB"}, "--reserve: size must not be negative");
  expect_bad_input({"fuzz", "--time", "-5s"}, "--time: duration must be positive");
  expect_bad_input({"fuzz", "--vram", "12XB"}, "--vram: unknown unit \"XB\"");
  expect_bad_input({"fuzz", "--cases", "1", "--reserve", "abc"}, "--reserve: not a size: \"abc\"");
  expect_bad_input({"fuzz", "--cases", "1", "--policy", "bogus"}, "--policy: unknown predictor");
  expect_bad_input({"fuzz", "--cases", "1", "--backend", "nosuch"}, "--backend: unknown backend");
  // A negative count must not wrap into 2^64 - 5 cases.
  expect_bad_input({"fuzz", "--cases", "-5"}, "--cases");
  expect_bad_input({"fuzz", "--cases", "abc"}, "--cases");
  // Zero is not "the default": it is refused wherever a count must be at least 1.
  expect_bad_input({"fuzz", "--cases", "0"}, "--cases: must be a whole number of at least 1, got 0");
  expect_bad_input({"calibrate", "--cases", "0"}, "--cases: must be a whole number of at least 1, got 0");
  expect_bad_input({"calibrate", "--cases", "-5"}, "--cases: must be a whole number of at least 1, got -5");
  expect_bad_input({"fuzz", "--cases", "1", "--shrink-execs", "0"}, "--shrink-execs: must be a whole number of at least 1");
  expect_bad_input({"fuzz", "--cases", "1", "--runs", "0"}, "--runs: must be a whole number of at least 1, got 0");
  expect_bad_input({"calibrate", "--cases", "1", "--seed", "-1"}, "--seed: must not be negative, got -1");
  expect_bad_input({"calibrate", "--cases", "1", "--shrink-execs", "0"}, "--shrink-execs: must be a whole number of at least 1");
  expect_bad_input({"fuzz", "--cases", "1", "--out", "o", "--devices", "a,b"}, "--devices: \"a\" is not a device");
  expect_bad_input({"fuzz", "--cases", "1", "--out", "o", "--devices", "0,0"}, "--devices: device 0 is listed twice");
  // CLI11's own parse errors are bad input too.
  expect_bad_input({"run"}, "scenario is required");
  expect_bad_input({}, "A subcommand is required");
  expect_bad_input({"models", "list", "--bogus"}, "--bogus");
}

TEST_F(Cli, NullInAFileIsAnErrorNotTheDefault) {
  // "allocator": null used to run as raw, and the verdict flipped with it.
  json d = json::parse(read_file(kExample));
  for (const char* key : {"allocator", "policy", "seed", "workload"}) {
    SCOPED_TRACE(key);
    json n = d;
    n[key] = nullptr;
    write("null.json", n.dump());
    expect_bad_input({"run", "null.json"}, std::string(key) + ": null is not allowed");
  }
  // A repro whose signature is null would replay as "any finding reproduces it".
  json repro = {{"schema", "vramfuzz.repro/1"}, {"signature", nullptr}, {"scenario", d}};
  write("repro.json", repro.dump());
  expect_bad_input({"replay", "repro.json"}, "signature: null is not allowed here");
  // Its origin is read back by shrink: null there is a damaged file, not an unknown seed.
  json finding = {{"schema", "vramfuzz.finding/1"}, {"signature", "oom:forward:upcast:raw"}, {"case_seed", nullptr}, {"scenario", d}};
  write("finding.json", finding.dump());
  expect_bad_input({"shrink", "finding.json", "--shrink-execs", "5", "--out", "r"}, "case_seed: null is not allowed here");
}

TEST_F(Cli, DuplicateKeysInFilesAreErrors) {
  // In a file: nlohmann would keep the last one (this ran as an 8 GiB device).
  std::string text = read_file(kExample);
  const auto at = text.find("\"total\"");
  ASSERT_NE(at, std::string::npos);
  text.insert(at, "\"total\": \"24GiB\", ");
  write("dup.json", text);
  expect_bad_input({"run", "dup.json"}, "device.total: key given twice in one object (in dup.json");
  // A JSONL trace line.
  write("dup.jsonl", "{\"op\":\"alloc\",\"id\":1,\"size\":10,\"size\":20}\n");
  expect_bad_input({"alloc-replay", "dup.jsonl"}, "dup.jsonl:1: size: key given twice");
}

TEST_F(Cli, FlagsGivenTwiceWithTheSameKeyAreErrors) {
  // The same option or constant twice on the command line: the last one used to win.
  expect_bad_input({"run", kExample, "--allocator", "async", "--option", "pool_granularity=32MiB", "--option", "pool_granularity=2MiB"},
                   "--option pool_granularity: given twice");
  const std::string trace = std::string(VF_SOURCE_DIR) + "/tests/data/origin-flux2.jsonl";
  expect_bad_input({"alloc-replay", trace, "--allocator", "async", "--option", "pool_granularity=32MiB", "--option",
                    "pool_granularity=2MiB"},
                   "--option pool_granularity: given twice");
  expect_bad_input({"run", kExample, "--set", "cfg_mult=2", "--set", "cfg_mult=3"}, "--set cfg_mult: given twice");
  expect_bad_input({"plan", kExample, "--reserve", "600MiB", "--set", "reserve=1GiB"}, "--set reserve: given twice");
  expect_bad_input({"fuzz", "--cases", "1", "--set", "cfg_mult=2", "--set", "cfg_mult=3"}, "--set cfg_mult: given twice");
  expect_bad_input({"calibrate", "--cases", "1", "--set", "cfg_mult=2", "--set", "cfg_mult=3"}, "--set cfg_mult: given twice");
  // A flag replaces the file's value (that is no duplicate), once.
  const Proc ok = run({"plan", kExample, "--set", "cfg_mult=3", "--reserve", "600MiB"});
  EXPECT_EQ(ok.exit_code, 0) << describe(ok);
  EXPECT_NE(ok.out.find("reserve 600.00 MiB"), std::string::npos) << ok.out;
  // fuzz: allocator options belong to one mode, so --option needs --allocator.
  expect_bad_input({"fuzz", "--cases", "1", "--option", "pool_granularity=32MiB"}, "--option");
}

TEST_F(Cli, AllocatorModeAliasesArePyTorchsBackendNames) {
  const Proc p = run({"plan", kExample, "--allocator", "cudaMallocAsync"});
  EXPECT_EQ(p.exit_code, 0) << describe(p);
  EXPECT_NE(p.out.find("allocator async"), std::string::npos) << p.out;
  const Proc q = run({"plan", kExample, "--allocator", "native"});
  EXPECT_EQ(q.exit_code, 0) << describe(q);
  EXPECT_NE(q.out.find("allocator caching"), std::string::npos) << q.out;
  for (const char* bad : {"ASYNC", "expandable"}) {
    SCOPED_TRACE(bad);
    const Proc e = expect_bad_input({"run", kExample, "--allocator", bad}, "--allocator: unknown allocator mode");
    EXPECT_NE(e.err.find("caching-expandable"), std::string::npos) << e.err;
    EXPECT_NE(e.err.find("native = caching, cudaMallocAsync = async"), std::string::npos) << e.err;
  }
  expect_bad_input({"fuzz", "--cases", "1", "--allocator", "ASYNC"}, "cudaMallocAsync");
  expect_bad_input({"calibrate", "--cases", "1", "--allocator", "ASYNC"}, "cudaMallocAsync");
}

// --option expandable_segments=True under caching runs the expandable model, and says so (the
// signature and every report name the mode from the scenario).
TEST_F(Cli, ExpandableSegmentsOptionRunsAndNamesTheExpandableMode) {
  const Proc p = run({"run", kExample, "--allocator", "caching", "--option", "expandable_segments=True"});
  EXPECT_NE(p.out.find("allocator caching-expandable"), std::string::npos) << describe(p);
  EXPECT_NE(p.out.find(":caching-expandable"), std::string::npos) << describe(p);  // the verdict's signature
}

TEST_F(Cli, NumericFlagsAreNeverClampedWrappedOrOctal) {
  // CLI11 clamped 2^64 to 2^64 - 1 and ran with exit 0.
  expect_bad_input({"fuzz", "--cases", "1", "--seed", "18446744073709551616"}, "--seed: overflows 64 bits");
  expect_bad_input({"calibrate", "--cases", "1", "--seed", "99999999999999999999"}, "--seed: overflows 64 bits");
  expect_bad_input({"alloc-replay", "x.jsonl", "--seed", "18446744073709551616"}, "--seed: overflows 64 bits");
  expect_bad_input({"fuzz", "--cases", "18446744073709551616"}, "--cases: overflows 64 bits");
  expect_bad_input({"fuzz", "--cases", "1", "--seed", "0x10"}, "--seed: must be a whole number");
  expect_bad_input({"fuzz", "--cases", "1", "--keep", "4294967296"}, "--keep");
  expect_bad_input({"models", "import", "x.safetensors", "--top", "-1"}, "--top");
  // The largest seed is taken as it is; a leading zero is decimal, not octal.
  const Proc max = run({"fuzz", "--cases", "1", "--no-shrink", "--seed", "18446744073709551615"});
  EXPECT_TRUE(max.exit_code == 0 || max.exit_code == 1) << describe(max);
  EXPECT_NE(max.out.find("seed 18446744073709551615"), std::string::npos) << max.out;
  const Proc octal = run({"fuzz", "--cases", "1", "--no-shrink", "--seed", "010"});
  EXPECT_TRUE(octal.exit_code == 0 || octal.exit_code == 1) << describe(octal);
  EXPECT_NE(octal.out.find(", seed 10\n"), std::string::npos) << octal.out;
  // Device sizes: the scenario's limit (1 PiB) holds for the flags too.
  expect_bad_input({"run", kExample, "--vram", "2048TiB"}, "--vram: 2048TiB is larger than the");
  expect_bad_input({"fuzz", "--cases", "1", "--vram", "2048TiB"}, "--vram: 2048TiB is larger than the");
  expect_bad_input({"calibrate", "--cases", "1", "--vram", "2048TiB"}, "--vram: 2048TiB is larger than the");
  expect_bad_input({"run", kExample, "--vram", "0"}, "--vram: device total must be greater than 0");
  expect_bad_input({"run", kExample, "--vram", "256MiB"}, "--vram: 256MiB: the scenario's memory used by others");
  expect_bad_input({"calibrate", "--cases", "1", "--margin", "2048TiB"}, "--margin");
  const std::string trace = std::string(VF_SOURCE_DIR) + "/tests/data/origin-flux2.jsonl";
  expect_bad_input({"alloc-replay", trace, "--device", "2048TiB"}, "--device: 2048TiB is larger than the");
  const Proc pib = run({"run", kExample, "--vram", "1024TiB"});
  expect_clean(pib);
  EXPECT_TRUE(pib.exit_code == 0 || pib.exit_code == 1) << "1 PiB itself is allowed\n" << describe(pib);
}

TEST_F(Cli, LogLevelWorksAfterTheCommandToo) {
  // README: "Every command takes --log-level"; after the command's name it was "not expected".
  const Proc p = run({"plan", kExample, "--log-level", "debug"});
  EXPECT_EQ(p.exit_code, 0) << describe(p);
  const Proc r = run({"run", kExample, "--policy", "comfy:dec2025", "--log-level", "warn"});
  EXPECT_EQ(r.exit_code, 0) << describe(r);
  const Proc m = run({"models", "list", "--log-level", "error"});
  EXPECT_EQ(m.exit_code, 0) << describe(m);
  const Proc before = run({"--log-level", "debug", "plan", kExample});
  EXPECT_EQ(before.exit_code, 0) << describe(before);
  // The level is applied: at "off" a bad scenario exits 2 without the error line.
  const Proc off = run({"run", "no-such.json", "--log-level", "off"});
  EXPECT_EQ(off.exit_code, 2) << describe(off);
  EXPECT_EQ(off.err, "") << describe(off);
  expect_bad_input({"run", kExample, "--log-level", "loud"}, "--log-level");
  // Unknown flags after a command are still errors.
  expect_bad_input({"run", kExample, "--bogus"}, "--bogus");
}

TEST_F(Cli, ErrorsNameTheFlagTheUserGave) {
  const Proc p = expect_bad_input({"run", kExample, "--allocator", "caching", "--option", "bogus=1"}, "--option bogus: unknown option");
  EXPECT_EQ(p.err.find("--option.options"), std::string::npos) << p.err;
  expect_bad_input({"run", kExample, "--option", "max_split_size_mb=128"}, "--option max_split_size_mb: the raw allocator");
  expect_bad_input({"run", kExample, "--set", "cfg_mult=99"}, "--set cfg_mult: must be between 1 and 16");
  const std::string trace = std::string(VF_SOURCE_DIR) + "/tests/data/origin-flux2.jsonl";
  expect_bad_input({"alloc-replay", trace, "--allocator", "async", "--option", "bogus=1"}, "--option bogus: unknown option");
  expect_bad_input({"alloc-replay", trace, "--context", "30GiB"}, "--context: 30720.00 MiB on top of 0.00 MiB used by others");
  expect_bad_input({"alloc-replay", trace, "--used-by-others", "24GiB"}, "--used-by-others: ");
  // An option from the scenario file is named as the file's field, one from a flag as the flag.
  json d = json::parse(read_file(kExample));
  d["allocator"] = {{"mode", "async"}, {"options", {{"opportunistic_probability", 0.3}}}};
  write("async.json", d.dump());
  expect_bad_input({"run", "async.json", "--option", "reuse_allow_opportunistic=False"},
                   "allocator.options.opportunistic_probability: has no effect with reuse_allow_opportunistic False");
}

TEST_F(Cli, CudaBackendWithoutAGpuExits3) {
  if (fs::exists("/dev/nvidiactl")) GTEST_SKIP() << "a GPU is present; the no-GPU contract is not testable here";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"run", kExample, "--backend", "cuda"}, {"fuzz", "--cases", "1", "--backend", "cuda"}}) {
    const Proc p = run(args);
    expect_clean(p);
    EXPECT_EQ(p.exit_code, 3) << describe(p);
    EXPECT_EQ(count_lines(p.err), 1u) << "one line of reason\n" << describe(p);
    EXPECT_EQ(p.err.rfind("[error] ", 0), 0u) << describe(p);
    std::string lower = p.err;
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    EXPECT_NE(lower.find("cuda"), std::string::npos) << describe(p);
    EXPECT_EQ(p.out.find("verdict:"), std::string::npos) << describe(p);
  }
}

// ---- fuzz ------------------------------------------------------------------------------------

TEST_F(Cli, FuzzWritesASummaryAndFindingsThatReplay) {
  // 130 cases of seed 1 under comfy:dec2025 find two raw signatures (cases 80 and 128).
  const Proc p = run({"fuzz", "--cases", "130", "--policy", "comfy:dec2025", "--shrink-execs", "60", "--allocator", "raw", "--out", "out"});
  expect_clean(p);
  ASSERT_EQ(p.exit_code, 1) << describe(p);
  const json summary = json::parse(read_file(dir_ / "out" / "summary.json"));
  EXPECT_EQ(summary["schema"], "vramfuzz.summary/1");
  EXPECT_EQ(summary["counts"]["cases"], 130);
  ASSERT_GE(summary["findings"].size(), 2u) << "the walk below must have something to check";
  EXPECT_EQ(summary["config"]["allocator"], "raw");
  EXPECT_EQ(summary["config"]["seed"], 1);
  const std::uint64_t findings = summary["counts"]["findings"].get<std::uint64_t>();
  EXPECT_EQ(p.exit_code, findings > 0 ? 1 : 0) << "exit 1 exactly when something was found";
  EXPECT_EQ(summary["counts"]["errors"], 0);
  EXPECT_EQ(summary["counts"]["signatures"], summary["findings"].size());

  // Every finding in the summary (a signature under a policy key): its count adds up, min(count,
  // keep=3) finding files are on disk in findings/<policy>/<signature>/, and the first finding of
  // each (new) one was shrunk into repro.json + repro.md there.
  std::uint64_t counted = 0;
  std::map<std::string, std::size_t> expected_files;
  for (const json& f : summary["findings"]) {
    const std::string sig = f["signature"].get<std::string>();
    EXPECT_EQ(f["policy"], "comfy:dec2025");
    counted += f["count"].get<std::uint64_t>();
    expected_files[policy_dir(f["policy"].get<std::string>()) + "/" + signature_dir(sig)] =
        std::min<std::size_t>(f["count"].get<std::size_t>(), 3);
    EXPECT_NE(sig.find(":raw"), std::string::npos) << sig;
    EXPECT_TRUE(fs::exists(dir_ / f["file"].get<std::string>())) << f["file"];
    ASSERT_FALSE(f["repro"].get<std::string>().empty()) << sig;
    EXPECT_TRUE(fs::exists(dir_ / f["repro"].get<std::string>())) << f["repro"];
  }
  EXPECT_EQ(counted, findings);

  std::map<std::string, std::size_t> files_per_dir;
  std::vector<fs::path> sig_dirs;
  if (fs::exists(dir_ / "out" / "findings")) {
    for (const auto& policy : fs::directory_iterator(dir_ / "out" / "findings")) {
      for (const auto& sig_dir : fs::directory_iterator(policy.path())) sig_dirs.push_back(sig_dir.path());
    }
  }
  for (const fs::path& sig_dir : sig_dirs) {
    const std::string dir_name = sig_dir.parent_path().filename().string() + "/" + sig_dir.filename().string();
    // The repro: schema, same signature and policy, a replay command that reproduces it from its
    // own folder, and its issue body.
    const fs::path repro = sig_dir / "repro.json";
    ASSERT_TRUE(fs::exists(repro)) << dir_name;
    ASSERT_TRUE(fs::exists(sig_dir / "repro.md")) << dir_name;
    const json r = json::parse(read_file(repro));
    EXPECT_EQ(r["schema"], "vramfuzz.repro/1");
    Catalog catalog;
    EXPECT_EQ(policy_dir(load_case_file(repro.string(), catalog).policy.key()) + "/" + signature_dir(r["signature"].get<std::string>()),
              dir_name);
    EXPECT_EQ(r["replay"], "vramfuzz replay repro.json");
    const Proc rr = run_cli({"replay", "repro.json"}, sig_dir);
    expect_clean(rr);
    EXPECT_EQ(rr.exit_code, 1) << describe(rr);
    EXPECT_NE(read_file(sig_dir / "repro.md").find(r["signature"].get<std::string>()), std::string::npos);
    for (const auto& file : fs::directory_iterator(sig_dir)) {
      const std::string name = file.path().filename().string();
      if (name == "repro.json" || name == "repro.md") continue;
      SCOPED_TRACE(name);
      ++files_per_dir[dir_name];
      EXPECT_EQ(file.path().extension(), ".json");
      const json f = json::parse(read_file(file.path()));  // throws (fails the test) if invalid
      EXPECT_EQ(f["schema"], "vramfuzz.finding/1");
      const std::string sig = f["signature"].get<std::string>();
      EXPECT_EQ(signature_dir(sig), sig_dir.filename().string());
      EXPECT_EQ(f["replay"], "vramfuzz run " + name);
      const Proc replay = run_cli({"run", name}, sig_dir);
      expect_clean(replay);
      EXPECT_EQ(replay.exit_code, 1) << describe(replay);
      EXPECT_EQ(verdict_signature(verdict_line(replay.out)), sig) << describe(replay);
    }
  }
  EXPECT_EQ(files_per_dir, expected_files);
}

// The command after `needle` in `text`, up to the end of its line, the closing backquote, tag or
// attribute quote, or the next signature of a JUnit message.
std::string command_after(const std::string& text, const std::string& needle) {
  const auto at = text.find(needle);
  if (at == std::string::npos) return "";
  const auto start = at + needle.size();
  return text.substr(start, text.find_first_of("`\n<\";", start) - start);
}

TEST_F(Cli, PrintedReplayCommandsWorkFromTheFolderTheySayAndAfterAMove) {
  // A relative --out, as people type it. Every replay command vramfuzz prints is phrased from the
  // folder of the file it is printed in, so it works whatever directory the reader is in, and
  // after the tree moved.
  const Proc p = run({"fuzz", "--seed", "3", "--cases", "20", "--policy", "comfy:dec2025", "--shrink-execs", "40", "--allocator", "raw",
                      "--out", "out2"});
  ASSERT_EQ(p.exit_code, 1) << "seed 3 finds a violation at case 10\n" << describe(p);
  fs::rename(dir_ / "out2", dir_ / "moved");
  const fs::path out = dir_ / "moved";
  const fs::path bin = dir_ / "bin";
  std::size_t checked = 0;
  auto expect_reproduces = [&](const std::string& command, const fs::path& cwd, const std::string& where) {
    SCOPED_TRACE(where + ": " + command);
    ASSERT_EQ(command.rfind("vramfuzz replay ", 0), 0u);
    const Proc r = test::run_pasted(VF_CLI, command, cwd, bin);
    expect_clean(r);
    EXPECT_EQ(r.exit_code, 1) << describe(r);
    ++checked;
  };
  for (const auto& e : fs::recursive_directory_iterator(out / "findings")) {
    if (e.path().filename() != "repro.md") continue;
    const std::string md = read_file(e.path());
    ASSERT_NE(md.find("From the folder this file is in:"), std::string::npos) << md;
    expect_reproduces(command_after(md, "From the folder this file is in:\n\n```\n"), e.path().parent_path(), "repro.md");
  }
  const std::string md = read_file(out / "summary.md");
  expect_reproduces(command_after(md, "Replay a finding from the folder of this file, e.g. `"), out, "summary.md");
  const std::string junit = read_file(out / "junit.xml");
  expect_reproduces(command_after(junit, "replay from the folder of junit.xml: "), out, "junit.xml message");
  expect_reproduces(command_after(junit, "replay (from the folder of junit.xml): "), out, "junit.xml body");
  const std::string html = read_file(out / "report.html");
  expect_reproduces(command_after(html, "replay from the folder of this report:</p>\n<pre>"), out, "report.html");
  EXPECT_GE(checked, 5u);
}

TEST_F(Cli, FuzzTakesAllocatorOptionsForItsOneModeAndRecordsThem) {
  // `--option` used to be accepted and ignored: now it shapes every case, and the command says so.
  expect_bad_input({"fuzz", "--cases", "5", "--option", "max_split_size_mb=128"}, "--option: needs --allocator");
  expect_bad_input({"fuzz", "--cases", "5", "--allocator", "raw", "--option", "max_split_size_mb=128"}, "max_split_size_mb");
  const Proc p = run({"fuzz", "--seed", "3", "--cases", "40", "--policy", "comfy:dec2025", "--allocator", "caching", "--option",
                      "max_split_size_mb=128", "--no-shrink", "--keep", "1", "--out", "out"});
  expect_clean(p);
  ASSERT_EQ(p.exit_code, 1) << "seed 3 finds something in 40 caching cases\n" << describe(p);
  const json summary = json::parse(read_file(dir_ / "out" / "summary.json"));
  EXPECT_EQ(summary["config"]["allocator_options"], json::array({"max_split_size_mb=128"}));
  EXPECT_NE(summary["command"].get<std::string>().find(" --allocator caching --option max_split_size_mb=128 "), std::string::npos)
      << summary["command"];
  ASSERT_FALSE(summary["findings"].empty());
  for (const json& f : summary["findings"]) {
    const json finding = json::parse(read_file(dir_ / f["file"].get<std::string>()));
    EXPECT_EQ(finding["scenario"]["allocator"]["options"]["max_split_size_mb"], 128) << f["file"];
    EXPECT_NE(finding["found_by"].get<std::string>().find("--option max_split_size_mb=128"), std::string::npos);
  }
}

TEST_F(Cli, FuzzIsDeterministic) {
  // Two campaigns with the same flags in two directories: the same summary (bar the wall time,
  // the timestamp and the host) and byte-identical finding files.
  fs::create_directories(dir_ / "a");
  fs::create_directories(dir_ / "b");
  const std::vector<std::string> args{"fuzz", "--cases", "50", "--shrink-execs", "60", "--allocator", "raw", "--out", "out"};
  const Proc a = run_cli(args, dir_ / "a");
  const Proc b = run_cli(args, dir_ / "b");
  expect_clean(a);
  expect_clean(b);
  EXPECT_EQ(a.exit_code, b.exit_code);
  json sa = json::parse(read_file(dir_ / "a" / "out" / "summary.json"));
  json sb = json::parse(read_file(dir_ / "b" / "out" / "summary.json"));
  sa["counts"].erase("seconds");
  sb["counts"].erase("seconds");
  sa.erase("run");  // when and where it ran: timestamp, hostname
  sb.erase("run");
  EXPECT_EQ(sa["counts"].dump(), sb["counts"].dump());
  EXPECT_EQ(sa.dump(2), sb.dump(2));

  auto files = [](const fs::path& root) {
    std::map<std::string, std::string> out;
    if (!fs::exists(root)) return out;
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      if (e.is_regular_file()) out[fs::relative(e.path(), root).string()] = read_file(e.path());
    }
    return out;
  };
  const auto fa = files(dir_ / "a" / "out" / "findings");
  const auto fb = files(dir_ / "b" / "out" / "findings");
  std::set<std::string> na, nb;
  for (const auto& [k, v] : fa) na.insert(k);
  for (const auto& [k, v] : fb) nb.insert(k);
  EXPECT_EQ(na, nb);
  EXPECT_EQ(fa, fb);
  EXPECT_EQ(fa.size(), [&] {
    std::size_t n = 0;  // finding files, plus repro.json and repro.md per signature
    for (const json& f : sa["findings"]) n += std::min<std::size_t>(f["count"].get<std::size_t>(), 3) + 2;
    return n;
  }());

  // A different seed is a different campaign.
  const Proc c = run_cli({"fuzz", "--cases", "50", "--shrink-execs", "60", "--allocator", "raw", "--seed", "2", "--out", "out2"}, dir_ / "a");
  expect_clean(c);
  const json sc = json::parse(read_file(dir_ / "a" / "out2" / "summary.json"));
  EXPECT_EQ(sc["config"]["seed"], 2);
  std::set<std::string> nc;
  for (const auto& [k, v] : files(dir_ / "a" / "out2" / "findings")) nc.insert(k);
  if (!na.empty() || !nc.empty()) {
    EXPECT_NE(nc, na) << "case seeds derive from the campaign seed";
  }
}

// ---- models ----------------------------------------------------------------------------------

TEST_F(Cli, ModelsListListsTheCatalog) {
  const Proc p = run({"models", "list"});
  expect_clean(p);
  EXPECT_EQ(p.exit_code, 0) << describe(p);
  ASSERT_EQ(catalog_entries().size(), 12u);
  EXPECT_EQ(count_lines(p.out), 13u) << "a header and 12 models\n" << p.out;
  for (const CatalogEntry& e : catalog_entries()) {
    EXPECT_NE(p.out.find("\n" + std::string(e.name) + " "), std::string::npos) << e.name << " missing\n" << p.out;
  }
}

TEST_F(Cli, ModelsShowWithAStorageDtype) {
  const Proc p = run({"models", "show", "flux1-dev", "--storage", "q4_k"});
  expect_clean(p);
  EXPECT_EQ(p.exit_code, 0) << describe(p);
  EXPECT_EQ(p.out.rfind("flux1-dev (diffusion, family flux): ", 0), 0u) << p.out;
  EXPECT_NE(p.out.find("stored as q4_k"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("  q4_k "), std::string::npos) << "the per-dtype breakdown lists q4_k\n" << p.out;
}

TEST_F(Cli, ModelsPrintBinaryUnitsLabelledAsSuch) {
  // docs/formats.md: MB/GB mean MiB/GiB. models list/show printed decimal "GB" (flux1-dev
  // "23.80 GB"); they print GiB, labelled GiB: 23,802,816,640 B = 22.17 GiB.
  const Proc list = run({"models", "list"});
  EXPECT_EQ(list.exit_code, 0) << describe(list);
  EXPECT_NE(list.out.find("bf16 22.17 GiB"), std::string::npos) << list.out;
  const Proc show = run({"models", "show", "flux1-dev"});
  EXPECT_EQ(show.exit_code, 0) << describe(show);
  EXPECT_NE(show.out.find("22700.13 MiB (22.17 GiB) stored as bf16"), std::string::npos) << show.out;
  for (const Proc* p : {&list, &show}) {
    EXPECT_EQ(std::regex_search(p->out, std::regex("[0-9] GB\\b")), false) << "no decimal GB left\n" << p->out;
  }
}

TEST_F(Cli, ModelsShowNamesTheModulesWithoutACastHook) {
  // Wan: 41 x [1, 6 or 2, 5120] bf16 modulations (40 x 61440 + 20480 B = 2.36 MiB), each beside
  // its block's layers; SD3.5: the root's pos_embed buffer; FLUX.2 VAE: bn's two fp32 [128].
  const Proc wan = run({"models", "show", "wan21-14b"});
  EXPECT_EQ(wan.exit_code, 0) << describe(wan);
  EXPECT_NE(wan.out.find("without a cast hook: 41 modules, 2.36 MiB (41 containers of raw tensors beside their children)\n"),
            std::string::npos)
      << wan.out;
  const Proc sd35 = run({"models", "show", "sd35-large", "--modules"});
  EXPECT_EQ(sd35.exit_code, 0) << describe(sd35);
  EXPECT_NE(sd35.out.find("without a cast hook: 1 module, 171.00 MiB (1 container of raw tensors beside its children)\n"),
            std::string::npos)
      << sd35.out;
  EXPECT_NE(sd35.out.find("  (root)  "), std::string::npos) << sd35.out;
  EXPECT_NE(sd35.out.find("pos_embed[1, 36864, 2432] bf16  [container]\n"), std::string::npos) << sd35.out;
  const Proc vae = run({"models", "show", "flux2-vae"});
  EXPECT_NE(vae.out.find("without a cast hook: 1 module, 1024 B (1 leaf of buffers only)\n"), std::string::npos) << vae.out;
  const Proc flux = run({"models", "show", "flux1-dev"});
  EXPECT_EQ(flux.out.find("without a cast hook"), std::string::npos) << flux.out;
}

TEST_F(Cli, ModelsShowUnscaledIsForFp8AndInt8StorageOnly) {
  // --unscaled means something for fp8 / int8 storage only (as a scenario's "scaled").
  expect_bad_input({"models", "show", "flux1-dev", "--unscaled"}, "--unscaled: applies to fp8 and int8 storage only, not bf16");
  const Proc fp8 = run({"models", "show", "flux1-dev", "--storage", "fp8_e4m3fn", "--unscaled"});
  EXPECT_EQ(fp8.exit_code, 0) << describe(fp8);
  EXPECT_NE(fp8.out.find("(unscaled)"), std::string::npos) << fp8.out;
}

TEST_F(Cli, ModelsShowUnknownExits2) {
  expect_bad_input({"models", "show", "nosuch"}, "unknown model \"nosuch\"");
  expect_bad_input({"models", "show", "nosuch"}, "flux1-dev");
  expect_bad_input({"models", "show", "flux1-dev", "--storage", "fp9"}, "--storage: unknown dtype \"fp9\"");
}

// ---- alloc-replay -----------------------------------------------------------------------------

TEST_F(Cli, AllocReplayReproducesTheOriginTable) {
  // The origin discussion's DEBUG lines under cudaMallocAsync with 32 MiB chunks.
  const std::string trace = std::string(VF_SOURCE_DIR) + "/tests/data/origin-flux2.jsonl";
  const Proc p = run({"alloc-replay", trace, "--allocator", "async", "--option", "pool_granularity=32MiB"});
  expect_clean(p);
  EXPECT_EQ(p.exit_code, 0) << describe(p);
  for (const char* line : {"[DEBUG 0] reserved: 1280.00 MiB (+ 1280.00 MiB), allocated: 1280.00 MiB, module: 1280.00 MiB",
                           "[DEBUG 64] reserved: 21504.00 MiB (+ 64.00 MiB), allocated: 21480.00 MiB, module: 40.00 MiB",
                           "[DEBUG 68] reserved: 21632.00 MiB (+ 32.00 MiB), allocated: 21610.00 MiB, module: 10.00 MiB"}) {
    EXPECT_NE(p.out.find(line), std::string::npos) << line << "\n" << p.out;
  }
  // A device too small for it: the OOMs are findings (exit 1), a bad option is bad input (exit 2).
  const Proc small = run({"alloc-replay", trace, "--allocator", "async", "--device", "4GiB"});
  expect_clean(small);
  EXPECT_EQ(small.exit_code, 1) << describe(small);
  const Proc bad = run({"alloc-replay", trace, "--allocator", "async", "--option", "max_split_size_mb=128"});
  EXPECT_EQ(bad.exit_code, 2) << describe(bad);
}

TEST_F(Cli, AllocReplayTablePrintsThePeaksOnce) {
  const std::string trace = std::string(VF_SOURCE_DIR) + "/tests/data/origin-flux2.jsonl";
  auto count = [](const std::string& text, const std::string& needle) {
    std::size_t n = 0;
    for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
    return n;
  };
  const Proc table = run({"alloc-replay", trace, "--table"});
  EXPECT_EQ(table.exit_code, 0) << describe(table);
  EXPECT_EQ(count(table.out, "peaks:"), 1u) << table.out;
  EXPECT_NE(table.out.find("# peaks: requested"), std::string::npos) << table.out;
  const Proc debug = run({"alloc-replay", trace});
  EXPECT_EQ(debug.exit_code, 0) << describe(debug);
  EXPECT_EQ(count(debug.out, "peaks:"), 1u) << debug.out;
  // --allocator is optional (README): the default is caching.
  EXPECT_NE(table.out.find("# mode caching"), std::string::npos) << table.out;
}

TEST_F(Cli, CalibrateRecommendsAReserveThatRunTakes) {
  // The recommendation used to print as "838.2 MiB", which --reserve refuses (not whole bytes).
  const Proc c = run({"calibrate", "--cases", "12", "--allocator", "raw", "--verify-rounds", "0", "--no-shrink", "--out", "cal"}, 120);
  ASSERT_EQ(c.exit_code, 0) << describe(c);
  const json summary = json::parse(read_file(dir_ / "cal" / "summary.json"));
  const std::regex whole_mib("\\b([0-9]+MiB)\\b");
  std::size_t checked = 0;
  for (const json& m : summary["calibrate"]["modes"]) {
    const Bytes rec = m["recommended"].get<Bytes>();
    EXPECT_EQ(rec % MiB, 0u) << "whole MiB: " << rec;
    EXPECT_GE(rec, m["need"].get<Bytes>() + summary["calibrate"]["margin"].get<Bytes>());
    EXPECT_LT(rec, m["need"].get<Bytes>() + summary["calibrate"]["margin"].get<Bytes>() + MiB);
    const std::string printed = std::to_string(rec / MiB) + "MiB";
    EXPECT_NE(c.out.find(printed), std::string::npos) << printed << "\n" << c.out;
    const Proc r = run({"plan", kExample, "--reserve", printed});
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    ++checked;
  }
  EXPECT_EQ(checked, 1u);
  // Every recommendation the tables print (modes and classes) is one --reserve takes.
  std::size_t tokens = 0;
  for (std::sregex_iterator it(c.out.begin(), c.out.end(), whole_mib), end; it != end; ++it) {
    const Proc r = run({"plan", kExample, "--reserve", (*it)[1].str()});
    EXPECT_EQ(r.exit_code, 0) << (*it)[1].str() << "\n" << describe(r);
    if (++tokens == 4) break;
  }
  EXPECT_GE(tokens, 1u) << c.out;
}

// ---- render-repro ----------------------------------------------------------------------------

// A committed repro rendered again with this version: its figures and tables are this run's, its
// shrink's lineage (overshoots, executions, the finding it came from) is the file's, and what the
// file did not say (an older version's missing `repeats`) it still does not say.
TEST_F(Cli, RenderReproRewritesAReproInPlaceAndKeepsItsLineage) {
  const fs::path corpus = fs::path(VF_SOURCE_DIR) / "fuzz/corpus/regressions/sep2026-oom-forward-cast-buffer-async/repro.json";
  const json before = json::parse(read_file(corpus));
  fs::create_directories(dir_ / "r");
  fs::copy_file(corpus, dir_ / "r" / "repro.json");
  const Proc p = run({"render-repro", "r/repro.json"}, 120);
  expect_clean(p);
  ASSERT_EQ(p.exit_code, 0) << describe(p);
  const json after = json::parse(read_file(dir_ / "r" / "repro.json"));
  EXPECT_EQ(after["signature"], before["signature"]);
  for (const char* key : {"original_overshoot", "largest_overshoot_seen", "shrink_margin"}) EXPECT_EQ(after["bytes"][key], before["bytes"][key]) << key;
  for (const char* key : {"executions", "cache_hits", "accepted", "budget_exhausted", "steps"}) {
    EXPECT_EQ(after["shrink"][key], before["shrink"][key]) << key;
  }
  EXPECT_EQ(after["reliability"], before["reliability"]);
  EXPECT_EQ(after["origin"], before["origin"]);  // the finding it was shrunk from, not the repro itself
  EXPECT_EQ(before["shrink"]["original"].contains("repeats"), after["shrink"]["original"].contains("repeats"));
  EXPECT_EQ(after["shrink"]["original"]["modules"], before["shrink"]["original"]["modules"]);
  // The dynamic OOM's stages each have their row, where the older rendering left the table empty.
  const std::string md = read_file(dir_ / "r" / "repro.md");
  EXPECT_NE(md.find("| 1 forward synthetic | none (dynamic VRAM: placed at run time) |"), std::string::npos) << md;
  EXPECT_NE(md.find("Largest shortfall (the failed request beyond the free memory) seen while shrinking"), std::string::npos) << md;
  // Rendering again changes nothing but nothing.
  const std::string once = read_file(dir_ / "r" / "repro.json");
  ASSERT_EQ(run({"render-repro", "r/repro.json"}, 120).exit_code, 0);
  EXPECT_EQ(read_file(dir_ / "r" / "repro.json"), once);
}

// What render-repro refuses, with exit 2 and the field named, leaving the file as it was: a file
// not named repro.json (it rewrites a folder's repro in place), a repro without its lineage, and a
// repro whose scenario no longer gives its signature.
TEST_F(Cli, RenderReproRefusesWhatItCannotRenderFaithfully) {
  const fs::path corpus = fs::path(VF_SOURCE_DIR) / "fuzz/corpus/regressions/sep2026-oom-forward-cast-buffer-async/repro.json";
  json doc = json::parse(read_file(corpus));
  write("other.json", doc.dump());
  expect_bad_input({"render-repro", "other.json"}, "render-repro rewrites a repro in place");

  fs::create_directories(dir_ / "a");
  json cut = doc;
  cut["bytes"].erase("original_overshoot");
  write("a/repro.json", cut.dump());
  expect_bad_input({"render-repro", "a/repro.json"}, "bytes.original_overshoot: missing");

  fs::create_directories(dir_ / "b");
  json other = doc;
  other["signature"] = "oom:forward:torch-cache:async";
  const std::string text = other.dump();
  write("b/repro.json", text);
  expect_bad_input({"render-repro", "b/repro.json"}, "gives oom:forward:cast-buffer:async here, not the recorded oom:forward:torch-cache:async");
  EXPECT_EQ(read_file(dir_ / "b" / "repro.json"), text);
  EXPECT_FALSE(fs::exists(dir_ / "b" / "repro.md"));
}

}  // namespace
}  // namespace vf
