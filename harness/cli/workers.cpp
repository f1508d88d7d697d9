#include "harness/cli/workers.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "harness/cli/signals.h"
#include "harness/core/error.h"

extern char** environ;

namespace vf::cli {
namespace {

// This process's own argv, as the kernel has it.
std::vector<std::string> own_argv() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();
  std::vector<std::string> out;
  std::size_t start = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i] != '\0') continue;
    out.push_back(all.substr(start, i - start));
    start = i + 1;
  }
  if (start < all.size()) out.push_back(all.substr(start));
  if (out.empty()) throw InfraError("--devices: cannot read this process's command line from /proc/self/cmdline");
  return out;
}

// argv without the options a worker gets its own value for (both "--x V" and "--x=V").
std::vector<std::string> worker_args(const std::vector<std::string>& argv, const std::string& out_dir, unsigned k, unsigned n) {
  static const std::set<std::string> kDropped = {"--devices", "--out", "--shard", "--progress"};
  std::vector<std::string> out{argv.front()};
  for (std::size_t i = 1; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    const std::string name = a.substr(0, a.find('='));
    if (kDropped.count(name)) {
      if (a.find('=') == std::string::npos) ++i;  // its value is the next word
      continue;
    }
    out.push_back(a);
  }
  for (const std::string& a : {std::string("--out"), (std::filesystem::path(out_dir) / fmt::format("shard-{}", k)).string(),
                               std::string("--shard"), fmt::format("{}/{}", k, n), std::string("--progress"), std::string("plain")}) {
    out.push_back(a);
  }
  return out;
}

}  // namespace

std::vector<std::string> parse_device_list(const std::string& text, const std::string& flag) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    std::string id = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (id.empty()) throw InputError(flag, fmt::format("expected device ids separated by commas (0,1,2), got \"{}\"", text));
    // What CUDA_VISIBLE_DEVICES takes: an index, or a GPU / MIG UUID as nvidia-smi -L prints it.
    const bool index = id.find_first_not_of("0123456789") == std::string::npos;
    if (!index && id.rfind("GPU-", 0) != 0 && id.rfind("MIG-", 0) != 0) {
      throw InputError(flag, fmt::format("\"{}\" is not a device: use indices (0,1) or UUIDs (GPU-..., MIG-...) as "
                                         "nvidia-smi -L prints them",
                                         id));
    }
    if (!seen.insert(id).second) throw InputError(flag, fmt::format("device {} is listed twice", id));
    out.push_back(std::move(id));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::pair<unsigned, unsigned> parse_shard(const std::string& text, const std::string& flag) {
  unsigned i = 0, n = 0;
  char slash = 0;
  std::istringstream in(text);
  if (!(in >> i >> slash >> n) || slash != '/' || !in.eof() || n == 0 || i >= n || text.find('-') != std::string::npos) {
    throw InputError(flag, fmt::format("expected I/N with 0 <= I < N (e.g. 0/4), got \"{}\"", text));
  }
  return {i, n};
}

WorkerRun run_workers(const std::vector<std::string>& devices, const std::string& out_dir) {
  const std::vector<std::string> argv = own_argv();
  const unsigned n = static_cast<unsigned>(devices.size());
  WorkerRun run;
  std::vector<pid_t> pids;
  // A worker that cannot be started ends the run: the ones already running are stopped and
  // reaped before the error goes up, so none is left behind (or a zombie).
  const auto abandon = [&pids](const std::string& why) {
    for (pid_t pid : pids) ::kill(pid, SIGTERM);
    for (pid_t pid : pids) {
      while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
    return InfraError(why);
  };
  const pid_t parent = ::getpid();
  for (unsigned k = 0; k < n; ++k) {
    const std::string dir = (std::filesystem::path(out_dir) / fmt::format("shard-{}", k)).string();
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw abandon(fmt::format("cannot create {}: {}", dir, ec.message()));
    run.dirs.push_back(dir);
    // Everything the child needs is prepared here: between fork and exec only async-signal-safe calls.
    std::vector<std::string> args = worker_args(argv, out_dir, k, n);
    std::vector<char*> cargs;
    for (std::string& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      if (std::strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) != 0) env.emplace_back(*e);
    }
    env.push_back("CUDA_VISIBLE_DEVICES=" + devices[k]);
    std::vector<char*> cenv;
    for (std::string& e : env) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    const std::string log = dir + "/stdout.log";
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw abandon(fmt::format("cannot write {}: {}", log, std::strerror(errno)));
    spdlog::info("devices: worker {} on device {}: {}", k, devices[k], fmt::join(args, " "));
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int err = errno;
      ::close(fd);
      throw abandon(fmt::format("fork failed for worker {}: {}", k, std::strerror(err)));
    }
    if (pid == 0) {
      // Own process group: a terminal's Ctrl-C reaches the parent only, which passes it on once.
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      // The parent may have died before prctl: then no signal will come, and nobody waits for us.
      if (::getppid() != parent) ::_exit(kExitInfra);
      ::dup2(fd, STDOUT_FILENO);
      ::execve("/proc/self/exe", cargs.data(), cenv.data());
      ::_exit(127);
    }
    ::close(fd);
    pids.push_back(pid);
  }
  run.exit_codes.assign(n, -1);
  std::size_t alive = n;
  bool forwarded = false;
  while (alive > 0) {
    if (stop_requested() && !forwarded) {
      spdlog::warn("devices: stopping the workers (they finish their current case and write their reports)");
      for (unsigned k = 0; k < n; ++k) {
        if (run.exit_codes[k] < 0) ::kill(pids[k], SIGTERM);
      }
      forwarded = true;
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    for (unsigned k = 0; k < n; ++k) {
      if (pids[k] != pid) continue;
      run.exit_codes[k] = WIFEXITED(status) ? WEXITSTATUS(status) : kExitInfra;
      --alive;
      if (WIFSIGNALED(status)) spdlog::warn("devices: worker {} died of signal {}", k, WTERMSIG(status));
    }
  }
  return run;
}

}  // namespace vf::cli
