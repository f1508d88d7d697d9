#include "harness/cuda/isolate.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "harness/core/error.h"
#include "harness/core/json_in.h"

extern char** environ;

namespace vf::cuda {

namespace {

using nlohmann::json;

json stat_json(const sim::Stat& s) { return json::array({s.current, s.peak}); }
sim::Stat stat_from(const json& j) {
  sim::Stat s;
  s.current = j.at(0).get<Bytes>();
  s.peak = j.at(1).get<Bytes>();
  return s;
}

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string last_line(const std::string& text) {
  std::string t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  const auto nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

// A temporary directory removed on scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "vramfuzz-case-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) throw InfraError(fmt::format("isolate: mkdtemp failed: {}", std::strerror(errno)));
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace

std::string exec_result_to_json(const ExecResult& r) {
  json j;
  j["schema"] = kExecResultSchema;
  j["backend"] = r.backend;
  j["environment"] = r.environment;
  j["ops_executed"] = r.ops_executed;
  json trace = json::array();
  for (const TraceRow& t : r.trace) trace.push_back({t.op, t.live, t.allocated, t.reserved, t.device_used});
  j["trace"] = std::move(trace);
  j["live_peak"] = r.live_peak;
  j["allocated_peak"] = r.allocated_peak;
  j["reserved_peak"] = r.reserved_peak;
  j["reserved_peak_op"] = r.reserved_peak_op;
  j["device_peak"] = r.device_peak;
  j["stage_reserved_peak"] = r.stage_reserved_peak;
  j["stage_reserved_peak_op"] = r.stage_reserved_peak_op;
  j["stage_allocated_at_peak"] = r.stage_allocated_at_peak;
  j["stage_held_at_peak"] = r.stage_held_at_peak;
  if (r.oom) {
    j["oom"] = {{"op", r.oom->op},       {"request", r.oom->request},     {"device_free", r.oom->device_free},
                {"reserved", r.oom->reserved}, {"allocated", r.oom->allocated}, {"detail", r.oom->detail},
                {"held", r.oom->held}};
  }
  if (r.error) j["error"] = *r.error;
  j["fatal"] = r.fatal;
  j["warnings"] = r.warnings;
  if (r.device) {
    const DeviceReport& d = *r.device;
    j["device"] = {{"total", d.total},
                   {"free_at_start", d.free_at_start},
                   {"ballast", d.ballast},
                   {"free_before", d.free_before},
                   {"free_after", d.free_after},
                   {"free_after_cleanup", d.free_after_cleanup},
                   {"leaked", d.leaked},
                   {"sampled_used_peak", d.sampled_used_peak},
                   {"samples", d.samples},
                   {"nvml_process_peak", d.nvml_process_peak ? json(*d.nvml_process_peak) : json(nullptr)},
                   {"pool_reserved_high", d.pool_reserved_high},
                   {"pool_used_high", d.pool_used_high},
                   {"h2d_copies", d.h2d_copies},
                   {"memsets", d.memsets},
                   {"launches", d.launches},
                   {"fallback_touches", d.fallback_touches}};
  }
  const sim::AllocStats& st = r.final_stats;
  j["final_stats"] = {{"requested", stat_json(st.requested)},
                      {"allocated", stat_json(st.allocated)},
                      {"active", stat_json(st.active)},
                      {"reserved", stat_json(st.reserved)},
                      {"inactive_split", stat_json(st.inactive_split)},
                      {"num_alloc_retries", st.num_alloc_retries},
                      {"num_ooms", st.num_ooms},
                      {"num_device_alloc", st.num_device_alloc},
                      {"num_device_free", st.num_device_free}};
  return j.dump() + "\n";
}

ExecResult exec_result_from_json(std::string_view text, std::string_view origin) {
  const json j = parse_json_text(text, origin);
  if (!j.is_object() || j.value("schema", "") != kExecResultSchema) {
    throw InputError(std::string(origin), fmt::format("not a {} document", kExecResultSchema));
  }
  ExecResult r;
  try {
    r.backend = j.at("backend").get<std::string>();
    r.environment = j.at("environment").get<std::string>();
    r.ops_executed = j.at("ops_executed").get<std::uint32_t>();
    for (const json& t : j.at("trace")) {
      r.trace.push_back(TraceRow{t.at(0).get<std::uint32_t>(), t.at(1).get<Bytes>(), t.at(2).get<Bytes>(),
                                 t.at(3).get<Bytes>(), t.at(4).get<Bytes>()});
    }
    r.live_peak = j.at("live_peak").get<Bytes>();
    r.allocated_peak = j.at("allocated_peak").get<Bytes>();
    r.reserved_peak = j.at("reserved_peak").get<Bytes>();
    r.reserved_peak_op = j.at("reserved_peak_op").get<std::uint32_t>();
    r.device_peak = j.at("device_peak").get<Bytes>();
    r.stage_reserved_peak = j.at("stage_reserved_peak").get<std::vector<Bytes>>();
    r.stage_reserved_peak_op = j.at("stage_reserved_peak_op").get<std::vector<std::uint32_t>>();
    r.stage_allocated_at_peak = j.at("stage_allocated_at_peak").get<std::vector<Bytes>>();
    r.stage_held_at_peak = j.at("stage_held_at_peak").get<std::vector<Bytes>>();
    if (j.contains("oom")) {
      const json& o = j.at("oom");
      r.oom = OomEvent{o.at("op").get<std::uint32_t>(), o.at("request").get<Bytes>(), o.at("device_free").get<Bytes>(),
                       o.at("reserved").get<Bytes>(),  o.at("allocated").get<Bytes>(), o.at("detail").get<std::string>(),
                       o.at("held").get<Bytes>()};
    }
    if (j.contains("error")) r.error = j.at("error").get<std::string>();
    r.fatal = j.at("fatal").get<bool>();
    r.warnings = j.at("warnings").get<std::vector<std::string>>();
    if (j.contains("device")) {
      const json& d = j.at("device");
      DeviceReport rep;
      rep.total = d.at("total").get<Bytes>();
      rep.free_at_start = d.at("free_at_start").get<Bytes>();
      rep.ballast = d.at("ballast").get<Bytes>();
      rep.free_before = d.at("free_before").get<Bytes>();
      rep.free_after = d.at("free_after").get<Bytes>();
      rep.free_after_cleanup = d.at("free_after_cleanup").get<Bytes>();
      rep.leaked = d.at("leaked").get<Bytes>();
      rep.sampled_used_peak = d.at("sampled_used_peak").get<Bytes>();
      rep.samples = d.at("samples").get<std::uint64_t>();
      if (!d.at("nvml_process_peak").is_null()) rep.nvml_process_peak = d.at("nvml_process_peak").get<Bytes>();
      rep.pool_reserved_high = d.at("pool_reserved_high").get<Bytes>();
      rep.pool_used_high = d.at("pool_used_high").get<Bytes>();
      rep.h2d_copies = d.at("h2d_copies").get<std::uint64_t>();
      rep.memsets = d.at("memsets").get<std::uint64_t>();
      rep.launches = d.at("launches").get<std::uint64_t>();
      rep.fallback_touches = d.at("fallback_touches").get<std::uint64_t>();
      r.device = rep;
    }
    const json& st = j.at("final_stats");
    r.final_stats.requested = stat_from(st.at("requested"));
    r.final_stats.allocated = stat_from(st.at("allocated"));
    r.final_stats.active = stat_from(st.at("active"));
    r.final_stats.reserved = stat_from(st.at("reserved"));
    r.final_stats.inactive_split = stat_from(st.at("inactive_split"));
    r.final_stats.num_alloc_retries = st.at("num_alloc_retries").get<std::uint64_t>();
    r.final_stats.num_ooms = st.at("num_ooms").get<std::uint64_t>();
    r.final_stats.num_device_alloc = st.at("num_device_alloc").get<std::uint64_t>();
    r.final_stats.num_device_free = st.at("num_device_free").get<std::uint64_t>();
  } catch (const json::exception& e) {
    throw InputError(std::string(origin), fmt::format("malformed exec result: {}", e.what()));
  }
  return r;
}

std::string self_executable() {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw InfraError(fmt::format("isolate: cannot resolve /proc/self/exe: {}", ec.message()));
  return p.string();
}

ExecResult IsolatedBackend::execute(const Scenario& s, const Program& p, const ExecOptions& opt) {
  ExecResult failed;
  failed.backend = cfg_.name;
  failed.environment = "isolated child";
  failed.stage_reserved_peak.assign(p.stage_begin.size(), 0);
  failed.stage_reserved_peak_op.assign(p.stage_begin.size(), 0);
  failed.stage_allocated_at_peak.assign(p.stage_begin.size(), 0);
  failed.stage_held_at_peak.assign(p.stage_begin.size(), 0);

  TempDir dir;
  const std::string scenario = (dir.path / "scenario.json").string();
  const std::string result = (dir.path / "result.json").string();
  const std::string out_log = (dir.path / "stdout.log").string();
  const std::string err_log = (dir.path / "stderr.log").string();
  write_file_atomic(scenario, scenario_to_json(s));

  std::vector<std::string> args = cfg_.command;
  for (const std::string& a : {std::string("--scenario"), scenario, std::string("--result"), result, std::string("--ops"),
                               std::to_string(p.ops.size())}) {
    args.push_back(a);
  }
  if (opt.record_trace) args.emplace_back("--trace");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err_log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    failed.error = fmt::format("isolate: cannot start {}: {}", args[0], std::strerror(rc));
    return failed;
  }

  // Wait, with a deadline: a hung GPU must not hang the campaign.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(cfg_.timeout_seconds);
  int status = 0;
  bool timed_out = false;
  for (auto sleep = std::chrono::microseconds(200);;) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) {
      failed.error = fmt::format("isolate: waitpid failed: {}", std::strerror(errno));
      return failed;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(20000));
  }

  const std::string err_text = read_all(err_log);
  std::istringstream lines(err_text);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) spdlog::debug("isolated child: {}", line);
  }
  std::error_code ec;
  if (!timed_out && std::filesystem::exists(result, ec)) {
    try {
      ExecResult r = exec_result_from_json(read_all(result), result);
      if (r.fatal) {
        // The child's context died with it; the next case gets a fresh process.
        r.fatal = false;
        r.warnings.push_back("the isolated child hit a sticky CUDA error; the next case runs in a fresh process");
      }
      return r;
    } catch (const InputError& e) {
      failed.error = fmt::format("isolate: the child's result is unreadable: {}", e.what());
      return failed;
    }
  }
  std::string how;
  if (timed_out) {
    how = fmt::format("timed out after {:.0f} s and was killed", cfg_.timeout_seconds);
  } else if (WIFSIGNALED(status)) {
    how = fmt::format("died of signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  } else {
    how = fmt::format("exited with status {} without a result", WEXITSTATUS(status));
  }
  const std::string tail = last_line(err_text);
  failed.error = fmt::format("isolated child {}{}{}", how, tail.empty() ? "" : "; its last words: ", tail);
  return failed;
}

}  // namespace vf::cuda
