// Running vramfuzz for real, as a process: shards and `merge` (the union of shards is one run),
// `--devices` worker processes, SIGTERM mid-campaign (reports complete, findings on disk), the
// `--time` budget with shrinking, the progress line, and `report` re-rendering from summary.json.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

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
  const json merged = summary("cm");
  for (const char* k : {"cases", "p50", "p90", "p99", "max", "need"}) {
    EXPECT_EQ(merged["calibrate"]["modes"][0][k], c["calibrate"]["modes"][0][k]) << k;
  }
  EXPECT_EQ(run({"calibrate", "--allocator", "nosuch"}).exit_code, 2);
  EXPECT_EQ(run({"calibrate", "--margin", "abc"}).exit_code, 2);
}

}  // namespace
}  // namespace vf
