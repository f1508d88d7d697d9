// Running the vramfuzz binary as a real process from a test: exit code, signal, stdout, stderr,
// with a timeout; a fresh temporary directory per test; reading a file whole. Shared by the tests
// that run the CLI or write files (test_cli, test_import, test_merge, test_reports).
#pragma once

#include <gtest/gtest.h>

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace vf::test {

struct Proc {
  int exit_code = -1;  // WEXITSTATUS when the process exited
  int signal = 0;      // the signal that killed it, 0 if it exited
  bool timed_out = false;
  std::string out, err;
  long max_rss_kb = 0;  // the child's peak resident set (getrusage's ru_maxrss)
  double wall_s = 0;    // from fork to exit
};

// Runs `exe` with `args` in `cwd`, capturing stdout and stderr; kills it after `timeout_s`.
inline Proc run_process(const std::string& exe, const std::vector<std::string>& args, const std::filesystem::path& cwd,
                        int timeout_s = 30) {
  int out_pipe[2], err_pipe[2];
  if (::pipe(out_pipe) != 0 || ::pipe(err_pipe) != 0) throw std::runtime_error("pipe failed");
  std::vector<std::string> argv_s{exe};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    ::close(err_pipe[0]);
    ::close(err_pipe[1]);
    if (::chdir(cwd.c_str()) != 0) ::_exit(126);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  const auto started = std::chrono::steady_clock::now();
  Proc p;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&p.out, &p.err};
  int open_fds = 2;
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      p.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    const int n = ::poll(fds, 2, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buf[65536];
      const ssize_t r = ::read(fds[i].fd, buf, sizeof buf);
      if (r > 0) {
        sinks[i]->append(buf, static_cast<std::size_t>(r));
      } else if (r == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (pollfd& f : fds) {
    if (f.fd >= 0) ::close(f.fd);
  }
  int status = 0;
  rusage usage{};
  while (::wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  p.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  p.max_rss_kb = usage.ru_maxrss;
  if (WIFEXITED(status)) p.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) p.signal = WTERMSIG(status);
  return p;
}

inline std::string describe(const Proc& p) {
  return "exit " + std::to_string(p.exit_code) + (p.signal ? " signal " + std::to_string(p.signal) : "") +
         (p.timed_out ? " (timed out)" : "") + "\n--- stdout ---\n" + p.out.substr(0, 4000) + "\n--- stderr ---\n" +
         p.err.substr(0, 4000);
}

// No crash and no abort-on-exception, whatever the exit code.
inline void expect_clean(const Proc& p) {
  EXPECT_FALSE(p.timed_out) << describe(p);
  EXPECT_EQ(p.signal, 0) << describe(p);
  for (const char* bad : {"terminate called", "AddressSanitizer", "runtime error:", "Segmentation fault", "core dumped",
                          "internal error", "Aborted"}) {
    EXPECT_EQ(p.err.find(bad), std::string::npos) << "stderr has \"" << bad << "\"\n" << describe(p);
    EXPECT_EQ(p.out.find(bad), std::string::npos) << "stdout has \"" << bad << "\"\n" << describe(p);
  }
}

// Runs `command` as a person would paste it into a POSIX shell in `cwd`, with `vramfuzz` on the
// PATH: a link to `exe` in `bin_dir` (created when missing).
inline Proc run_pasted(const std::string& exe, const std::string& command, const std::filesystem::path& cwd,
                       const std::filesystem::path& bin_dir, int timeout_s = 60) {
  std::filesystem::create_directories(bin_dir);
  std::error_code ec;
  if (!std::filesystem::exists(bin_dir / "vramfuzz", ec)) std::filesystem::create_symlink(exe, bin_dir / "vramfuzz");
  return run_process("/bin/sh", {"-c", "PATH=\"$1:$PATH\"; eval \"$2\"", "sh", bin_dir.string(), command}, cwd, timeout_s);
}

// Each test in its own temporary directory (dir_), removed with everything in it afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "vf_test_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::filesystem::path dir_;
};

// The whole file as bytes ("" when it cannot be read: the assertion that follows says what).
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace vf::test
